import {mkdtemp} from 'node:fs/promises'
import {randomBytes} from 'node:crypto'
import os from 'node:os'
import path from 'node:path'

import {Fleet, FleetMember} from '../control-plane/fleet.js'
import {RunResult, SimEnvironment} from '../control-plane/sim.js'
import {ControlClient} from '../coordination/client.js'
import {checkpoint} from '../coordination/controller.js'
import {restoreCheckpoint} from '../coordination/restore.js'
import {discover, readHeadServer} from '../coordination/discover.js'
import {Coordinator, forget} from '../coordination/operations.js'
import {RunTracker} from '../coordination/runs.js'
import {EpisodeId, captureKey, nextAttempt} from '../protocol/episode.js'

/**
 * The rehearsal the README runs: the same episodes once without interruption, and once with a
 * checkpoint, a crash of every process, and a restore into a fresh fleet. The results must match.
 */
export interface DemoOptions {
  episodes?: number
  steps?: number
  stepMs?: number
  /** Episodes whose resources server cannot capture them (restarts). */
  restarts?: number
  root?: string
  members?: FleetMember[]
  log?: (msg: string) => void
}

export interface DemoReport {
  ok: boolean
  episodes: number
  checkpointId: string
  checkpointDir: string
  root: string
  completedAtCheckpoint: number
  continued: number
  /** Continued episodes that resumed from a boundary past their first step. */
  continuedFromBoundary: number
  restarted: number
  mismatches: {rolloutId: string; expected: string; got: string | null}[]
  timingsMs: {reference: number; untilCheckpoint: number; checkpoint: number; restore: number; rerun: number}
}

interface Task {
  rolloutId: string
  input: string
  steps: number
  restart: boolean
}

