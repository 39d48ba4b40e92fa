// How each cost grows with the number of episodes: 1x, 10x and 100x (1,000 -> 100,000 episodes,
// 10% of them restarts).
//   1. The scope math alone: restartsOf (every participant's restart list, merged) and continuedOf,
//      against the pairwise filter it replaced (O(n·m): ~5 s at 100,000 with 10,000 restarts).
//   2. prepare -> scope -> commit (commitAndPublish, with its publish gate) -> resume -> restore
//      into a fresh fleet, on the built-in fleet (environment, policy model, agent, resources;
//      participants in this process on 127.0.0.1, each holding every episode).
//   3. retire of every replacement attempt and forget of every rollout, in batches of 1,024
//      (RETIRE_BATCH), on a built-in fleet that holds none of them: the controller's batching and
//      the participants' retire marks. (The doubles index what they hold by rollout, so a retire
//      costs the episodes it names; before, each one scanned every episode held: 44 s for 10,000.)
// Usage: npm run bench:scale -- [--base 1000] [--restart-pct 10] [--pairwise-max 100000]
import {mkdtemp, rm} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {load as loadDist} from './dist.mjs'
import {arg, load, machine, median, secs, table} from './lib.mjs'

const {Fleet} = await loadDist('control-plane/fleet.js')
const {SimEnvironment, SimDownstream, taskDigest} = await loadDist('control-plane/sim.js')
const {ControlClient} = await loadDist('coordination/client.js')
const {continuedOf, restartsOf, prepare, resume, restore, retire, forget, RETIRE_BATCH} = await loadDist('coordination/operations.js')
const {commitAndPublish} = await loadDist('coordination/controller.js')
const {captureKey} = await loadDist('protocol/episode.js')

const BASE = arg('base', 1000)
const RESTART_PCT = arg('restart-pct', 10)
const PAIRWISE_MAX = arg('pairwise-max', 100_000)
const SCALES = (process.env.SCALES ?? '1,10,100').split(',').map(Number)
const TOKEN = 'bench-token'

const episodesOf = (n) => Array.from({length: n}, (_, i) => ({rolloutId: `r${i}`, attempt: i % 3}))
const isRestart = (i) => i % Math.round(100 / RESTART_PCT) === 0

function time(fn, reps) {
  const ms = []
  let out
  for (let r = 0; r < reps; r++) {
    const t = performance.now()
    out = fn()
    ms.push(performance.now() - t)
  }
  return {ms: median(ms), out}
}

// ---------------------------------------------------------------- 1. scope math

const mathRows = []
const mathMs = {}
for (const x of SCALES) {
  const n = BASE * x
  const eps = episodesOf(n)
  // Four participants each report the restarts they hold: the same keys, merged and de-duplicated.
  const keys = eps.filter((_, i) => isRestart(i)).map(captureKey)
  const lists = [keys, keys, keys.slice().reverse(), keys]
  const restarts = time(() => restartsOf(lists), 5)
  const scope = time(() => continuedOf(eps, restarts.out), 5)
  let pairwise = null
  if (n <= PAIRWISE_MAX) {
    const r = restarts.out
    pairwise = time(() => eps.filter((e) => !r.some((q) => q.rolloutId === e.rolloutId && q.attempt === e.attempt)), n >= 100_000 ? 1 : 3)
    if (pairwise.out.length !== scope.out.length || pairwise.out.some((e, i) => e !== scope.out[i])) throw new Error('continuedOf differs from the pairwise filter')
  }
  mathMs[x] = restarts.ms + scope.ms
  mathRows.push([
    `${x}x: ${n.toLocaleString('en')} episodes, ${keys.length.toLocaleString('en')} restarts`,
    `${restarts.ms.toFixed(1)} ms`,
    `${scope.ms.toFixed(1)} ms`,
    pairwise ? `${pairwise.ms.toFixed(0)} ms` : 'skipped',
    pairwise ? `${Math.round(pairwise.ms / scope.ms)}x` : '',
    x === SCALES[0] ? '' : `${(mathMs[x] / mathMs[SCALES[0]]).toFixed(1)}x`,
  ])
  console.error(`scope math ${x}x done — ${load()}`)
}

// ---------------------------------------------------------------- 2. the built-in fleet end to end

function participantsOf(fleet) {
  return fleet.servers.filter((s) => s.participant).map((s) => ({server: s.name, url: s.url, kind: s.participant.kind, instance: s.participant.instance}))
}

