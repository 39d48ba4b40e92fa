import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {ControlClient} from '../../src/coordination/client.js'
import {FULL, TOKEN, later, startFleet} from '../helpers/fleet.js'
import {commandsArb, initialTasks} from '../helpers/model-commands.js'
import {Shared, World} from '../helpers/model-world.js'

/**
 * Model-based random test: random sequences of episodes, prepare, commit + publish, resume,
 * one-shot checkpoints, retire, forget, crash + restore of LATEST, restores pointed at a busy
 * fleet, latency on one downstream server's step calls, and faults (500, a brief or long hang, a
 * dropped connection before or after handling) on one participant's route, against a real fleet of the participant double and the real controller.
 * After every step: LATEST verifies; no participant manifest appears after its resume returned;
 * a restore is all or nothing; a restore into a busy fleet is refused (fleet_state) and retires
 * nothing; every episode's result equals an uninterrupted run of the same episode.
 *
 * Seeded and replayable:
 *   GYMCKPT_MODEL_SEED=<seed> [GYMCKPT_MODEL_PATH=<path>] npx vitest run test/integration/model-based.test.ts
 * GYMCKPT_MODEL_RUNS (default 10) sets the number of runs, GYMCKPT_MODEL_BUDGET_MS (default 20000)
 * the time after which no new run starts, GYMCKPT_MODEL_SHRINK=1 shrinks a failure (slow: every
 * shrink step is a run against real servers), GYMCKPT_MODEL_TRACE=1 prints every run's steps.
 */

const envInt = (name: string): number | undefined => {
  const v = process.env[name]
  if (v === undefined || v === '') return undefined
  const n = Number(v)
  if (!Number.isInteger(n)) throw new Error(`${name} must be an integer, got '${v}'`)
  return n
}

const SEED = envInt('GYMCKPT_MODEL_SEED') ?? (Date.now() ^ Math.floor(Math.random() * 0x7fffffff)) | 0
const PATH = process.env.GYMCKPT_MODEL_PATH || undefined
const RUNS = envInt('GYMCKPT_MODEL_RUNS') ?? 10
const SHRINK = process.env.GYMCKPT_MODEL_SHRINK === '1'
/** Stop starting new runs after this long (the runs done so far count as the test). */
const BUDGET_MS = envInt('GYMCKPT_MODEL_BUDGET_MS') ?? 20_000

describe('model-based: random checkpoint, crash, restore and fault sequences', () => {
  it(`keeps every invariant (seed ${SEED})`, {timeout: BUDGET_MS + 80_000}, async () => {
    const client = new ControlClient({token: TOKEN, replyGraceSeconds: 0.25})
    later(() => client.close())
    const shared = new Shared(client, await startFleet({members: FULL}))
    const started = Date.now()
    let runs = 0
    let skipped = 0
    const details = await fc.check(
      fc.asyncProperty(initialTasks, commandsArb(16), async (initial, cmds) => {
        // Out of time: the remaining runs pass without running (a run in progress always finishes,
        // so a failure is never dropped, unlike fast-check's interruptAfterTimeLimit).
        if (Date.now() - started > BUDGET_MS && PATH === undefined) return void skipped++
        runs++
        const world = await World.create(shared)
        try {
          world.begin(`start ${initial.length} tasks`)
          await world.start(initial)
          await world.check()
          await fc.asyncModelRun(() => ({model: {}, real: world}), cmds)
          await world.drain()
        } finally {
          await world.close()
        }
      }),
      {seed: SEED, path: PATH, numRuns: RUNS, endOnFailure: !SHRINK},
    )
    const replay = `GYMCKPT_MODEL_SEED=${details.seed}${details.counterexamplePath ? ` GYMCKPT_MODEL_PATH=${details.counterexamplePath}` : ''} npx vitest run test/integration/model-based.test.ts`
    if (details.failed) {
      console.error(`model-based run failed; replay with:\n  ${replay}`)
      const cause = details.errorInstance instanceof Error ? details.errorInstance.message : String(details.errorInstance)
      throw new Error(`${fc.defaultReportMessage(details) ?? 'failed'}\n\n${cause}\n\nreplay: ${replay}`)
    }
    const stats = [...shared.stats]
      .sort()
      .map(([k, v]) => `${k}: ${v}`)
      .join(', ')
    console.log(`model-based: ${runs} run(s) in ${Date.now() - started} ms, seed ${details.seed}${skipped ? ` (time budget reached: ${skipped} run(s) not started)` : ''}; ${stats}`)
    expect(runs).toBeGreaterThan(0)
  })
})
