import {mkdir, stat} from 'node:fs/promises'
import path from 'node:path'

import {EpisodeId, captureKey, fromCaptureKey, quoteInput, toWire} from '../protocol/episode.js'
import {CommitReply, Operation, StatusReply, pendingRestored} from '../protocol/wire.js'
import {CheckpointStateError} from '../storage/errors.js'
import {writeCollectionManifest} from '../storage/collector.js'
import {fsyncDir, probeWritableDir} from '../storage/fsutil.js'
import {VerifyProblem, verifyCheckpoint} from '../storage/verify.js'
import {
  CONTROLLER_MANIFEST,
  ControllerManifest,
  FORMAT_VERSION,
  describeFsError,
  publishLatest,
  readScopeRecord,
  setAsideControllerManifests,
  syncParticipantDirs,
  writeControllerManifest,
  writeScopeRecord,
} from '../storage/root.js'
import {ControllerError, CoordinationError, NextStep, ParticipantFailure, failureMessage, failureNames, nextStep} from './errors.js'
import {Coordinator, PrepareResult, StageResult, continuedOf, commit, prepare, renew, restartsOf, resume, resumeAll, statusAll} from './operations.js'
import type {DiscoveredParticipant, Discovery, Participant} from './discover.js'
import {RunTracker, newCheckpointId} from './runs.js'

export type Log = (msg: string) => void

/** One participant's share of an operation: its calls' wall time per phase, and what it wrote or installed. */
export interface ParticipantTiming {
  server: string
  kind: string
  instance: string
  prepareMs: number | null
  commitMs: number | null
  restoreMs: number | null
  resumeMs: number | null
  /** Records it committed (its manifest's record_count) or restore installed. */
  records: number | null
  /** Bytes of its records file in the checkpoint. */
  bytes: number | null
}

const TIMED = {prepare: 'prepareMs', commit: 'commitMs', restore: 'restoreMs', resume: 'resumeMs'} as const satisfies Partial<Record<Operation, keyof ParticipantTiming>>

/** Times each participant's calls from the coordinator's call events (every call of an operation summed). */
export class CallTimer {
  private readonly ms = new Map<string, Partial<Record<Operation, number>>>()

  /** The coordinator with its calls timed; the caller's own onCall still hears every event. */
  wrap(c: Coordinator): Coordinator {
    const outer = c.onCall
    return {
      ...c,
      onCall: (e) => {
        if (e.ms !== null) {
          const t = this.ms.get(e.server) ?? {}
          t[e.operation] = (t[e.operation] ?? 0) + e.ms
          this.ms.set(e.server, t)
        }
        outer?.(e)
      },
    }
  }

  /**
   * Runs `fn`; a ControllerError it throws carries the timings so far, so a failed operation still
   * shows which participant answered and how long the others took. Nested operations each set them;
   * the outermost timer, which hears every call, sets them last.
   */
  async timed<T>(participants: Participant[], fn: () => Promise<T>): Promise<T> {
    try {
      return await fn()
    } catch (err) {
      if (err instanceof ControllerError) err.timings = this.tableIfTimed(participants)
      throw err
    }
  }

  /** The table, or null when no timed call (prepare, commit, restore, resume) was made. */
  tableIfTimed(participants: Participant[]): ParticipantTiming[] | null {
    return [...this.ms.values()].some((t) => Object.keys(TIMED).some((op) => op in t)) ? this.table(participants) : null
  }

  /** One row per participant, in the coordinator's order; sizes from the commit or restore. */
  table(participants: Participant[], sizes: Map<string, {records: number | null; bytes: number | null}> = new Map()): ParticipantTiming[] {
    return participants.map((p) => {
      const t = this.ms.get(p.server) ?? {}
      const row: ParticipantTiming = {server: p.server, kind: p.kind, instance: p.instance, prepareMs: null, commitMs: null, restoreMs: null, resumeMs: null, records: null, bytes: null}
      for (const [op, key] of Object.entries(TIMED) as [keyof typeof TIMED, (typeof TIMED)[keyof typeof TIMED]][]) if (t[op] !== undefined) row[key] = Math.round(t[op])
      return {...row, ...(sizes.get(p.server) ?? {})}
    })
  }
}

/**
 * Renews every lease periodically while a long step (waiting, publishing) runs. One renew at a
 * time (a tick while the last one is still out is skipped, so a hung participant does not take
 * every control connection), and stop() cuts an outstanding renew short: the resume or the
 * report that follows must not wait for it.
 */
export class LeaseKeeper {
  private timer: NodeJS.Timeout | null = null
  private running: Promise<unknown> | null = null
  private readonly ctl = new AbortController()

  constructor(
    private readonly c: Coordinator,
    private readonly checkpointId: string,
    private readonly everyMs: number,
    private readonly extendS: number,
    private readonly log: Log,
  ) {}

  start(): this {
    this.timer = setInterval(() => {
      if (this.running) return
      this.running = renew({...this.c, signal: this.ctl.signal, onStage: undefined, onCall: undefined}, this.checkpointId, Date.now() / 1000 + this.extendS)
        .catch((err: Error) => {
          if (!this.ctl.signal.aborted) this.log(`lease renewal failed: ${err.message}`)
        })
        .finally(() => (this.running = null))
    }, this.everyMs)
    this.timer.unref()
    return this
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer)
    this.timer = null
    this.ctl.abort()
    await this.running
  }
}

