// More rules of the participant double's phase machine (src/control-plane/control-plane.ts), from
// the survivors of the unit-only run of 2026-12-04 (issue 12): the words of each refusal, and the
// blocker count a participant reports.
import {writeFile} from 'node:fs/promises'
import path from 'node:path'

import {afterEach, describe, expect, it, vi} from 'vitest'

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

function make(opts: ControlPlaneOptions = {}, kind: 'model' | 'agent' = 'model') {
  const p = new SimDownstream(kind, 'm')
  const cp = new ControlPlane(p, opts)
  p.attach(cp)
  planes.push(cp)
  return {p, cp}
}

function session(p: SimDownstream, key: string, restored = false) {
  const [rolloutId, a] = key.includes('-a') ? [key.split('-a')[0]!, Number(key.split('-a')[1])] : [key, 0]
  p.sessions.set(key, {ep: {rolloutId, attempt: a}, chain: `chain-${key}`, calls: 1, restart: false, restored})
}

/** `[name, status, code, message]` of the ControlError a call rejects with. */
async function refusal(p: Promise<unknown>): Promise<[string, number, string, string]> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  )
  if (!(e instanceof ControlError)) throw new Error(`expected a ControlError, got ${String(e)}`)
  return [e.name, e.status, e.code, e.message]
}

describe('the words of each refusal', () => {
  it('admission: a resumed ID, another open checkpoint, a wrong phase', async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await refusal(cp.prepare({checkpoint_id: 'b', deadline_ts: soon()}))).toEqual(['ControlError', 409, 'checkpoint_conflict', "checkpoint 'a' is active in phase prepared"])
    expect(await refusal(cp.retire({checkpoint_id: 'a', deadline_ts: soon(), episode_ids: []}))).toEqual(['ControlError', 409, 'invalid_phase', 'not valid in phase prepared; resume first'])
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await refusal(cp.renew({checkpoint_id: 'a', deadline_ts: soon()}))).toEqual(['ControlError', 409, 'stale_checkpoint', "checkpoint 'a' was already resumed"])
    expect(await refusal(cp.renew({checkpoint_id: 'c', deadline_ts: soon()}))).toEqual(['ControlError', 409, 'invalid_phase', 'not valid in phase idle'])
  })

  it('retire under another ID while restored names the restore', async () => {
    const {cp} = make()
    const dir = await tempDir()
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'm', checkpointId: 'src'}, [])
    await cp.restore({checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: []})
    expect(await refusal(cp.retire({checkpoint_id: 'x', deadline_ts: soon(), episode_ids: []}))).toEqual(['ControlError', 409, 'checkpoint_conflict', "checkpoint 'rs' is active in phase restored"])
    // A restore of the same ID with another scope: it already completed.
    expect(await refusal(cp.restore({checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [{rollout_id: 'q', attempt: 0}]}))).toEqual([
      'ControlError',
      409,
      'checkpoint_conflict',
      "checkpoint 'rs' already completed restore with another directory or scope",
    ])
  })

  it('commit: another directory for a checkpoint whose write is pending, and a deadline passed during the write', async () => {
    const {cp} = make({}, 'agent')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const root = await tempDir()
    // The first write fails (its directory is a file), which keeps its job for a retry with the same arguments.
    const file = path.join(root, 'file')
    await writeFile(file, 'not a directory')
    await expect(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: file})).rejects.toThrow(CheckpointStateError)
    expect(await refusal(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: path.join(root, 'b')}))).toEqual([
      'ControlError',
      409,
      'checkpoint_conflict',
      "checkpoint 'a' is already being written to another directory or scope",
    ])
    const {cp: cp2} = make({}, 'agent')
    await cp2.prepare({checkpoint_id: 'b', deadline_ts: soon()})
    const dir2 = await tempDir()
    expect(await refusal(cp2.commit({checkpoint_id: 'b', deadline_ts: Date.now() / 1000 - 1, checkpoint_dir: dir2}))).toEqual([
      'ControlError',
      409,
      'deadline_exceeded',
      "checkpoint 'b' deadline passed during I/O",
    ])
    // The write goes on; waiting for it (a retry with time left) keeps it from racing the temp directory's removal.
    expect((await cp2.commit({checkpoint_id: 'b', deadline_ts: soon(), checkpoint_dir: dir2})).phase).toBe('committed')
  })

  it('restore: a deadline passed while reading names the directory', async () => {
    const {cp} = make()
    const dir = await tempDir()
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'm', checkpointId: 'src'}, [])
    expect(await refusal(cp.restore({checkpoint_id: 'rs', deadline_ts: Date.now() / 1000 - 1, checkpoint_dir: dir, episode_ids: []}))).toEqual([
      'ControlError',
      409,
      'deadline_exceeded',
      `checkpoint 'rs' deadline passed while reading ${path.join(dir, 'gym', 'model', 'm')}`,
    ])
  })
})

