// Timings on failure paths (issue 7, item 7): an operation that fails after some of its calls were
// made still says which participant answered and how long each call took, as a successful one does.
import {describe, expect, it} from 'vitest'

import {checkpoint, commitAndPublish, prepareOrAbort} from '../../src/coordination/controller.js'
import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {restoreCheckpoint} from '../../src/coordination/restore.js'
import {FULL, coordinatorFor, soon, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const SERVERS = ['env', 'policy', 'agent', 'res']

describe('timings on failure paths', () => {
  it('a commit refused by one participant carries every participant its calls reached, the failed one included', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepareOrAbort(c, 'c1', soon())
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const root = await tempDir()
    const err = (await commitAndPublish(c, {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon()}).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.timings?.map((t) => t.server)).toEqual(SERVERS)
    // Every participant was called (commit goes to all at once), the refusing one too.
    for (const t of err.timings!) expect(t.commitMs, t.server).toEqual(expect.any(Number))
    // Nothing was prepared in this operation: its own timer only heard the commit.
    for (const t of err.timings!) expect(t.prepareMs, t.server).toBeNull()
  })

  it('a checkpoint failing at commit carries the prepare and the closing resume as well: the outermost timer wins', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('policy').faults.add('commit', {type: 'status', status: 503})
    const root = await tempDir()
    const err = (await checkpoint(c, {root, checkpointId: 'c2', timeoutS: 10, episodes: []}).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.message).toMatch(/policy: HTTP 503/)
    const rows = err.timings!
    expect(rows.map((t) => t.server)).toEqual(SERVERS)
    for (const t of rows) {
      expect(t.prepareMs, `${t.server} prepare`).toEqual(expect.any(Number))
      expect(t.commitMs, `${t.server} commit`).toEqual(expect.any(Number))
      expect(t.resumeMs, `${t.server} resume`).toEqual(expect.any(Number))
    }
  })

  it('a restore refused before anything was sent has no timings (status probes are not timed calls)', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const err = (await restoreCheckpoint(c, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.timings).toBeNull()
  })

  it('a restore that fails on one participant carries the restore calls of all of them', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    await checkpoint(c, {root, checkpointId: 'c3', timeoutS: 10, episodes: []})
    const fresh = await startFleet({members: FULL})
    fresh.server('res').faults.add('restore', {type: 'status', status: 500})
    const c2 = await coordinatorFor(fresh)
    const err = (await restoreCheckpoint(c2, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.timings?.map((t) => t.server)).toEqual(SERVERS)
    for (const t of err.timings!) expect(t.restoreMs, t.server).toEqual(expect.any(Number))
  })
})
