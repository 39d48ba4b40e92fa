import {readFile, readdir, rm, stat} from 'node:fs/promises'
import path from 'node:path'
import {Agent, request} from 'undici'

import {EpisodeId, captureKey, fromWire} from '../protocol/episode.js'
import {COLLECTION_MANIFEST, CollectInputError, DispatchLog, PID_FILE, ResultsFile, Row, acquirePidLock, newRunId, readDispatchLog} from '../storage/collector.js'
import {applyPrune, planPrune} from '../storage/prune.js'
import {readCheckpointSummary, readLatest} from '../storage/root.js'
import {Log, checkpoint} from './controller.js'
import {ControllerError, CoordinationError} from './errors.js'
import {Coordinator, RETIRE_BATCH, forget, resume, retire} from './operations.js'
import {restoreCheckpoint} from './restore.js'
import {RunTracker} from './runs.js'

/** Gym's collector keeps the two newest published checkpoints. */
export const KEEP_CHECKPOINTS = 2
/** The deadline of a try to resume a checkpoint whose resume failed (seconds, at most --timeout). */
const RESUME_AGAIN_S = 30
/** The same at a stop or the end of the run, where waiting long holds the exit up. */
const LAST_RESUME_S = 5

export interface CollectOptions {
  rows: Row[]
  /** The collection root (absolute). */
  root: string
  output: ResultsFile
  /** Base URL of the server that takes /run. */
  runUrl: string
  concurrency: number
  /** Take a checkpoint this often (null: only on request). */
  checkpointEveryMs: number | null
  /** Seconds each checkpoint, restore, retire or forget may take. */
  timeoutS: number
  /** Failed /run calls a row may have before it counts as failed for good. */
  maxAttempts: number
  resume: boolean
  log: Log
  onProgress?: (s: CollectStats) => void
}

export interface CollectStats {
  total: number
  done: number
  failed: number
  inFlight: number
  queued: number
  /** /run calls that failed and were retired, then sent again as the next attempt. */
  retried: number
  checkpoints: number
  checkpointsMissed: number
  checkpointsFailed: number
  restores: number
  /** Restores sent on --resume that failed (their rows started over). */
  restoresFailed: number
  lastCheckpointId: string | null
  lastCheckpointAt: string | null
  /** How long dispatch was paused for each checkpoint taken, ms. */
  pausesMs: number[]
}

export interface CollectOutcome extends CollectStats {
  runId: string
  wallMs: number
  /** finished: every row done or failed; stopped: a stop request, after its checkpoint. */
  end: 'finished' | 'stopped'
  /** For a stop: whether its checkpoint was published. */
  stopCheckpointed: boolean
  failedRows: {rollout_id: string; attempts: number; error: string}[]
}

interface Pending {
  row: Row
  attempt: number
  /** Why its last /run failed (for a row waiting to be retired). */
  error?: string
}

/**
 * A rollout collection with partial-rollout checkpoints, as Gym's collector runs one: the
 * controller dispatches every /run itself, so it knows which episodes it continues. Each attempt
 * is logged before its /run is sent; a failed /run is never resent but retired everywhere and
 * sent again as the next attempt; checkpoints pause dispatch, prepare, wait only for /run replies
 * already on the wire, commit continued(in flight + restored-unclaimed), publish, and resume.
 */