/** The outcome of resuming a checkpoint to close it: which participants could not be reopened. */
export interface CloseOutcome {
  resumed: boolean
  failures: ParticipantFailure[]
}

/**
 * Resumes `id` everywhere (reverse order, going on past failures) to close a checkpoint that will
 * not be committed. Never throws: the caller reports the failures with its own error.
 */
export async function closeCheckpoint(c: Coordinator, id: string, deadlineTs: number, log?: Log): Promise<CloseOutcome> {
  try {
    await resume({...c, signal: undefined}, id, Math.max(deadlineTs, Date.now() / 1000 + 30))
    return {resumed: true, failures: []}
  } catch (err) {
    log?.(`resume of '${id}' failed: ${(err as Error).message}`)
    return {resumed: false, failures: err instanceof CoordinationError ? err.failures : [{server: 'fleet', status: null, code: null, message: (err as Error).message}]}
  }
}

/** How an aborted checkpoint left the fleet, for an error message, and the step that finishes it. */
export function afterClose(id: string, a: CloseOutcome): {text: string; next: NextStep[]} {
  if (a.resumed) return {text: `the fleet was resumed (checkpoint '${id}' is closed for good)`, next: []}
  const names = failureNames(a.failures)
  return {
    text: `resuming '${id}' failed on ${names}; the others were resumed. A participant that stays unreachable reopens by itself when its lease expires`,
    next: [nextStep('resume', ['--id', id])],
  }
}

/**
 * The checkpoints participants report open, other than `except`: `{id: ["server (phase)", ...]}`.
 */
export function openCheckpoints(statuses: Map<string, StatusReply>, except?: string): Map<string, string[]> {
  const open = new Map<string, string[]>()
  for (const [server, st] of statuses) {
    if (st.checkpoint_id === null || st.checkpoint_id === except) continue
    open.set(st.checkpoint_id, [...(open.get(st.checkpoint_id) ?? []), `${server} (${st.phase})`])
  }
  return open
}

/**
 * What a stateless `commit` commits, from a tolerant discovery: the checkpoint every participant is
 * prepared under (or `id`) and the restarts they report. Refuses, sending nothing, when none or
 * several are open, a participant is not prepared under it, or one is down. A checkpoint that can
 * never be committed (one holder is down or came back empty while others hold it) is closed on
 * every reachable participant first, so they do not stay closed until their leases run out.
 * `again` are the arguments that name the root again in a suggested `commit` or `prepare` line;
 * `scopeArgs` (the episode flags) are repeated in a suggested `commit` line only.
 */
export async function preparedForCommit(
  c: Coordinator,
  discovery: Discovery,
  opts: {id?: string; deadlineTs: number; log?: Log; again?: string[]; scopeArgs?: string[]},
): Promise<{checkpointId: string; restarts: EpisodeId[]}> {
  const id = checkpointToCommit(discovery.participants, opts.id, opts.again ?? [])
  // A fleet without its policy model (no_model: it came back without checkpoint routes) is down
  // too: committing without it would publish a checkpoint that cannot restore the model.
  const down = discovery.failures
  const holders = discovery.participants.filter((p) => p.status.checkpoint_id === id)
  const lost = discovery.participants.filter((p) => p.status.checkpoint_id === null)
  const isPrepared = (p: DiscoveredParticipant) => p.status.checkpoint_id === id && (p.status.phase === 'prepared' || p.status.phase === 'committed')
  // A prepare that never finished (left closed for inspection: a holder still preparing, later
  // stages never reached) is refused below as not prepared, and left as it is: the participants
  // without the checkpoint were never asked, not restarted.
  const finished = holders.every(isPrepared)
  if (holders.length && finished && (down.length || lost.length)) {
    const closed = await closeCheckpoint(c, id, opts.deadlineTs, opts.log)
    const after = afterClose(id, closed)
    // Servers that are down reopen by themselves when their lease runs out; a policy model that no
    // longer takes part (no_model) holds nothing to reopen.
    const unreachable = down.filter((f) => f.code !== 'no_model')
    const why = [
      ...down.map((f) => (f.code === 'no_model' ? 'no policy model takes part any more (its server answers without checkpoint routes)' : `${f.server} is down (${failureMessage(f)})`)),
      ...lost.map((p) => `${p.server} holds no checkpoint (restarted, or its lease expired)`),
    ].join('; ')
    const state =
      closed.resumed && unreachable.length
        ? `every reachable participant was resumed; ${unreachable.map((f) => f.server).join(', ')} reopen(s) by itself when its lease expires, or resume again once it is back`
        : after.text
    throw new ControllerError(
      down.length ? 'discovery' : 'participant',
      `checkpoint '${id}' cannot be committed: ${why}; nothing was committed; ${state}. Checkpoint again (a new ID) once every server is back.`,
      {checkpoint_id: id, unreachable: down.map((f) => ({server: f.server, message: failureMessage(f)})), lost: lost.map((p) => p.server)},
    ).withNext(...(unreachable.length ? [nextStep('resume', ['--id', id])] : after.next))
  }
  if (down.length)
    throw new CoordinationError('discover', down, 'every participant must answer before a commit; nothing was sent').withNext(
      nextStep('commit', ['--id', id, ...(opts.again ?? []), ...(opts.scopeArgs ?? [])]),
    )
  const notPrepared = discovery.participants.filter((p) => !isPrepared(p))
  if (notPrepared.length) {
    throw new ControllerError(
      'fleet_state',
      `not prepared under '${id}': ${notPrepared.map((p) => `${p.server} (${p.status.phase}${p.status.checkpoint_id ? ` of '${p.status.checkpoint_id}'` : ''})`).join(', ')}; nothing was sent`,
    ).withNext(nextStep('resume', ['--id', id]))
  }
  try {
    return {checkpointId: id, restarts: restartsOf(discovery.participants.map((p) => [p.server, p.status.report.restarts] as const))}
  } catch (err) {
    // Nothing was sent; the fleet stays prepared until resumed.
    if (err instanceof ControllerError) err.withNext(nextStep('resume', ['--id', id]))
    throw err
  }
}

