import {fromCaptureKey} from '../protocol/episode.js'

/** A FIFO async mutex: the control plane serialises every transition through one. */
export class Mutex {
  private tail: Promise<void> = Promise.resolve()

  run<T>(fn: () => Promise<T> | T): Promise<T> {
    const result = this.tail.then(fn)
    this.tail = result.then(
      () => {},
      () => {},
    )
    return result
  }
}

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason)
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    const onAbort = () => {
      clearTimeout(t)
      reject(signal!.reason)
    }
    signal?.addEventListener('abort', onAbort, {once: true})
  })
}

/** Resolves to 'timeout' once `deadlineMs` (epoch ms) passes, unless `p` settles first. */
export async function raceDeadline<T>(p: Promise<T>, deadlineMs: number): Promise<{value: T} | 'timeout'> {
  if (deadlineMs - Date.now() <= 0) {
    // Lost before it started: what `p` does later (a rejection included) is nobody's concern.
    p.catch(() => {})
    return 'timeout'
  }
  let timer: NodeJS.Timeout | undefined
  // A timer holds at most 2^31 - 1 ms (~24.8 days; Node fires a longer one after 1 ms): a deadline
  // further away is waited for in steps.
  const expiry = new Promise<'timeout'>((r) => {
    const arm = () => {
      const left = deadlineMs - Date.now()
      if (left <= 0) r('timeout')
      else timer = setTimeout(arm, Math.min(left, 2 ** 31 - 1))
    }
    arm()
  })
  try {
    return await Promise.race([p.then((value) => ({value})), expiry])
  } finally {
    clearTimeout(timer)
  }
}

/** A set of waiters woken on every change; `wait` resolves at the next change or after `ms`. */
export class Notifier {
  private waiters = new Set<() => void>()
  notify(): void {
    const w = [...this.waiters]
    this.waiters.clear()
    for (const f of w) f()
  }
  wait(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t)
        this.waiters.delete(done)
        resolve()
      }
      const t = setTimeout(done, Math.max(0, ms))
      this.waiters.add(done)
    })
  }
}

/**
 * A Map keyed by capture key that also finds every key of one rollout, so that retiring a batch
 * costs the episodes it names, not every episode held for each one (O(held × retired) before:
 * 44 s to retire 10,000 of 10,000).
 */
export class RolloutMap<V> extends Map<string, V> {
  private readonly byRollout = new Map<string, Set<string>>()

  /** Empty: Map's constructor would call set() before byRollout exists. */
  constructor() {
    super()
  }

  override set(key: string, value: V): this {
    if (!super.has(key)) {
      const r = rolloutOfKey(key)
      let keys = this.byRollout.get(r)
      if (!keys) this.byRollout.set(r, (keys = new Set()))
      keys.add(key)
    }
    return super.set(key, value)
  }

  override delete(key: string): boolean {
    if (!super.delete(key)) return false
    const r = rolloutOfKey(key)
    const keys = this.byRollout.get(r)
    keys?.delete(key)
    if (keys?.size === 0) this.byRollout.delete(r)
    return true
  }

  override clear(): void {
    super.clear()
    this.byRollout.clear()
  }

  /** The keys held of this rollout's episodes (a copy: entries may be deleted while it is read). */
  keysOf(rolloutId: string): string[] {
    const keys = this.byRollout.get(rolloutId)
    return keys ? [...keys] : []
  }
}

function rolloutOfKey(key: string): string {
  try {
    return fromCaptureKey(key).rolloutId
  } catch {
    return key
  }
}
