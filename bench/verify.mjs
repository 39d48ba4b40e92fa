// Offline verify against the machine's hashing limit, side by side in one invocation on the same
// files: `openssl dgst -sha256` (the same OpenSSL SHA-256 as Node's crypto; with SHA extensions
// this, not coreutils, is the limit), `sha256sum`, and `node -e 0` (what a Node CLI pays to
// start). Two checkpoints of realistic records (bench/data.mjs) over 4 participants:
//   standard  1,000 records of ~350 KB (~350 MB)
//   large     100 records of ~20 MB (~2 GB): one record is far larger than any read buffer, so
//             verify must stream within a record to keep its peak RSS bounded
// gymckpt is measured three times: verifyCheckpoint in a bare process (the library's throughput,
// the process start excluded) with its default threads (one per core: this one and workers) and
// with one, and the CLI as an operator runs it (wall, start-up included).
// Throughput ratio = baseline time / gymckpt time (goal: >= 0.8 of openssl's), medians of the
// per-run ratios; peak RSS from each process itself or GNU time.
// Usage: npm run bench:verify -- [--runs 5] [--records 1000] [--kb 350] [--large-records 100] [--large-mb 20] [--large 0]
import {rmSync, statSync} from 'node:fs'
import {mkdtemp} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

import {KINDS, realisticRecord} from './data.mjs'
import {DIST, RUN_JS, load as loadDist} from './dist.mjs'
import {arg, have, load, machine, mb, median, ratio, run, secs, table, warm} from './lib.mjs'

const {writeParticipantState} = await loadDist('storage/participant-store.js')
const {pyDumpsBuffer, pyDumpsView} = await loadDist('storage/pyjson.js')
const {FORMAT_VERSION, writeControllerManifest} = await loadDist('storage/root.js')

const RUNS = arg('runs', 5)
const CORES = os.availableParallelism()
const P = 4
const sets = [{name: 'standard', records: arg('records', 1000), kb: arg('kb', 350)}]
if (arg('large', 1)) sets.push({name: 'large', records: arg('large-records', 100), kb: arg('large-mb', 20) * 1024})
const OPENSSL = have('openssl', ['version']) ? 'openssl' : null
const SHA256SUM = have('sha256sum') ? 'sha256sum' : null
if (!OPENSSL) console.error('openssl not found: its baseline is skipped')
if (!SHA256SUM) console.error('sha256sum not found: its baseline is skipped')

/**
 * A record of `kb` KB. Above a few MB only one body is built and every record gets its own
 * episode_id in front of it (building 2 GB of distinct objects would take minutes).
 */
function lineMaker(kb) {
  if (kb <= 4096) return (i) => pyDumpsView(realisticRecord(i, kb))
  const body = pyDumpsBuffer(realisticRecord(0, kb))
  const rest = body.subarray(body.indexOf('}') + 1)
  return (i) => Buffer.concat([Buffer.from(`{"episode_id": {"rollout_id": "r${i}", "attempt": 0}`), rest])
}

async function makeCheckpoint(root, set) {
  const id = `ckpt-${set.name}`
  const dir = path.join(root, id)
  const line = lineMaker(set.kb)
  const participants = []
  const files = []
  for (let p = 0; p < P; p++) {
    const kind = KINDS[p]
    function* lines() {
      for (let i = p; i < set.records; i += P) yield line(i)
    }
    const manifest = await writeParticipantState({checkpointDir: dir, kind, instance: kind, checkpointId: id}, lines())
    participants.push({server: kind, kind, instance: kind, manifest, episode_ids: []})
    files.push(path.join(dir, 'gym', kind, kind, manifest.records_file))
  }
  const continued = Array.from({length: set.records}, (_, i) => ({rollout_id: `r${i}`, attempt: 0}))
  await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: id, created_at: Date.now() / 1000, continued, restarted: [], participants})
  return {dir, files, bytes: files.reduce((n, f) => n + statSync(f).size, 0)}
}

const verifyScript = (dir, opts = {}) => `
  import {verifyCheckpoint} from ${JSON.stringify(new URL('storage/verify.js', DIST).href)}
  import {peakRssKb} from ${JSON.stringify(new URL('./lib.mjs', import.meta.url).href)}
  const t = performance.now()
  const r = await verifyCheckpoint(${JSON.stringify(dir)}, ${JSON.stringify(opts)})
  const ms = performance.now() - t
  if (!r.ok) { console.error(JSON.stringify(r.problems)); process.exit(1) }
  console.log(JSON.stringify({ms, peak_rss_kb: peakRssKb()}))
`

