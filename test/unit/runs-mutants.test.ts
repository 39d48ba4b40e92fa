// The run tracker and the ID makers of src/coordination/runs.ts, pinned down for the mutants the
// integration tests leave alive: exact IDs, which episodes are candidates, and how the wait for
// /run replies wakes, gives up and cleans up (fake timers: nothing here waits for real time).
import {getEventListeners} from 'node:events'

import {afterEach, describe, expect, it, vi} from 'vitest'

import {ControllerError} from '../../src/coordination/errors.js'
import {RunTracker, newCheckpointId, newRestoreId} from '../../src/coordination/runs.js'
import {EpisodeId} from '../../src/protocol/episode.js'

/** A /run call the test settles by hand. */
function pendingRun(): {run: Promise<string>; reply: (v: string) => void; fail: (e: Error) => void} {
  let reply!: (v: string) => void
  let fail!: (e: Error) => void
  const run = new Promise<string>((res, rej) => {
    reply = res
    fail = rej
  })
  return {run, reply, fail}
}

/** Lets every settled promise run its callbacks (no timer is advanced). */
async function flush(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve()
}

/** The state of a promise after the microtasks ran. */
async function settled<T>(p: Promise<T>): Promise<{state: 'pending'} | {state: 'fulfilled'; value: T} | {state: 'rejected'; reason: unknown}> {
  let out: {state: 'pending'} | {state: 'fulfilled'; value: T} | {state: 'rejected'; reason: unknown} = {state: 'pending'}
  p.then(
    (value) => (out = {state: 'fulfilled', value}),
    (reason: unknown) => (out = {state: 'rejected', reason}),
  )
  await flush()
  return out
}

const ep = (rolloutId: string, attempt = 0): EpisodeId => ({rolloutId, attempt})

afterEach(() => {
  vi.useRealTimers()
})

describe('newCheckpointId and newRestoreId', () => {
  it('a checkpoint ID is the UTC time to the second, without separators, and 8 hex digits', () => {
    const id = newCheckpointId(new Date('2026-12-04T09:08:07.654Z'))
    expect(id).toMatch(/^ckpt-20261204T090807-[0-9a-f]{8}$/)
    expect(newCheckpointId(new Date('2026-12-04T09:08:07.654Z'))).not.toBe(id)
  })

  it('without a time, the ID is of now', () => {
    vi.useFakeTimers({now: new Date('2031-01-02T03:04:05.006Z')})
    expect(newCheckpointId()).toMatch(/^ckpt-20310102T030405-[0-9a-f]{8}$/)
  })

  it('a restore ID is 12 hex digits', () => {
    const id = newRestoreId()
    expect(id).toMatch(/^restore-[0-9a-f]{12}$/)
    expect(newRestoreId()).not.toBe(id)
  })
})

describe('RunTracker: outstanding and candidates', () => {
  it('track returns the run itself; a run is outstanding until it replies or fails', async () => {
    const t = new RunTracker()
    const a = pendingRun()
    const b = pendingRun()
    expect(t.track(ep('a'), a.run)).toBe(a.run)
    t.track(ep('b', 2), b.run)
    expect(t.outstanding()).toEqual([ep('a'), ep('b', 2)])
    a.reply('ok')
    await flush()
    expect(t.outstanding()).toEqual([ep('b', 2)])
    b.fail(new Error('refused'))
    await expect(b.run).rejects.toThrow('refused')
    await flush()
    expect(t.outstanding()).toEqual([])
    expect(t.candidates()).toEqual([])
  })

  it('a run tracked again under the same episode stays outstanding when the first one replies', async () => {
    const t = new RunTracker()
    const first = pendingRun()
    const second = pendingRun()
    t.track(ep('a', 1), first.run)
    t.track(ep('a', 1), second.run)
    first.reply('old')
    await flush()
    expect(t.outstanding()).toEqual([ep('a', 1)])
    second.reply('new')
    await flush()
    expect(t.outstanding()).toEqual([])
  })

  it('the first run of an episode tracked twice replying last is no error', async () => {
    const unhandled: unknown[] = []
    const seen = (reason: unknown) => unhandled.push(reason)
    process.on('unhandledRejection', seen)
    try {
      const t = new RunTracker()
      const first = pendingRun()
      const second = pendingRun()
      t.track(ep('a'), first.run)
      t.track(ep('a'), second.run)
      second.reply('new')
      await flush()
      first.reply('old')
      await flush()
      await new Promise((r) => setImmediate(r))
      expect(unhandled).toEqual([])
      expect(t.outstanding()).toEqual([])
    } finally {
      process.off('unhandledRejection', seen)
    }
  })

  it('restored episodes are candidates under their replacement attempt until their /run is sent', async () => {
    const t = new RunTracker()
    const x = pendingRun()
    t.track(ep('x'), x.run)
    t.noteRestored([ep('r', 3), ep('s', 1)])
    expect(t.outstanding()).toEqual([ep('x')])
    expect(t.candidates()).toEqual([ep('x'), ep('r', 3), ep('s', 1)])
    // The replacement /run of r is sent: r is a candidate as that run, and stays gone once it replies.
    const r = pendingRun()
    t.track(ep('r', 3), r.run)
    expect(t.candidates()).toEqual([ep('x'), ep('r', 3), ep('s', 1)])
    r.reply('done')
    await flush()
    expect(t.candidates()).toEqual([ep('x'), ep('s', 1)])
  })

  it('a restored rollout with a /run in flight is a candidate only as that run', () => {
    const t = new RunTracker()
    t.track(ep('r', 1), pendingRun().run)
    t.noteRestored([ep('r', 2)])
    expect(t.candidates()).toEqual([ep('r', 1)])
    expect(t.outstanding()).toEqual([ep('r', 1)])
  })
})