export class Collector {
  private readonly tracker = new RunTracker()
  private readonly data: Agent
  private readonly queue: Pending[] = []
  /** rollout -> how many of its /run calls failed in this run. */
  private readonly failures = new Map<string, number>()
  private readonly toRetire: Pending[] = []
  private readonly retiredOrRestored = new Set<string>()
  private readonly toForget = new Set<string>()
  private readonly failedRows: CollectOutcome['failedRows'] = []
  private inFlight = 0
  private checkpointWanted = false
  /** The prune after the last checkpoint: it runs while rows are dispatched, never during a checkpoint. */
  private pruning: Promise<void> = Promise.resolve()
  private stopWanted = false
  private wake: () => void = () => {}
  /** The one timer that wakes the loop for a time-based retry, and the time it is set for. */
  private wakeTimer: NodeJS.Timeout | null = null
  private wakeTimerAt = Infinity
  /** A published checkpoint whose resume failed on some participant: resumed again, with backoff. */
  private unresumed: {id: string; retryAt: number; backoffMs: number} | null = null
  /** The try in flight to resume `unresumed` (it runs beside dispatch), and how to cut it short. */
  private resuming: {done: Promise<void>; abort: AbortController} | null = null
  /** What a try in the background raised (only an interrupt of the command): the loop raises it. */
  private resumeFailure: unknown = null
  private lastResumeTried = false
  /** /run refused with admission_closed (the fleet closed by someone else): no dispatch until then. */
  private admissionHoldUntil = 0
  private admissionBackoffMs = 0
  private readonly stats: CollectStats
  private log!: DispatchLog

  constructor(
    private readonly c: Coordinator,
    private readonly opts: CollectOptions,
  ) {
    this.data = new Agent({connections: opts.concurrency, headersTimeout: 0, bodyTimeout: 0, keepAliveTimeout: 30_000})
    this.stats = {
      total: opts.rows.length,
      done: 0,
      failed: 0,
      inFlight: 0,
      queued: 0,
      retried: 0,
      checkpoints: 0,
      checkpointsMissed: 0,
      checkpointsFailed: 0,
      restores: 0,
      restoresFailed: 0,
      lastCheckpointId: null,
      lastCheckpointAt: null,
      pausesMs: [],
    }
  }

  /** SIGUSR1: take a checkpoint as soon as possible and go on. */
  requestCheckpoint(): void {
    this.checkpointWanted = true
    this.wake()
  }

  /** SIGTERM (preemption): stop dispatching, take a checkpoint, and end. */
  requestStop(): void {
    this.stopWanted = true
    this.wake()
  }

  async run(): Promise<CollectOutcome> {
    const t0 = Date.now()
    const release = await acquirePidLock(this.opts.root).catch((err: unknown) => {
      throw err instanceof CollectInputError ? new ControllerError('input', err.message) : err
    })
    let timer: NodeJS.Timeout | null = null
    try {
      const carry = await this.plan()
      const runId = newRunId()
      this.log = await DispatchLog.create(this.opts.root, runId, carry)
      if (this.opts.checkpointEveryMs) {
        timer = setInterval(() => this.requestCheckpoint(), this.opts.checkpointEveryMs)
        timer.unref()
      }
      const end = await this.loop(runId)
      if (timer) clearInterval(timer)
      timer = null
      // A participant left closed by the last checkpoint's failed resume is not left so by the run.
      await this.lastResumeTry()
      if (end.end === 'finished') await this.forgetAll([...this.retiredOrRestored])
      return {...this.snapshot(), runId, wallMs: Date.now() - t0, ...end, failedRows: this.failedRows}
    } finally {
      if (timer) clearInterval(timer)
      if (this.wakeTimer) clearTimeout(this.wakeTimer)
      await this.pruning
      await this.log?.close()
      await this.opts.output.close()
      // Not close(): after a stop, /run calls are still parked on the fleet and would be awaited.
      await this.data.destroy().catch(() => {})
      await release()
    }
  }

  private snapshot(): CollectStats {
    return {...this.stats, inFlight: this.inFlight, queued: this.queue.length + this.toRetire.length, pausesMs: [...this.stats.pausesMs]}
  }

  private progress(): void {
    this.opts.onProgress?.(this.snapshot())
  }

