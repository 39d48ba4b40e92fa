// The participant double's phase machine (src/control-plane/control-plane.ts), in process, with
// real temp directories (issue 12).
import {readdir, rm, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {afterEach, describe, expect, it} from 'vitest'

import {ControlError, ControlPlane, ControlPlaneOptions} from '../../src/control-plane/control-plane.js'
import {SimDownstream} from '../../src/control-plane/sim.js'
import {CheckpointStateError} from '../../src/storage/errors.js'
import {writeParticipantState} from '../../src/storage/participant-store.js'
import {tempDir} from '../helpers/tmp.js'

const planes: ControlPlane[] = []
afterEach(() => {
  for (const cp of planes.splice(0)) cp.close()
})

const soon = (s = 10) => Date.now() / 1000 + s

function make(opts: ControlPlaneOptions = {}, kind: 'model' | 'agent' | 'resources' = 'model') {
  const p = new SimDownstream(kind, 'm')
  const cp = new ControlPlane(p, opts)
  p.attach(cp)
  planes.push(cp)
  return {p, cp}
}

function session(p: SimDownstream, key: string, extra: Partial<{restart: boolean; restored: boolean}> = {}) {
  const [rolloutId, a] = key.includes('-a') ? [key.split('-a')[0]!, Number(key.split('-a')[1])] : [key, 0]
  p.sessions.set(key, {ep: {rolloutId, attempt: a}, chain: `chain-${key}`, calls: 1, restart: extra.restart ?? false, restored: extra.restored ?? false})
}

/** The ControlError a call rejects with. */
async function failure(p: Promise<unknown>): Promise<ControlError> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  )
  if (!(e instanceof ControlError)) throw new Error(`expected a ControlError, got ${String(e)}`)
  return e
}

async function code(p: Promise<unknown>): Promise<string> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  )
  if (!(e instanceof ControlError)) throw new Error(`expected a ControlError, got ${String(e)}`)
  return `${e.status} ${e.code}`
}

describe('admission checks', () => {
  it('another open checkpoint is a conflict, a resumed ID is stale, a wrong phase is invalid', async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await code(cp.prepare({checkpoint_id: 'b', deadline_ts: soon()}))).toBe('409 checkpoint_conflict')
    expect(await code(cp.renew({checkpoint_id: 'b', deadline_ts: soon()}))).toBe('409 checkpoint_conflict')
    expect(await code(cp.restore({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: '/nonexistent', episode_ids: []}))).toBe('409 invalid_phase')
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await code(cp.prepare({checkpoint_id: 'a', deadline_ts: soon()}))).toBe('409 stale_checkpoint')
    expect(await code(cp.renew({checkpoint_id: 'a', deadline_ts: soon()}))).toBe('409 stale_checkpoint')
    expect(await code(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: '/x'}))).toBe('409 stale_checkpoint')
    expect(await code(cp.renew({checkpoint_id: 'c', deadline_ts: soon()}))).toBe('409 invalid_phase')
    expect(await code(cp.commit({checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: '/x'}))).toBe('409 invalid_phase')
  })

  it('retire and forget are refused while a checkpoint is open, and allowed when idle', async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await code(cp.retire({checkpoint_id: 'r', deadline_ts: soon(), episode_ids: [{rollout_id: 'x', attempt: 0}]}))).toBe('409 invalid_phase')
    expect(await code(cp.forget({checkpoint_id: 'r', deadline_ts: soon(), rollout_ids: ['x']}))).toBe('409 invalid_phase')
    expect(cp.retired.size).toBe(0)
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await cp.retire({checkpoint_id: 'r', deadline_ts: soon(), episode_ids: [{rollout_id: 'x', attempt: 0}]})).toEqual({retired_count: 1})
  })
})

