// Offline verify of a checkpoint holding N records of ~350 KB, against sha256sum over the same
// records files: throughput ratio, and the verifier's peak RSS (measured in a child process).
// Usage: npm run bench:verify -- [--records 1000] [--kb 350] [--participants 4] [--runs 3]
import {execFileSync, spawnSync} from 'node:child_process'
import {mkdtemp, readdir, rm, stat} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {writeParticipantState} from '../dist/storage/participant-store.js'
import {pyDumpsBuffer} from '../dist/storage/pyjson.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../dist/storage/root.js'
import {arg, machine, median} from './lib.mjs'

const N = arg('records', 1000)
const KB = arg('kb', 350)
const P = arg('participants', 4)
const RUNS = arg('runs', 3)
const NAN_EVERY = arg('nan-every', 20)
const KINDS = ['environment', 'model', 'agent', 'resources']

function record(i) {
  const messages = []
  let size = 0
  for (let m = 0; size < KB * 1024; m++) {
    const content = `turn ${m} of rollout ${i}: the tool said "ok" — résumé ${'lorem ipsum dolor sit amet '.repeat(36)}\n`
    messages.push(new Map([['role', m % 2 ? 'assistant' : 'user'], ['content', content], ['token_ids', Array.from({length: 24}, (_, k) => (i * 7919 + m * 104729 + k) % 151_000)], ['logprob', -0.125 * (m % 9) - 0.001]]))
    size += content.length + 24 * 7 + 60
  }
  return new Map([
    ['episode_id', new Map([['rollout_id', `r${i}`], ['attempt', 0]])],
    ['session_id', `s${i}`],
    ['state', new Map([['messages', messages], ['score', i % NAN_EVERY === 0 ? NaN : 0.5]])],
  ])
}

const root = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-bench-verify-'))
try {
  const id = 'ckpt-bench'
  const dir = path.join(root, id)
  console.error(`writing ${N} records of ~${KB} KB over ${P} participants ...`)
  const participants = []
  for (let p = 0; p < P; p++) {
    const kind = KINDS[p % 4]
    const instance = `${kind}-${p}`
    function* lines() {
      for (let i = p; i < N; i += P) yield pyDumpsBuffer(record(i))
    }
    const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: id}, lines())
    participants.push({server: instance, kind, instance, manifest, episode_ids: []})
  }
  const continued = Array.from({length: N}, (_, i) => ({rollout_id: `r${i}`, attempt: 0}))
  await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: id, created_at: Date.now() / 1000, continued, restarted: [], participants})
  await publishLatest(root, id)
  const files = []
  for (const p of participants) files.push(path.join(dir, 'gym', p.kind, p.instance, p.manifest.records_file))
  let bytes = 0
  for (const f of files) bytes += (await stat(f)).size

  const verifyScript = `
    import {verifyCheckpoint} from ${JSON.stringify(new URL('../dist/storage/verify.js', import.meta.url).href)}
    const t = performance.now()
    const r = await verifyCheckpoint(${JSON.stringify(root)})
    const ms = performance.now() - t
    if (!r.ok) { console.error(JSON.stringify(r.problems)); process.exit(1) }
    console.log(JSON.stringify({ms, rssKb: process.resourceUsage().maxRSS}))
  `
  const verify = []
  const sums = []
  let rss = 0
  // Warm the page cache once so both tools read from memory.
  execFileSync('sha256sum', files)
  for (let r = 0; r < RUNS; r++) {
    const v = spawnSync(process.execPath, ['--input-type=module', '-e', verifyScript], {encoding: 'utf8'})
    if (v.status !== 0) throw new Error(`verify failed: ${v.stderr}`)
    const out = JSON.parse(v.stdout)
    verify.push(out.ms)
    rss = Math.max(rss, out.rssKb)
    const t = performance.now()
    execFileSync('sha256sum', files)
    sums.push(performance.now() - t)
    console.error(`run ${r + 1}: verify ${(out.ms / 1000).toFixed(2)} s, sha256sum ${(sums.at(-1) / 1000).toFixed(2)} s`)
  }
  const mb = bytes / 1e6
  const result = {
    bench: 'verify',
    machine: machine(),
    records: N,
    participants: P,
    total_mb: Math.round(mb),
    records_with_nan: Math.ceil(N / NAN_EVERY),
    runs: RUNS,
    verify_median_s: +(median(verify) / 1000).toFixed(2),
    sha256sum_median_s: +(median(sums) / 1000).toFixed(2),
    verify_mb_per_s: Math.round(mb / (median(verify) / 1000)),
    sha256sum_mb_per_s: Math.round(mb / (median(sums) / 1000)),
    throughput_ratio_vs_sha256sum: +(median(sums) / median(verify)).toFixed(2),
    verify_peak_rss_mb: Math.round(rss / 1024),
    largest_record_kb: KB,
  }
  console.log(JSON.stringify(result, null, 1))
} finally {
  await rm(root, {recursive: true, force: true})
}