  /**
   * Where the rows start: fresh at attempt 0; or, resuming, from the previous run's dispatch log
   * and LATEST. Returns the highest logged attempt of every unfinished rollout (the new log keeps
   * them, so no attempt number is ever used twice).
   */
  private async plan(): Promise<Map<string, number>> {
    const {rows, output, root} = this.opts
    const unfinished = rows.filter((r) => !output.done.has(r.rolloutId))
    this.stats.done = rows.length - unfinished.length
    const fresh = () => unfinished.forEach((row) => this.queue.push({row, attempt: 0}))
    if (!this.opts.resume) {
      if (await readDispatchLog(root)) throw new ControllerError('input', `${root} holds the dispatch log of an earlier run: pass --resume to continue it, or use another --root`)
      fresh()
      return new Map()
    }
    const prev = await readDispatchLog(root)
    if (!prev) {
      fresh()
      return new Map()
    }
    const logged = (r: string) => prev.attempts.get(r)
    const carry = new Map(unfinished.flatMap((r) => (logged(r.rolloutId) === undefined ? [] : [[r.rolloutId, logged(r.rolloutId)!] as [string, number]])))
    const latest = await readLatest(root)
    const latestRun = latest ? await collectionRunId(path.join(root, latest)) : null
    const byId = new Map(unfinished.map((r) => [r.rolloutId, r]))
    const restored = new Map<string, EpisodeId>()
    if (latest && latestRun === prev.runId) {
      // The crashed run published this checkpoint: restore what it continued, unless the row is
      // done or a later attempt of it was dispatched after the checkpoint (then it starts over).
      const summary = await readCheckpointSummary(path.join(root, latest))
      const continued = (summary?.continued ?? []).map(fromWire)
      const skip = new Set<string>()
      for (const e of continued) {
        if (byId.has(e.rolloutId) && (logged(e.rolloutId) ?? -1) <= e.attempt) restored.set(e.rolloutId, e)
        else skip.add(e.rolloutId)
      }
      const retireFirst = unfinished.filter((r) => !restored.has(r.rolloutId) && logged(r.rolloutId) !== undefined).map((r) => ({rolloutId: r.rolloutId, attempt: logged(r.rolloutId)!}))
      this.opts.log(`resuming run ${prev.runId}: restoring checkpoint '${latest}' (${restored.size} row(s) continue from it; ${retireFirst.length} start over)`)
      for (const e of retireFirst) this.retiredOrRestored.add(e.rolloutId)
      try {
        const r = await restoreCheckpoint(this.c, {location: root, checkpointId: latest, timeoutS: this.opts.timeoutS, skipRollouts: skip, retireFirst, log: this.opts.log})
        this.stats.restores++
        this.tracker.noteRestored(r.replacements)
        for (const e of r.replacements) {
          this.queue.push({row: byId.get(e.rolloutId)!, attempt: e.attempt})
          this.retiredOrRestored.add(e.rolloutId)
        }
        for (const e of r.restarted) this.retiredOrRestored.add(e.rolloutId)
      } catch (err) {
        // The restore was sent and failed: its cleanup retired the replacement attempts and
        // resumed the fleet. As Gym's collector does (reference 9.7 C.5), those rows start over
        // from input two attempts after the checkpointed one; the run goes on. A restore refused
        // before anything was sent (busy fleet, invalid checkpoint) still stops the command.
        if (!(err instanceof CoordinationError && err.operation === 'restore')) throw err
        this.stats.restoresFailed++
        this.opts.log(`restore of '${latest}' failed; its ${restored.size} row(s) start over from input: ${err.message}`)
        for (const e of restored.values()) {
          this.queue.push({row: byId.get(e.rolloutId)!, attempt: e.attempt + 2})
          this.retiredOrRestored.add(e.rolloutId)
        }
        restored.clear()
      }
    } else {
      // The crashed run never published a checkpoint of its own: every unfinished row starts
      // over, its logged attempt retired first so nothing of it can still write.
      const retireFirst = unfinished.filter((r) => logged(r.rolloutId) !== undefined).map((r) => ({rolloutId: r.rolloutId, attempt: logged(r.rolloutId)!}))
      this.opts.log(`resuming run ${prev.runId}: it published no checkpoint of its own; ${unfinished.length} unfinished row(s) start over`)
      if (retireFirst.length) await retire(this.c, 'retire', retireFirst, Date.now() / 1000 + this.opts.timeoutS)
      for (const e of retireFirst) this.retiredOrRestored.add(e.rolloutId)
    }
    const queued = new Set(this.queue.map((p) => p.row.rolloutId))
    for (const row of unfinished) {
      if (restored.has(row.rolloutId) || queued.has(row.rolloutId)) continue
      const last = logged(row.rolloutId)
      this.queue.push({row, attempt: last === undefined ? 0 : last + 1})
    }
    return carry
  }