describe('blockers', () => {
  it("the participant's own blocker count is kept when it reports one", () => {
    const {p, cp} = make()
    p.report = () => ({ready: false, blockers: ['x'], blocker_count: 7, counts: {}, restarts: []})
    expect(cp.report()).toMatchObject({blockers: ['x'], blocker_count: 7})
  })

  it('a commit refused for blockers names at most 100 of them', async () => {
    const {p, cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    p.stuckBlockers = Array.from({length: 130}, (_, i) => `b${String(i).padStart(3, '0')}`)
    const [, , code, message] = await refusal(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: await tempDir()}))
    expect(code).toBe('export_failed')
    expect(message).toBe(`participant is no longer ready to commit: blockers=${JSON.stringify(p.stuckBlockers.slice(0, 100))}; resume, then prepare again under a new checkpoint ID`)
  })
})

describe('leases', () => {
  it('retire and forget in the idle phase start no lease', async () => {
    const {cp} = make()
    await cp.retire({checkpoint_id: 'r', deadline_ts: soon(), episode_ids: [{rollout_id: 'x', attempt: 0}]})
    await cp.forget({checkpoint_id: 'r', deadline_ts: soon(), rollout_ids: ['x']})
    expect([cp.phase, cp.checkpointId, cp.leaseExpiresAt, cp.status().lease_expires_at]).toEqual(['idle', null, null, null])
  })

  it('a prepare of the checkpoint still preparing renews its lease and closes admission only once', async () => {
    const {p, cp} = make({leaseGraceSeconds: 100})
    let closes = 0
    const close = p.closeAdmission.bind(p)
    p.closeAdmission = () => {
      closes++
      close()
    }
    p.stuckBlockers = ['b']
    const d1 = soon(0.1)
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: d1})).phase).toBe('preparing')
    expect(cp.leaseExpiresAt).toBe(d1 + 100)
    const d2 = soon(0.2)
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: d2})).phase).toBe('preparing')
    expect(cp.leaseExpiresAt).toBe(d2 + 100)
    expect(closes).toBe(1)
  })

  it('a commit renews the lease', async () => {
    const {cp} = make({leaseGraceSeconds: 100}, 'agent')
    const d1 = soon(1)
    await cp.prepare({checkpoint_id: 'a', deadline_ts: d1})
    const d2 = soon(20)
    await cp.commit({checkpoint_id: 'a', deadline_ts: d2, checkpoint_dir: await tempDir()})
    expect(cp.leaseExpiresAt).toBe(d2 + 100)
  })

  it('a lease beyond what a timer holds (24.8 days) is timed in steps, without an overflow warning', async () => {
    const warnings: string[] = []
    const onWarning = (w: Error) => warnings.push(w.name)
    process.on('warning', onWarning)
    try {
      const {cp} = make({leaseGraceSeconds: 30 * 86_400})
      await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
      await new Promise((r) => setTimeout(r, 100))
      expect(cp.phase).toBe('prepared')
    } finally {
      process.off('warning', onWarning)
    }
    expect(warnings.filter((n) => n === 'TimeoutOverflowWarning')).toEqual([])
  })
})