/** The checkpoint the participants are prepared under (or `id`), with the real problem when none is. */
function checkpointToCommit(ps: DiscoveredParticipant[], id: string | undefined, again: string[]): string {
  if (id) return id
  const open = [...openCheckpoints(new Map(ps.map((p) => [p.server, p.status]))).keys()]
  if (open.length === 0) throw new ControllerError('fleet_state', 'no participant has an open checkpoint; nothing was sent. Prepare one first.').withNext(nextStep('prepare', again))
  if (open.length > 1)
    throw new ControllerError('fleet_state', `participants hold different checkpoints (${open.join(', ')}); nothing was sent. Pass --id, or resume them and prepare again.`).withNext(
      ...open.map((k) => nextStep('resume', ['--id', k])),
    )
  return open[0]!
}

/** What `resume` did: the ID it resumed (null: none was active), each reply, and who was down. */
export interface ResumeOutcome extends StageResult<'resume'> {
  checkpointId: string | null
  /** Participants that had it open and reopened (the others had nothing open under it). */
  reopened: number
  /** Checkpoints the participants reported open before the resume. */
  active: string[]
  unreachable: ParticipantFailure[]
  /** What went wrong, to throw once the outcome is shown: participants that failed, or were down. */
  error: CoordinationError | null
}

/**
 * Resumes `id` (default: the one checkpoint or restore the participants report active) on every
 * participant that answered discovery, going on past failures. The failures, and the members that
 * were down (they reopen when their lease expires), come back as `error`: the caller shows what
 * was resumed first, then throws it.
 */