  private async loop(runId: string): Promise<Pick<CollectOutcome, 'end' | 'stopCheckpointed'>> {
    for (;;) {
      const woken = new Promise<void>((r) => (this.wake = r))
      if (this.resumeFailure) throw this.resumeFailure
      if (this.unresumed && !this.resuming) {
        // Tried beside dispatch: a participant that hangs on resume must not hold the rows up.
        if (Date.now() >= this.unresumed.retryAt) this.resumeInBackground()
        else this.wakeAt(this.unresumed.retryAt)
      }
      if (this.stopWanted) {
        // Nothing left to run: the run is finished, not stopped (no --resume is needed).
        if (this.inFlight === 0 && this.queue.length === 0 && this.toRetire.length === 0) return {end: 'finished', stopCheckpointed: false}
        // A checkpoint left open by a failed resume would refuse the stop's checkpoint: one short
        // try to close it; if it stays open, the run stops on the checkpoint LATEST names.
        if (await this.lastResumeTry()) {
          this.opts.log(`stopping without a new checkpoint: checkpoint ${this.unresumed!.id} is still open on a participant (LATEST names it)`)
          return {end: 'stopped', stopCheckpointed: false}
        }
        return {end: 'stopped', stopCheckpointed: await this.takeCheckpoint(runId)}
      }
      if (this.checkpointWanted) {
        this.checkpointWanted = false
        if (this.unresumed) {
          // Its preflight would refuse it (another checkpoint is open); and no prepare goes out
          // beside a resume still in flight.
          this.stats.checkpointsFailed++
          this.opts.log(`checkpoint not taken: checkpoint ${this.unresumed.id} is not resumed on every participant yet; the run goes on from it`)
          this.progress()
        } else if (this.inFlight > 0 || this.tracker.candidates().length > 0) await this.takeCheckpoint(runId)
        continue
      }
      if (this.toRetire.length) {
        await this.retireFailed()
        continue
      }
      if (this.toForget.size) await this.forgetAll([...this.toForget])
      if (this.queue.length === 0 && this.inFlight === 0) return {end: 'finished', stopCheckpointed: false}
      await this.dispatch()
      this.progress()
      await woken
    }
  }

  /** Logs the next batch (one fsync), then sends its /run calls. */
  private async dispatch(): Promise<void> {
    if (Date.now() < this.admissionHoldUntil) {
      this.wakeAt(this.admissionHoldUntil)
      return
    }
    const batch = this.queue.splice(0, Math.max(0, this.opts.concurrency - this.inFlight))
    if (batch.length === 0) return
    await this.log.append(batch.map((p) => [p.row.rolloutId, p.attempt]))
    for (const p of batch) {
      this.inFlight++
      const e = {rolloutId: p.row.rolloutId, attempt: p.attempt}
      void this.tracker
        .track(e, this.send(p))
        .then(
          (r) => this.settled(p, r),
          (err: Error) => this.settled(p, {ok: false, resend: false, error: err.message}),
        )
        .catch((err: Error) => this.opts.log(`recording the result of ${captureKey(e)} failed: ${err.message}`))
    }
  }

