// The participant double's phase machine (src/control-plane/control-plane.ts), third round (issue
// 12): the mutants the run of 2026-12-04 left "not killed yet". Each needs an exact order of steps
// or an exact clock: the lease timer (fake timers: a lease longer than a timer holds, an expiry to
// the millisecond, no timer after close), a waiting prepare woken only after its checkpoint moved on
// (its wait is held by the test, so nothing else can wake it first), and a commit's write in flight
// when a retry or a resume arrives (both queued on the lock before any of the write's I/O returns).
import {readdir} from 'node:fs/promises'
import path from 'node:path'

import {afterEach, describe, expect, it, vi} from 'vitest'

import {ControlError, ControlPlane, ControlPlaneOptions} from '../../src/control-plane/control-plane.js'
import {SimDownstream} from '../../src/control-plane/sim.js'
import {tempDir} from '../helpers/tmp.js'

const planes: ControlPlane[] = []
afterEach(() => {
  vi.useRealTimers()
  vi.restoreAllMocks()
  for (const cp of planes.splice(0)) cp.close()
})

const soon = (s = 10) => Date.now() / 1000 + s

function make(opts: ControlPlaneOptions = {}, kind: 'model' | 'agent' = 'agent') {
  const p = new SimDownstream(kind, 'm')
  const cp = new ControlPlane(p, opts)
  p.attach(cp)
  planes.push(cp)
  return {p, cp}
}

/**
 * Gives `p` a restored session x-a1 no replacement claimed, whose deletion (the commit's cleanup
 * of unscoped restored state) blocks: `started` once it began, `release()` lets it end.
 */
function blockedCleanup(p: SimDownstream): {started: Promise<void>; release: () => void} {
  let done!: () => void
  let called!: () => void
  const started = new Promise<void>((r) => (called = r))
  p.deleteRestored = () => {
    called()
    return new Promise<void>((r) => (done = r))
  }
  p.sessions.set('x-a1', {ep: {rolloutId: 'x', attempt: 1}, chain: 'c', calls: 1, restart: false, restored: true})
  return {started, release: () => done()}
}

function session(p: SimDownstream, key: string) {
  const [rolloutId, a] = key.includes('-a') ? [key.split('-a')[0]!, Number(key.split('-a')[1])] : [key, 0]
  p.sessions.set(key, {ep: {rolloutId, attempt: a}, chain: `chain-${key}`, calls: 1, restart: false, restored: false})
}

/** Settles `p` or gives up after `ms` (a bound far from both outcomes: at once, or never before a 60 s deadline). */
async function within<T>(p: Promise<T>, ms = 3000): Promise<{value: T} | 'pending'> {
  let timer: NodeJS.Timeout | undefined
  const bound = new Promise<'pending'>((r) => (timer = setTimeout(() => r('pending'), ms)))
  try {
    return await Promise.race([p.then((value) => ({value})), bound])
  } finally {
    clearTimeout(timer)
  }
}

const DAY_MS = 86_400_000
const TIMER_MAX = 2 ** 31 - 1
/** A whole second, so that `leaseExpiresAt * 1000` is an exact millisecond. */
const NOW = 1_900_000_000_000

describe('the lease timer, on a fake clock', () => {
  function fakeClock() {
    vi.useFakeTimers({toFake: ['setTimeout', 'clearTimeout', 'Date']})
    vi.setSystemTime(NOW)
  }

  it('a lease longer than a timer holds is checked at 2^31-1 ms, kept, and expires at its exact millisecond', async () => {
    fakeClock()
    const logs: string[] = []
    const {cp} = make({leaseGraceSeconds: 30 * 86_400, log: (m) => logs.push(m)})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: NOW / 1000 + 10})
    const expiry = NOW + 10_000 + 30 * DAY_MS
    expect([cp.phase, cp.leaseExpiresAt! * 1000]).toEqual(['prepared', expiry])
    // The one timer is the lease's, at what a timer holds: not sooner (no busy polling).
    expect(vi.getTimerCount()).toBe(1)
    await vi.advanceTimersToNextTimerAsync()
    expect(Date.now() - NOW).toBe(TIMER_MAX)
    // Checked before expiry: the lease is kept and timed again for what is left.
    expect([cp.phase, cp.checkpointId, logs]).toEqual(['prepared', 'a', []])
    await vi.advanceTimersByTimeAsync(expiry - 1 - Date.now())
    expect([cp.phase, logs]).toEqual(['prepared', []])
    // Its very millisecond: expired then, not one later.
    await vi.advanceTimersByTimeAsync(1)
    expect(Date.now()).toBe(expiry)
    expect([cp.phase, cp.checkpointId, logs]).toEqual(['idle', null, ["lease expired in phase prepared; resuming checkpoint 'a'"]])
  })

  it('a short lease: one timer, at its expiry', async () => {
    fakeClock()
    const {cp} = make({leaseGraceSeconds: 5})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: NOW / 1000 + 1})
    await vi.advanceTimersToNextTimerAsync()
    expect(Date.now() - NOW).toBe(6000)
    expect(cp.phase).toBe('idle')
  })

  it('no lease timer is armed once the plane is closed', async () => {
    fakeClock()
    const {cp} = make()
    cp.close()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: NOW / 1000 + 10})
    expect(cp.leaseExpiresAt).toBe(NOW / 1000 + 610)
    expect(vi.getTimerCount()).toBe(0)
  })
})

