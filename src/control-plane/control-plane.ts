import {EpisodeId, captureKey, fromCaptureKey, fromWire, nextAttempt, sortedKeys} from '../protocol/episode.js'
import {ErrorCode, HTTP_STATUS_OF} from '../protocol/errors.js'
import {
  CommitRequest,
  MAX_REPORTED_BLOCKERS,
  Phase,
  PrepareReport,
  PrepareRequest,
  ParticipantManifest,
  ForgetRequest,
  RestoreRequest,
  RetireRequest,
  StatusReplyWire,
  WireReply,
} from '../protocol/wire.js'
import {CheckpointStateError} from '../storage/errors.js'
import {participantDir, readParticipantState, StoredRecord, writeParticipantState} from '../storage/participant-store.js'
import {PyJsonError, PyValue, pyDumpsView} from '../storage/pyjson.js'
import {Mutex, Notifier, raceDeadline} from './util.js'

/** A refusal the control plane sends on purpose, in Gym's `{"error": {code, detail}}` envelope. */
export class ControlError extends Error {
  readonly status: number
  constructor(
    readonly code: ErrorCode,
    detail: string,
  ) {
    super(detail)
    this.name = 'ControlError'
    this.status = HTTP_STATUS_OF[code]
  }
}

export interface ExportedRecord {
  episode: EpisodeId
  /** The record as a dict; `episode_id` first, as Gym writes it. */
  record: PyValue
}

/** What a server plugs into its control plane (Gym's CheckpointParticipant). */
export interface Participant {
  readonly kind: string
  readonly instance: string
  /** Current readiness with every blocker (the control plane caps the list). */
  report(): PrepareReport
  closeAdmission(): void
  openAdmission(): void
  /**
   * Takes the cut (Gym's rule): environment, agent and resources export every live episode they
   * hold, whatever the scope; the policy model only those in `scope`; restored-but-unclaimed state
   * only in `scope`, on every kind. A null scope exports everything live.
   */
  exportRecords(scope: ReadonlySet<string> | null): ExportedRecord[]
  /**
   * Extra fields of the commit reply for these exported records (Gym's commit_reply): the policy
   * model's `staging_keys`, the token-store keys they reference. Other kinds add nothing.
   */
  commitReplyExtras?(exported: ExportedRecord[]): {staging_keys?: string[]}
  /** Throws a message when a restored record is invalid for this participant. */
  validateRecord(key: string, record: PyValue): void
  /** Installs records under their next attempt. `scope` is every episode the restore continues. */
  install(records: StoredRecord[], scope: EpisodeId[]): Promise<void>
  /** True while the process serves live state, where a restore is refused. */
  hasLiveState(): boolean
  /** Stops the attempt's (and earlier attempts') work, waits for it, frees its state. */
  retire(e: EpisodeId, signal: AbortSignal): Promise<void>
  /** Frees restored state the commit scope leaves out, without refusing its attempt. */
  deleteRestored(keys: string[]): Promise<void>
  /** Restored-but-unclaimed capture keys (replacement attempts). */
  restoredKeys(): string[]
  statusExtra(): Record<string, unknown>
  onChange(cb: () => void): void
}

export interface ControlPlaneOptions {
  leaseGraceSeconds?: number
  /** Retry period of a lease expiry whose reopen failed (Gym: 30 s). */
  leaseRetryMs?: number
  resumedIdsKept?: number
  retireConcurrency?: number
  log?: (msg: string) => void
}

interface Remembered {
  args: string | null
  reply: unknown
}

interface CommitJob {
  args: string
  scope: ReadonlySet<string> | null
  exported: ExportedRecord[] | null
  write: Promise<ParticipantManifest> | null
  exportedKeys: string[]
  cleanup: Promise<void> | null
  stopped: boolean
}

const RESUMED_IDS_KEPT = 64

/** One participant's checkpoint control plane: phases, fencing, leases, storage, retire marks. */
export class ControlPlane {
  phase: Phase = 'idle'
  checkpointId: string | null = null
  leaseExpiresAt: number | null = null
  /** rollout -> highest retired attempt. */
  readonly retired = new Map<string, number>()
  private readonly resumed = new Set<string>()
  private readonly completed = new Map<string, Remembered>()
  private readonly jobs = new Map<string, CommitJob>()
  private readonly exportFailed = new Map<string, string>()
  private readonly lock = new Mutex()
  private readonly changes = new Notifier()
  private install: Promise<void> | null = null
  private leaseTimer: NodeJS.Timeout | null = null
  private readonly grace: number
  private readonly leaseRetryMs: number
  private readonly kept: number
  private readonly retireConcurrency: number
  private readonly log: (msg: string) => void
  private closed = false