describe('commit and restore, more', () => {
  it('an export that threw is not tried again by a retry', async () => {
    const {p, cp} = make({}, 'agent')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const exportRecords = p.exportRecords.bind(p)
    let calls = 0
    p.exportRecords = (scope) => {
      if (calls++ === 0) throw new Error('disk gone')
      return exportRecords(scope)
    }
    const dir = await tempDir()
    await refusal(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir}))
    expect(await refusal(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir}))).toEqual([
      'ControlError',
      409,
      'export_failed',
      "checkpoint 'a' cannot be committed (export failed: disk gone); resume, then prepare again under a new checkpoint ID",
    ])
    expect(calls).toBe(1)
  })

  it('a commit without a scope keeps restored state (nothing is cut to a scope)', async () => {
    const {p, cp} = make({}, 'agent')
    session(p, 'r-a1', true)
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const r = await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: await tempDir()})
    expect(r.phase).toBe('committed')
    expect([...p.sessions.keys()]).toEqual(['r-a1'])
  })

  it('a record that cannot be encoded fails the write, naming its episode', async () => {
    const {p, cp} = make({}, 'agent')
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    p.exportRecords = () => [{episode: {rolloutId: 'bad', attempt: 2}, record: new Map([['f', (() => 1) as never]])}]
    const err = await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: await tempDir()}).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(CheckpointStateError)
    expect((err as Error).message).toBe("checkpoint record of episode 'bad-a2' cannot be written: a function is not JSON-representable")
  })

  it('a restore whose participant cannot close admission reopens it and fails', async () => {
    const {p, cp} = make()
    const dir = await tempDir()
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'm', checkpointId: 'src'}, [])
    let opened = 0
    const open = p.openAdmission.bind(p)
    p.openAdmission = () => {
      opened++
      open()
    }
    p.closeAdmission = () => {
      throw new Error('cannot close')
    }
    await expect(cp.restore({checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: []})).rejects.toThrow('cannot close')
    expect([opened, cp.phase, cp.checkpointId]).toEqual([1, 'idle', null])
  })
})

describe('resume and retire, more', () => {
  it('resuming an ID already resumed is idempotent even while another checkpoint is open', async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    await cp.prepare({checkpoint_id: 'b', deadline_ts: soon()})
    expect(await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})).toEqual({phase: 'idle', idempotent: true})
    expect([cp.phase, cp.checkpointId]).toEqual(['prepared', 'b'])
  })

  it('a retire naming attempts highest first still stops the rollout through its highest', async () => {
    const {p, cp} = make()
    session(p, 'x-a1')
    session(p, 'x-a2')
    const r = await cp.retire({
      checkpoint_id: 'r',
      deadline_ts: soon(),
      episode_ids: [
        {rollout_id: 'x', attempt: 2},
        {rollout_id: 'x', attempt: 1},
      ],
    })
    expect(r).toEqual({retired_count: 2})
    expect([...p.sessions.keys()]).toEqual([])
    expect(cp.retired.get('x')).toBe(2)
  })

  it('a retire or forget whose deadline is this very millisecond is refused', async () => {
    const {cp} = make()
    const now = 1_900_000_000_000
    vi.useFakeTimers({toFake: ['Date']})
    vi.setSystemTime(now)
    try {
      expect(await refusal(cp.forget({checkpoint_id: 'r', deadline_ts: now / 1000, rollout_ids: ['x']}))).toEqual(['ControlError', 409, 'deadline_exceeded', 'forget deadline passed'])
      expect(await refusal(cp.retire({checkpoint_id: 'r', deadline_ts: now / 1000, episode_ids: [{rollout_id: 'x', attempt: 0}]}))).toEqual([
        'ControlError',
        409,
        'deadline_exceeded',
        'retire deadline passed before its episodes were stopped',
      ])
    } finally {
      vi.useRealTimers()
    }
  })
})