export async function resumeFleet(c: Coordinator, discovery: Discovery, opts: {id?: string; deadlineTs: number}): Promise<ResumeOutcome> {
  const active = [...openCheckpoints(new Map(discovery.participants.map((p) => [p.server, p.status]))).keys()]
  if (!opts.id && active.length > 1)
    throw new ControllerError('input', `participants report several active checkpoints (${active.join(', ')}); pass --id`).withNext(...active.map((k) => nextStep('resume', ['--id', k])))
  const id = opts.id ?? active[0] ?? null
  const down = discovery.failures.filter((f) => f.code !== 'no_model')
  const result: StageResult<'resume'> = id ? await resumeAll(c, id, opts.deadlineTs) : {replies: new Map(), failures: []}
  // A participant that had it open at discovery reopened, whatever its reply says: a resume sent
  // again after a dropped connection (client.ts) is answered `idempotent` when the first one landed.
  // (A status names a checkpoint exactly when its phase is not idle, reference 3.1.)
  const hadOpen = new Set(discovery.participants.filter((p) => p.status.checkpoint_id === id).map((p) => p.server))
  const reopened = [...result.replies].filter(([server, r]) => !r.idempotent || hadOpen.has(server)).length
  const outcome = {...result, checkpointId: id, reopened, active, unreachable: down}
  if (id && result.failures.length) {
    const others = active.filter((k) => k !== id)
    const isConflict = (f: ParticipantFailure) => f.code === 'checkpoint_conflict'
    // A conflict with a checkpoint open at discovery points at that one; any other failure (or a
    // conflict with one opened since) needs this resume again. Both can happen in one resume.
    const elsewhere = others.length > 0 && result.failures.some(isConflict)
    const again = !elsewhere || !result.failures.every(isConflict)
    // Members that were down are named too: they are as closed as the ones that failed.
    const alsoDown = down.length ? `; down, reopening when their lease expires: ${failureNames(down)}` : ''
    const advice = [
      ...(elsewhere ? [`those refusing with checkpoint_conflict hold another checkpoint (${others.join(', ')}); resume that one if no controller is still working on it`] : []),
      ...(again ? [`the other participants were resumed; resume '${id}' again`] : []),
    ]
    const error = new CoordinationError('resume', [...result.failures, ...down], advice.join('; ') + alsoDown).withNext(
      ...(elsewhere ? others.map((k) => nextStep('resume', ['--id', k])) : []),
      ...(again ? [nextStep('resume', ['--id', id])] : []),
    )
    return {...outcome, error}
  }
  if (down.length) {
    const lease = Math.max(0, ...discovery.participants.filter((p) => p.status.checkpoint_id === id).map((p) => p.status.lease_expires_at ?? 0))
    const error = new CoordinationError(
      'discover',
      down,
      `every reachable participant was resumed${id ? ` under '${id}'` : ''}; the ones down reopen by themselves when their lease expires${lease ? ` (the others' lease ran to ${new Date(lease * 1000).toISOString()})` : ''}, or resume again once they are back`,
    ).withNext(...(id ? [nextStep('resume', ['--id', id])] : []))
    return {...outcome, error}
  }
  return {...outcome, error: null}
}

/**
 * Before a prepare sends anything: every participant answers, and none has another checkpoint
 * open (a second prepare would be refused by them, and its cleanup would only fence its own ID).
 */
export async function preparePreflight(c: Coordinator, id: string): Promise<Map<string, StatusReply>> {
  const {statuses, failures} = await statusAll(c)
  // An interrupt cuts the status calls short: that is the interrupt, not an unreachable fleet.
  if (c.signal?.aborted) throw new ControllerError('interrupted', `interrupted before checkpoint '${id}' was prepared; nothing was sent`)
  if (failures.length) throw new CoordinationError('discover', failures, `every participant must answer before checkpoint '${id}' is prepared; nothing was sent`)
  const open = openCheckpoints(statuses, id)
  if (open.size === 0) return statuses
  const list = [...open].map(([k, servers]) => `'${k}' on ${servers.join(', ')}`).join('; ')
  throw new ControllerError(
    'fleet_state',
    `another checkpoint is open: ${list}; nothing was sent. Finish it first: commit it (gymckpt commit --id ID --root ROOT --episodes-file FILE) or resume it, unless another controller is still working on it.`,
    {open: [...open].map(([id, participants]) => ({checkpoint_id: id, participants}))},
  ).withNext(...[...open.keys()].map((k) => nextStep('resume', ['--id', k])))
}

/**
 * Prepares. When a stage misses its deadline, fails, or is interrupted, resumes every participant
 * (unless keepClosed: then only a missed deadline leaves the fleet closed) and raises:
 * `not_prepared` with each server's blockers, the stage's error, or `interrupted`.
 */
export async function prepareOrAbort(
  c: Coordinator,
  id: string,
  deadlineTs: number,
  opts: {keepClosed?: boolean; log?: Log; preflight?: (statuses: Map<string, StatusReply>) => void} = {},
): Promise<PrepareResult> {
  // Not `opts.preflight?.(await …)`: an optional call does not evaluate its argument.
  const statuses = await preparePreflight(c, id)
  opts.preflight?.(statuses)
  let prep: PrepareResult
  try {
    prep = await prepare(c, id, deadlineTs)
  } catch (err) {
    // Earlier stages are closed: reopen them, and fence the ID on the stages never reached.
    const a = afterClose(id, await closeCheckpoint(c, id, deadlineTs, opts.log))
    if (c.signal?.aborted) throw new ControllerError('interrupted', `interrupted while preparing '${id}'; ${a.text}`).withNext(...a.next)
    if (err instanceof CoordinationError) throw new CoordinationError('prepare', err.failures, a.text).withNext(...a.next)
    throw err
  }
  if (prep.prepared) {
    // A restart that does not decode makes the prepared checkpoint uncommittable: close it now,
    // not leave the fleet closed until its leases run out.
    try {
      prep.restarts()
    } catch (err) {
      const a = afterClose(id, await closeCheckpoint(c, id, deadlineTs, opts.log))
      if (err instanceof ControllerError) throw new ControllerError(err.code, `${err.message}; checkpoint '${id}' cannot be committed; ${a.text}`).withNext(...a.next)
      throw err
    }
    return prep
  }
  const blockers = prep.blockers()
  const list = Object.entries(blockers)
    .map(([s, b]) => `${s}: ${b.blockerCount} (${b.blockers.slice(0, 5).join(', ')}${b.blockerCount > 5 ? ', …' : ''})`)
    .join('; ')
  const details = {checkpoint_id: id, blockers: Object.entries(blockers).map(([server, b]) => ({server, blockers: b.blockers, blocker_count: b.blockerCount})), not_reached: prep.notReached}
  if (opts.keepClosed) {
    throw new ControllerError(
      'not_prepared',
      `checkpoint '${id}' was not prepared before its deadline; blockers: ${list}. The fleet is left closed for inspection: resume '${id}' when done.`,
      details,
    ).withNext(nextStep('status'), nextStep('resume', ['--id', id]))
  }
  const a = afterClose(id, await closeCheckpoint(c, id, deadlineTs, opts.log))
  throw new ControllerError(
    'not_prepared',
    `checkpoint '${id}' was not prepared before its deadline; blockers: ${list}. ${a.text}; wait for the blockers or retire them, then checkpoint again (a new ID).`,
    details,
  ).withNext(...a.next)
}

export interface CommitPlan {
  checkpointId: string
  root: string
  /** Candidates in the controller's order; null omits the scope. */
  episodes: EpisodeId[] | null
  /** Every restart the prepared participants reported. */
  restarts: EpisodeId[]
  deadlineTs: number
  tracker?: RunTracker
  /** Evaluated once the rollout set is final (after awaited /run replies), stored in gymckpt.json. */
  controllerState?: () => unknown
  /** Write gymckpt.json and replace LATEST (default true). */
  publish?: boolean
  /** Also write Gym's collection.json with this run ID (a rollout collection's checkpoint). */
  collectionRunId?: string
  /**
   * A stateless commit, which an operator may run again after a partial failure: the first try's
   * scope is recorded in the checkpoint directory, and a retry with the same episodes sends it.
   */
  rememberScope?: boolean
  /** With rememberScope: the participants whose status says they committed this ID already. */
  committedOn?: string[]
}

export interface CommitOutcome {
  checkpointId: string
  checkpointDir: string
  continued: EpisodeId[]
  restarted: EpisodeId[]
  replies: Map<string, CommitReply>
  /** /run calls whose replies were awaited before the rollout set was built. */
  awaitedRuns: EpisodeId[]
  published: boolean
  /** Per participant: its commit call's time, the records it committed and their bytes. */
  timings: ParticipantTiming[]
}

/**
 * Checks a checkpoint root before anything is sent: not empty, a directory (created if missing)
 * in which this process can create files. Exit 2 then means nothing was sent, with the real cause.
 */
export async function checkRoot(root: string): Promise<string> {
  if (!root.trim()) throw new ControllerError('input', 'the checkpoint root is empty: pass --root DIR; nothing was sent')
  const abs = path.resolve(root)
  try {
    await probeWritableDir(abs)
  } catch (err) {
    throw new ControllerError('input', `checkpoint root ${abs} cannot hold checkpoints: ${describeFsError(err)}; nothing was sent`)
  }
  return abs
}

/**
 * Refuses a commit without a scope where a policy model takes part: Gym's model exports only the
 * scope and answers a commit without episode_ids with 409 checkpoint_error (reference 4.6), so the
 * checkpoint would fail after prepare closed the fleet for nothing. `how` says, in the caller's
 * terms, how to give the scope.
 */
export function checkScope(c: Coordinator, episodes: EpisodeId[] | null | undefined, how = 'name them (an empty list when none continue)'): void {
  if (episodes != null) return
  const model = c.participants.find((p) => p.kind === 'model')
  if (model) {
    throw new ControllerError(
      'input',
      `no commit scope: the policy model ${model.server} refuses a commit that does not name the episodes the controller continues (Gym answers 409 checkpoint_error); ${how}; nothing was sent`,
    )
  }
}

/**
 * Refuses a scope the operator gave that leaves out restored episodes whose replacement has not
 * started (reference 5.3.1 and 5.3.4): every participant's commit would delete their restored state, and
 * the progress a restore brought back would be gone with no error. Each must be named by its
 * replacement attempt, the key the participants report; `--drop-restored` lets them go on purpose.
 */
export function checkRestoredInScope(statuses: Iterable<readonly [string, StatusReply]>, episodes: EpisodeId[]): void {
  const named = new Set(episodes.map(captureKey))
  const holders = new Map<string, string[]>()
  for (const [server, st] of statuses) for (const k of pendingRestored(st)) if (!named.has(k)) holders.set(k, [...(holders.get(k) ?? []), server])
  if (holders.size === 0) return
  const missing = [...holders.keys()].sort()
  const shown = missing.slice(0, 10).map((k) => `${quoteInput(k)} (${holders.get(k)!.join(', ')})`)
  // An episode named at the attempt it was checkpointed under, not at its replacement.
  const earlier: string[] = []
  for (const k of missing) {
    let e: EpisodeId
    try {
      e = fromCaptureKey(k)
    } catch {
      continue
    }
    const at = episodes.find((x) => x.rolloutId === e.rolloutId && x.attempt < e.attempt)
    if (at) earlier.push(`${quoteInput(captureKey(at))} is named, but its restored state is under the replacement attempt ${quoteInput(k)}`)
  }
  throw new ControllerError(
    'input',
    `the scope leaves out ${missing.length} restored episode(s) whose replacement has not started: ${shown.join(', ')}${missing.length > 10 ? ', …' : ''}; ` +
      `every participant's commit would delete their restored state.${earlier.length ? ` ${earlier.slice(0, 5).join('; ')}.` : ''} ` +
      'Name each by its replacement attempt, as listed, or pass --drop-restored to let that state go; nothing was sent',
    {restored: missing},
  )
}

/**
 * The scope a stateless commit sends: the one its first try sent, read back from the checkpoint
 * directory, when the operator gives the same episodes again. Participants that committed take a
 * retry only with the same scope (reference 3.5), and the scope is the episodes minus the restarts
 * reported *now*: a restart that ended since the first try would change it, the ones that
 * committed would refuse, and the ones that had not would commit another scope, making the
 * checkpoint impossible to complete. Other episodes than the first try's are refused, sending
 * nothing. The first try records its scope before it sends.
 */
async function firstTryScope(checkpointDir: string, plan: CommitPlan, scope: EpisodeId[] | null): Promise<EpisodeId[] | null> {
  const keys = (l: EpisodeId[] | null) => (l === null ? null : l.map(captureKey).sort())
  const sorted = (l: string[] | null) => (l === null ? null : [...l].sort())
  const same = (a: string[] | null, b: string[] | null) => (a === null || b === null ? a === b : a.join('\n') === b.join('\n'))
  const given = keys(plan.episodes)
  let prev
  try {
    prev = await readScopeRecord(checkpointDir)
  } catch (err) {
    throw new ControllerError('invalid_checkpoint', `cannot read the scope of an earlier try in ${checkpointDir}: ${describeFsError(err)}; nothing was sent`)
  }
  if (prev && prev.checkpoint_id === plan.checkpointId) {
    // The first try's list as it was sent, in its order: Gym version A compares the scope of a
    // write still in flight as given (reference 3.5), so the same set in another order would be refused.
    if (same(sorted(prev.scope), keys(scope)) || same(prev.given, given)) return prev.scope === null ? null : prev.scope.map(fromCaptureKey)
    throw new ControllerError(
      'input',
      `checkpoint '${plan.checkpointId}' was first committed (in part) with ${prev.given === null ? 'no scope' : `another list of ${prev.given.length} episode(s)`}; a retry must give the same episodes ` +
        `(participants that committed refuse another scope, and the rest would commit a different one); nothing was sent. Give the first try's episodes, or resume '${plan.checkpointId}' and checkpoint again under a new ID`,
    ).withNext(nextStep('resume', ['--id', plan.checkpointId]))
  }
  // Committed somewhere, but not from this directory: another --root (a relative one from another
  // working directory), and those would refuse it while the rest commit into the wrong place.
  if (plan.committedOn?.length) {
    throw new ControllerError(
      'input',
      `${plan.committedOn.join(', ')} already committed '${plan.checkpointId}', but ${checkpointDir} holds no record of that first try: a retry must commit into the first try's directory (the same --root, as an absolute path); nothing was sent`,
    ).withNext(nextStep('resume', ['--id', plan.checkpointId]))
  }
  try {
    await writeScopeRecord(checkpointDir, {checkpoint_id: plan.checkpointId, given, scope: scope === null ? null : scope.map(captureKey)})
  } catch (err) {
    throw new ControllerError('invalid_checkpoint', `cannot record the commit's scope in ${checkpointDir}: ${describeFsError(err)}; nothing was sent`)
  }
  return scope
}

/**
 * Commits everywhere at once with scope = continued(episodes), waits for /run replies already on
 * the wire, then writes the controller manifest and publishes LATEST: only after every commit
 * succeeded.
 */
export async function commitAndPublish(c: Coordinator, plan: CommitPlan): Promise<CommitOutcome> {
  const timer = new CallTimer()
  c = timer.wrap(c)
  checkScope(c, plan.episodes)
  return timer.timed(c.participants, async () => {
    const checkpointDir = path.join(path.resolve(plan.root), plan.checkpointId)
    try {
      await mkdir(checkpointDir, {recursive: true})
    } catch (err) {
      throw new ControllerError('invalid_checkpoint', `cannot create checkpoint directory ${checkpointDir}: ${describeFsError(err)}`)
    }
    let scope = plan.episodes ? continuedOf(plan.episodes, plan.restarts) : null
    if (plan.rememberScope) scope = await firstTryScope(checkpointDir, plan, scope)
    const replies = await commit(c, plan.checkpointId, checkpointDir, scope, plan.deadlineTs).catch((err: unknown) => {
      // A participant that already committed this ID (an earlier try that failed elsewhere) takes
      // a retry only with the same directory and scope (reference 3.5).
      if (err instanceof CoordinationError && err.failures.some((f) => f.code === 'checkpoint_conflict'))
        throw new CoordinationError(
          'commit',
          err.failures,
          `a retry of a commit must send the directory and scope of the first try: this one sent ${checkpointDir} and ${scope ? `${scope.length} episode(s)` : 'no scope'}`,
        )
      throw err
    })
    const committed = new Set<string>()
    for (const [server, r] of replies) {
      for (const k of r.episode_ids) {
        // A key from a participant is untrusted input: it must decode as a capture key.
        try {
          fromCaptureKey(k)
        } catch (err) {
          throw new CoordinationError('commit', [{server, status: 200, code: 'bad_reply', message: `commit reply names episode ${quoteInput(k)}, which is no capture key: ${(err as Error).message}`}])
        }
        committed.add(k)
      }
    }
    const restartKeys = new Set(plan.restarts.map(captureKey))
    const awaitedRuns = plan.tracker ? await plan.tracker.waitForReplies(new Set([...committed, ...restartKeys]), plan.deadlineTs * 1000, c.signal) : []
    // A /run that replied after prepare is done, not continued: the rollout set is built after it,
    // from the candidates still open now. That drops the awaited replies, and also a reply that
    // arrived during the commit fan-out (before the wait began), or a /run refused with
    // admission_closed (it never ran): neither may be restored and run again.
    const open = plan.tracker ? new Set(plan.tracker.candidates().map(captureKey)) : null
    const continued = (scope ?? [...committed].sort().map(fromCaptureKey)).filter((e) => open === null || open.has(captureKey(e)))
    const restarted = plan.episodes ? plan.episodes.filter((e) => restartKeys.has(captureKey(e))) : plan.restarts
    const publish = plan.publish ?? true
    if (publish) {
      const manifest: ControllerManifest = {
        format_version: FORMAT_VERSION,
        checkpoint_id: plan.checkpointId,
        created_at: Date.now() / 1000,
        continued: continued.map(toWire),
        restarted: restarted.map(toWire),
        participants: c.participants.map((p) => {
          const r = replies.get(p.server)!
          return {server: p.server, kind: p.kind, instance: p.instance, manifest: r.manifest, episode_ids: r.episode_ids, ...(r.staging_keys ? {staging_keys: r.staging_keys} : {})}
        }),
      }
      if (plan.controllerState) manifest.controller_state = plan.controllerState()
      try {
        await syncParticipantDirs(checkpointDir, c.participants)
      } catch (err) {
        throw new ControllerError('invalid_checkpoint', `cannot make the participants' state under ${checkpointDir} durable (fsync): ${describeFsError(err)}; LATEST was not moved`)
      }
      try {
        await writeControllerManifest(checkpointDir, manifest)
      } catch (err) {
        if (err instanceof CheckpointStateError) throw new ControllerError('invalid_checkpoint', err.message)
        throw new ControllerError('invalid_checkpoint', `cannot write the controller manifest of ${checkpointDir}: ${describeFsError(err)}; LATEST was not moved`)
      }
      // From here until the gate passes, a failure must not leave the directory looking published
      // (list and prune count a directory with a controller manifest): the manifests are set aside.
      if (plan.collectionRunId) {
        await writeCollectionManifest(checkpointDir, {
          checkpoint_id: plan.checkpointId,
          run_id: plan.collectionRunId,
          created_at: manifest.created_at,
          continued: manifest.continued,
          restarted: manifest.restarted,
        }).catch(async (err: unknown) => {
          throw new ControllerError('invalid_checkpoint', `cannot write ${path.join(checkpointDir, 'collection.json')}: ${describeFsError(err)}; LATEST was not moved${await setAside(checkpointDir)}`)
        })
      }
      // The publish gate: LATEST moves only to a checkpoint that passes what restore checks. The
      // controller manifest just written names every participant, so verify finds each one missing
      // (no `expect` list: it would name each a second time).
      const verify = await verifyCheckpoint(checkpointDir).catch(async (err: unknown) => {
        if (err instanceof CheckpointStateError) return err
        throw new ControllerError('invalid_checkpoint', `cannot verify ${checkpointDir} before publishing it: ${(err as Error).message}; LATEST was not moved${await setAside(checkpointDir)}`)
      })
      const errors: VerifyProblem[] =
        verify instanceof CheckpointStateError ? [{severity: 'error', where: checkpointDir, message: verify.message}] : verify.problems.filter((p) => p.severity === 'error')
      if (errors.length) {
        const aside = await setAside(checkpointDir)
        // The same details as a restore refusing a checkpoint that fails verification.
        throw new ControllerError(
          'invalid_checkpoint',
          `checkpoint ${checkpointDir} was committed but does not verify, so it was not published (LATEST is unchanged)${aside}: ${errors.map((p) => `${p.where}: ${p.message}`).join('; ')}`,
          {checkpoint_dir: checkpointDir, problems: errors},
        )
      }
      try {
        // The checkpoint directory's own entry in the root, durable before LATEST names it.
        await fsyncDir(path.resolve(plan.root))
        await publishLatest(path.resolve(plan.root), plan.checkpointId)
      } catch (err) {
        throw new ControllerError('invalid_checkpoint', `cannot publish ${checkpointDir}: replacing ${path.join(path.resolve(plan.root), 'LATEST')} failed: ${describeFsError(err)}`)
      }
    }
    const timings = timer.table(c.participants, await committedSizes(checkpointDir, replies))
    return {checkpointId: plan.checkpointId, checkpointDir, continued, restarted, replies, awaitedRuns, published: publish, timings}
  })
}

/**
 * Sets a refused checkpoint's controller manifests aside (root.ts setAsideControllerManifests) and
 * says so, for the end of the error message; a failure to do so is said too, never raised.
 */
async function setAside(checkpointDir: string): Promise<string> {
  return setAsideControllerManifests(checkpointDir).then(
    (names) => (names.length ? `; its controller manifest was set aside as ${names.join(' and ')}, so it is not listed as published` : ''),
    (err: unknown) => `; setting its controller manifest aside failed (${describeFsError(err)}): remove ${path.join(checkpointDir, CONTROLLER_MANIFEST)} before pruning`,
  )
}

/** Records and bytes per committing server: the size of the records file its manifest names (null when there is none to stat). */
async function committedSizes(checkpointDir: string, replies: Map<string, CommitReply>): Promise<Map<string, {records: number; bytes: number | null}>> {
  const out = new Map<string, {records: number; bytes: number | null}>()
  await Promise.all(
    [...replies].map(async ([server, r]) => {
      const m = r.manifest
      // Names from a participant are untrusted: only a base name is joined, and only stat'ed.
      const bytes = await stat(path.join(checkpointDir, 'gym', path.basename(m.kind), path.basename(m.instance), path.basename(m.records_file))).then(
        (st) => st.size,
        () => null,
      )
      out.set(server, {records: m.record_count, bytes})
    }),
  )
  return out
}

export interface CheckpointOptions {
  root: string
  checkpointId?: string
  /** Seconds each phase (prepare+commit, then resume) may take. */
  timeoutS?: number
  episodes?: EpisodeId[] | null
  /** How to give a scope, in the caller's terms, for the error when there is none (checkScope). */
  scopeHint?: string
  /** Let a scope leave out restored episodes no replacement has claimed (their state is deleted). */
  dropRestored?: boolean
  tracker?: RunTracker
  controllerState?: () => unknown
  /** Also write Gym's collection.json with this run ID. */
  collectionRunId?: string
  renewEveryMs?: number
  /** Leave the fleet closed when prepare misses its deadline (to inspect it). */
  keepClosedOnBlockers?: boolean
  log?: Log
  onPhase?: (phase: 'prepare' | 'commit' | 'publish' | 'resume', state: 'start' | 'done' | 'failed') => void
}

export interface CheckpointOutcome extends CommitOutcome {
  prepare: PrepareResult
}

/**
 * prepare → commit → publish → resume. Whatever happens after prepare (a failure, SIGINT,
 * SIGTERM), every participant is resumed before this returns, and the first error is raised.
 */
export async function checkpoint(c: Coordinator, opts: CheckpointOptions): Promise<CheckpointOutcome> {
  const log = opts.log ?? (() => {})
  const timeoutS = opts.timeoutS ?? 300
  const id = opts.checkpointId ?? newCheckpointId()
  const deadlineTs = Date.now() / 1000 + timeoutS
  const phase = opts.onPhase ?? (() => {})
  const timer = new CallTimer()
  c = timer.wrap(c)
  return timer.timed(c.participants, async () => {
    await checkRoot(opts.root)
    // Before prepare (a tracker always gives a scope: its candidates, taken at commit).
    checkScope(c, opts.episodes !== undefined ? opts.episodes : opts.tracker ? [] : null, opts.scopeHint)
    phase('prepare', 'start')
    // prepareOrAbort resumes by itself when prepare does not succeed.
    // A scope the operator gave is checked against the restored state the fleet holds, before prepare.
    const given = opts.episodes
    const preflight = given && !opts.dropRestored ? (st: Map<string, StatusReply>) => checkRestoredInScope(st, given) : undefined
    const prep = await prepareOrAbort(c, id, deadlineTs, {keepClosed: opts.keepClosedOnBlockers, log, preflight}).catch((err: unknown) => {
      phase('prepare', 'failed')
      throw err
    })
    phase('prepare', 'done')
    const keeper = new LeaseKeeper(c, id, opts.renewEveryMs ?? 60_000, timeoutS, log).start()
    let outcome: CommitOutcome | undefined
    let error: unknown
    try {
      phase('commit', 'start')
      const episodes = opts.episodes !== undefined ? opts.episodes : opts.tracker ? opts.tracker.candidates() : null
      outcome = await commitAndPublish(c, {
        checkpointId: id,
        root: opts.root,
        episodes,
        restarts: prep.restarts(),
        deadlineTs,
        tracker: opts.tracker,
        controllerState: opts.controllerState,
        collectionRunId: opts.collectionRunId,
      })
      phase('commit', 'done')
    } catch (err) {
      phase('commit', 'failed')
      error = err
    }
    await keeper.stop()
    // Whatever happened after prepare (a failure, SIGINT, SIGTERM), every participant is resumed.
    phase('resume', 'start')
    const closed = await closeCheckpoint(c, id, Date.now() / 1000 + timeoutS, log)
    phase('resume', closed.resumed ? 'done' : 'failed')
    const after = afterClose(id, closed)
    // commitAndPublish either resolved (`outcome`) or threw (`error`).
    if (!outcome) {
      if (c.signal?.aborted) throw new ControllerError('interrupted', `interrupted during checkpoint '${id}'; nothing was published; ${after.text}`).withNext(...after.next)
      if (error instanceof CoordinationError)
        throw new CoordinationError(error.operation, error.failures, `nothing was published; ${after.text}; checkpoint again (under a new ID)`).withNext(...after.next)
      if (error instanceof ControllerError) throw new ControllerError(error.code, `${error.message}; ${after.text}`, error.details).withNext(...after.next)
      throw error
    }
    if (!closed.resumed) {
      const err = new CoordinationError('resume', closed.failures, `checkpoint '${id}' was committed and published, but ${after.text}`).withNext(...after.next)
      err.published = {checkpointId: id, checkpointDir: outcome.checkpointDir}
      throw err
    }
    // A signal that came while the fleet was being resumed: the checkpoint stands, and the caller
    // still learns it was interrupted (exit 130), as for any other phase.
    if (c.signal?.aborted)
      throw new ControllerError('interrupted', `interrupted after checkpoint '${id}' was published; the fleet was resumed`, {
        checkpoint_id: id,
        checkpoint_dir: outcome.checkpointDir,
        published: outcome.published,
      })
    const sizes = new Map(outcome.timings.map((t) => [t.server, {records: t.records, bytes: t.bytes}]))
    return {...outcome, prepare: prep, timings: timer.table(c.participants, sizes)}
  })
}