  constructor(
    readonly participant: Participant,
    opts: ControlPlaneOptions = {},
  ) {
    this.grace = opts.leaseGraceSeconds ?? 600
    this.leaseRetryMs = opts.leaseRetryMs ?? 30_000
    this.kept = opts.resumedIdsKept ?? RESUMED_IDS_KEPT
    this.retireConcurrency = opts.retireConcurrency ?? 8
    this.log = opts.log ?? (() => {})
    participant.onChange(() => this.changes.notify())
  }

  close(): void {
    this.closed = true
    if (this.leaseTimer) clearTimeout(this.leaseTimer)
    this.changes.notify()
  }

  // ---------------------------------------------------------------- status

  report(): PrepareReport {
    const r = this.participant.report()
    const all = r.blockers
    return {...r, blockers: all.slice(0, MAX_REPORTED_BLOCKERS), blocker_count: r.blocker_count ?? all.length}
  }

  status(): StatusReplyWire {
    return {
      kind: this.participant.kind,
      instance: this.participant.instance,
      phase: this.phase,
      checkpoint_id: this.checkpointId,
      lease_expires_at: this.leaseExpiresAt,
      retired_rollouts: this.retired.size,
      report: this.report(),
      ...this.participant.statusExtra(),
    }
  }

  // ---------------------------------------------------------------- checks

  private admit(id: string, allowed: readonly Phase[]): void {
    if (this.resumed.has(id)) throw new ControlError('stale_checkpoint', `checkpoint '${id}' was already resumed`)
    if (this.checkpointId !== null && this.checkpointId !== id) {
      throw new ControlError('checkpoint_conflict', `checkpoint '${this.checkpointId}' is active in phase ${this.phase}`)
    }
    if (!allowed.includes(this.phase)) throw new ControlError('invalid_phase', `not valid in phase ${this.phase}`)
  }

  private admitOutsideCheckpoint(id: string, deadlineTs: number): void {
    if (this.phase !== 'idle' && this.phase !== 'restored') throw new ControlError('invalid_phase', `not valid in phase ${this.phase}; resume first`)
    if (this.checkpointId !== null && this.checkpointId !== id) {
      throw new ControlError('checkpoint_conflict', `checkpoint '${this.checkpointId}' is active in phase ${this.phase}`)
    }
    if (this.phase === 'restored') this.renewLease(deadlineTs)
  }

  /** The reply a completed prepare, commit or restore of `id` gave, replayed to a retry with the same arguments. */
  private remembered<O extends 'prepare' | 'commit' | 'restore'>(id: string, op: O, args: string | null): WireReply<O> | undefined {
    const r = this.completed.get(`${op}\0${id}`)
    if (!r) return undefined
    if (r.args !== args) throw new ControlError('checkpoint_conflict', `checkpoint '${id}' already completed ${op} with another directory or scope`)
    // Stored under the same operation's key by remember() below.
    return r.reply as WireReply<O>
  }

  private remember<O extends 'prepare' | 'commit' | 'restore'>(id: string, op: O, args: string | null, reply: WireReply<O>): void {
    this.completed.set(`${op}\0${id}`, {args, reply})
  }

  private fence(id: string): void {
    this.resumed.delete(id)
    this.resumed.add(id)
    while (this.resumed.size > this.kept) this.resumed.delete(this.resumed.values().next().value!)
    for (const k of [...this.completed.keys()]) if (k.endsWith(`\0${id}`)) this.completed.delete(k)
  }

  // ---------------------------------------------------------------- lease

  private renewLease(deadlineTs: number): void {
    this.leaseExpiresAt = Math.max(this.leaseExpiresAt ?? 0, deadlineTs + this.grace)
    this.scheduleLease(this.leaseExpiresAt * 1000 - Date.now())
  }

  private scheduleLease(ms: number): void {
    if (this.closed) return
    if (this.leaseTimer) clearTimeout(this.leaseTimer)
    this.leaseTimer = setTimeout(() => void this.leaseCheck(), Math.max(0, Math.min(ms, 2 ** 31 - 1)))
    this.leaseTimer.unref()
  }