describe('prepare', () => {
  it('waits for readiness until its deadline, then replies preparing with the blockers, admission still closed', async () => {
    const {p, cp} = make()
    p.stuckBlockers = ['b1']
    const t0 = Date.now()
    const r = await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(0.4)})
    expect(Date.now() - t0).toBeGreaterThanOrEqual(300)
    expect(r.phase).toBe('preparing')
    expect(r.report).toMatchObject({ready: false, blockers: ['b1'], blocker_count: 1})
    expect(p.admissionClosed).toBe(true)
    expect(cp.phase).toBe('preparing')
    // Ready now: a second prepare of the same ID finishes it, and is then remembered.
    p.stuckBlockers = []
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})).phase).toBe('prepared')
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})).phase).toBe('prepared')
  })

  it('is woken by a change: it does not wait out its deadline once the blockers clear', async () => {
    const {p, cp} = make()
    p.stuckBlockers = ['b1']
    setTimeout(() => {
      p.stuckBlockers = []
      p.openAdmission()
      p.closeAdmission()
    }, 100)
    const t0 = Date.now()
    const r = await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(20)})
    expect(r.phase).toBe('prepared')
    expect(Date.now() - t0).toBeLessThan(5000)
  })

  it('a resume during the wait ends it: the prepare replies idle', async () => {
    const {p, cp} = make()
    p.stuckBlockers = ['b1']
    const pending = cp.prepare({checkpoint_id: 'a', deadline_ts: soon(20)})
    await new Promise((r) => setTimeout(r, 50))
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    expect((await pending).phase).toBe('idle')
    expect(p.admissionClosed).toBe(false)
  })

  it('a participant that cannot close admission leaves the plane idle, admission open', async () => {
    const {p, cp} = make()
    let opened = 0
    p.closeAdmission = () => {
      throw new Error('cannot close')
    }
    const open = p.openAdmission.bind(p)
    p.openAdmission = () => {
      opened++
      open()
    }
    await expect(cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})).rejects.toThrow('cannot close')
    expect([cp.phase, cp.checkpointId, cp.leaseExpiresAt, opened]).toEqual(['idle', null, null, 1])
    expect(cp.status()).toMatchObject({phase: 'idle', checkpoint_id: null, lease_expires_at: null})
  })

  it('caps the blockers it reports at 100 and counts them all', async () => {
    const {p, cp} = make()
    p.stuckBlockers = Array.from({length: 130}, (_, i) => `b${String(i).padStart(3, '0')}`)
    const r = await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(0.1)})
    expect(r.report.blockers).toHaveLength(100)
    expect(r.report.blocker_count).toBe(130)
    expect((cp.status().report as {blockers: string[]}).blockers[99]).toBe('b099')
  })
})

describe('lease', () => {
  it('a lease is the later of the old one and deadline + grace; renew answers it', async () => {
    const {cp} = make({leaseGraceSeconds: 100})
    const d = soon(10)
    await cp.prepare({checkpoint_id: 'a', deadline_ts: d})
    expect(cp.leaseExpiresAt).toBe(d + 100)
    expect(await cp.renew({checkpoint_id: 'a', deadline_ts: d - 5})).toEqual({lease_expires_at: d + 100})
    expect(await cp.renew({checkpoint_id: 'a', deadline_ts: d + 5})).toEqual({lease_expires_at: d + 105})
    expect(cp.status().lease_expires_at).toBe(d + 105)
  })

  it('an expired lease resumes the checkpoint by itself and fences its ID', async () => {
    const logs: string[] = []
    const {p, cp} = make({leaseGraceSeconds: 0.2, log: (m) => logs.push(m)})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(0)})
    expect(cp.phase).toBe('prepared')
    await new Promise((r) => setTimeout(r, 600))
    expect([cp.phase, cp.checkpointId, cp.leaseExpiresAt, p.admissionClosed]).toEqual(['idle', null, null, false])
    expect(logs).toEqual(["lease expired in phase prepared; resuming checkpoint 'a'"])
    expect(await code(cp.prepare({checkpoint_id: 'a', deadline_ts: soon()}))).toBe('409 stale_checkpoint')
    expect(await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})).toEqual({phase: 'idle', idempotent: true})
  })

  it('a renewed lease is not cut short by the timer of the old one', async () => {
    const {cp} = make({leaseGraceSeconds: 0.3})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(0)})
    await new Promise((r) => setTimeout(r, 150))
    await cp.renew({checkpoint_id: 'a', deadline_ts: soon(1)})
    await new Promise((r) => setTimeout(r, 400))
    expect(cp.phase).toBe('prepared')
  })

  it('a lease reopen that fails is retried', async () => {
    const logs: string[] = []
    const {p, cp} = make({leaseGraceSeconds: 0.1, leaseRetryMs: 100, log: (m) => logs.push(m)})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(0)})
    let fails = 1
    const open = p.openAdmission.bind(p)
    p.openAdmission = () => {
      if (fails-- > 0) throw new Error('busy')
      open()
    }
    await new Promise((r) => setTimeout(r, 800))
    expect(cp.phase).toBe('idle')
    expect(logs).toContain("lease reopen of 'a' failed (busy); retrying in 100 ms")
  })
})