describe('the lease timer, on the real clock', () => {
  it('does not keep the process alive (it is unref()ed)', async () => {
    const spy = vi.spyOn(globalThis, 'setTimeout')
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    expect(cp.phase).toBe('prepared')
    const timers = spy.mock.results.map((r) => r.value as NodeJS.Timeout)
    expect(timers.length).toBe(1)
    expect(timers[0]!.hasRef()).toBe(false)
  })

  it('an expiry that waited for the lock behind the resume of its checkpoint does nothing', async () => {
    const logs: string[] = []
    const {p, cp} = make({leaseGraceSeconds: 0, log: (m) => logs.push(m)})
    const {started, release} = blockedCleanup(p)
    const checks = vi.spyOn(cp as unknown as {leaseCheck: () => Promise<void>}, 'leaseCheck')
    const dir = await tempDir()
    await cp.prepare({checkpoint_id: 'c', deadline_ts: soon(0.5)})
    const commit = cp.commit({checkpoint_id: 'c', deadline_ts: soon(0.6), checkpoint_dir: dir, episode_ids: []}).catch((e: unknown) => e)
    await started
    // The resume holds the lock while the deletion hangs; the lease (grace 0) expires meanwhile, and
    // its check queues on the lock behind the resume.
    const resume = cp.resume({checkpoint_id: 'c', deadline_ts: soon(30)})
    // Expired and waiting for the lock: checked at or after the expiry (a timer that fires a
    // millisecond early is timed again first), and no timer armed.
    const waiting = () => checks.mock.calls.length > 0 && cp['leaseTimer'] === null && Date.now() >= cp.leaseExpiresAt! * 1000
    for (let i = 0; i < 250 && !waiting(); i++) await new Promise((r) => setTimeout(r, 20))
    expect(waiting()).toBe(true)
    release()
    expect(await resume).toEqual({phase: 'idle', idempotent: false})
    await commit
    await checks.mock.results.at(-1)!.value
    // The checkpoint it was armed for is gone: no second reopen, nothing logged.
    expect(logs).toEqual([])
    expect([cp.phase, cp.checkpointId]).toEqual(['idle', null])
  })
})

/**
 * Holds every wait of a waiting prepare until the test releases it: nothing (no resume, no other
 * prepare) can wake it before the test has moved the checkpoint on.
 */
function holdWaits(cp: ControlPlane) {
  const held: (() => void)[] = []
  cp['changes'].wait = () => new Promise<void>((r) => held.push(r))
  return {
    get count() {
      return held.length
    },
    release(i: number) {
      held[i]!()
    },
  }
}

async function until(cond: () => boolean) {
  for (let i = 0; i < 250 && !cond(); i++) await new Promise((r) => setTimeout(r, 5))
  expect(cond()).toBe(true)
}

