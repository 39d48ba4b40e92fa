// Gym's policy model exports only the commit scope and refuses a commit without one (409
// checkpoint_error, reference 4.6). Every fleet gymckpt drives has a model (discovery requires
// one), so a checkpoint or commit without a scope is refused before anything is sent, instead of
// failing after prepare closed the whole fleet.
import {describe, expect, it} from 'vitest'

import {checkScope, checkpoint, commitAndPublish} from '../../src/coordination/controller.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {Coordinator} from '../../src/coordination/operations.js'
import {RunTracker} from '../../src/coordination/runs.js'
import {FULL, coordinatorFor, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const sentOps = (fleet: Awaited<ReturnType<typeof startFleet>>) => fleet.servers.flatMap((s) => s.journal.map((j) => j.route)).filter((r) => r !== 'status')

describe('the commit scope a policy model needs', () => {
  it('checkpoint and commit without one are refused naming the model, and nothing is sent', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const err = (await checkpoint(c, {root, scopeHint: 'pass --episodes-file'}).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.code).toBe('input')
    expect(err.message).toBe(
      'no commit scope: the policy model policy refuses a commit that does not name the episodes the controller continues (Gym answers 409 checkpoint_error); pass --episodes-file; nothing was sent',
    )
    const plain = (await commitAndPublish(c, {checkpointId: 'c1', root, episodes: null, restarts: [], deadlineTs: Date.now() / 1000 + 10}).catch((e: unknown) => e)) as ControllerError
    expect(plain.message).toMatch(/; name them \(an empty list when none continue\); nothing was sent$/)
    expect(sentOps(fleet)).toEqual([])
  })

  it('an empty scope is one; a tracker always gives one (its candidates at commit)', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    expect((await checkpoint(c, {root: await tempDir(), timeoutS: 10, episodes: []})).published).toBe(true)
    expect((await checkpoint(c, {root: await tempDir(), timeoutS: 10, tracker: new RunTracker()})).published).toBe(true)
  })

  it('participants without a policy model need none', () => {
    const c = {participants: [{server: 'env', url: 'http://127.0.0.1:1', kind: 'environment', instance: 'e'}]} as unknown as Coordinator
    expect(() => checkScope(c, null)).not.toThrow()
    expect(() => checkScope(c, undefined)).not.toThrow()
    const withModel = {participants: [...c.participants, {server: 'm', url: 'http://127.0.0.1:2', kind: 'model', instance: 'm'}]} as unknown as Coordinator
    expect(() => checkScope(withModel, null)).toThrow(/policy model m refuses/)
    expect(() => checkScope(withModel, [])).not.toThrow()
  })
})