  private async leaseCheck(): Promise<void> {
    this.leaseTimer = null
    const id = this.checkpointId
    if (id === null || this.leaseExpiresAt === null || this.closed) return
    const left = this.leaseExpiresAt * 1000 - Date.now()
    if (left > 0) return this.scheduleLease(left)
    try {
      await this.lock.run(async () => {
        if (this.checkpointId !== id) return
        this.log(`lease expired in phase ${this.phase}; resuming checkpoint '${id}'`)
        await this.reopen(id, Date.now() / 1000 + this.leaseRetryMs / 1000)
      })
    } catch (err) {
      // Gym retries after any error, not only a passed deadline.
      this.log(`lease reopen of '${id}' failed (${(err as Error).message}); retrying in ${this.leaseRetryMs} ms`)
      this.scheduleLease(this.leaseRetryMs)
    }
  }

  // ---------------------------------------------------------------- prepare / renew

  async prepare(req: PrepareRequest): Promise<WireReply<'prepare'>> {
    const id = req.checkpoint_id
    const done = this.remembered(id, 'prepare', null)
    if (done !== undefined) return done
    await this.lock.run(() => {
      this.admit(id, ['idle', 'preparing'])
      if (this.phase === 'idle') {
        this.checkpointId = id
        this.phase = 'preparing'
        this.renewLease(req.deadline_ts)
        try {
          this.participant.closeAdmission()
        } catch (err) {
          this.participant.openAdmission()
          this.phase = 'idle'
          this.checkpointId = null
          this.leaseExpiresAt = null
          throw err
        }
      } else this.renewLease(req.deadline_ts)
    })
    const deadlineMs = req.deadline_ts * 1000
    for (;;) {
      if (this.checkpointId !== id || this.phase !== 'preparing' || this.closed) break
      if (this.participant.report().ready) break
      const left = deadlineMs - Date.now()
      if (left <= 0) break
      await this.changes.wait(Math.min(left, 1000))
    }
    return this.lock.run(() => {
      const report = this.report()
      if (this.checkpointId === id && this.phase === 'preparing' && report.ready) {
        this.phase = 'prepared'
        const reply = {phase: this.phase, report}
        this.remember(id, 'prepare', null, reply)
        return reply
      }
      // Missed the deadline (still preparing, admission closed) or finished by a resume (idle).
      return {phase: this.checkpointId === id ? this.phase : ('idle' as Phase), report}
    })
  }

  renew(req: PrepareRequest): Promise<WireReply<'renew'>> {
    return this.lock.run(() => {
      this.admit(req.checkpoint_id, ['preparing', 'prepared', 'committed', 'restored'])
      this.renewLease(req.deadline_ts)
      return {lease_expires_at: this.leaseExpiresAt!}
    })
  }

  // ---------------------------------------------------------------- commit

  async commit(req: CommitRequest): Promise<WireReply<'commit'>> {
    const id = req.checkpoint_id
    const scope = req.episode_ids ? req.episode_ids.map(fromWire) : null
    const args = JSON.stringify([req.checkpoint_dir, scope ? sortedKeys(scope) : null])
    const done = this.remembered(id, 'commit', args)
    if (done !== undefined) return done
    const job = await this.lock.run(() => {
      this.admit(id, ['prepared'])
      this.renewLease(req.deadline_ts)
      const failed = this.exportFailed.get(id)
      if (failed) throw new ControlError('export_failed', `checkpoint '${id}' cannot be committed (${failed}); resume, then prepare again under a new checkpoint ID`)
      let job = this.jobs.get(id)
      if (job && job.args !== args) throw new ControlError('checkpoint_conflict', `checkpoint '${id}' is already being written to another directory or scope`)
      if (!job) {
        const report = this.participant.report()
        if (!report.ready) {
          const why = `participant is no longer ready to commit: blockers=${JSON.stringify(report.blockers.slice(0, MAX_REPORTED_BLOCKERS))}`
          this.exportFailed.set(id, why)
          throw new ControlError('export_failed', `${why}; resume, then prepare again under a new checkpoint ID`)
        }
        if (scope) {
          const restarts = new Set(report.restarts)
          const bad = sortedKeys(scope).filter((k) => restarts.has(k))
          if (bad.length) throw new ControlError('restart_in_scope', `the commit scope names episodes that restart: ${JSON.stringify(bad)}`)
        }
        // Gym's policy model exports only the scope, and refuses a commit that names none
        // (reference 4.6); it stays prepared, and nothing is remembered.
        if (!scope && this.participant.kind === 'model') throw new ControlError('checkpoint_error', 'model commit needs the episode_ids the controller continues')
        const scopeKeys = scope ? new Set(scope.map(captureKey)) : null
        job = {args, scope: scopeKeys, exported: null, write: null, exportedKeys: [], cleanup: null, stopped: false}
        try {
          // The cut: taken once, at the first commit, and never again for this checkpoint.
          job.exported = this.participant.exportRecords(scopeKeys)
        } catch (err) {
          const why = `export failed: ${(err as Error).message}`
          this.exportFailed.set(id, why)
          throw new ControlError('export_failed', `checkpoint '${id}' ${why}; resume, then prepare again under a new checkpoint ID`)
        }
        job.exportedKeys = sortedKeys(job.exported.map((r) => r.episode))
        this.jobs.set(id, job)
      }
      if (!job.write) job.write = this.startWrite(id, req.checkpoint_dir, job)
      return job
    })
    const raced = await raceDeadline(job.write!, req.deadline_ts * 1000)
    if (raced === 'timeout') throw new ControlError('deadline_exceeded', `checkpoint '${id}' deadline passed during I/O`)
    return this.lock.run(() => {
      this.admit(id, ['prepared', 'committed'])
      this.phase = 'committed'
      const reply = {phase: 'committed', manifest: raced.value, episode_ids: job.exportedKeys, ...this.participant.commitReplyExtras?.(job.exported!)}
      this.remember(id, 'commit', args, reply)
      return reply
    })
  }

