import {randomBytes} from 'node:crypto'

import {EpisodeId, captureKey} from '../protocol/episode.js'
import {ControllerError} from './errors.js'

export function newCheckpointId(now = new Date()): string {
  const ts = now
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, '')
  return `ckpt-${ts}-${randomBytes(4).toString('hex')}`
}

export function newRestoreId(): string {
  return `restore-${randomBytes(6).toString('hex')}`
}

/**
 * The controller's outstanding /run calls, and the restored episodes whose replacement /run has
 * not been sent yet: together, the candidates of a commit scope.
 */
export class RunTracker {
  private readonly runs = new Map<string, {episode: EpisodeId; done: Promise<unknown>}>()
  /** rollout -> replacement attempt, until its /run is sent. */
  private readonly restored = new Map<string, number>()
  private readonly waiters = new Set<() => void>()

  track<T>(episode: EpisodeId, run: Promise<T>): Promise<T> {
    const key = captureKey(episode)
    const done = run.then(
      () => {},
      () => {},
    )
    this.runs.set(key, {episode, done})
    this.restored.delete(episode.rolloutId)
    void done.then(() => {
      if (this.runs.get(key)?.done === done) this.runs.delete(key)
      for (const w of [...this.waiters]) w()
    })
    return run
  }

  noteRestored(replacements: EpisodeId[]): void {
    for (const e of replacements) this.restored.set(e.rolloutId, e.attempt)
  }

  outstanding(): EpisodeId[] {
    return [...this.runs.values()].map((r) => r.episode)
  }

  /** In-flight episodes plus restored-unclaimed ones (named by their replacement attempt). */
  candidates(): EpisodeId[] {
    const out = this.outstanding()
    const inFlight = new Set(out.map((e) => e.rolloutId))
    for (const [rolloutId, attempt] of this.restored) if (!inFlight.has(rolloutId)) out.push({rolloutId, attempt})
    return out
  }

  /**
   * Waits for every outstanding /run whose episode is neither in `exclude` (the committed episodes
   * and the restarts): its reply is already on the wire, since no participant holds it.
   */
  async waitForReplies(exclude: ReadonlySet<string>, deadlineMs: number, signal?: AbortSignal): Promise<EpisodeId[]> {
    const pending = () => [...this.runs.entries()].filter(([k]) => !exclude.has(k))
    const waited = pending().map(([, r]) => r.episode)
    for (;;) {
      const left = pending()
      if (left.length === 0) return waited
      if (signal?.aborted) throw new ControllerError('interrupted', 'interrupted while waiting for /run replies')
      const ms = deadlineMs - Date.now()
      if (ms <= 0) {
        throw new ControllerError(
          'participant',
          `${left.length} /run call(s) outside the committed episodes did not reply before the deadline: ${left
            .slice(0, 10)
            .map(([k]) => k)
            .join(', ')}`,
        )
      }
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(t)
          this.waiters.delete(wake)
          signal?.removeEventListener('abort', wake)
          resolve()
        }
        const t = setTimeout(wake, Math.min(ms, 1000))
        this.waiters.add(wake)
        signal?.addEventListener('abort', wake, {once: true})
      })
    }
  }
}
