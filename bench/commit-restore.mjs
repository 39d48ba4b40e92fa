// Commit and restore of N sessions of ~350 KB each through the participant double over HTTP
// (the seed's measurement: 1,000 x 350 KB, commit 3.6 s, restore 3.4 s in Gym's Python).
// Usage: npm run bench:commit -- [--sessions 1000] [--kb 350] [--runs 3]
import {mkdtemp, rm} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {ParticipantServer} from '../dist/control-plane/server.js'
import {SimDownstream} from '../dist/control-plane/sim.js'
import {ControlClient} from '../dist/coordination/client.js'
import {encodeBody} from '../dist/coordination/operations.js'
import {pyDumps} from '../dist/storage/pyjson.js'
import {arg, fmt, machine, median} from './lib.mjs'

const N = arg('sessions', 1000)
const KB = arg('kb', 350)
const RUNS = arg('runs', 3)
// 1: every session holds a NaN (Python's bare token), which takes the exact reader on restore.
const NAN = arg('nan', 1)
const TOKEN = 'bench-token'

/** A transcript-like session state: nested dicts, lists of token ids, floats, escapes, unicode. */
function payload(i) {
  const messages = []
  let size = 0
  for (let m = 0; size < KB * 1024; m++) {
    // Flat strings, as a server holds them after reading them off the wire.
    const content = Buffer.from(`turn ${m} of session ${i}: the tool said "ok" — résumé ${'lorem ipsum dolor sit amet '.repeat(36)}\n`).toString()
    const msg = new Map([
      ['role', m % 2 ? 'assistant' : 'user'],
      ['content', content],
      ['token_ids', Array.from({length: 24}, (_, k) => (i * 7919 + m * 104729 + k) % 151_000)],
      ['logprob', -0.125 * (m % 9) - 0.001],
    ])
    messages.push(msg)
    size += content.length + 24 * 7 + 60
  }
  return new Map([['messages', messages], ['meta', new Map([['task', `task-${i}`], ['score', NAN ? NaN : 0.5]])]])
}

async function server() {
  const p = new SimDownstream('model', 'policy')
  const s = new ParticipantServer({name: 'policy', token: TOKEN, participant: p})
  await s.listen()
  return {s, p}
}

const client = new ControlClient({token: TOKEN})
const call = async (url, op, body) => {
  const r = await client.call({name: 'policy', url}, op, encodeBody(body), body.deadline_ts)
  if (!r.ok) throw new Error(`${op}: ${JSON.stringify(r.failure)}`)
  return r.reply
}

const base = payload(0)
const recordBytes = pyDumps(base).length
console.error(`building ${N} sessions of ${(recordBytes / 1024).toFixed(0)} KB (encoded) ...`)
const commits = []
const restores = []
let lastManifest
for (let run = 0; run < RUNS; run++) {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-bench-commit-'))
  try {
    const {s, p} = await server()
    for (let i = 0; i < N; i++) {
      const key = `r${i}`
      // Distinct objects per session, like a real participant's memory.
      p.sessions.set(key, {ep: {rolloutId: key, attempt: 0}, chain: 'c', calls: 1, restart: false, restored: false, payload: run === 0 && i === 0 ? base : payload(i)})
    }
    const deadline = Date.now() / 1000 + 600
    const scope = Array.from({length: N}, (_, i) => ({rollout_id: `r${i}`, attempt: 0}))
    await call(s.url, 'prepare', {checkpoint_id: 'c', deadline_ts: deadline})
    const t0 = performance.now()
    const reply = await call(s.url, 'commit', {checkpoint_id: 'c', deadline_ts: deadline, checkpoint_dir: dir, episode_ids: scope})
    commits.push(performance.now() - t0)
    lastManifest = reply.manifest
    await call(s.url, 'resume', {checkpoint_id: 'c', deadline_ts: deadline})
    await s.close()
    p.sessions.clear()

    const fresh = await server()
    const t1 = performance.now()
    const r = await call(fresh.s.url, 'restore', {checkpoint_id: 'rs', deadline_ts: deadline, checkpoint_dir: dir, episode_ids: scope})
    restores.push(performance.now() - t1)
    if (r.restored.length !== N) throw new Error(`restored ${r.restored.length} of ${N}`)
    // Byte for byte: the restored state encodes to exactly what was committed.
    const again = pyDumps(fresh.p.sessions.get('r0-a1').payload)
    if (run === 0 && again !== pyDumps(base)) throw new Error('restored payload differs from the committed one')
    await fresh.s.close()
  } finally {
    await rm(dir, {recursive: true, force: true})
  }
  console.error(`run ${run + 1}: commit ${fmt(commits.at(-1))}, restore ${fmt(restores.at(-1))}`)
}
await client.close()
const mb = (lastManifest.record_count * recordBytes) / 1e6
const result = {
  bench: 'commit-restore',
  machine: machine(),
  sessions: N,
  record_kb: Math.round(recordBytes / 1024),
  total_mb: Math.round(mb),
  runs: RUNS,
  nan_in_every_record: Boolean(NAN),
  commit_median_s: +(median(commits) / 1000).toFixed(2),
  restore_median_s: +(median(restores) / 1000).toFixed(2),
  commit_mb_per_s: Math.round(mb / (median(commits) / 1000)),
  restore_mb_per_s: Math.round(mb / (median(restores) / 1000)),
  seed_python_s: {commit: 3.6, restore: 3.4},
  peak_rss_mb: Math.round(process.resourceUsage().maxRSS / 1024),
}
console.log(JSON.stringify(result, null, 1))