describe('commit', () => {
  it('a participant no longer ready cannot commit this checkpoint, even once ready again', async () => {
    const {p, cp} = make({}, 'agent')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    p.stuckBlockers = ['late']
    const dir = await tempDir()
    const e1 = await failure(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir}))
    expect([e1.code, e1.message]).toEqual(['export_failed', 'participant is no longer ready to commit: blockers=["late"]; resume, then prepare again under a new checkpoint ID'])
    p.stuckBlockers = []
    const e2 = await failure(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir}))
    expect(e2.code).toBe('export_failed')
    expect(e2.message).toContain("checkpoint 'a' cannot be committed (participant is no longer ready")
    expect(await readdir(dir)).toEqual([])
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    await cp.prepare({checkpoint_id: 'b', deadline_ts: soon()})
    expect((await cp.commit({checkpoint_id: 'b', deadline_ts: soon(), checkpoint_dir: dir})).phase).toBe('committed')
  })

  it("the policy model refuses a commit without a scope (Gym's checkpoint_error), remembers nothing and stays prepared", async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    const e = await failure(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir}))
    expect([e.code, e.message]).toEqual(['checkpoint_error', 'model commit needs the episode_ids the controller continues'])
    expect(cp.phase).toBe('prepared')
    expect(await readdir(dir)).toEqual([])
    expect((await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: []})).phase).toBe('committed')
    // An agent needs none: it exports every live session whatever the scope.
    const agent = make({}, 'agent').cp
    await agent.prepare({checkpoint_id: 'b', deadline_ts: soon()})
    expect((await agent.commit({checkpoint_id: 'b', deadline_ts: soon(), checkpoint_dir: await tempDir()})).phase).toBe('committed')
  })

  it('an export that throws fails this checkpoint for good', async () => {
    const {p, cp} = make({}, 'agent')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    p.exportRecords = () => {
      throw new Error('disk gone')
    }
    const dir = await tempDir()
    const e = await failure(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir}))
    expect([e.code, e.message]).toEqual(['export_failed', "checkpoint 'a' export failed: disk gone; resume, then prepare again under a new checkpoint ID"])
  })

  it('a scope naming a reported restart is refused, naming it', async () => {
    const {p, cp} = make()
    session(p, 'ok')
    session(p, 'rs', {restart: true})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    const e = await failure(
      cp.commit({
        checkpoint_id: 'a',
        deadline_ts: soon(),
        checkpoint_dir: dir,
        episode_ids: [
          {rollout_id: 'rs', attempt: 0},
          {rollout_id: 'ok', attempt: 0},
        ],
      }),
    )
    expect([e.code, e.message]).toEqual(['restart_in_scope', 'the commit scope names episodes that restart: ["rs"]'])
    const r = await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [{rollout_id: 'ok', attempt: 0}]})
    expect(r).toMatchObject({phase: 'committed', episode_ids: ['ok']})
  })

  it('the cut is taken once; a replay with the same arguments (scope in any order) gets the same reply; others conflict', async () => {
    const {p, cp} = make()
    session(p, 'x')
    session(p, 'y')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    const scope = [
      {rollout_id: 'x', attempt: 0},
      {rollout_id: 'y', attempt: 0},
    ]
    const r1 = await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: scope})
    expect(r1).toMatchObject({phase: 'committed', episode_ids: ['x', 'y']})
    session(p, 'z')
    const r2 = await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [...scope].reverse()})
    expect(r2).toEqual(r1)
    expect(await code(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: scope.slice(0, 1)}))).toBe('409 checkpoint_conflict')
    expect(await code(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir + '-other', episode_ids: scope}))).toBe('409 checkpoint_conflict')
    expect(await code(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir}))).toBe('409 checkpoint_conflict')
    expect(cp.phase).toBe('committed')
    expect(await code(cp.restore({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: []}))).toBe('409 invalid_phase')
  })

  it('a commit to another directory while the first write runs is a conflict', async () => {
    const {p, cp} = make({}, 'agent')
    session(p, 'x')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    const first = cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir})
    expect(await code(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: path.join(dir, 'b')}))).toBe('409 checkpoint_conflict')
    expect((await first).phase).toBe('committed')
  })

  it('a write that fails is redone by a retry with the same exported records', async () => {
    const {p, cp} = make({}, 'agent')
    session(p, 'x')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const root = await tempDir()
    const file = path.join(root, 'file')
    await writeFile(file, 'not a directory')
    await expect(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: file})).rejects.toThrow(CheckpointStateError)
    expect(cp.phase).toBe('prepared')
    // Same arguments: the write runs again (into a directory that can take it now), with the same cut.
    await rm(file)
    session(p, 'late')
    const r = await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: file})
    expect(r).toMatchObject({phase: 'committed', episode_ids: ['x']})
  })

  it('a write that outlives the deadline is deadline_exceeded, and the phase stays prepared', async () => {
    const {p, cp} = make({}, 'agent')
    session(p, 'x')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    expect(await code(cp.commit({checkpoint_id: 'a', deadline_ts: Date.now() / 1000 - 1, checkpoint_dir: dir}))).toBe('409 deadline_exceeded')
    expect(cp.phase).toBe('prepared')
    // The write goes on; a retry with the same arguments and time left gets its result.
    expect((await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir})).phase).toBe('committed')
  })

  it('restored state the scope leaves out is deleted after the write; restored state in scope stays', async () => {
    const {p, cp} = make()
    session(p, 'in-a1', {restored: true})
    session(p, 'out-a1', {restored: true})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    const r = await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [{rollout_id: 'in', attempt: 1}]})
    expect(r).toMatchObject({episode_ids: ['in-a1']})
    expect([...p.sessions.keys()]).toEqual(['in-a1'])
  })
})