export async function runDemo(opts: DemoOptions = {}): Promise<DemoReport> {
  const log = opts.log ?? (() => {})
  const n = opts.episodes ?? 24
  const steps = opts.steps ?? 8
  const stepMs = opts.stepMs ?? 40
  const nRestarts = Math.min(opts.restarts ?? 2, n)
  const root = opts.root ?? (await mkdtemp(path.join(os.tmpdir(), 'gymckpt-demo-')))
  // The rehearsal fleet lives in this process only; its token never leaves it.
  const token = randomBytes(16).toString('hex')
  // Restarts keep running through a checkpoint instead of parking: they are long enough not to
  // finish during one, so the rehearsal always has restarts to start over.
  const tasks: Task[] = Array.from({length: n}, (_, i) => ({
    rolloutId: `demo-${i}`,
    input: `task ${i}: ${'x'.repeat(i % 7)}`,
    steps: i < nRestarts ? steps * 4 : i % 4 === 3 ? 2 : steps + (i % 3),
    restart: i < nRestarts,
  }))
  const run = (fleet: Fleet, t: Task, attempt: number) => fleet.run({rolloutId: t.rolloutId, attempt, input: t.input, steps: t.steps, stepMs, restart: t.restart})
  const t0 = Date.now()

  // 1. Uninterrupted reference.
  log(`reference: ${n} episodes of 2 to ${steps + 2} steps on a fresh fleet`)
  const reference = new Map<string, string>()
  {
    const fleet = await Fleet.start({token, members: opts.members})
    try {
      for (const r of await Promise.all(tasks.map((t) => run(fleet, t, 0)))) {
        if (r.status !== 200) throw new Error(`reference run failed: ${JSON.stringify(r.body)}`)
        const b = r.body as RunResult
        reference.set(b.rollout_id, b.result)
      }
    } finally {
      await fleet.close()
    }
  }
  const tRef = Date.now()

  const client = new ControlClient({token})
  const connect = async (fleet: Fleet): Promise<Coordinator> => {
    const servers = await readHeadServer(fleet.headUrl!, 10_000)
    const d = await discover(client, servers, {probeTimeoutMs: 10_000})
    return {client, participants: d.participants}
  }
  try {
    // 2. Same episodes, checkpointed mid-flight, then every process crashes.
    const completed = new Map<string, string>()
    const tracker = new RunTracker()
    const fleetB = await Fleet.start({token, members: opts.members, head: true})
    const c = await connect(fleetB)
    log(`discovered ${c.participants.length} participants through the head server: ${c.participants.map((p) => `${p.server} (${p.kind})`).join(', ')}`)
    for (const t of tasks) {
      const e: EpisodeId = {rolloutId: t.rolloutId, attempt: 0}
      void tracker
        .track(e, run(fleetB, t, 0))
        .then((r) => {
          if (r.status === 200) completed.set(t.rolloutId, (r.body as RunResult).result)
        })
        .catch(() => {})
    }
    // Checkpoint once most episodes are a few steps in (not on a timer, which a loaded machine
    // would turn into a checkpoint before the first boundary).
    const env = fleetB.environments[0]!.participant as SimEnvironment
    const until = Date.now() + 30_000
    // The restart-only episodes become restarts at their first step: wait for that too, so a
    // loaded machine does not checkpoint one as an ordinary episode without a boundary.
    const restartKeys = tasks.filter((t) => t.restart).map((t) => t.rolloutId)
    const ready = () =>
      [...env.episodes.values()].filter((e) => (e.boundary?.step ?? 0) >= Math.min(2, steps - 1)).length >= Math.ceil(n / 2) && restartKeys.every((k) => env.episodes.get(k)?.restart !== false)
    while (!ready() && Date.now() < until) {
      await new Promise((r) => setTimeout(r, stepMs / 2))
    }
    const tCk = Date.now()
    const ck = await checkpoint(c, {root, tracker, timeoutS: 30, controllerState: () => ({completed: Object.fromEntries(completed)})})
    const tCkDone = Date.now()
    log(`checkpoint ${ck.checkpointId}: ${ck.continued.length} continued, ${ck.restarted.length} restarted, ${completed.size} already complete (${tCkDone - tCk} ms)`)
    await new Promise((r) => setTimeout(r, stepMs * 2))
    await fleetB.crash()
    log('crash: every server of the fleet is gone, with its in-memory state')

    // 3. Fresh processes: restore all or nothing, then continue from the boundaries.
    const fleetC = await Fleet.start({token, members: opts.members, head: true})
    try {
      const c2 = await connect(fleetC)
      const tRestore = Date.now()
      const restored = await restoreCheckpoint(c2, {location: root, timeoutS: 30, log})
      const tRestored = Date.now()
      log(`restore ${restored.restoreId}: ${restored.replacements.length} episodes continue at attempt + 1; ${restored.restarted.length} start over (${tRestored - tRestore} ms)`)
      const state = restored.controllerState as {completed: Record<string, string>}
      const results = new Map<string, string>(Object.entries(state.completed))
      const byId = new Map(tasks.map((t) => [t.rolloutId, t]))
      let fromBoundary = 0
      const reruns = [...restored.replacements.map((e) => ({e, cont: true})), ...restored.restarted.map((e) => ({e: nextAttempt(e), cont: false}))]
      const replies = await Promise.all(reruns.map(({e}) => run(fleetC, byId.get(e.rolloutId)!, e.attempt)))
      replies.forEach((r, i) => {
        const {e, cont} = reruns[i]!
        if (r.status !== 200) throw new Error(`rerun of ${captureKey(e)} failed: HTTP ${r.status} ${JSON.stringify(r.body)}`)
        const b = r.body as RunResult
        if (cont && b.resumed_from_step > 0) fromBoundary++
        results.set(b.rollout_id, b.result)
      })
      // Every restored or retired rollout is done for good now.
      await forget(c2, 'forget', [...reruns.map((r) => r.e.rolloutId)], Date.now() / 1000 + 30)
      const tDone = Date.now()
      const mismatches = tasks
        .filter((t) => results.get(t.rolloutId) !== reference.get(t.rolloutId))
        .map((t) => ({rolloutId: t.rolloutId, expected: reference.get(t.rolloutId)!, got: results.get(t.rolloutId) ?? null}))
      return {
        ok: mismatches.length === 0,
        episodes: n,
        checkpointId: ck.checkpointId,
        checkpointDir: ck.checkpointDir,
        root,
        completedAtCheckpoint: Object.keys(state.completed).length,
        continued: restored.replacements.length,
        continuedFromBoundary: fromBoundary,
        restarted: restored.restarted.length,
        mismatches,
        timingsMs: {reference: tRef - t0, untilCheckpoint: tCk - tRef, checkpoint: tCkDone - tCk, restore: tRestored - tRestore, rerun: tDone - tRestored},
      }
    } finally {
      await fleetC.close()
    }
  } finally {
    await client.close()
  }
}