describe('a waiting prepare woken after its checkpoint moved on', () => {
  it('resumed, and another checkpoint preparing: it replies idle at once and leaves the other one alone', async () => {
    const {p, cp} = make()
    const waits = holdWaits(cp)
    p.stuckBlockers = ['b']
    const a = cp.prepare({checkpoint_id: 'a', deadline_ts: soon(60)})
    await until(() => waits.count === 1)
    expect(await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})).toEqual({phase: 'idle', idempotent: false})
    const b = cp.prepare({checkpoint_id: 'b', deadline_ts: soon(60)})
    await until(() => waits.count === 2)
    expect([cp.phase, cp.checkpointId]).toEqual(['preparing', 'b'])
    waits.release(0)
    const r = await within(a)
    expect(r).toEqual({value: {phase: 'idle', report: expect.objectContaining({ready: false, blockers: ['b']})}})
    // It waited no further, and b is untouched.
    expect(waits.count).toBe(2)
    expect([cp.phase, cp.checkpointId]).toEqual(['preparing', 'b'])
    p.stuckBlockers = []
    waits.release(1)
    expect((await b).phase).toBe('prepared')
  })

  it('resumed, and another checkpoint preparing that is now ready: it does not prepare the other one', async () => {
    const {p, cp} = make()
    const waits = holdWaits(cp)
    p.stuckBlockers = ['b']
    const a = cp.prepare({checkpoint_id: 'a', deadline_ts: soon(60)})
    await until(() => waits.count === 1)
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    const b = cp.prepare({checkpoint_id: 'b', deadline_ts: soon(60)})
    await until(() => waits.count === 2)
    // Ready now, but b's own prepare has not looked yet (its wait is held too).
    p.stuckBlockers = []
    waits.release(0)
    expect(await within(a)).toEqual({value: {phase: 'idle', report: expect.objectContaining({ready: true})}})
    expect([cp.phase, cp.checkpointId]).toEqual(['preparing', 'b'])
    waits.release(1)
    expect((await b).phase).toBe('prepared')
    expect(cp.phase).toBe('prepared')
  })

  it('prepared by a second prepare and committed meanwhile: it replies committed and keeps that phase', async () => {
    const {p, cp} = make()
    const waits = holdWaits(cp)
    p.stuckBlockers = ['b']
    const a = cp.prepare({checkpoint_id: 'a', deadline_ts: soon(60)})
    await until(() => waits.count === 1)
    p.stuckBlockers = []
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(60)})).phase).toBe('prepared')
    expect((await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: await tempDir()})).phase).toBe('committed')
    waits.release(0)
    expect(await within(a)).toEqual({value: {phase: 'committed', report: expect.objectContaining({ready: true})}})
    expect([cp.phase, cp.checkpointId, waits.count]).toEqual(['committed', 'a', 1])
  })

  it('committed meanwhile and no longer ready: it replies committed at once, without waiting again', async () => {
    const {p, cp} = make()
    const waits = holdWaits(cp)
    p.stuckBlockers = ['b']
    const a = cp.prepare({checkpoint_id: 'a', deadline_ts: soon(60)})
    await until(() => waits.count === 1)
    p.stuckBlockers = []
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon(60)})
    await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: await tempDir()})
    p.stuckBlockers = ['late']
    waits.release(0)
    expect(await within(a)).toEqual({value: {phase: 'committed', report: expect.objectContaining({ready: false, blockers: ['late']})}})
    expect(waits.count).toBe(1)
  })
})

describe("a commit's write in flight", () => {
  it('a retry with the same arguments joins the write instead of starting a second one', async () => {
    const {p, cp} = make()
    session(p, 'x')
    let cuts = 0
    const restoredKeys = p.restoredKeys.bind(p)
    p.restoredKeys = () => {
      cuts++
      return restoredKeys()
    }
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    const req = {checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [{rollout_id: 'x', attempt: 0}]}
    // Both are queued on the lock before any of the first write's I/O can return.
    const first = cp.commit(req)
    const retry = cp.commit(req)
    const [r1, r2] = await Promise.all([first, retry])
    expect([r1.phase, r2.phase, r2.manifest]).toEqual(['committed', 'committed', r1.manifest])
    // One write: its restored-state cut ran once.
    expect(cuts).toBe(1)
  })

  it('a resume stops it: nothing is published', async () => {
    const {p, cp} = make()
    for (let i = 0; i < 20; i++) session(p, `r${i}`)
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    const commit = cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir}).catch((e: unknown) => e)
    // Queued on the lock right behind the commit's admission, before the write's first I/O returns.
    expect(await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})).toEqual({phase: 'idle', idempotent: false})
    const err = await commit
    expect(err).not.toBeInstanceOf(ControlError)
    expect((err as Error).name).toBe('WriteStoppedError')
    const left = await readdir(path.join(dir, 'gym', 'agent', 'm')).catch(() => [])
    expect(left.filter((f) => f === 'manifest.json' || f.startsWith('records-'))).toEqual([])
  })
})

