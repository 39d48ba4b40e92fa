// One measured storage operation of gymckpt's participant store, in its own process (so its peak
// RSS is its own). Run with --expose-gc: the heap is collected before the clock starts.
//   commit OUT_CHECKPOINT_DIR N KB           N fresh records (built untimed), then the timed commit
//   restore PARTICIPANT_DIR [SCOPE_FILE] [--commit OUT_CHECKPOINT_DIR]
//                                            timed restore of the records in scope (all without a
//                                            scope file); with --commit, then a timed commit of
//                                            exactly the state it restored (the double's path)
// Prints one JSON line: {ms, sha256, records, kept, peak_rss_kb, data_rss_kb, commit_ms?, ...}.
import {readFileSync} from 'node:fs'

import {realisticRecord} from './data.mjs'
import {load} from './dist.mjs'
import {peakRssKb, resetPeakRss} from './lib.mjs'

const {writeParticipantState, readParticipantState} = await load('storage/participant-store.js')
const {pyDumpsView} = await load('storage/pyjson.js')

const rssKb = () => Math.round(process.memoryUsage.rss() / 1024)
// The heap collected and the peak RSS started over: what follows is measured alone.
const settle = () => {
  globalThis.gc?.()
  globalThis.gc?.()
  resetPeakRss()
}

async function commit(dir, records) {
  function* lines() {
    for (const r of records) yield pyDumpsView(r)
  }
  const t = performance.now()
  const m = await writeParticipantState({checkpointDir: dir, kind: 'agent', instance: 'agent', checkpointId: 'bench'}, lines())
  return {ms: performance.now() - t, manifest: m}
}

const [mode, ...rest] = process.argv.slice(2)
let out
if (mode === 'commit') {
  const [dir, n, kb] = rest
  const records = Array.from({length: Number(n)}, (_, i) => realisticRecord(i, Number(kb)))
  settle()
  const data = rssKb()
  const c = await commit(dir, records)
  out = {ms: c.ms, sha256: c.manifest.records_sha256, records: c.manifest.record_count, kept: records.length, data_rss_kb: data}
} else if (mode === 'restore') {
  const dir = rest[0]
  const scopeFile = rest[1] && !rest[1].startsWith('--') ? rest[1] : null
  const commitTo = rest.includes('--commit') ? rest[rest.indexOf('--commit') + 1] : null
  let keep = null
  settle()
  const data = rssKb()
  const t = performance.now()
  if (scopeFile) keep = new Set(readFileSync(scopeFile, 'utf8').split('\n').filter(Boolean))
  const r = await readParticipantState(dir, {kind: 'agent', instance: 'agent', keep: keep ?? {has: () => true}})
  const ms = performance.now() - t
  out = {ms, sha256: r.manifest.records_sha256, records: r.keys.length, kept: r.kept.length, data_rss_kb: data}
  if (commitTo) {
    const records = r.kept.map((k) => k.record)
    out.restore_peak_rss_kb = peakRssKb()
    settle()
    out.restored_rss_kb = rssKb()
    const c = await commit(commitTo, records)
    out.commit_ms = c.ms
    out.commit_sha256 = c.manifest.records_sha256
  }
}
out.peak_rss_kb = peakRssKb()
console.log(JSON.stringify(out))