describe('RunTracker.waitForReplies', () => {
  it('returns at once the episodes it waited for: none when every run is excluded or none is out', async () => {
    const t = new RunTracker()
    expect(await t.waitForReplies(new Set(), Date.now() + 1000)).toEqual([])
    t.track(ep('a'), pendingRun().run)
    t.track(ep('b', 1), pendingRun().run)
    expect(await t.waitForReplies(new Set(['a', 'b-a1']), Date.now() + 1000)).toEqual([])
  })

  it('waits only for runs outside the excluded set, and names them in order', async () => {
    vi.useFakeTimers({now: 1_000_000})
    const t = new RunTracker()
    const a = pendingRun()
    const b = pendingRun()
    const c = pendingRun()
    t.track(ep('a'), a.run)
    t.track(ep('b', 1), b.run)
    t.track(ep('c'), c.run)
    const w = t.waitForReplies(new Set(['b-a1']), Date.now() + 5000)
    expect((await settled(w)).state).toBe('pending')
    c.reply('c')
    expect((await settled(w)).state).toBe('pending')
    // b is excluded: its reply is not waited for.
    a.reply('a')
    expect(await settled(w)).toEqual({state: 'fulfilled', value: [ep('a'), ep('c')]})
  })

  it('a reply wakes the wait at once, not at its next tick', async () => {
    vi.useFakeTimers({now: 1_000_000})
    const t = new RunTracker()
    const a = pendingRun()
    t.track(ep('a'), a.run)
    const w = t.waitForReplies(new Set(), Date.now() + 60_000)
    await vi.advanceTimersByTimeAsync(10)
    a.reply('a')
    expect(await settled(w)).toEqual({state: 'fulfilled', value: [ep('a')]})
    // The tick's timer was cleared, the waiter forgotten.
    expect(vi.getTimerCount()).toBe(0)
    expect((t as unknown as {waiters: Set<unknown>}).waiters.size).toBe(0)
  })

  it('a wait that ends by its tick forgets its waiter and clears no other', async () => {
    vi.useFakeTimers({now: 1_000_000})
    const t = new RunTracker()
    const a = pendingRun()
    t.track(ep('a'), a.run)
    const w = t.waitForReplies(new Set(), Date.now() + 2500)
    w.catch(() => {})
    await vi.advanceTimersByTimeAsync(1000)
    expect((t as unknown as {waiters: Set<unknown>}).waiters.size).toBe(1)
    expect(vi.getTimerCount()).toBe(1)
    await vi.advanceTimersByTimeAsync(1000)
    expect((t as unknown as {waiters: Set<unknown>}).waiters.size).toBe(1)
    await vi.advanceTimersByTimeAsync(500)
    expect((await settled(w)).state).toBe('rejected')
    expect((t as unknown as {waiters: Set<unknown>}).waiters.size).toBe(0)
    expect(vi.getTimerCount()).toBe(0)
  })

  it('checks at least every second, and gives up exactly at the deadline', async () => {
    vi.useFakeTimers({now: 1_000_000})
    const t = new RunTracker()
    t.track(ep('slow'), pendingRun().run)
    const w = t.waitForReplies(new Set(), Date.now() + 300)
    w.catch(() => {})
    await vi.advanceTimersByTimeAsync(299)
    expect((await settled(w)).state).toBe('pending')
    await vi.advanceTimersByTimeAsync(1)
    const out = await settled(w)
    expect(out.state).toBe('rejected')
    const err = (out as {reason: unknown}).reason
    expect(err).toBeInstanceOf(ControllerError)
    expect((err as ControllerError).code).toBe('participant')
    expect((err as ControllerError).message).toBe('1 /run call(s) outside the committed episodes did not reply before the deadline: slow')
  })

  it('a long deadline is reached by ticks of one second', async () => {
    vi.useFakeTimers({now: 1_000_000})
    const t = new RunTracker()
    t.track(ep('slow'), pendingRun().run)
    const w = t.waitForReplies(new Set(), Date.now() + 3000)
    w.catch(() => {})
    await vi.advanceTimersByTimeAsync(999)
    expect(vi.getTimerCount()).toBe(1)
    // The first tick is due in one second, not at the deadline.
    await vi.advanceTimersByTimeAsync(1)
    expect((t as unknown as {waiters: Set<unknown>}).waiters.size).toBe(1)
    expect(vi.getTimerCount()).toBe(1)
    await vi.advanceTimersByTimeAsync(2000)
    expect((await settled(w)).state).toBe('rejected')
  })

  it('a deadline already reached fails before any wait; the message names at most 10 runs', async () => {
    vi.useFakeTimers({now: 1_000_000})
    const t = new RunTracker()
    for (let i = 0; i < 12; i++) t.track(ep(`r${i}`, i % 2), pendingRun().run)
    const w = t.waitForReplies(new Set(['r0']), Date.now())
    const out = await settled(w)
    expect(out.state).toBe('rejected')
    const err = (out as {reason: unknown}).reason as ControllerError
    expect(err.code).toBe('participant')
    expect(err.message).toBe('11 /run call(s) outside the committed episodes did not reply before the deadline: r1-a1, r2, r3-a1, r4, r5-a1, r6, r7-a1, r8, r9-a1, r10')
    expect(vi.getTimerCount()).toBe(0)
  })

  it('a deadline in the past fails too', async () => {
    const t = new RunTracker()
    t.track(ep('a'), pendingRun().run)
    await expect(t.waitForReplies(new Set(), Date.now() - 1)).rejects.toThrow('1 /run call(s) outside the committed episodes did not reply before the deadline: a')
  })

  it('an abort wakes the wait at once and fails it as interrupted; its listener is removed', async () => {
    vi.useFakeTimers({now: 1_000_000})
    const t = new RunTracker()
    t.track(ep('a'), pendingRun().run)
    const ac = new AbortController()
    const w = t.waitForReplies(new Set(), Date.now() + 60_000, ac.signal)
    w.catch(() => {})
    await vi.advanceTimersByTimeAsync(1)
    expect(getEventListeners(ac.signal, 'abort')).toHaveLength(1)
    ac.abort()
    const out = await settled(w)
    expect(out.state).toBe('rejected')
    const err = (out as {reason: unknown}).reason as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.code).toBe('interrupted')
    expect(err.message).toBe('interrupted while waiting for /run replies')
    expect(getEventListeners(ac.signal, 'abort')).toHaveLength(0)
    expect(vi.getTimerCount()).toBe(0)
  })

  it('an aborted signal fails a wait that has runs to wait for, not one that has none', async () => {
    const t = new RunTracker()
    const ac = new AbortController()
    ac.abort()
    expect(await t.waitForReplies(new Set(), Date.now() + 1000, ac.signal)).toEqual([])
    t.track(ep('a'), pendingRun().run)
    await expect(t.waitForReplies(new Set(), Date.now() + 1000, ac.signal)).rejects.toMatchObject({code: 'interrupted'})
  })

  it('a wait woken by a reply removes its abort listener', async () => {
    vi.useFakeTimers({now: 1_000_000})
    const t = new RunTracker()
    const a = pendingRun()
    t.track(ep('a'), a.run)
    const ac = new AbortController()
    const w = t.waitForReplies(new Set(), Date.now() + 60_000, ac.signal)
    await flush()
    a.reply('a')
    expect(await settled(w)).toEqual({state: 'fulfilled', value: [ep('a')]})
    expect(getEventListeners(ac.signal, 'abort')).toHaveLength(0)
  })
})