/** Every participant holds every episode at a boundary; restarts are marked where they run. */
function populate(fleet, eps) {
  for (const s of fleet.servers) {
    const p = s.participant
    if (p instanceof SimEnvironment) {
      eps.forEach((ep, i) => {
        const key = captureKey(ep)
        p.episodes.set(key, {
          ep,
          key,
          state: 'parked',
          restart: isRestart(i),
          retiring: false,
          boundary: {step: 2, acc: `acc-${key}`},
          taskDigest: taskDigest(`in-${key}`, 4),
          abort: new AbortController(),
          done: Promise.resolve(),
        })
      })
    } else if (p instanceof SimDownstream) {
      eps.forEach((ep, i) => {
        const key = captureKey(ep)
        p.sessions.set(key, {
          ep,
          chain: `chain-${key}`,
          calls: 2,
          restart: isRestart(i),
          restored: false,
          payload: new Map([
            ['turns', [key, 'ok']],
            ['score', 0.5],
          ]),
        })
      })
    }
  }
}

const e2eRows = []
const e2e = {}
const root = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-bench-scale-'))
const client = new ControlClient({token: TOKEN})
try {
  for (const x of SCALES) {
    const n = BASE * x
    const eps = episodesOf(n)
    const fleet = await Fleet.start({token: TOKEN})
    const fresh = await Fleet.start({token: TOKEN})
    const marks = await Fleet.start({token: TOKEN})
    const c = {client, participants: participantsOf(fleet)}
    const c2 = {client, participants: participantsOf(fresh)}
    const t = {}
    const step = (k, t0) => {
      t[k] = performance.now() - t0
      if (process.env.VERBOSE) console.error(`  ${x}x ${k}: ${secs(t[k])}`)
    }
    try {
      populate(fleet, eps)
      const deadline = Date.now() / 1000 + 3600
      const id = `scale-${x}`
      let t0 = performance.now()
      const prep = await prepare(c, id, deadline)
      step('prepare', t0)
      if (!prep.prepared) throw new Error(`not prepared: ${JSON.stringify(prep.blockers()).slice(0, 300)}`)
      t0 = performance.now()
      const restarts = prep.restarts()
      const scope = prep.continued(eps)
      step('scope', t0)
      t0 = performance.now()
      const out = await commitAndPublish(c, {checkpointId: id, root, episodes: eps, restarts, deadlineTs: deadline})
      step('commit', t0)
      if (out.continued.length !== scope.length) throw new Error(`committed ${out.continued.length}, scope ${scope.length}`)
      t0 = performance.now()
      await resume(c, id, deadline)
      step('resume', t0)
      t0 = performance.now()
      const r = await restore(c2, `restore-${x}`, out.checkpointDir, out.continued, deadline)
      step('restore', t0)
      if (r.replacements.length !== scope.length) throw new Error('restore lost episodes')
      await resume(c2, `restore-${x}`, deadline)
      // Retire and forget on a fleet that holds none of them: the controller's batches and the
      // participants' marks. (A double holding the episodes scans all it holds for each one retired.)
      const c3 = {client, participants: participantsOf(marks)}
      t0 = performance.now()
      await retire(c3, `retire-${x}`, r.replacements, deadline)
      step('retire', t0)
      t0 = performance.now()
      await forget(
        c3,
        `forget-${x}`,
        r.replacements.map((e) => e.rolloutId),
        deadline,
      )
      step('forget', t0)
    } finally {
      await fleet.close()
      await fresh.close()
      await marks.close()
      if (!process.env.KEEP) await rm(path.join(root, `scale-${x}`), {recursive: true, force: true})
    }
    e2e[x] = t
    const grow = (k) => (x === SCALES[0] ? '' : ` (${(t[k] / e2e[SCALES[0]][k]).toFixed(1)}x)`)
    e2eRows.push([`${x}x: ${n.toLocaleString('en')}`, ...['prepare', 'scope', 'commit', 'resume', 'restore', 'retire', 'forget'].map((k) => `${secs(t[k])}${grow(k)}`)])
    console.error(`fleet ${x}x done — ${load()}`)
  }
} finally {
  await client.close()
  if (!process.env.KEEP) await rm(root, {recursive: true, force: true})
}

console.log(`\nscale: ${machine()}; ${RESTART_PCT}% of the episodes restart; growth relative to 1x in parentheses (linear = 10x, 100x)`)
table(
  'scope math (medians of 5; the pairwise filter is what continuedOf was)',
  ['episodes', 'restartsOf (4 lists)', 'continuedOf', 'pairwise filter', 'pairwise / continuedOf', 'growth of restartsOf + continuedOf'],
  mathRows,
)
table(
  `built-in fleet (4 participants, each holding every episode), one pass per scale; retire/forget in batches of ${RETIRE_BATCH} on a fleet holding none of them (marks only)`,
  ['episodes', 'prepare', 'scope (restarts + continued)', 'commit + publish gate', 'resume', 'restore (fresh fleet)', 'retire', 'forget'],
  e2eRows,
)
