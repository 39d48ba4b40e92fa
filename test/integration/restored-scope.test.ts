// A scope the operator gives after a restore must name every restored episode no replacement has
// claimed, by its replacement attempt (reference 5.3.1): every participant's commit deletes the
// restored state the scope leaves out (5.3.4). `checkpoint` and `commit` refuse such a scope before
// anything is sent, unless told to let that state go (--drop-restored).
import {describe, expect, it} from 'vitest'

import {checkpoint} from '../../src/coordination/controller.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {prepare, resume} from '../../src/coordination/operations.js'
import {restoreCheckpoint} from '../../src/coordination/restore.js'
import {FULL, FULL_PARTICIPANTS, checkpointedFleet, coordinatorFor, startFleet, soon} from '../helpers/fleet.js'
import {cli} from '../helpers/cli.js'
import {tempDir} from '../helpers/tmp.js'

/** A fleet restored from a checkpoint that continued a@0 and b@0; neither replacement dispatched. */
async function restored() {
  const {root} = await checkpointedFleet()
  const fresh = await startFleet({members: FULL})
  const c2 = await coordinatorFor(fresh)
  await restoreCheckpoint(c2, {location: root, timeoutS: 10})
  const marks = new Map(fresh.servers.map((s) => [s.name, s.journal.length]))
  /** Every route a server got since the restore, but status. */
  const sentSince = () => fresh.servers.flatMap((s) => s.journal.slice(marks.get(s.name)).map((j) => j.route)).filter((r) => r !== 'status')
  return {fresh, c: c2, sentSince}
}

describe('a scope after a restore keeps the restored state', () => {
  it('checkpoint: a scope that leaves out restored episodes, or names one at its checkpointed attempt, is refused before prepare', async () => {
    const {fresh, c, sentSince} = await restored()
    const err = (await checkpoint(c, {root: await tempDir(), timeoutS: 10, episodes: [{rolloutId: 'a', attempt: 0}]}).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.code).toBe('input')
    expect(err.message).toBe(
      "the scope leaves out 2 restored episode(s) whose replacement has not started: 'a-a1' (env), 'b-a1' (env); every participant's commit would delete their restored state. " +
        "'a' is named, but its restored state is under the replacement attempt 'a-a1'. Name each by its replacement attempt, as listed, or pass --drop-restored to let that state go; nothing was sent",
    )
    expect(err.details).toEqual({restored: ['a-a1', 'b-a1']})
    expect(sentSince()).toEqual([])
    // Still restored, still held.
    expect(fresh.server('env').controlPlane!.status()).toMatchObject({phase: 'idle', restored_pending: ['a-a1', 'b-a1']})
    expect(fresh.server('policy').controlPlane!.status()).toMatchObject({restored_generation_cuts: ['a-a1', 'b-a1']})
  })

  it('checkpoint: a scope naming both replacement attempts carries both into the next checkpoint', async () => {
    const {c} = await restored()
    const out = await checkpoint(c, {
      root: await tempDir(),
      timeoutS: 10,
      episodes: [
        {rolloutId: 'a', attempt: 1},
        {rolloutId: 'b', attempt: 1},
      ],
    })
    expect([...out.replies.keys()].sort()).toEqual(FULL_PARTICIPANTS)
    for (const [server, r] of out.replies) expect(r.episode_ids, server).toEqual(['a-a1', 'b-a1'])
  })

  it('checkpoint: --drop-restored lets the state left out go', async () => {
    const {fresh, c} = await restored()
    const out = await checkpoint(c, {root: await tempDir(), timeoutS: 10, episodes: [{rolloutId: 'a', attempt: 1}], dropRestored: true})
    expect([...out.replies.keys()].sort()).toEqual(FULL_PARTICIPANTS)
    for (const [server, r] of out.replies) expect(r.episode_ids, server).toEqual(['a-a1'])
    expect(fresh.server('env').controlPlane!.status()).toMatchObject({restored_pending: ['a-a1']})
  })

  it('the CLI: commit of a prepared fleet refuses such a scope (exit 2, the fleet stays prepared), and commits it with --drop-restored', async () => {
    const {fresh, c, sentSince} = await restored()
    const id = 'ck-next'
    await prepare(c, id, soon())
    const root = await tempDir()
    const fleetArgs = fresh.serverArgs().flatMap((s) => ['--server', s])
    const refused = await cli(['commit', ...fleetArgs, '--root', root, '--episode', 'a@1', '--json'])
    expect(refused.code, refused.stderr).toBe(2)
    expect(refused.json.error.message).toMatch(/^the scope leaves out 1 restored episode\(s\) whose replacement has not started: 'b-a1' \(env\);/)
    expect(refused.json.error.details).toEqual({restored: ['b-a1']})
    expect(refused.json.error.next).toEqual([
      expect.stringMatching(/^gymckpt commit --id ck-next --root \S+ --episodes-file - --server /),
      expect.stringMatching(/^gymckpt resume --id ck-next --server /),
    ])
    expect(sentSince()).toEqual(['prepare', 'prepare', 'prepare', 'prepare'])
    for (const s of fresh.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.phase, s.name).toBe('prepared')

    const dropped = await cli(['commit', ...fleetArgs, '--root', root, '--episode', 'a@1', '--drop-restored', '--json'])
    expect(dropped.code, dropped.stderr).toBe(0)
    expect(dropped.json.continued).toEqual([{rollout_id: 'a', attempt: 1}])
    await resume(c, id, soon())
    expect(fresh.server('env').controlPlane!.status()).toMatchObject({phase: 'idle', restored_pending: ['a-a1']})
  })
})