describe('restore', () => {
  async function checkpointOf(keys: string[]) {
    const dir = await tempDir()
    const lines = keys.map((k) => {
      const [r, a] = k.includes('-a') ? [k.split('-a')[0], Number(k.split('-a')[1])] : [k, 0]
      return `{"episode_id": {"rollout_id": "${r}", "attempt": ${a}}, "session_id": "${k}", "state": {"chain": "c-${k}", "calls": 2}}`
    })
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'm', checkpointId: 'src-1'}, lines)
    return dir
  }

  it('installs the scope under the next attempts, replies them sorted, and stays closed until resumed', async () => {
    const {p, cp} = make({leaseGraceSeconds: 50})
    const dir = await checkpointOf(['b', 'a-a2', 'skip'])
    const d = soon()
    const r = await cp.restore({
      checkpoint_id: 'rs',
      deadline_ts: d,
      checkpoint_dir: dir,
      episode_ids: [
        {rollout_id: 'b', attempt: 0},
        {rollout_id: 'a', attempt: 2},
      ],
    })
    expect(r).toEqual({phase: 'restored', source_checkpoint_id: 'src-1', restored: ['a-a3', 'b-a1']})
    expect([...p.sessions.keys()].sort()).toEqual(['a-a3', 'b-a1'])
    expect([cp.phase, cp.checkpointId, cp.leaseExpiresAt, p.admissionClosed]).toEqual(['restored', 'rs', d + 50, true])
    // A replay gets the same reply; other arguments conflict.
    expect(
      await cp.restore({
        checkpoint_id: 'rs',
        deadline_ts: d,
        checkpoint_dir: dir,
        episode_ids: [
          {rollout_id: 'a', attempt: 2},
          {rollout_id: 'b', attempt: 0},
        ],
      }),
    ).toEqual(r)
    expect(await code(cp.restore({checkpoint_id: 'rs', deadline_ts: d, checkpoint_dir: dir, episode_ids: []}))).toBe('409 checkpoint_conflict')
    expect(await cp.resume({checkpoint_id: 'rs', deadline_ts: soon()})).toEqual({phase: 'idle', idempotent: false})
    expect(p.admissionClosed).toBe(false)
  })

  it('a process with live state refuses a restore', async () => {
    const {p, cp} = make()
    session(p, 'live')
    const dir = await checkpointOf(['a'])
    const e = await failure(cp.restore({checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: []}))
    expect([e.status, e.code, e.message]).toEqual([409, 'checkpoint_error', 'model restore requires a process without live episodes'])
  })

  it('an invalid record is refused before anything is installed; a failed install reopens admission', async () => {
    const {p, cp} = make()
    const dir = await tempDir()
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'm', checkpointId: 'src'}, ['{"episode_id": {"rollout_id": "a", "attempt": 0}, "state": {"chain": 1}}'])
    await expect(cp.restore({checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [{rollout_id: 'a', attempt: 0}]})).rejects.toThrow(
      "checkpoint record of episode 'a' is invalid: state must be {chain, calls}",
    )
    expect([cp.phase, p.admissionClosed, p.sessions.size]).toEqual(['idle', false, 0])
    const good = await checkpointOf(['a'])
    p.install = async () => {
      throw new Error('install broke')
    }
    await expect(cp.restore({checkpoint_id: 'rs2', deadline_ts: soon(), checkpoint_dir: good, episode_ids: [{rollout_id: 'a', attempt: 0}]})).rejects.toThrow('install broke')
    expect([cp.phase, cp.checkpointId, p.admissionClosed]).toEqual(['idle', null, false])
  })

  it('a restore past its deadline is deadline_exceeded', async () => {
    const {cp} = make()
    const dir = await checkpointOf(['a'])
    expect(await code(cp.restore({checkpoint_id: 'rs', deadline_ts: Date.now() / 1000 - 1, checkpoint_dir: dir, episode_ids: []}))).toBe('409 deadline_exceeded')
    expect(cp.phase).toBe('idle')
  })
})