  private startWrite(id: string, checkpointDir: string, job: CommitJob): Promise<ParticipantManifest> {
    const records = job.exported!
    const p = this.participant
    function* lines(): Generator<Buffer> {
      for (const r of records) {
        try {
          // A view the writer copies before the next record is encoded.
          yield pyDumpsView(r.record)
        } catch (err) {
          if (err instanceof PyJsonError) throw new CheckpointStateError(`checkpoint record of episode '${captureKey(r.episode)}' cannot be written: ${err.message}`)
          throw err
        }
      }
    }
    const write = writeParticipantState(
      {
        checkpointDir,
        kind: p.kind,
        instance: p.instance,
        checkpointId: id,
        shouldStop: () => job.stopped,
        runLocked: (fn) => this.lock.run(fn),
      },
      lines(),
    ).then(async (manifest) => {
      // Restored state this scope does not continue is deleted, not carried to the next checkpoint.
      if (job.scope && !job.cleanup) {
        const drop = p.restoredKeys().filter((k) => !job.scope!.has(k))
        if (drop.length) {
          job.cleanup = p.deleteRestored(drop)
          await job.cleanup
        }
      }
      return manifest
    })
    // A write that failed is redone by a retry, with the same exported records.
    write.catch(() => {
      if (this.jobs.get(id) === job) job.write = null
    })
    return write
  }

  // ---------------------------------------------------------------- restore

  async restore(req: RestoreRequest): Promise<WireReply<'restore'>> {
    const id = req.checkpoint_id
    const scope = req.episode_ids.map(fromWire)
    const args = JSON.stringify([req.checkpoint_dir, sortedKeys(scope)])
    const done = this.remembered(id, 'restore', args)
    if (done !== undefined) return done
    return this.lock.run(async () => {
      const again = this.remembered(id, 'restore', args)
      if (again !== undefined) return again
      this.admit(id, ['idle'])
      if (this.participant.hasLiveState()) throw new ControlError('checkpoint_error', `${this.participant.kind} restore requires a process without live episodes`)
      const p = this.participant
      const keep = new Set(scope.map(captureKey))
      const dir = participantDir(req.checkpoint_dir, p.kind, p.instance)
      const read = await raceDeadline(readParticipantState(dir, {kind: p.kind, instance: p.instance, keep}), req.deadline_ts * 1000)
      if (read === 'timeout') throw new ControlError('deadline_exceeded', `checkpoint '${id}' deadline passed while reading ${dir}`)
      const state = read.value
      for (const r of state.kept) {
        try {
          p.validateRecord(r.key, r.record)
        } catch (err) {
          throw new CheckpointStateError(`checkpoint record of episode '${r.key}' is invalid: ${(err as Error).message}`)
        }
      }
      if (this.install) await this.install.catch(() => {})
      try {
        p.closeAdmission()
      } catch (err) {
        p.openAdmission()
        throw err
      }
      const install = p.install(state.kept, scope)
      this.install = install
      try {
        await install
      } catch (err) {
        p.openAdmission()
        throw err
      } finally {
        if (this.install === install) this.install = null
      }
      this.phase = 'restored'
      this.checkpointId = id
      this.renewLease(req.deadline_ts)
      const reply = {
        phase: 'restored' as const,
        source_checkpoint_id: state.manifest.checkpoint_id,
        restored: sortedKeys(state.kept.map((r) => nextAttempt(fromCaptureKey(r.key)))),
      }
      this.remember(id, 'restore', args, reply)
      return reply
    })
  }