describe('three listed as equivalent before, told apart here', () => {
  it('a prepare whose deadline is this very millisecond does not wait (not even 0 ms)', async () => {
    vi.useFakeTimers({toFake: ['Date']})
    vi.setSystemTime(NOW)
    const {p, cp} = make()
    const waits = holdWaits(cp)
    p.stuckBlockers = ['b']
    expect(await within(cp.prepare({checkpoint_id: 'a', deadline_ts: NOW / 1000}))).toEqual({value: {phase: 'preparing', report: expect.objectContaining({ready: false})}})
    expect(waits.count).toBe(0)
  })

  it('a commit whose scope drops no restored state does not call deleteRestored', async () => {
    const {p, cp} = make()
    session(p, 'x')
    p.sessions.set('y-a1', {ep: {rolloutId: 'y', attempt: 1}, chain: 'c', calls: 1, restart: false, restored: true})
    const deleted: string[][] = []
    p.deleteRestored = async (keys) => void deleted.push(keys)
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const episode_ids = [
      {rollout_id: 'x', attempt: 0},
      {rollout_id: 'y', attempt: 1},
    ]
    expect((await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: await tempDir(), episode_ids})).phase).toBe('committed')
    expect(deleted).toEqual([])
  })

  it('a resume wakes a waiting prepare itself, even when the participant reports no change', async () => {
    // Only the timers are fake: a prepare not woken waits for a 1 s timer that never fires here.
    vi.useFakeTimers({toFake: ['setTimeout', 'clearTimeout']})
    const p = new SimDownstream('agent', 'm')
    p.onChange = () => {}
    const cp = new ControlPlane(p)
    p.attach(cp)
    planes.push(cp)
    p.stuckBlockers = ['b']
    let reply: unknown
    const a = cp.prepare({checkpoint_id: 'a', deadline_ts: soon(60)}).then((r) => (reply = r))
    for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r))
    expect(reply).toBeUndefined()
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    for (let i = 0; i < 10 && reply === undefined; i++) await new Promise((r) => setImmediate(r))
    expect(reply).toEqual({phase: 'idle', report: expect.objectContaining({ready: false})})
    await a
  })
})

describe('a lease expiry whose reopen outlives its retry period', () => {
  it('gives up after leaseRetryMs (not days), logs it, and resumes on a later try', async () => {
    const logs: string[] = []
    const {p, cp} = make({leaseGraceSeconds: 0, leaseRetryMs: 200, log: (m) => logs.push(m)})
    const {started, release} = blockedCleanup(p)
    const dir = await tempDir()
    await cp.prepare({checkpoint_id: 'c', deadline_ts: soon(0.5)})
    const commit = cp.commit({checkpoint_id: 'c', deadline_ts: soon(0.6), checkpoint_dir: dir, episode_ids: []}).catch((e: unknown) => e)
    await started
    // The deletion hangs past the lease (grace 0): the reopen waits for it only 200 ms.
    for (let i = 0; i < 250 && logs.length < 2; i++) await new Promise((r) => setTimeout(r, 20))
    expect(logs.slice(0, 2)).toEqual([
      "lease expired in phase prepared; resuming checkpoint 'c'",
      "lease reopen of 'c' failed (restored state is still being deleted; resume again); retrying in 200 ms",
    ])
    expect(cp.phase).toBe('prepared')
    release()
    await commit
    for (let i = 0; i < 250 && cp.phase !== 'idle'; i++) await new Promise((r) => setTimeout(r, 20))
    expect([cp.phase, cp.checkpointId]).toEqual(['idle', null])
  })
})

describe('an ID whose fence was dropped (more IDs resumed since than resumedIdsKept)', () => {
  it('is admitted again and commits afresh: the job of its first life is gone', async () => {
    const {cp} = make({resumedIdsKept: 1})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    expect((await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: await tempDir()})).phase).toBe('committed')
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    // Fencing 'b' drops the fence of 'a'.
    await cp.resume({checkpoint_id: 'b', deadline_ts: soon()})
    expect((await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})).phase).toBe('prepared')
    const dir = await tempDir()
    expect((await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir})).phase).toBe('committed')
    expect(await readdir(path.join(dir, 'gym', 'agent', 'm'))).toContain('manifest.json')
  })

  it('is admitted again and commits: the export failure of its first life is gone', async () => {
    const {p, cp} = make({resumedIdsKept: 1})
    const exportRecords = p.exportRecords.bind(p)
    let calls = 0
    p.exportRecords = (scope) => {
      if (calls++ === 0) throw new Error('disk gone')
      return exportRecords(scope)
    }
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    await expect(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir})).rejects.toThrow('export failed: disk gone')
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    await cp.resume({checkpoint_id: 'b', deadline_ts: soon()})
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    expect((await cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir})).phase).toBe('committed')
  })
})
