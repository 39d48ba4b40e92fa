// What the publish gate costs: commitAndPublish (src/coordination/controller.ts) runs
// verifyCheckpoint over the committed directory before it moves LATEST. Measured on a checkpoint
// of 1,000 realistic records of ~350 KB (bench/data.mjs) held by the built-in fleet's policy
// model, agent and resources doubles (a third each; the environment holds small boundaries), in
// one process on 127.0.0.1. Each run: prepare -> commitAndPublish without publishing (the commit)
// -> the gate exactly as commitAndPublish calls it -> resume; then prepare -> commitAndPublish with
// publishing (commit + gate + LATEST) -> resume. Goal: the gate under 15% of the commit.
// Usage: npm run bench:gate -- [--records 1000] [--kb 350] [--runs 3]
import {mkdtemp, rm} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {realisticRecord} from './data.mjs'
import {load as loadDist} from './dist.mjs'
import {arg, load, machine, mb, median, peakRssKb, ratio, secs, table} from './lib.mjs'

const {Fleet} = await loadDist('control-plane/fleet.js')
const {SimDownstream} = await loadDist('control-plane/sim.js')
const {ControlClient} = await loadDist('coordination/client.js')
const {prepare, resume} = await loadDist('coordination/operations.js')
const {commitAndPublish} = await loadDist('coordination/controller.js')
const {verifyCheckpoint} = await loadDist('storage/verify.js')

const N = arg('records', 1000)
const KB = arg('kb', 350)
const RUNS = arg('runs', 3)
const TOKEN = 'bench-token'

const fleet = await Fleet.start({token: TOKEN})
const participants = fleet.servers.filter((s) => s.participant).map((s) => ({server: s.name, url: s.url, kind: s.participant.kind, instance: s.participant.instance}))
const holders = fleet.servers.filter((s) => s.participant instanceof SimDownstream).map((s) => s.participant)
console.error(`building ${N} sessions of ~${KB} KB over ${holders.length} participants ...`)
const episodes = []
for (let i = 0; i < N; i++) {
  const ep = {rolloutId: `r${i}`, attempt: 0}
  episodes.push(ep)
  holders[i % holders.length].sessions.set(`r${i}`, {ep, chain: `c${i}`, calls: 1, restart: false, restored: false, payload: realisticRecord(i, KB)})
}
const client = new ControlClient({token: TOKEN})
const c = {client, participants}
const expect = participants.map((p) => ({kind: p.kind, instance: p.instance, server: p.server}))
const root = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-bench-gate-'))
const m = {commit: [], gate: [], published: []}
let bytes = 0
try {
  for (let r = 0; r < RUNS; r++) {
    const deadline = Date.now() / 1000 + 3600
    // The commit alone: commitAndPublish without the manifest, the gate and LATEST.
    let id = `gate-${r}-commit`
    let prep = await prepare(c, id, deadline)
    let t = performance.now()
    const out = await commitAndPublish(c, {checkpointId: id, root, episodes, restarts: prep.restarts(), deadlineTs: deadline, publish: false})
    m.commit.push(performance.now() - t)
    await resume(c, id, deadline)
    // The gate, as commitAndPublish runs it (every participant expected).
    t = performance.now()
    const v = await verifyCheckpoint(out.checkpointDir, {expect})
    m.gate.push(performance.now() - t)
    // Without a controller manifest verify reports that as an error; nothing else may fail.
    const other = v.problems.filter((p) => p.severity === 'error' && !/no controller manifest/.test(p.message))
    if (other.length) throw new Error(JSON.stringify(other))
    bytes = v.participants.reduce((n, p) => n + p.bytes, 0)
    await rm(out.checkpointDir, {recursive: true, force: true})
    // The whole thing: commit, controller manifest, gate, LATEST.
    id = `gate-${r}-published`
    prep = await prepare(c, id, deadline)
    t = performance.now()
    const pub = await commitAndPublish(c, {checkpointId: id, root, episodes, restarts: prep.restarts(), deadlineTs: deadline})
    m.published.push(performance.now() - t)
    if (!pub.published) throw new Error('not published')
    await resume(c, id, deadline)
    await rm(pub.checkpointDir, {recursive: true, force: true})
    console.error(
      `run ${r + 1}/${RUNS}: commit ${secs(m.commit.at(-1))}, gate ${secs(m.gate.at(-1))} (${((100 * m.gate.at(-1)) / m.commit.at(-1)).toFixed(0)}%), commit + publish ${secs(m.published.at(-1))} — ${load()}`,
    )
  }
} finally {
  await client.close()
  await fleet.close()
  await rm(root, {recursive: true, force: true})
}
const q = ratio(m.gate, m.commit)
const added = ratio(m.published, m.commit)
console.log(
  `\npublish gate: ${N.toLocaleString('en')} records, ${Math.round(bytes / 1e6)} MB over ${holders.length} participants (+ the environment's boundaries), ${RUNS} runs, medians; share = median of same-run ratios. ${machine()}`,
)
table(
  '',
  ['measurement', 'time', 'share of the commit', 'goal', ''],
  [
    ['commit (commitAndPublish, publish: false)', secs(median(m.commit)), '1.00', '', ''],
    ['publish gate (verifyCheckpoint as commitAndPublish calls it)', secs(median(m.gate)), q.toFixed(2), '< 0.15', q < 0.15 ? 'met' : 'not met'],
    ['commit + publish (manifest, gate, LATEST)', secs(median(m.published)), added.toFixed(2), '', ''],
  ],
)
console.log(`controller + participants peak RSS ${mb(peakRssKb())} (one process: 1,000 sessions held in memory)`)