describe('resume and the fence', () => {
  it('resuming an ID never prepared fences it; resuming it again is idempotent', async () => {
    const {cp} = make()
    expect(await cp.resume({checkpoint_id: 'never', deadline_ts: soon()})).toEqual({phase: 'idle', idempotent: true})
    expect(await code(cp.prepare({checkpoint_id: 'never', deadline_ts: soon()}))).toBe('409 stale_checkpoint')
    expect(await cp.resume({checkpoint_id: 'never', deadline_ts: soon()})).toEqual({phase: 'idle', idempotent: true})
  })

  it('resuming another ID than the open one is a conflict and keeps the open one', async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await code(cp.resume({checkpoint_id: 'b', deadline_ts: soon()}))).toBe('409 checkpoint_conflict')
    expect([cp.phase, cp.checkpointId]).toEqual(['prepared', 'a'])
  })

  it('the fence keeps the configured number of IDs, oldest out first', async () => {
    const {cp} = make({resumedIdsKept: 3})
    for (const id of ['a', 'b', 'c']) await cp.resume({checkpoint_id: id, deadline_ts: soon()})
    await cp.prepare({checkpoint_id: 'x', deadline_ts: soon()})
    await cp.resume({checkpoint_id: 'x', deadline_ts: soon()})
    // Fence now holds b, c, x: 'a' fell out.
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})).phase).toBe('prepared')
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await code(cp.prepare({checkpoint_id: 'c', deadline_ts: soon()}))).toBe('409 stale_checkpoint')
    expect((await cp.prepare({checkpoint_id: 'b', deadline_ts: soon()})).phase).toBe('prepared')
  })

  it('a resumed ID forgets what it completed: its replies are not replayed after the fence', async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await code(cp.prepare({checkpoint_id: 'a', deadline_ts: soon()}))).toBe('409 stale_checkpoint')
  })
})