  // ---------------------------------------------------------------- resume

  resume(req: PrepareRequest): Promise<WireReply<'resume'>> {
    const id = req.checkpoint_id
    return this.lock.run(async () => {
      if (this.resumed.has(id)) return {phase: 'idle' as const, idempotent: true}
      if (this.phase === 'idle' && this.checkpointId === null) {
        // Fencing an ID never prepared here refuses a late prepare of an aborted checkpoint.
        this.fence(id)
        return {phase: 'idle' as const, idempotent: true}
      }
      this.admit(id, ['preparing', 'prepared', 'committed', 'restored'])
      await this.reopen(id, req.deadline_ts)
      return {phase: 'idle' as const, idempotent: false}
    })
  }

  /** Called under the lock. Keeps the phase when the cleanup outlives the deadline. */
  private async reopen(id: string, deadlineTs: number): Promise<void> {
    const job = this.jobs.get(id)
    if (job) {
      job.stopped = true
      if (job.cleanup) {
        const r = await raceDeadline(
          job.cleanup.catch(() => {}),
          deadlineTs * 1000,
        )
        if (r === 'timeout') throw new ControlError('deadline_exceeded', 'restored state is still being deleted; resume again')
      }
    }
    this.participant.openAdmission()
    this.fence(id)
    this.jobs.delete(id)
    this.exportFailed.delete(id)
    this.phase = 'idle'
    this.checkpointId = null
    this.leaseExpiresAt = null
    if (this.leaseTimer) clearTimeout(this.leaseTimer)
    this.leaseTimer = null
    this.changes.notify()
  }

  // ---------------------------------------------------------------- retire / forget

  async retire(req: RetireRequest): Promise<WireReply<'retire'>> {
    const episodes = req.episode_ids.map(fromWire)
    const deadlineMs = req.deadline_ts * 1000
    return this.lock.run(async () => {
      this.admitOutsideCheckpoint(req.checkpoint_id, req.deadline_ts)
      // Mark first, before any work the deadline limits: a late retire still refuses the attempt.
      for (const e of episodes) this.retired.set(e.rolloutId, Math.max(this.retired.get(e.rolloutId) ?? -1, e.attempt))
      if (Date.now() >= deadlineMs) throw new ControlError('deadline_exceeded', `retire deadline passed before its episodes were stopped`)
      if (this.install) {
        const r = await raceDeadline(
          this.install.catch(() => {}),
          deadlineMs,
        )
        if (r === 'timeout') throw new ControlError('deadline_exceeded', 'retire deadline passed while a restore was still installing')
      }
      // Each rollout once, through its latest attempt, a bounded number at a time.
      const latest = new Map<string, EpisodeId>()
      for (const e of episodes) if ((latest.get(e.rolloutId)?.attempt ?? -1) < e.attempt) latest.set(e.rolloutId, e)
      const queue = [...latest.values()]
      const ctl = new AbortController()
      const work = Promise.all(
        Array.from({length: Math.min(this.retireConcurrency, queue.length)}, async () => {
          for (let e = queue.shift(); e; e = queue.shift()) await this.participant.retire(e, ctl.signal)
        }),
      )
      const r = await raceDeadline(work, deadlineMs)
      if (r === 'timeout') {
        ctl.abort(new Error('retire deadline passed'))
        throw new ControlError('deadline_exceeded', 'retire deadline passed before its episodes stopped; retry the retire')
      }
      this.changes.notify()
      return {retired_count: episodes.length}
    })
  }

  forget(req: ForgetRequest): Promise<WireReply<'forget'>> {
    return this.lock.run(() => {
      this.admitOutsideCheckpoint(req.checkpoint_id, req.deadline_ts)
      if (Date.now() >= req.deadline_ts * 1000) throw new ControlError('deadline_exceeded', 'forget deadline passed')
      for (const r of req.rollout_ids) this.retired.delete(r)
      return {forgotten_count: req.rollout_ids.length}
    })
  }

  /** The data-plane check: 409 stale_attempt for an attempt at or below its rollout's mark. */
  checkAttempt(e: EpisodeId): void {
    const mark = this.retired.get(e.rolloutId)
    if (mark !== undefined && e.attempt <= mark) throw new ControlError('stale_attempt', `attempt ${e.attempt} of rollout '${e.rolloutId}' was retired (up to attempt ${mark})`)
  }
}
