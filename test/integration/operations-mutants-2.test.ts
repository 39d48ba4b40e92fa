// More rules of src/coordination/operations.ts (issue 12), from the survivors of the run of
// 2026-12-04: which refusal names an open checkpoint, who a dry run says would refuse, and which
// participant a failed restore's cleanup believes installed something when its reply was lost.
import {describe, expect, it} from 'vitest'

import {Fleet, FleetMember} from '../../src/control-plane/fleet.js'
import {CoordinationError} from '../../src/coordination/errors.js'
import {Coordinator, commit, prepare, restore, resume, retire, retirePreview} from '../../src/coordination/operations.js'
import {episode} from '../../src/protocol/episode.js'
import {Kind} from '../../src/protocol/wire.js'
import {coordinatorFor, soon, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const MEMBERS: FleetMember[] = [
  {name: 'a-env', kind: 'environment'},
  {name: 'z-env', kind: 'environment'},
  {name: 'b-model', kind: 'model'},
  {name: 'c-agent', kind: 'agent'},
]

function bodies(fleet: Fleet, route: string, name: string): any[] {
  return fleet
    .server(name)
    .journal.filter((j) => j.route === route)
    .map((j) => JSON.parse(j.body))
}

/** The same coordinator, asking only `names`. */
const only = (c: Coordinator, ...names: string[]): Coordinator => ({...c, participants: c.participants.filter((p) => names.includes(p.server))})

/** A committed checkpoint with no records (every participant's state written), and a fresh fleet to restore it into. */
async function emptyCheckpointAndFreshFleet(): Promise<{root: string; fresh: Fleet; fc: Coordinator}> {
  const fleet = await startFleet({members: MEMBERS})
  const c = await coordinatorFor(fleet)
  const root = await tempDir()
  await prepare(c, 'ck', soon())
  await commit(c, 'ck', root, [], soon())
  await resume(c, 'ck', soon())
  const fresh = await startFleet({members: MEMBERS})
  return {root, fresh, fc: await coordinatorFor(fresh)}
}

describe('retire: which refusal says a checkpoint is open', () => {
  it('one invalid_phase among other failures of the stage is enough to name the open checkpoint', async () => {
    const fleet = await startFleet({members: MEMBERS})
    const c = await coordinatorFor(fleet)
    // z-env has a checkpoint open (it refuses with invalid_phase); a-env fails with a plain 500.
    await prepare(only(c, 'z-env'), 'open', soon())
    fleet.server('a-env').faults.add('retire', {type: 'status', status: 500})
    const err = (await retire(c, 'ret', [episode('r1')], soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.failures.map((f) => [f.server, f.status, f.code])).toEqual([
      ['a-env', 500, null],
      ['z-env', 409, 'invalid_phase'],
    ])
    expect(err.message).toMatch(/retire is refused while a checkpoint is open: resume first, then retire again$/)
    expect(err.message).not.toContain('were not called')
    await resume(only(c, 'z-env'), 'open', soon())
  })
})

describe('retirePreview: who would refuse', () => {
  it('a participant with a checkpoint open under the very ID of the retire still refuses it (in the order given)', () => {
    const p = (server: string, kind: Kind, phase: string, checkpoint_id: string | null) => ({server, url: 'http://x', kind, instance: server, status: {phase, checkpoint_id}})
    const participants = [
      p('e', 'environment', 'prepared', 'rs'),
      p('m', 'model', 'committed', 'rs'),
      p('a', 'agent', 'preparing', 'rs'),
      p('r', 'resources', 'restored', 'rs'),
      p('i', 'model', 'idle', null),
    ]
    expect(retirePreview(participants, 1, 'rs').would_refuse).toEqual([
      {server: 'e', phase: 'prepared', checkpoint_id: 'rs'},
      {server: 'm', phase: 'committed', checkpoint_id: 'rs'},
      {server: 'a', phase: 'preparing', checkpoint_id: 'rs'},
    ])
  })
})

describe('restore cleanup: a participant whose restore reply was lost', () => {
  it('is not retired when its status shows a checkpoint of this ID open but not restored', async () => {
    const {root, fresh, fc} = await emptyCheckpointAndFreshFleet()
    // z-env has a prepare open under the restore's ID, and the restore never reaches it (the
    // connection drops before it is handled): its status says prepared, under this ID.
    await prepare(only(fc, 'z-env'), 'rs', soon())
    fresh.server('z-env').faults.add('restore', {type: 'drop'})
    const logs: string[] = []
    const err = (await restore(fc, 'rs', root, [episode('e1')], soon(), (m) => logs.push(m)).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.failures.map((f) => [f.server, f.status])).toEqual([['z-env', null]])
    // It installed nothing: no retire is sent to it (it would refuse one in its phase), and the
    // cleanup's resume closes its prepare.
    expect(bodies(fresh, 'retire', 'z-env')).toEqual([])
    expect(logs).toEqual([])
    for (const s of fresh.servers) expect(s.controlPlane!.phase, s.name).toBe('idle')
  })

  it('is not retired when its status shows it restored under another ID', async () => {
    const {root, fresh, fc} = await emptyCheckpointAndFreshFleet()
    // z-env was restored under another ID earlier; this restore never reaches it.
    await restore(only(fc, 'z-env'), 'other', root, [], soon())
    fresh.server('z-env').faults.add('restore', {type: 'drop'})
    const logs: string[] = []
    const err = (await restore(fc, 'rs', root, [episode('e1')], soon(), (m) => logs.push(m)).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => [f.server, f.status])).toEqual([['z-env', null]])
    expect(bodies(fresh, 'retire', 'z-env')).toEqual([])
    // Only the resume under this ID is refused there (its open restore is another one).
    expect(logs).toHaveLength(1)
    expect(logs[0]).toMatch(/^restore cleanup: resume failed: checkpoint resume failed on 1 participant\(s\): z-env/)
    expect(fresh.server('z-env').controlPlane!.phase).toBe('restored')
    expect(fresh.server('z-env').controlPlane!.checkpointId).toBe('other')
    await resume(only(fc, 'z-env'), 'other', soon())
  })

  it('is asked only when it sent no reply: one that refused (restored under this ID with another scope) is not retired', async () => {
    const {root, fresh, fc} = await emptyCheckpointAndFreshFleet()
    // z-env completed a restore under this very ID with another scope: it refuses this one with a
    // conflict (a reply, so it installed nothing now), while its status says restored under this ID.
    await restore(only(fc, 'z-env'), 'rs', root, [], soon())
    const statusCalls = () => fresh.server('z-env').journal.filter((j) => j.route === 'status').length
    const before = statusCalls()
    const logs: string[] = []
    const err = (await restore(fc, 'rs', root, [episode('e1')], soon(), (m) => logs.push(m)).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.failures.map((f) => [f.server, f.status, f.code])).toEqual([['z-env', 409, 'checkpoint_conflict']])
    // No status probe, and nothing retired there: what it holds is its earlier restore's.
    expect(statusCalls()).toBe(before)
    expect(bodies(fresh, 'retire', 'z-env')).toEqual([])
    expect(fresh.server('z-env').controlPlane!.retired.size).toBe(0)
    expect(logs).toEqual([])
    for (const s of fresh.servers) expect(s.controlPlane!.phase, s.name).toBe('idle')
  })
})