const root = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-bench-verify-'))
const results = []
try {
  for (const set of sets) {
    console.error(`writing the ${set.name} checkpoint: ${set.records} records of ~${set.kb} KB over ${P} participants ...`)
    const ck = await makeCheckpoint(root, set)
    const cli = fileURLToPath(RUN_JS)
    // Warm the page cache so every tool reads from memory.
    warm(ck.files)
    const m = {lib: [], lib1: [], cli: [], openssl: [], sha256sum: [], nodeStart: []}
    const rss = {}
    const keep = (k, r) => {
      m[k].push(r.ms ?? r.wallMs)
      if (r.peak_rss_kb != null) rss[k] = Math.max(rss[k] ?? 0, r.peak_rss_kb)
    }
    for (let r = 0; r < RUNS; r++) {
      keep('lib', run(process.execPath, ['--input-type=module', '-e', verifyScript(ck.dir)], {json: true}))
      keep('lib1', run(process.execPath, ['--input-type=module', '-e', verifyScript(ck.dir, {concurrency: 1})], {json: true}))
      keep('cli', run(process.execPath, [cli, 'verify', ck.dir, '--json']))
      if (OPENSSL) keep('openssl', run(OPENSSL, ['dgst', '-sha256', ...ck.files]))
      if (SHA256SUM) keep('sha256sum', run(SHA256SUM, ck.files))
      keep('nodeStart', run(process.execPath, ['-e', '0']))
      console.error(
        `${set.name} run ${r + 1}/${RUNS}: verifyCheckpoint ${secs(m.lib.at(-1))} (one thread ${secs(m.lib1.at(-1))}), CLI ${secs(m.cli.at(-1))}, openssl ${secs(m.openssl.at(-1))}, sha256sum ${secs(m.sha256sum.at(-1))}, node -e 0 ${secs(m.nodeStart.at(-1))} — ${load()}`,
      )
    }
    results.push({set, ck, m, rss})
    rmSync(ck.dir, {recursive: true, force: true})
  }
} finally {
  rmSync(root, {recursive: true, force: true})
}

console.log(`\nverify: ${RUNS} runs, medians, page cache warm; throughput ratio = baseline time / gymckpt time (median of same-run ratios; >= 0.8 of openssl's is the goal). ${machine()}`)
const rows = []
for (const {set, ck, m, rss} of results) {
  const size = `${set.records.toLocaleString('en')} x ${set.kb >= 1024 ? `${Math.round(set.kb / 1024)} MB` : `${set.kb} KB`} (${Math.round(ck.bytes / 1e6)} MB)`
  const rate = (ms) => `${Math.round(ck.bytes / 1e6 / (median(ms) / 1000))} MB/s`
  for (const [what, g] of [
    [`verifyCheckpoint (library, default: ${CORES} threads, this one and ${CORES - 1} worker${CORES === 2 ? '' : 's'})`, 'lib'],
    ['verifyCheckpoint (library, one thread)', 'lib1'],
    ['gymckpt verify (CLI, wall)', 'cli'],
  ]) {
    for (const [bName, b] of [
      ['openssl dgst -sha256', 'openssl'],
      ['sha256sum', 'sha256sum'],
    ]) {
      const q = m[b].length ? ratio(m[b], m[g]) : null
      rows.push([
        `${size}: ${what}`,
        `${secs(median(m[g]))} (${rate(m[g])})`,
        m[b].length ? `${bName} ${secs(median(m[b]))} (${rate(m[b])})` : `${bName}: skipped`,
        q == null ? 'n/a' : q.toFixed(2),
        b === 'openssl' ? (q == null ? 'n/a' : q >= 0.8 ? 'met (>= 0.8)' : 'not met (>= 0.8)') : '',
        `${mb(rss[g])}${rss[g] == null ? '' : rss[g] < 150 * 1024 ? ' (met: < 150 MB)' : ' (not met: < 150 MB)'}`,
        mb(rss[b]),
      ])
    }
  }
  rows.push([`${size}: node -e 0 (start-up alone)`, secs(median(m.nodeStart)), '', '', '', mb(rss.nodeStart), ''])
}
table('', ['measurement', 'gymckpt', 'baseline', 'throughput ratio', 'goal', 'gymckpt peak RSS', 'baseline peak RSS'], rows)