describe('retire and forget', () => {
  it('marks every rollout at its highest attempt, before the deadline check; a late retire still refuses the attempt', async () => {
    const {cp} = make()
    const e = await failure(
      cp.retire({
        checkpoint_id: 'r',
        deadline_ts: Date.now() / 1000 - 1,
        episode_ids: [
          {rollout_id: 'x', attempt: 2},
          {rollout_id: 'x', attempt: 1},
          {rollout_id: 'y', attempt: 0},
        ],
      }),
    )
    expect([e.code, e.message]).toEqual(['deadline_exceeded', 'retire deadline passed before its episodes were stopped'])
    expect([...cp.retired]).toEqual([
      ['x', 2],
      ['y', 0],
    ])
    expect(() => cp.checkAttempt({rolloutId: 'x', attempt: 2})).toThrow(new ControlError('stale_attempt', "attempt 2 of rollout 'x' was retired (up to attempt 2)"))
    expect(() => cp.checkAttempt({rolloutId: 'x', attempt: 0})).toThrow(ControlError)
    expect(() => cp.checkAttempt({rolloutId: 'x', attempt: 3})).not.toThrow()
    expect(() => cp.checkAttempt({rolloutId: 'z', attempt: 0})).not.toThrow()
    // A lower attempt never lowers a mark.
    await cp.retire({checkpoint_id: 'r', deadline_ts: soon(), episode_ids: [{rollout_id: 'x', attempt: 0}]})
    expect(cp.retired.get('x')).toBe(2)
    expect(cp.status().retired_rollouts).toBe(2)
  })

  it('stops each rollout once, through its latest attempt, a bounded number at a time', async () => {
    const {p, cp} = make({retireConcurrency: 2})
    const seen: string[] = []
    let running = 0
    let most = 0
    p.retire = async (e) => {
      seen.push(`${e.rolloutId}@${e.attempt}`)
      most = Math.max(most, ++running)
      await new Promise((r) => setTimeout(r, 20))
      running--
    }
    const eps = [
      {rollout_id: 'a', attempt: 0},
      {rollout_id: 'a', attempt: 3},
      {rollout_id: 'b', attempt: 1},
      {rollout_id: 'c', attempt: 0},
      {rollout_id: 'd', attempt: 0},
    ]
    expect(await cp.retire({checkpoint_id: 'r', deadline_ts: soon(), episode_ids: eps})).toEqual({retired_count: 5})
    expect(seen.sort()).toEqual(['a@3', 'b@1', 'c@0', 'd@0'])
    expect(most).toBe(2)
  })

  it('a retire whose work outlives the deadline aborts it and says so', async () => {
    const {p, cp} = make()
    let aborted: unknown = null
    // The Participant interface passes an abort signal (SimDownstream's own retire ignores it).
    const retire = (_e: unknown, signal: AbortSignal) =>
      new Promise<void>((_r, reject) =>
        signal.addEventListener('abort', () => {
          aborted = signal.reason
          reject(signal.reason)
        }),
      )
    p.retire = retire as unknown as SimDownstream['retire']
    const e = await failure(cp.retire({checkpoint_id: 'r', deadline_ts: soon(0.2), episode_ids: [{rollout_id: 'a', attempt: 0}]}))
    expect([e.code, e.message]).toEqual(['deadline_exceeded', 'retire deadline passed before its episodes stopped; retry the retire'])
    expect((aborted as Error).message).toBe('retire deadline passed')
  })

  it('forget drops the marks it names, counts what it was sent, and refuses a passed deadline before dropping anything', async () => {
    const {cp} = make()
    await cp.retire({
      checkpoint_id: 'r',
      deadline_ts: soon(),
      episode_ids: [
        {rollout_id: 'a', attempt: 0},
        {rollout_id: 'b', attempt: 0},
      ],
    })
    const e = await failure(cp.forget({checkpoint_id: 'f', deadline_ts: Date.now() / 1000 - 1, rollout_ids: ['a']}))
    expect([e.code, e.message]).toEqual(['deadline_exceeded', 'forget deadline passed'])
    expect(cp.retired.size).toBe(2)
    expect(await cp.forget({checkpoint_id: 'f', deadline_ts: soon(), rollout_ids: ['a', 'zz']})).toEqual({forgotten_count: 2})
    expect([...cp.retired.keys()]).toEqual(['b'])
  })

  it('in the restored phase, retire under the restore ID is allowed and renews its lease; another ID conflicts', async () => {
    const {cp} = make({leaseGraceSeconds: 100})
    const dir = await tempDir()
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'm', checkpointId: 'src'}, [])
    await cp.restore({checkpoint_id: 'rs', deadline_ts: soon(1), checkpoint_dir: dir, episode_ids: []})
    const before = cp.leaseExpiresAt!
    const d = soon(30)
    await cp.retire({checkpoint_id: 'rs', deadline_ts: d, episode_ids: [{rollout_id: 'a', attempt: 1}]})
    expect(cp.leaseExpiresAt).toBe(Math.max(before, d + 100))
    expect(await code(cp.retire({checkpoint_id: 'other', deadline_ts: soon(), episode_ids: [{rollout_id: 'a', attempt: 1}]}))).toBe('409 checkpoint_conflict')
    expect(await code(cp.forget({checkpoint_id: 'other', deadline_ts: soon(), rollout_ids: ['a']}))).toBe('409 checkpoint_conflict')
    expect(await cp.forget({checkpoint_id: 'rs', deadline_ts: soon(), rollout_ids: ['a']})).toEqual({forgotten_count: 1})
  })
})

describe('status', () => {
  it('reports kind, instance, phase, ID, lease, retired marks, the report and the participant extras', async () => {
    const {cp} = make({}, 'resources')
    expect(cp.status()).toEqual({
      kind: 'resources',
      instance: 'm',
      phase: 'idle',
      checkpoint_id: null,
      lease_expires_at: null,
      retired_rollouts: 0,
      report: {ready: true, blockers: [], blocker_count: 0, counts: {sessions: 0, inflight: 0}, restarts: []},
      mode: 'exported',
      verify: 'wait',
    })
  })
})