  private async send(p: Pending): Promise<{ok: true; reply: Record<string, unknown>} | {ok: false; resend: boolean; error: string}> {
    let res
    let text: string
    try {
      res = await request(`${this.opts.runUrl.replace(/\/$/, '')}/run`, {
        method: 'POST',
        dispatcher: this.data,
        headers: {'content-type': 'application/json'},
        body: JSON.stringify({...p.row.body, _ng_attempt_index: p.attempt}),
      })
      text = await res.body.text()
    } catch (err) {
      // Never resent: the first request may still be running.
      return {ok: false, resend: false, error: `no reply: ${(err as Error).message}`}
    }
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      json = undefined
    }
    if (res.statusCode === 200 && json && typeof json === 'object' && !Array.isArray(json)) return {ok: true, reply: json as Record<string, unknown>}
    const code = (json as {error?: {code?: string}} | undefined)?.error?.code
    // Refused before it ran (a checkpoint another controller opened): the same attempt may go again.
    return {ok: false, resend: res.statusCode === 409 && code === 'admission_closed', error: `HTTP ${res.statusCode} ${code ?? ''} ${text.slice(0, 200)}`.trim()}
  }

  private async settled(p: Pending, r: Awaited<ReturnType<Collector['send']>>): Promise<void> {
    // Still in flight until its row is written: the run must not end (and close the output)
    // while the last rows' appends are pending.
    try {
      await this.record(p, r)
    } finally {
      this.inFlight--
      this.progress()
      this.wake()
    }
  }

  private async record(p: Pending, r: Awaited<ReturnType<Collector['send']>>): Promise<void> {
    const id = p.row.rolloutId
    if (r.ok) {
      this.admissionBackoffMs = 0
      try {
        await this.opts.output.append({...r.reply, _ng_rollout_id: id, _ng_attempt_index: p.attempt})
      } catch (err) {
        // Its result is lost: the row fails (named in the outcome), not vanishes from the counts;
        // it is not in the output, so --resume runs it again.
        const error = `writing its result to ${this.opts.output.file} failed: ${(err as Error).message}`
        this.opts.log(`/run of ${captureKey({rolloutId: id, attempt: p.attempt})} replied, but ${error}`)
        this.stats.failed++
        this.failedRows.push({rollout_id: id, attempts: (this.failures.get(id) ?? 0) + 1, error})
        if (!this.stopWanted) {
          // Every later result would be lost alike (a full or lost disk): no more rows are sent;
          // the run stops as on SIGTERM, with a checkpoint of the rows in flight.
          this.opts.log(`stopping: no more rows are sent while the output cannot be written; fix it, then run again with --resume`)
          this.stopWanted = true
        }
        return
      }
      this.stats.done++
      if (this.retiredOrRestored.has(id)) this.toForget.add(id)
    } else if (r.resend) {
      // Refused before it ran: sent again, first in line, once the fleet has had time to reopen
      // (100 ms, doubling to 5 s while refusals go on), not in a loop that logs each try.
      if (Date.now() >= this.admissionHoldUntil) {
        this.admissionBackoffMs = Math.min(Math.max(this.admissionBackoffMs * 2, 100), 5000)
        this.admissionHoldUntil = Date.now() + this.admissionBackoffMs
        this.wakeAt(this.admissionHoldUntil)
        this.opts.log(`/run of ${captureKey({rolloutId: id, attempt: p.attempt})} refused (admission closed): sending again in ${this.admissionBackoffMs} ms`)
      }
      this.queue.unshift(p)
    } else {
      this.opts.log(`/run of ${captureKey({rolloutId: id, attempt: p.attempt})} failed: ${r.error}`)
      this.toRetire.push({...p, error: r.error})
    }
  }

  /** Retires failed attempts everywhere (batched), then queues each as its next attempt. */
  private async retireFailed(): Promise<void> {
    const batch = this.toRetire.splice(0, RETIRE_BATCH)
    try {
      await retire(
        this.c,
        'retire',
        batch.map((p) => ({rolloutId: p.row.rolloutId, attempt: p.attempt})),
        Date.now() / 1000 + this.opts.timeoutS,
      )
    } catch (err) {
      this.opts.log(`retire of ${batch.length} failed attempt(s) failed, retrying in 1 s: ${(err as Error).message}`)
      this.toRetire.unshift(...batch)
      await new Promise((r) => setTimeout(r, 1000))
      return
    }
    for (const p of batch) {
      const id = p.row.rolloutId
      this.retiredOrRestored.add(id)
      const failed = (this.failures.get(id) ?? 0) + 1
      this.failures.set(id, failed)
      if (failed < this.opts.maxAttempts) {
        this.stats.retried++
        this.queue.push({row: p.row, attempt: p.attempt + 1})
      } else {
        this.stats.failed++
        this.failedRows.push({rollout_id: id, attempts: failed, error: p.error ?? 'failed'})
      }
    }
  }

  private async forgetAll(ids: string[]): Promise<void> {
    try {
      await forget(this.c, 'forget', ids, Date.now() / 1000 + this.opts.timeoutS)
      for (const id of ids) {
        this.toForget.delete(id)
        this.retiredOrRestored.delete(id)
      }
    } catch (err) {
      this.opts.log(`forget of ${ids.length} rollout(s) failed; will retry: ${(err as Error).message}`)
    }
  }

  /** One checkpoint with dispatch paused. A missed or failed one is logged and the run goes on. */
  private async takeCheckpoint(runId: string): Promise<boolean> {
    // The last prune removes partial checkpoint directories: it must be over before a new one is made.
    await this.pruning
    const t0 = Date.now()
    // Once LATEST names it, the checkpoint is taken, whatever fails after.
    const taken = async (id: string, what: string) => {
      await this.opts.output.sync().catch((err: Error) => this.opts.log(`syncing ${this.opts.output.file} after checkpoint ${id} failed: ${err.message}`))
      this.stats.checkpoints++
      this.stats.lastCheckpointId = id
      this.stats.lastCheckpointAt = new Date().toISOString()
      this.stats.pausesMs.push(Date.now() - t0)
      this.opts.log(`checkpoint ${id}: ${what} (${Date.now() - t0} ms)`)
      // Old checkpoints go while rows run on: removing hundreds of MB does not hold dispatch up.
      this.pruning = this.prune()
    }
    try {
      const out = await checkpoint(this.c, {root: this.opts.root, tracker: this.tracker, timeoutS: this.opts.timeoutS, collectionRunId: runId, log: this.opts.log})
      await taken(out.checkpointId, `${out.continued.length} continued, ${out.restarted.length} restarted`)
      return true
    } catch (err) {
      if (err instanceof ControllerError && err.code === 'interrupted') throw err
      // Published (LATEST names it), then resuming failed somewhere: the checkpoint was taken.
      if (err instanceof CoordinationError && err.published) {
        this.unresumed = {id: err.published.checkpointId, retryAt: Date.now() + 1000, backoffMs: 1000}
        this.wakeAt(this.unresumed.retryAt)
        await taken(err.published.checkpointId, `published, but ${err.message}`)
        return true
      }
      if (err instanceof ControllerError && err.code === 'not_prepared') this.stats.checkpointsMissed++
      else this.stats.checkpointsFailed++
      this.opts.log(`checkpoint not taken; the run goes on from the previous one: ${(err as Error).message}`)
      return false
    } finally {
      this.progress()
    }
  }

  /**
   * Wakes the loop at `at` (epoch ms) or later, to send what waits for that time. A timer can fire
   * before Date.now() reaches `at` (Node counts it from the event loop's cached time), so the loop
   * arms it again whenever it finds the time not yet come: with nothing in flight, nothing else
   * would wake it. One timer, kept at the earliest time asked for; it holds the process open.
   */
  private wakeAt(at: number): void {
    if (this.wakeTimer && this.wakeTimerAt <= at) return
    if (this.wakeTimer) clearTimeout(this.wakeTimer)
    this.wakeTimerAt = at
    this.wakeTimer = setTimeout(
      () => {
        this.wakeTimer = null
        this.wakeTimerAt = Infinity
        this.wake()
      },
      Math.max(0, at - Date.now()),
    )
  }

  /**
   * Resumes the checkpoint whose resume failed somewhere, on every participant (the ones already
   * resumed answer idempotent). Until it succeeds it is tried again, 1 s then doubling to 30 s,
   * beside dispatch (resumeInBackground: a participant that hangs does not hold the rows up), and
   * no checkpoint is taken meanwhile; a participant nobody reaches reopens by itself when its
   * lease expires. `cut` ends a try early (a stop); it then counts as a failed try.
   */
  private async resumeAgain(cut?: AbortSignal, deadlineS = RESUME_AGAIN_S): Promise<void> {
    const u = this.unresumed!
    const outer = this.c.signal
    const signal = cut && outer ? AbortSignal.any([outer, cut]) : (cut ?? outer)
    try {
      // A resume is quick where it is answered at all: a short deadline, not the run's --timeout.
      await resume({...this.c, signal}, u.id, Date.now() / 1000 + Math.min(this.opts.timeoutS, deadlineS))
      this.unresumed = null
      this.opts.log(`checkpoint ${u.id}: resumed on every participant`)
    } catch (err) {
      if (outer?.aborted) throw new ControllerError('interrupted', `interrupted while resuming checkpoint '${u.id}' again`)
      // Cut short by a stop, which makes its own last try next: no retry to announce.
      if (cut?.aborted) return void this.opts.log(`resuming checkpoint ${u.id} again: the try in flight was cut short by the end of the run`)
      u.backoffMs = Math.min(u.backoffMs * 2, 30_000)
      u.retryAt = Date.now() + u.backoffMs
      this.wakeAt(u.retryAt)
      this.opts.log(`resuming checkpoint ${u.id} again failed; next try in ${u.backoffMs / 1000} s: ${(err as Error).message}`)
    }
  }

  private resumeInBackground(): void {
    const abort = new AbortController()
    const done = this.resumeAgain(abort.signal)
      .catch((err: unknown) => {
        this.resumeFailure = err
      })
      .finally(() => {
        this.resuming = null
        this.wake()
      })
    this.resuming = {done, abort}
  }

  /**
   * At a stop or the end of the run (once): cuts a background try short, then makes one short try
   * of its own. True when the checkpoint is still open somewhere (its participants reopen by
   * themselves when their leases end).
   */
  private async lastResumeTry(): Promise<boolean> {
    if (this.lastResumeTried) return this.unresumed !== null
    this.lastResumeTried = true
    if (this.resuming) {
      this.resuming.abort.abort()
      await this.resuming.done
    }
    if (this.resumeFailure) throw this.resumeFailure
    if (this.unresumed) await this.resumeAgain(undefined, LAST_RESUME_S)
    return this.unresumed !== null
  }

  /** Keeps the two newest published checkpoints; removes older ones and partial ones. */
  private async prune(): Promise<void> {
    try {
      await applyPrune(await planPrune(this.opts.root, KEEP_CHECKPOINTS))
      // Leftover temp files of an interrupted atomic write (ours or Gym's collector's), as Gym's
      // collector removes them: this collector holds the root, so none of them is in use.
      // A fresh collector.pid temp is another collector starting on this root: it must be told the
      // root is held, not fail on its vanished temp file. Only a minute-old one is a leftover.
      for (const name of await readdir(this.opts.root)) {
        if (!/^\.[^/]+\.[0-9a-f]{8}$/.test(name)) continue
        const file = path.join(this.opts.root, name)
        if (name.startsWith(`.${PID_FILE}.`) && Date.now() - (await stat(file).catch(() => ({mtimeMs: 0}))).mtimeMs < 60_000) continue
        await rm(file, {force: true})
      }
    } catch (err) {
      this.opts.log(`prune of ${this.opts.root} failed: ${(err as Error).message}`)
    }
  }
}

/** The run ID in a checkpoint's collection.json, or null. */
async function collectionRunId(checkpointDir: string): Promise<string | null> {
  try {
    const m = JSON.parse(await readFile(path.join(checkpointDir, COLLECTION_MANIFEST), 'utf8')) as {run_id?: unknown}
    return typeof m.run_id === 'string' ? m.run_id : null
  } catch {
    return null
  }
}
