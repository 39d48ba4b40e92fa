import {describe, expect, it} from 'vitest'

import {SimDownstream, SimEnvironment} from '../../src/control-plane/sim.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {restoreCheckpoint} from '../../src/coordination/restore.js'
import {FULL, coordinatorFor, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

/**
 * A replay step does not hold a checkpoint back (reference 11: "checkpoint does not wait; after a
 * crash the step re-runs from the earlier boundary"). Its calls may reach some downstream servers
 * before they close and others after: the checkpoint then holds the environment before the step
 * and some downstream sessions after it. Gym's downstream work for a replay step is replay-safe
 * (the model cuts held generations, resources serve only replay-safe requests), so the step run
 * again after a restore must leave every session as one run of it would. Found by the model-based
 * test on a loaded CI machine (seed 1334581292, path 6).
 */
describe('a replay step straddling prepare', () => {
  it('restores to the same result as an uninterrupted run', async () => {
    const task = {rolloutId: 'rs', input: 'rs-input', steps: 4, stepMs: 20, stepMode: 'replay' as const}
    const reference = await startFleet({members: FULL})
    const want = await reference.run(task)
    expect(want.status).toBe(200)

    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env').participant as SimEnvironment
    const policy = fleet.server('policy').participant as SimDownstream
    const agent = fleet.server('agent').participant as SimDownstream
    // The policy model hears of step 2 only after the checkpoint has closed it; agent and
    // resources serve step 2 at once.
    const c = await coordinatorFor(fleet)
    const run = fleet.run(task)
    await waitFor(() => agent.sessions.get('rs')?.calls === 1, 5000, 'step 1 at the agent')
    policy.latencyMs = 5000
    await waitFor(() => agent.sessions.get('rs')?.calls === 2, 5000, 'step 2 at the agent')
    expect(env.episodes.get('rs')?.boundary?.step).toBe(1)
    const root = await tempDir()
    const out = await checkpoint(c, {root, timeoutS: 10, episodes: [{rolloutId: 'rs', attempt: 0}]})
    expect(out.continued).toEqual([{rolloutId: 'rs', attempt: 0}])
    policy.latencyMs = 0
    await fleet.crash()
    void run

    const fresh = await startFleet({members: FULL})
    const r = await restoreCheckpoint(await coordinatorFor(fresh), {location: root, timeoutS: 10})
    expect(r.replacements).toEqual([{rolloutId: 'rs', attempt: 1}])
    const got = await fresh.run({...task, attempt: 1})
    expect(got.status).toBe(200)
    expect((got.body as {resumed_from_step: number}).resumed_from_step).toBe(1)
    expect((got.body as {result: string}).result).toBe((want.body as {result: string}).result)
  })
})
