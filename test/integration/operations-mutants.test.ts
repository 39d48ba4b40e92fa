// Fan-out rules of src/coordination/operations.ts that no other test holds (issue 12): fleets with
// several servers per kind, retire and forget stages that fail, what forget and retire send.
import {describe, expect, it} from 'vitest'

import {Fleet, FleetMember} from '../../src/control-plane/fleet.js'
import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {
  CallEvent,
  Coordinator,
  RETIRE_BATCH,
  commit,
  encodeBody,
  fanOut,
  forget,
  prepare,
  renew,
  restore,
  resume,
  resumeAll,
  retire,
  retireEach,
  retirePreview,
  restartsOf,
  STATUS_TIMEOUT_MS,
  statusAll,
} from '../../src/coordination/operations.js'
import {Kind} from '../../src/protocol/wire.js'
import {captureKey, episode} from '../../src/protocol/episode.js'
import {coordinatorFor, soon, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

/** Two servers of every kind, named so that name order and kind order disagree. */
const WIDE: FleetMember[] = [
  {name: 'z-env', kind: 'environment'},
  {name: 'a-env', kind: 'environment'},
  {name: 'y-model', kind: 'model'},
  {name: 'b-model', kind: 'model'},
  {name: 'x-agent', kind: 'agent'},
  {name: 'c-agent', kind: 'agent'},
  {name: 'w-res', kind: 'resources'},
  {name: 'd-res', kind: 'resources'},
]

/** Servers in the order their first `route` call arrived. */
function arrivals(fleet: Fleet, route: string): string[] {
  return fleet.servers
    .flatMap((s) => s.journal.filter((j) => j.route === route).map((j) => ({name: s.name, at: j.at})))
    .sort((a, b) => a.at - b.at)
    .map((x) => x.name)
}

function bodies(fleet: Fleet, route: string, name: string): any[] {
  return fleet
    .server(name)
    .journal.filter((j) => j.route === route)
    .map((j) => JSON.parse(j.body))
}

async function wide(): Promise<{fleet: Fleet; c: Coordinator}> {
  const fleet = await startFleet({members: WIDE})
  return {fleet, c: await coordinatorFor(fleet)}
}

const kindOf = (name: string) => WIDE.find((m) => m.name === name)!.kind
const stageOrder = (names: string[], order: string[][]) => names.map((n) => order.findIndex((ks) => ks.includes(kindOf(n))))

describe('prepare on a fleet with several servers per kind', () => {
  it('stops at a stage where only some servers are not prepared: later stages are never called', async () => {
    const {fleet, c} = await wide()
    // One of the two environments holds a blocker that never clears; the other is ready.
    fleet.server('a-env').participant!.stuckBlockers = ['stuck-1', 'stuck-2']
    const r = await prepare(c, 'ck-1', soon(1.5))
    expect(r.prepared).toBe(false)
    expect([...r.replies.keys()].sort()).toEqual(['a-env', 'z-env'])
    expect(r.replies.get('z-env')!.phase).toBe('prepared')
    expect(r.replies.get('a-env')!.phase).toBe('preparing')
    expect(r.blockers()).toEqual({'a-env': {blockers: ['stuck-1', 'stuck-2'], blockerCount: 2}})
    // Not reached, in kind order and name order within a kind.
    expect(r.notReached).toEqual(['b-model', 'y-model', 'c-agent', 'x-agent', 'd-res', 'w-res'])
    for (const n of r.notReached) expect(bodies(fleet, 'prepare', n), n).toEqual([])
    await resume(c, 'ck-1', soon())
  })

  it('prepares every stage in kind order, both servers of a kind at once, with the same bytes', async () => {
    const {fleet, c} = await wide()
    const stages: string[] = []
    const r = await prepare({...c, onStage: (e) => stages.push(`${e.stage}:${e.servers.join(',')}:${e.done ? `done/${e.failures}` : 'start'}`)}, 'ck-2', soon())
    expect(r.prepared).toBe(true)
    expect(r.notReached).toEqual([])
    expect(r.blockers()).toEqual({})
    expect(stageOrder(arrivals(fleet, 'prepare'), [['environment'], ['model'], ['agent'], ['resources']])).toEqual([0, 0, 1, 1, 2, 2, 3, 3])
    expect(stages).toEqual([
      'environment:a-env,z-env:start',
      'environment:a-env,z-env:done/0',
      'model:b-model,y-model:start',
      'model:b-model,y-model:done/0',
      'agent:c-agent,x-agent:start',
      'agent:c-agent,x-agent:done/0',
      'resources:d-res,w-res:start',
      'resources:d-res,w-res:done/0',
    ])
    const raw = fleet.servers.map((s) => s.journal.find((j) => j.route === 'prepare')!.body)
    expect(new Set(raw).size).toBe(1)
    expect(JSON.parse(raw[0]!)).toEqual({checkpoint_id: 'ck-2', deadline_ts: expect.any(Number)})
    await resume(c, 'ck-2', soon())
  })

  it('a stage with a failing server throws every failure of that stage and calls no later stage', async () => {
    const {fleet, c} = await wide()
    fleet.server('y-model').faults.add('prepare', {type: 'status', status: 500})
    fleet.server('b-model').faults.add('prepare', {type: 'status', status: 503})
    const err = (await prepare(c, 'ck-3', soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.failures.map((f) => [f.server, f.status])).toEqual([
      ['b-model', 503],
      ['y-model', 500],
    ])
    expect(err.operation).toBe('prepare')
    expect(err.message).toMatch(/^checkpoint prepare failed on 2 participant\(s\): b-model: HTTP 503 .*\. resume checkpoint 'ck-3' before preparing again$/)
    // (A status fault answers before the request is journaled: the models do not show.)
    expect(arrivals(fleet, 'prepare').sort()).toEqual(['a-env', 'z-env'])
    for (const n of ['c-agent', 'x-agent', 'd-res', 'w-res']) expect(fleet.server(n).controlPlane!.phase, n).toBe('idle')
    await resume(c, 'ck-3', soon())
  })
})

describe('resume', () => {
  it('goes in reverse kind order and on past failures, then reports them all', async () => {
    const {fleet, c} = await wide()
    await prepare(c, 'ck-r', soon())
    fleet.server('c-agent').faults.add('resume', {type: 'status', status: 500})
    const all = await resumeAll(c, 'ck-r', soon())
    expect(all.failures.map((f) => f.server)).toEqual(['c-agent'])
    expect([...all.replies.keys()].sort()).toEqual(
      WIDE.map((m) => m.name)
        .filter((n) => n !== 'c-agent')
        .sort(),
    )
    // c-agent's refused call is not journaled: one agent shows.
    expect(stageOrder(arrivals(fleet, 'resume'), [['resources'], ['agent'], ['model'], ['environment']])).toEqual([0, 0, 1, 2, 2, 3, 3])
    for (const s of fleet.servers) if (s.name !== 'c-agent') expect(s.controlPlane!.phase, s.name).toBe('idle')
    expect(fleet.server('c-agent').controlPlane!.phase).toBe('prepared')
    fleet.server('c-agent').faults.add('resume', {type: 'status', status: 500})
    const err = (await resume(c, 'ck-r', soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.message).toMatch(/^checkpoint resume failed on 1 participant\(s\): c-agent: HTTP 500 .*resume 'ck-r' again/)
    expect((await resume(c, 'ck-r', soon())).get('c-agent')).toEqual({phase: 'idle', idempotent: false})
  })
})

describe('retire and forget', () => {
  it('retire goes environment, then agent, then model and resources together, with one body for all', async () => {
    const {fleet, c} = await wide()
    const n = await retire(c, 'ret', [episode('r1'), episode('r2', 3)], soon())
    expect(n).toBe(2)
    expect(stageOrder(arrivals(fleet, 'retire'), [['environment'], ['agent'], ['model', 'resources']])).toEqual([0, 0, 1, 1, 2, 2, 2, 2])
    for (const s of fleet.servers) {
      expect(bodies(fleet, 'retire', s.name), s.name).toEqual([
        {
          checkpoint_id: 'ret',
          deadline_ts: expect.any(Number),
          episode_ids: [
            {rollout_id: 'r1', attempt: 0},
            {rollout_id: 'r2', attempt: 3},
          ],
        },
      ])
      expect(s.controlPlane!.retired.get('r2'), s.name).toBe(3)
    }
    const raw = fleet.servers.map((s) => s.journal.find((j) => j.route === 'retire')!.body)
    expect(new Set(raw).size).toBe(1)
  })

  it('a failing retire stage is an error, and the stages after it are never called', async () => {
    const {fleet, c} = await wide()
    fleet.server('x-agent').faults.add('retire', {type: 'status', status: 500})
    const err = (await retire(c, 'ret', [episode('r1')], soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.operation).toBe('retire')
    expect(err.failures.map((f) => f.server)).toEqual(['x-agent'])
    expect(err.message).toMatch(/x-agent: HTTP 500 .*\. the stages after agent were not called; retire again once every participant answers \(it is idempotent\)$/)
    expect(err.message).not.toContain('checkpoint is open')
    expect(arrivals(fleet, 'retire').sort()).toEqual(['a-env', 'c-agent', 'z-env'])
    for (const n of ['b-model', 'y-model', 'd-res', 'w-res']) expect(fleet.server(n).controlPlane!.retired.size, n).toBe(0)
  })

  it('a retire refused by a participant with a checkpoint open fails', async () => {
    const {fleet, c} = await wide()
    await prepare(c, 'open', soon())
    const err = (await retire(c, 'ret', [episode('r1')], soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => [f.server, f.code])).toEqual([
      ['a-env', 'invalid_phase'],
      ['z-env', 'invalid_phase'],
    ])
    expect(arrivals(fleet, 'retire').sort()).toEqual(['a-env', 'z-env'])
    expect(err.message).toMatch(/retire is refused while a checkpoint is open: resume first, then retire again$/)
    await resume(c, 'open', soon())
  })

  it('retire sends batches of 1024, every batch to every stage; an empty list sends nothing', async () => {
    const {fleet, c} = await wide()
    expect(await retire(c, 'ret', [], soon())).toBe(0)
    expect(arrivals(fleet, 'retire')).toEqual([])
    const eps = Array.from({length: RETIRE_BATCH + 1}, (_, i) => episode(`r${i}`))
    expect(await retire(c, 'ret', eps, soon())).toBe(RETIRE_BATCH + 1)
    for (const s of fleet.servers) {
      expect(
        bodies(fleet, 'retire', s.name).map((b) => b.episode_ids.length),
        s.name,
      ).toEqual([RETIRE_BATCH, 1])
      expect(bodies(fleet, 'retire', s.name)[1].episode_ids, s.name).toEqual([{rollout_id: `r${RETIRE_BATCH}`, attempt: 0}])
    }
  })

  it('forget sends the rollouts sorted and de-duplicated, in retire order, and the marks go', async () => {
    const {fleet, c} = await wide()
    await retire(c, 'ret', [episode('b'), episode('a', 2)], soon())
    const n = await forget(c, 'fgt', ['b', 'a', 'b'], soon())
    expect(n).toBe(2)
    expect(stageOrder(arrivals(fleet, 'forget'), [['environment'], ['agent'], ['model', 'resources']])).toEqual([0, 0, 1, 1, 2, 2, 2, 2])
    for (const s of fleet.servers) {
      expect(bodies(fleet, 'forget', s.name), s.name).toEqual([{checkpoint_id: 'fgt', deadline_ts: expect.any(Number), rollout_ids: ['a', 'b']}])
      expect(s.controlPlane!.retired.size, s.name).toBe(0)
    }
  })

  it('forget sends batches of 1024; nothing to forget sends nothing', async () => {
    const {fleet, c} = await wide()
    expect(await forget(c, 'fgt', [], soon())).toBe(0)
    expect(arrivals(fleet, 'forget')).toEqual([])
    const ids = Array.from({length: RETIRE_BATCH + 2}, (_, i) => `f${String(i).padStart(5, '0')}`)
    expect(await forget(c, 'fgt', [...ids].reverse(), soon())).toBe(ids.length)
    const sent = bodies(fleet, 'forget', 'a-env').map((b) => b.rollout_ids)
    expect(sent.map((l: string[]) => l.length)).toEqual([RETIRE_BATCH, 2])
    expect(sent.flat()).toEqual(ids)
  })

  it('a failing forget stage is an error, and the stages after it are never called', async () => {
    const {fleet, c} = await wide()
    fleet.server('z-env').faults.add('forget', {type: 'status', status: 500})
    const err = (await forget(c, 'fgt', ['r'], soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.operation).toBe('forget')
    expect(err.failures.map((f) => f.server)).toEqual(['z-env'])
    expect(err.message).toMatch(/the stages after environment were not called; forget again once every participant answers \(it is idempotent\)$/)
    expect(arrivals(fleet, 'forget')).toEqual(['a-env'])
  })

  it('each retire or forget batch gets the whole timeout from when it is sent, not what the batches before it left', async () => {
    const {fleet, c} = await wide()
    const eps = Array.from({length: RETIRE_BATCH + 1}, (_, i) => episode(`r${i}`))
    const ids = eps.map((e) => e.rolloutId)
    for (const op of ['retire', 'forget'] as const) {
      // The first batch takes 400 ms at the environment stage.
      fleet.server('a-env').faults.add(op, {type: 'delay', ms: 400})
      const given = soon(5)
      if (op === 'retire') await retire(c, 'ret', eps, given)
      else await forget(c, 'fgt', ids, given)
      for (const s of fleet.servers) {
        const [b1, b2] = bodies(fleet, op, s.name).map((b) => b.deadline_ts as number)
        expect(b1, s.name).toBe(given)
        expect(b2! - b1!, `${op} ${s.name}`).toBeGreaterThanOrEqual(0.35)
        expect(b2! - b1!, `${op} ${s.name}`).toBeLessThan(5)
      }
    }
  })

  it('retireEach (a cleanup) gives each batch the whole timeout from when it is sent, also at later stages', async () => {
    const {fleet, c} = await wide()
    const eps = Array.from({length: RETIRE_BATCH + 1}, (_, i) => episode(`r${i}`))
    fleet.server('a-env').faults.add('retire', {type: 'delay', ms: 400})
    const given = soon(5)
    await retireEach(
      c,
      'ret',
      new Map([
        ['a-env', eps],
        ['b-model', [episode('m')]],
      ]),
      given,
    )
    const deadlines = (server: string) => bodies(fleet, 'retire', server).map((b) => b.deadline_ts as number)
    const [b1, b2] = deadlines('a-env')
    expect(b1).toBe(given)
    expect(b2! - given).toBeGreaterThanOrEqual(0.35)
    expect(b2! - given).toBeLessThan(5)
    // The model's stage starts after both environment batches.
    const [m] = deadlines('b-model')
    expect(m! - given).toBeGreaterThanOrEqual(0.35)
    expect(m! - given).toBeLessThan(5)
  })

  it('retireEach sends each participant its own list, in retire order, and skips empty lists', async () => {
    const {fleet, c} = await wide()
    const lists = new Map([
      ['x-agent', [episode('ra', 1)]],
      ['z-env', [episode('rz')]],
      ['b-model', Array.from({length: RETIRE_BATCH + 1}, (_, i) => episode(`m${i}`))],
      ['d-res', []],
    ])
    await retireEach(c, 'ret', lists, soon())
    expect(arrivals(fleet, 'retire').filter((n, i, a) => a.indexOf(n) === i)).toEqual(['z-env', 'x-agent', 'b-model'])
    expect(bodies(fleet, 'retire', 'x-agent').map((b) => b.episode_ids)).toEqual([[{rollout_id: 'ra', attempt: 1}]])
    expect(bodies(fleet, 'retire', 'b-model').map((b) => b.episode_ids.length)).toEqual([RETIRE_BATCH, 1])
    expect(bodies(fleet, 'retire', 'd-res')).toEqual([])
    expect(fleet.server('z-env').controlPlane!.retired.get('rz')).toBe(0)
    expect(fleet.server('a-env').controlPlane!.retired.size).toBe(0)
  })

  it('retireEach (a cleanup) goes on past a stage with a failure, and names every failure at the end', async () => {
    const {fleet, c} = await wide()
    fleet.server('c-agent').faults.add('retire', {type: 'status', status: 500})
    const lists = new Map([
      ['c-agent', [episode('a'), ...Array.from({length: RETIRE_BATCH}, (_, i) => episode(`x${i}`))]],
      ['x-agent', [episode('b')]],
      ['y-model', [episode('c')]],
    ])
    const err = (await retireEach(c, 'ret', lists, soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.failures.map((f) => [f.server, f.status])).toEqual([['c-agent', 500]])
    // The failing member sends no second batch; the model stage still gets its retire.
    expect(bodies(fleet, 'retire', 'c-agent')).toHaveLength(0)
    expect(bodies(fleet, 'retire', 'x-agent')).toHaveLength(1)
    expect(bodies(fleet, 'retire', 'y-model').map((b) => b.episode_ids)).toEqual([[{rollout_id: 'c', attempt: 0}]])
  })
})

describe('the one-shot fan-outs', () => {
  it('renew and commit go to all at once; commit sends the scope only when there is one', async () => {
    const {fleet, c} = await wide()
    await prepare(c, 'ck-c', soon())
    const leases = await renew(c, 'ck-c', soon(50))
    expect(leases.size).toBe(8)
    const dir = await tempDir()
    // Without a scope, the policy models refuse (Gym's rule, reference 4.6); the others commit.
    const err = (await commit(c, 'ck-c', dir, null, soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => [f.server, f.status, f.code]).sort()).toEqual([
      ['b-model', 409, 'checkpoint_error'],
      ['y-model', 409, 'checkpoint_error'],
    ])
    for (const s of fleet.servers) {
      const b = bodies(fleet, 'commit', s.name)[0]
      expect(Object.keys(b).sort(), s.name).toEqual(['checkpoint_dir', 'checkpoint_id', 'deadline_ts'])
    }
    await resume(c, 'ck-c', soon())
    await prepare(c, 'ck-d', soon())
    const dir2 = await tempDir()
    await commit(c, 'ck-d', dir2, [episode('q', 2)], soon())
    expect(bodies(fleet, 'commit', 'a-env')[1].episode_ids).toEqual([{rollout_id: 'q', attempt: 2}])
    await resume(c, 'ck-d', soon())
  })

  it('a commit failure names the retry or the resume', async () => {
    const {fleet, c} = await wide()
    await prepare(c, 'ck-f', soon())
    fleet.server('w-res').faults.add('commit', {type: 'status', status: 500})
    const err = (await commit(c, 'ck-f', await tempDir(), [], soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => f.server)).toEqual(['w-res'])
    expect(err.message).toMatch(/retry the commit with the same directory and scope, or resume 'ck-f' and prepare a new checkpoint$/)
    await resume(c, 'ck-f', soon())
  })

  it('a renew failure is an error naming the server', async () => {
    const {fleet, c} = await wide()
    await prepare(c, 'ck-n', soon())
    fleet.server('b-model').faults.add('renew', {type: 'status', status: 500})
    const err = (await renew(c, 'ck-n', soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err.operation).toBe('renew')
    expect(err.failures.map((f) => f.server)).toEqual(['b-model'])
    await resume(c, 'ck-n', soon())
  })

  it('fanOut collects replies and failures separately and tells the stage its failure count', async () => {
    const {fleet, c} = await wide()
    fleet.server('a-env').faults.add('resume', {type: 'status', status: 500})
    const events: unknown[] = []
    const r = await fanOut({...c, onStage: (e) => events.push(e)}, 'resume', c.participants.slice(0, 3), encodeBody({checkpoint_id: 'x', deadline_ts: soon()}), soon(), 'st')
    expect([...r.replies.keys()].sort()).toEqual(['b-model', 'z-env'])
    expect(r.failures.map((f) => f.server)).toEqual(['a-env'])
    expect(events).toEqual([
      {operation: 'resume', stage: 'st', servers: ['a-env', 'z-env', 'b-model']},
      {operation: 'resume', stage: 'st', servers: ['a-env', 'z-env', 'b-model'], done: true, failures: 1},
    ])
  })

  it('fanOut tells onCall when each call is sent (no time) and when it settles (its time, ok, the failure code)', async () => {
    const {fleet, c} = await wide()
    fleet.server('a-env').faults.add('resume', {type: 'status', status: 409, body: JSON.stringify({error: {code: 'stale_checkpoint', detail: 'x'}})})
    const calls: CallEvent[] = []
    const deadline = soon()
    await fanOut({...c, onCall: (e) => calls.push(e)}, 'resume', c.participants.slice(0, 3), encodeBody({checkpoint_id: 'x', deadline_ts: deadline}), deadline, 'st')
    expect(calls.slice(0, 3)).toEqual(['a-env', 'z-env', 'b-model'].map((server) => ({operation: 'resume', stage: 'st', server, deadlineTs: deadline, ms: null})))
    const settled = calls.slice(3)
    expect(settled.map((e) => e.server).sort()).toEqual(['a-env', 'b-model', 'z-env'])
    for (const e of settled) {
      expect(e).toMatchObject({operation: 'resume', stage: 'st', deadlineTs: deadline})
      expect(e.ms, e.server).toBeGreaterThanOrEqual(0)
      expect([e.ok, e.code], e.server).toEqual(e.server === 'a-env' ? [false, 'stale_checkpoint'] : [true, null])
    }
    // The settled time is measured from when the stage's calls were sent: never more than the stage took.
    const t0 = performance.now()
    const slow: CallEvent[] = []
    await fanOut({...c, onCall: (e) => slow.push(e)}, 'resume', c.participants.slice(0, 2), encodeBody({checkpoint_id: 'x', deadline_ts: deadline}), deadline)
    const took = performance.now() - t0
    for (const e of slow.filter((x) => x.ms !== null)) expect(e.ms, e.server).toBeLessThanOrEqual(took)
    expect(slow.filter((e) => e.ms !== null).length).toBe(2)
    expect(slow.filter((e) => e.ms === null).map((e) => e.stage)).toEqual(['all', 'all'])
  })

  it('statusAll reports an unreachable participant as a failure, not an exception', async () => {
    const {fleet, c} = await wide()
    fleet.server('d-res').faults.add('status', {type: 'status', status: 500})
    const r = await statusAll(c)
    expect(r.statuses.size).toBe(7)
    expect(r.failures.map((f) => f.server)).toEqual(['d-res'])
    expect(r.statuses.get('a-env')).toMatchObject({kind: 'environment', phase: 'idle'})
  })

  it('statusAll waits as long as discovery does (60 s) for a reply: a multi-worker server may take 30 s', async () => {
    const {c} = await wide()
    const waited: number[] = []
    const status: typeof c.client.status = (ref, timeoutMs, signal) => {
      waited.push(timeoutMs)
      return c.client.status(ref, timeoutMs, signal)
    }
    const client = Object.assign(Object.create(c.client) as typeof c.client, {status})
    await statusAll({...c, client})
    expect(STATUS_TIMEOUT_MS).toBe(60_000)
    expect(waited).toEqual(c.participants.map(() => 60_000))
  })

  it('a 200 reply that says the operation did not happen is a failure: a resume still closed, a restore not restored, a key that is no capture key', async () => {
    const {fleet, c} = await wide()
    await prepare(c, 'ck-w', soon())
    // The participant answers 200 but stays prepared.
    fleet.server('d-res').faults.add('resume', {type: 'status', status: 200, body: JSON.stringify({phase: 'prepared', report: {ready: true, blockers: [], counts: {}, restarts: []}})})
    const err = (await resume(c, 'ck-w', soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => [f.server, f.code])).toEqual([['d-res', 'bad_reply']])
    expect(err.failures[0]!.message).toMatch(/^unexpected resume reply: phase: /)
    await resume(c, 'ck-w', soon())
    const {RestoreReply} = await import('../../src/protocol/wire.js')
    expect(RestoreReply.safeParse({phase: 'idle', source_checkpoint_id: 'x', restored: []}).success).toBe(false)
    const bad = RestoreReply.safeParse({phase: 'restored', source_checkpoint_id: 'x', restored: ['r1-a1', '../x']})
    expect(bad.success).toBe(false)
    expect(bad.error!.issues[0]!.message).toMatch(/^'\.\.\/x' is no capture key: /)
    expect(RestoreReply.safeParse({phase: 'restored', source_checkpoint_id: 'x', restored: ['r1-a1']}).success).toBe(true)
  })

  it('a restore answered 200 without restoring, while another fails, is cleaned up with the rest: replacements retired, everyone resumed', async () => {
    const {root, fresh, fc} = await restorableE1('ck-b')
    fresh.server('w-res').faults.add('restore', {type: 'status', status: 200, body: JSON.stringify({phase: 'restored', source_checkpoint_id: 'ck-b', restored: ['../x']})})
    fresh.server('y-model').faults.add('restore', {type: 'status', status: 500})
    const err = (await restore(fc, 'rs-b', root, [episode('e1')], soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.failures.map((f) => [f.server, f.code])).toEqual([
      ['w-res', 'bad_reply'],
      ['y-model', null],
    ])
    for (const s of fresh.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.phase, s.name).toBe('idle')
    expect(bodies(fresh, 'retire', 'w-res').map((b) => b.episode_ids)).toEqual([[{rollout_id: 'e1', attempt: 1}]])
  })

  it('encodeBody is the JSON of the body in UTF-8', () => {
    expect(encodeBody({a: 'é', b: [1]}).equals(Buffer.from('{"a":"é","b":[1]}', 'utf8'))).toBe(true)
  })
})

/**
 * A checkpoint (`id`) holding e1, run to a boundary on a-env of a wide fleet, and a fresh wide
 * fleet to restore it into.
 */
async function restorableE1(id: string): Promise<{root: string; fresh: Fleet; fc: Coordinator}> {
  const {fleet, c} = await wide()
  const root = await tempDir()
  const run = fleet.run({rolloutId: 'e1', steps: 4, stepMs: 40}, 'a-env')
  await new Promise((r) => setTimeout(r, 60))
  await prepare(c, id, soon())
  await commit(c, id, root, [episode('e1')], soon())
  await resume(c, id, soon())
  await run
  const fresh = await startFleet({members: WIDE})
  return {root, fresh, fc: await coordinatorFor(fresh)}
}

describe('restore cleanup', () => {
  it('a failed restore retires on each participant what it installed (all of it where it failed inside), resumes everyone, and raises the restore error', async () => {
    const {fleet, c} = await wide()
    // A checkpoint to restore: run two episodes to a boundary, commit, resume.
    const root = await tempDir()
    const runs = [fleet.run({rolloutId: 'e1', steps: 4, stepMs: 40}, 'a-env'), fleet.run({rolloutId: 'e2', steps: 4, stepMs: 40}, 'z-env')]
    await new Promise((r) => setTimeout(r, 60))
    await prepare(c, 'ck-s', soon())
    await commit(c, 'ck-s', root, [episode('e1'), episode('e2')], soon())
    await resume(c, 'ck-s', soon())
    await Promise.all(runs)
    const fresh = await startFleet({members: WIDE})
    const fc = await coordinatorFor(fresh)
    fresh.server('y-model').faults.add('restore', {type: 'status', status: 500})
    const logs: string[] = []
    const err = (await restore(fc, 'rs-1', root, [episode('e1'), episode('e2')], soon(), (m) => logs.push(m)).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.operation).toBe('restore')
    expect(err.failures.map((f) => f.server)).toEqual(['y-model'])
    expect(err.message).toMatch(/what the restore installed was retired and the fleet was resumed/)
    expect(logs).toEqual([])
    // The environment that held e1 retires e1-a1 only; the one that held nothing retires nothing.
    const env1 = bodies(fresh, 'retire', 'a-env')
    expect(env1.map((b) => b.episode_ids)).toEqual([[{rollout_id: 'e1', attempt: 1}]])
    expect(bodies(fresh, 'retire', 'z-env').map((b) => b.episode_ids)).toEqual([[{rollout_id: 'e2', attempt: 1}]])
    // The failed participant (a 500: it may have stopped half way through its install) retires
    // every replacement attempt.
    expect(bodies(fresh, 'retire', 'y-model').map((b) => b.episode_ids)).toEqual([
      [
        {rollout_id: 'e1', attempt: 1},
        {rollout_id: 'e2', attempt: 1},
      ],
    ])
    for (const s of fresh.servers) {
      expect(s.controlPlane!.phase, s.name).toBe('idle')
      expect(
        bodies(fresh, 'resume', s.name).map((b) => b.checkpoint_id),
        s.name,
      ).toEqual(['rs-1'])
    }
  })

  it('a restore whose reply was lost asks that participant whether it restored, and retires what it did', async () => {
    const {root, fresh, fc} = await restorableE1('ck-t')
    // a-env installs, then the connection drops before its reply; b-model refuses outright (busy).
    fresh.server('a-env').faults.add('restore', {type: 'drop-after'})
    fresh.server('b-model').faults.add('restore', {type: 'status', status: 409, body: JSON.stringify({error: {code: 'invalid_phase', detail: 'busy'}})})
    // c-agent's connection drops before its restore is handled: no reply, and nothing installed.
    fresh.server('c-agent').faults.add('restore', {type: 'drop'})
    const err = (await restore(fc, 'rs-2', root, [episode('e1')], soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => [f.server, f.status])).toEqual([
      ['a-env', null],
      ['b-model', 409],
      ['c-agent', null],
    ])
    expect(bodies(fresh, 'retire', 'a-env').map((b) => b.episode_ids)).toEqual([[{rollout_id: 'e1', attempt: 1}]])
    // z-env replied that it installed nothing (it never held e1): its status, restored under this
    // ID, does not override its reply. c-agent never got the request, but an idle participant
    // whose reply is missing may have failed half way through an install: it is retired too.
    expect(fresh.server('z-env').controlPlane!.phase).toBe('idle')
    expect(bodies(fresh, 'retire', 'z-env')).toEqual([])
    expect(bodies(fresh, 'retire', 'c-agent').map((b) => b.episode_ids)).toEqual([[{rollout_id: 'e1', attempt: 1}]])
    expect(bodies(fresh, 'retire', 'b-model')).toEqual([])
    expect(fresh.server('a-env').controlPlane!.phase).toBe('idle')
  })

  it('a participant that missed its deadline retires every replacement attempt; one that refused before installing is not touched', async () => {
    const {root, fresh, fc} = await restorableE1('ck-v')
    const refusal = (status: number, code: string) => ({type: 'status' as const, status, body: JSON.stringify({error: {code, detail: 'x'}})})
    // Gym's install outlives the deadline: a participant answering deadline_exceeded may go on installing.
    fresh.server('b-model').faults.add('restore', refusal(409, 'deadline_exceeded'))
    fresh.server('c-agent').faults.add('restore', refusal(422, 'invalid_checkpoint_state'))
    fresh.server('d-res').faults.add('restore', refusal(409, 'invalid_phase'))
    const err = (await restore(fc, 'rs-4', root, [episode('e1')], soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => [f.server, f.code])).toEqual([
      ['b-model', 'deadline_exceeded'],
      ['c-agent', 'invalid_checkpoint_state'],
      ['d-res', 'invalid_phase'],
    ])
    expect(bodies(fresh, 'retire', 'b-model').map((b) => b.episode_ids)).toEqual([[{rollout_id: 'e1', attempt: 1}]])
    expect(bodies(fresh, 'retire', 'c-agent')).toEqual([])
    expect(bodies(fresh, 'retire', 'd-res')).toEqual([])
    for (const s of fresh.servers)
      expect(
        bodies(fresh, 'resume', s.name).map((b) => b.checkpoint_id),
        s.name,
      ).toEqual(['rs-4'])
  })

  it('a cleanup that fails is logged, and the restore error is still the one raised', async () => {
    const {root, fresh, fc} = await restorableE1('ck-u')
    fresh.server('b-model').faults.add('restore', {type: 'status', status: 500})
    fresh.server('a-env').faults.add('retire', {type: 'status', status: 500})
    fresh.server('d-res').faults.add('resume', {type: 'status', status: 500})
    const logs: string[] = []
    const err = (await restore(fc, 'rs-3', root, [episode('e1')], soon(), (m) => logs.push(m)).catch((e: unknown) => e)) as CoordinationError
    expect(err.operation).toBe('restore')
    expect(logs).toHaveLength(2)
    expect(logs[0]).toMatch(/^restore cleanup: retire of the installed replacement attempts failed: checkpoint retire failed on 1 participant\(s\): a-env/)
    expect(logs[1]).toMatch(/^restore cleanup: resume failed: checkpoint resume failed on 1 participant\(s\): d-res/)
  })

  it('a restore that succeeds everywhere returns the replies and the next attempts, and sends nothing else', async () => {
    const {root, fresh, fc} = await restorableE1('ck-v')
    const out = await restore(fc, 'rs-4', root, [episode('e1')], soon())
    expect(out.replacements).toEqual([{rolloutId: 'e1', attempt: 1}])
    expect(out.replies.get('a-env')!.restored).toEqual(['e1-a1'])
    expect(out.replies.get('z-env')!.restored).toEqual([])
    expect(arrivals(fresh, 'retire')).toEqual([])
    expect(arrivals(fresh, 'resume')).toEqual([])
    expect(fresh.server('a-env').controlPlane!.phase).toBe('restored')
    await resume(fc, 'rs-4', soon())
  })
})

describe('operations: more rules', () => {
  it('retireEach with exactly one batch per server sends one call, never an empty batch', async () => {
    const {fleet, c} = await wide()
    const list = Array.from({length: RETIRE_BATCH}, (_, i) => episode(`m${i}`))
    await retireEach(c, 'ret', new Map([['b-model', list]]), soon())
    expect(bodies(fleet, 'retire', 'b-model').map((b) => b.episode_ids.length)).toEqual([RETIRE_BATCH])
  })

  it('stages are named by their kinds, and a kind with no server is no stage', async () => {
    const fleet = await startFleet({members: [WIDE[1]!, WIDE[3]!, WIDE[6]!]})
    const c = await coordinatorFor(fleet)
    const stages: unknown[] = []
    await retire({...c, onStage: (e) => e.done || stages.push([e.stage, e.servers])}, 'r', [episode('x')], soon())
    expect(stages).toEqual([
      ['environment', ['a-env']],
      ['model+resources', ['b-model', 'w-res']],
    ])
    expect(retirePreview(c.participants, 1, 'r').stages).toEqual([
      {stage: 'environment', servers: ['a-env']},
      {stage: 'model+resources', servers: ['b-model', 'w-res']},
    ])
  })

  it('retirePreview: stages, calls per server, and who would refuse (a checkpoint open, or another ID in restored)', () => {
    const p = (server: string, kind: Kind, status?: {phase: string; checkpoint_id: string | null}) => ({server, url: 'http://x', kind, instance: server, status})
    const participants = [
      p('m', 'model', {phase: 'idle', checkpoint_id: null}),
      p('e', 'environment', {phase: 'prepared', checkpoint_id: 'c1'}),
      p('a', 'agent', {phase: 'restored', checkpoint_id: 'rs'}),
      p('r', 'resources', {phase: 'restored', checkpoint_id: 'other'}),
      p('r2', 'resources', {phase: 'idle', checkpoint_id: 'stale'}),
      p('a2', 'agent'),
    ]
    const out = retirePreview(participants, 2049, 'rs')
    expect(out).toEqual({
      stages: [
        {stage: 'environment', servers: ['e']},
        {stage: 'agent', servers: ['a', 'a2']},
        {stage: 'model+resources', servers: ['m', 'r', 'r2']},
      ],
      calls_per_server: 3,
      would_refuse: [
        {server: 'e', phase: 'prepared', checkpoint_id: 'c1'},
        {server: 'r', phase: 'restored', checkpoint_id: 'other'},
        {server: 'r2', phase: 'idle', checkpoint_id: 'stale'},
      ],
    })
    expect(retirePreview(participants, 1024, 'rs').calls_per_server).toBe(1)
    expect(retirePreview(participants, 0, 'rs').calls_per_server).toBe(0)
    expect(retirePreview([p('z', 'model', {phase: 'restored', checkpoint_id: 'rs'}), p('y', 'model', {phase: 'idle', checkpoint_id: null})], 1, 'rs').would_refuse).toEqual([])
  })

  it('restartsOf refuses a restart that is no capture key, naming it', () => {
    expect(
      restartsOf([
        ['e1', [captureKey(episode('a')), captureKey(episode('b', 1))]],
        ['e2', [captureKey(episode('a'))]],
      ]),
    ).toEqual([episode('a'), episode('b', 1)])
    let err: unknown
    try {
      restartsOf([
        ['e1', [captureKey(episode('a'))]],
        ['e2', ['not a key']],
      ])
    } catch (e) {
      err = e
    }
    expect(err).toBeInstanceOf(ControllerError)
    expect((err as ControllerError).code).toBe('participant')
    expect((err as Error).message).toMatch(/^e2 reported a restart 'not a key' that is not a valid capture key: ./)
  })

  it("a restore cleanup outlives the restore's own deadline: it gets 30 s more", async () => {
    const {root, fresh, fc} = await restorableE1('ck-w')
    // y-model answers only after the restore's deadline has passed (and refuses, too late): the
    // fan-out waits for it, so the cleanup starts after that deadline.
    fresh.server('y-model').faults.add('restore', {type: 'delay', ms: 800})
    const logs: string[] = []
    const err = (await restore(fc, 'rs-5', root, [episode('e1')], soon(0.4), (m) => logs.push(m)).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => f.server)).toEqual(['y-model'])
    expect(logs).toEqual([])
    expect(bodies(fresh, 'retire', 'a-env').map((b) => b.episode_ids)).toEqual([[{rollout_id: 'e1', attempt: 1}]])
    expect(fresh.server('a-env').controlPlane!.retired.get('e1')).toBe(1)
    for (const s of fresh.servers) expect(s.controlPlane!.phase, s.name).toBe('idle')
  })

  it('an interrupted restore cleans up and says so', async () => {
    const {c} = await wide()
    const root = await tempDir()
    await prepare(c, 'ck-x', soon())
    await commit(c, 'ck-x', root, [], soon())
    await resume(c, 'ck-x', soon())
    const fresh = await startFleet({members: WIDE})
    const fc = await coordinatorFor(fresh)
    fresh.server('d-res').faults.add('restore', {type: 'hang'})
    const abort = new AbortController()
    const onCall = (e: CallEvent) => {
      if (e.operation === 'restore' && e.ms === null) setImmediate(() => abort.abort())
    }
    const err = (await restore({...fc, signal: abort.signal, onCall}, 'rs-6', root, [], soon()).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('interrupted')
    expect(err.message).toBe("interrupted during restore 'rs-6'; what it installed was retired and the fleet was resumed")
    for (const s of fresh.servers)
      expect(
        bodies(fresh, 'resume', s.name).map((b) => b.checkpoint_id),
        s.name,
      ).toEqual(['rs-6'])
  })
})