describe('what wakes a waiting prepare at once', () => {
  // Without a wake-up a waiting prepare looks again after at most a second; each of these answers
  // well before that.
  it('close() ends the wait: the prepare replies preparing', async () => {
    const {p, cp} = make()
    p.stuckBlockers = ['b']
    const t0 = Date.now()
    const pending = cp.prepare({checkpoint_id: 'a', deadline_ts: soon(5)})
    setTimeout(() => cp.close(), 50)
    expect((await pending).phase).toBe('preparing')
    expect(Date.now() - t0).toBeLessThan(900)
  })

  it('a change of the participant: the prepare replies prepared', async () => {
    const {p, cp} = make()
    p.stuckBlockers = ['b']
    setTimeout(() => {
      p.stuckBlockers = []
      p.openAdmission()
      p.closeAdmission()
    }, 50)
    const t0 = Date.now()
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(5)})).phase).toBe('prepared')
    expect(Date.now() - t0).toBeLessThan(900)
  })

  it('a resume: the prepare replies idle', async () => {
    const {p, cp} = make()
    p.stuckBlockers = ['b']
    const t0 = Date.now()
    const pending = cp.prepare({checkpoint_id: 'a', deadline_ts: soon(5)})
    setTimeout(() => void cp.resume({checkpoint_id: 'a', deadline_ts: soon()}), 50)
    expect((await pending).phase).toBe('idle')
    expect(Date.now() - t0).toBeLessThan(900)
  })

  it('its deadline: a prepare never waits past it', async () => {
    const {p, cp} = make()
    p.stuckBlockers = ['b']
    const t0 = Date.now()
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(0.3)})).phase).toBe('preparing')
    expect(Date.now() - t0).toBeLessThan(900)
  })
})

describe('restored state still being deleted', () => {
  /** A plane whose commit hangs in deleting restored state until `release()`. */
  async function deleting(opts: ControlPlaneOptions = {}) {
    const {p, cp} = make(opts)
    let release!: () => void
    let called!: () => void
    const started = new Promise<void>((r) => (called = r))
    p.deleteRestored = () => {
      called()
      return new Promise<void>((r) => (release = r))
    }
    session(p, 'x-a1', true)
    return {p, cp, started, release: () => release()}
  }

  it('a resume that outlives the deletion says so', async () => {
    const {cp, started, release} = await deleting()
    await cp.prepare({checkpoint_id: 'c', deadline_ts: soon()})
    const commit = cp.commit({checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: await tempDir(), episode_ids: []})
    await started
    expect(await refusal(cp.resume({checkpoint_id: 'c', deadline_ts: Date.now() / 1000 + 0.1}))).toEqual([
      'ControlError',
      409,
      'deadline_exceeded',
      'restored state is still being deleted; resume again',
    ])
    release()
    expect((await commit).phase).toBe('committed')
    await cp.resume({checkpoint_id: 'c', deadline_ts: soon()})
  })

  it('a lease that expires during the deletion waits for it (up to the retry period), then resumes', async () => {
    const logs: string[] = []
    const {cp, started, release} = await deleting({leaseGraceSeconds: 0, leaseRetryMs: 5000, log: (m) => logs.push(m)})
    await cp.prepare({checkpoint_id: 'c', deadline_ts: soon(0.2)})
    // The commit's deadline (and so the lease) ends while the deletion hangs.
    const commit = cp.commit({checkpoint_id: 'c', deadline_ts: Date.now() / 1000 + 0.3, checkpoint_dir: await tempDir(), episode_ids: []}).catch((e: unknown) => e)
    await started
    await new Promise((r) => setTimeout(r, 500))
    release()
    await commit
    for (let i = 0; i < 50 && cp.phase !== 'idle'; i++) await new Promise((r) => setTimeout(r, 20))
    expect(cp.phase).toBe('idle')
    expect(logs).toEqual(["lease expired in phase prepared; resuming checkpoint 'c'"])
  })
})
