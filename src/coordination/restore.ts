import {EpisodeId, captureKey, fromWire, nextAttempt, toWire} from '../protocol/episode.js'
import {RESTORED_LISTS, StatusReply} from '../protocol/wire.js'
import {CheckpointStateError} from '../storage/errors.js'
import {RestoreOutcome, appendRestoreLog} from '../storage/restore-log.js'
import {listParticipantDirs, readCheckpointSummary, resolveCheckpoint} from '../storage/root.js'
import {VerifyReport, verifyCheckpoint} from '../storage/verify.js'
import {CallTimer, Log, ParticipantTiming} from './controller.js'
import {ControllerError, CoordinationError, ParticipantFailure, failureList, nextStep} from './errors.js'
import {Coordinator, restore, resume, retire, statusAll} from './operations.js'
import {newRestoreId} from './runs.js'

/** Report counts that mean live work (Gym's counts per kind, section 5.1 of the reference). */
export const LIVE_COUNTS = ['episodes', 'sessions', 'inflight', 'held'] as const

/**
 * Why a participant cannot take a restore. Gym restores only into fresh processes: a restore into
 * one that holds work would be refused there, and the cleanup of that failure would retire the
 * work. Empty when the participant is fresh.
 */
export function restoreBlockers(st: StatusReply): string[] {
  const why: string[] = []
  if (st.phase !== 'idle' || st.checkpoint_id !== null) why.push(`is in phase ${st.phase}${st.checkpoint_id ? ` of '${st.checkpoint_id}'` : ''}`)
  const live = LIVE_COUNTS.filter((k) => (st.report.counts[k] ?? 0) > 0).map((k) => `${st.report.counts[k]} ${k}`)
  if (live.length) why.push(`holds ${live.join(', ')}`)
  for (const k of RESTORED_LISTS) {
    const v = (st as Record<string, unknown>)[k]
    if (Array.isArray(v) && v.length) why.push(`holds ${v.length} restored episode(s) no replacement has claimed (${k})`)
  }
  if (st.report.restarts.length) why.push(`runs ${st.report.restarts.length} restart(s)`)
  const blockers = st.report.blocker_count ?? st.report.blockers.length
  if (blockers > 0) why.push(`reports ${blockers} blocker(s) (work in flight)`)
  if (st.retired_rollouts > 0) why.push(`holds ${st.retired_rollouts} retired-rollout mark(s) from an earlier retire or failed restore, which would refuse replacements of those rollouts`)
  return why
}

export interface RestorePlanParticipant {
  server: string
  kind: string
  instance: string
  /** Records in its directory (null when unread: --skip-verify, or a missing directory). */
  records: number | null
  /** Records the restore installs there (in the restore's scope), each under attempt + 1. */
  install: number | null
  /** Records outside the scope, which the restore skips. */
  skip: number | null
}

/** What a restore would do, computed without sending anything but status probes. */
export interface RestorePlan {
  checkpointId: string
  checkpointDir: string
  /** The restore's scope: the episodes as committed. */
  continued: EpisodeId[]
  /** Dispatch these next: each continued episode at attempt + 1, from its boundary. */
  replacements: EpisodeId[]
  /** Crashed attempts retired after the restore, before the resume; they start over from input at attempt + 1. */
  restarted: EpisodeId[]
  participants: RestorePlanParticipant[]
  /** Participants that are not fresh, each with its reasons. */
  busy: {server: string; reasons: string[]}[]
  unreachable: ParticipantFailure[]
  /**
   * Participants the checkpoint holds state of that no server of the fleet restores: a server not
   * started, or one that answered 404 and was skipped (checkpointing off). Records in the scope
   * there would be lost; `install` is null when unknown (--skip-verify).
   */
  missing: {kind: string; instance: string; records: number | null; install: number | null}[]
  verify: VerifyReport | null
  /** The controller manifest the checkpoint was published with (null: never published). */
  manifest: string | null
  controllerState: unknown
}

export interface RestoreOptions {
  /** A checkpoint root (LATEST is followed) or a checkpoint directory. */
  location: string
  checkpointId?: string
  timeoutS?: number
  /** Skip the offline verification (the fleet preflight still runs). */
  skipVerify?: boolean
  /** Leave restored participants closed (the caller resumes with the restore ID). */
  keepClosed?: boolean
  /** Rollouts left out of the restore scope (a collector's finished rows, or rows it starts over). */
  skipRollouts?: ReadonlySet<string>
  /** More attempts to retire with the restarts, after the restore and before the resume (a collector's later dispatches). */
  retireFirst?: EpisodeId[]
  log?: Log
}

function asInvalid(err: unknown): never {
  if (err instanceof CheckpointStateError) throw new ControllerError('invalid_checkpoint', err.message)
  throw err
}

async function fleetPreflight(c: Coordinator): Promise<Pick<RestorePlan, 'busy' | 'unreachable'>> {
  const {statuses, failures} = await statusAll(c)
  const busy = c.participants.flatMap((p) => {
    const st = statuses.get(p.server)
    const reasons = st ? restoreBlockers(st) : []
    return reasons.length ? [{server: p.server, reasons}] : []
  })
  return {busy, unreachable: failures}
}

/**
 * The restore preflight, shared by `restore --dry-run` and the real restore: resolves and verifies
 * the checkpoint offline, and asks every participant whether it is fresh. Sends nothing else.
 */
export async function planRestore(c: Coordinator, opts: RestoreOptions): Promise<RestorePlan> {
  const resolved = await resolveCheckpoint(opts.location, opts.checkpointId).catch(asInvalid)
  const fleet = await fleetPreflight(c)
  const verify = opts.skipVerify ? null : await verifyCheckpoint(resolved.checkpointDir, {expect: c.participants.map((p) => ({kind: p.kind, instance: p.instance, server: p.server}))}).catch(asInvalid)
  const summary = await readCheckpointSummary(resolved.checkpointDir).catch(asInvalid)
  const continued = (summary ? summary.continued.map(fromWire) : []).filter((e) => !opts.skipRollouts?.has(e.rolloutId))
  const scope = new Set(continued.map(captureKey))
  const participants = c.participants.map((p): RestorePlanParticipant => {
    const v = verify?.participants.find((d) => d.kind === p.kind && d.instance === p.instance)
    if (!v) return {server: p.server, kind: p.kind, instance: p.instance, records: null, install: null, skip: null}
    const install = v.episodes.filter((k) => scope.has(k)).length
    return {server: p.server, kind: p.kind, instance: p.instance, records: v.records, install, skip: v.records - install}
  })
  const here = (x: {kind: string; instance: string}) => c.participants.some((p) => p.kind === x.kind && p.instance === x.instance)
  const missing = verify
    ? verify.participants.filter((v) => !here(v)).map((v) => ({kind: v.kind, instance: v.instance, records: v.records, install: v.episodes.filter((k) => scope.has(k)).length}))
    : (await listParticipantDirs(resolved.checkpointDir).catch(asInvalid)).filter((d) => !here(d)).map((d) => ({kind: d.kind, instance: d.instance, records: null, install: null}))
  return {
    checkpointId: summary?.checkpointId ?? resolved.checkpointId,
    checkpointDir: resolved.checkpointDir,
    continued,
    replacements: continued.map(nextAttempt),
    restarted: summary ? summary.restarted.map(fromWire) : [],
    participants,
    ...fleet,
    missing,
    verify,
    manifest: summary?.source ?? null,
    controllerState: summary?.controllerState,
  }
}

/** What failed after the restore: each participant's failure, or the error's own message. */
function failureDetail(err: unknown): string {
  return err instanceof CoordinationError ? failureList(err.failures) : (err as Error).message
}

/**
 * Throws the error the real restore would stop at; returns when it would go ahead. A dry run's
 * errors say so ("dry run: ..."): the same refusals, and nothing was sent either way.
 */
export function assertRestorable(plan: RestorePlan, opts: {dryRun?: boolean} = {}): void {
  const said = (m: string) => (opts.dryRun ? `dry run: ${m}` : m)
  if (plan.unreachable.length)
    throw new CoordinationError(
      'discover',
      plan.unreachable,
      opts.dryRun ? 'every participant must answer before a restore; the dry run sent nothing' : 'every participant must answer before a restore; nothing was sent',
    )
  if (plan.busy.length) {
    const list = plan.busy.map((b) => `${b.server} ${b.reasons.join(', ')}`).join('; ')
    throw new ControllerError(
      'fleet_state',
      said(
        `restore refused, nothing was sent: restore needs freshly started servers, and ${plan.busy.length} participant(s) are not: ${list}. ` +
          'A restore there would be refused, and cleaning up after it would retire their work. Point the command at the fresh fleet, or restart these servers first.',
      ),
      {busy: plan.busy},
    )
  }
  // State of a participant the fleet lacks: only records outside the scope may be left behind.
  const lost = plan.missing.filter((m) => m.install !== 0)
  if (lost.length) {
    const list = lost.map((m) => `${m.kind}/${m.instance} (${m.install === null ? 'records not read: --skip-verify' : `${m.install} record(s) in the scope`})`).join(', ')
    throw new ControllerError(
      'fleet_state',
      said(
        `restore refused, nothing was sent: the checkpoint holds state of ${lost.length} participant(s) no server of this fleet restores: ${list}. ` +
          'Their episodes would continue without it. Start those servers with checkpointing on (a server that answers 404 on its status is skipped as no participant) and restore again.',
      ),
      {missing: lost},
    )
  }
  if (plan.verify && !plan.verify.ok) {
    const errs = plan.verify.problems.filter((p) => p.severity === 'error')
    throw new ControllerError('invalid_checkpoint', said(`checkpoint ${plan.checkpointDir} failed verification, nothing was sent: ${errs.map((p) => `${p.where}: ${p.message}`).join('; ')}`), {
      checkpoint_dir: plan.checkpointDir,
      problems: plan.verify.problems,
    })
  }
  if (!plan.manifest) {
    throw new ControllerError('invalid_checkpoint', said(`${plan.checkpointDir} has no controller manifest: it was never published; nothing was sent`))
  }
}

export interface RestoreResult extends RestorePlan {
  restoreId: string
  restoredByServer: Record<string, string[]>
  resumed: boolean
  /** Per participant: its restore and resume calls' time, the records it installed and their file's bytes. */
  timings: ParticipantTiming[]
}

/**
 * Restores a published checkpoint into a fresh fleet, all or nothing: the preflight (refuses a
 * fleet holding work, an invalid checkpoint), then the restore, then the crashed attempts of
 * restarts are retired while admission is still closed (so no harness that outlived the crash is
 * ever admitted), then resume. Once the restore succeeded, a first SIGINT/SIGTERM no longer cuts
 * the retire and the resume short (the fleet would stay closed with those attempts unretired):
 * they finish, and the caller then learns it was interrupted. A checkpoint resolved
 * inside a root gets a line in ROOT/restores.jsonl whatever the outcome: 'refused' (stopped
 * before anything was sent), 'failed' (something was sent and nothing stays restored), or
 * 'restored' (with an error when only the resume after it failed).
 */
export async function restoreCheckpoint(c: Coordinator, opts: RestoreOptions): Promise<RestoreResult> {
  const timeoutS = opts.timeoutS ?? 300
  const restoreId = newRestoreId()
  const timer = new CallTimer()
  c = timer.wrap(c)
  const startedAt = new Date().toISOString()
  // Resolved once, so the restore and its log line name the same checkpoint even if LATEST moves.
  // An unresolvable location is left to planRestore, which reports it (and nothing is logged).
  const resolved = await resolveCheckpoint(opts.location, opts.checkpointId).catch(() => null)
  const record = async (outcome: RestoreOutcome, err: unknown): Promise<void> => {
    if (!resolved?.root) return
    const entry = {
      restore_id: restoreId,
      time: startedAt,
      checkpoint_id: resolved.checkpointId,
      checkpoint_dir: resolved.checkpointDir,
      outcome,
      error: err === undefined ? null : err instanceof Error ? err.message : String(err),
      participants: c.participants.length,
    }
    // The restore's own outcome always wins: a log that cannot be written is only a warning.
    await appendRestoreLog(resolved.root, entry).catch((e: unknown) => opts.log?.(`warning: restore '${restoreId}' ${outcome}, but it was not recorded: ${(e as Error).message}`))
  }
  let outcome: RestoreOutcome = 'refused'
  try {
    const plan = await planRestore(c, resolved?.root ? {...opts, checkpointId: resolved.checkpointId} : opts)
    assertRestorable(plan)
    // The checkpoint may have taken long to verify: look at the fleet again right before sending.
    if (plan.verify) Object.assign(plan, await fleetPreflight(c))
    assertRestorable(plan)
    outcome = 'failed'
    const deadlineTs = Date.now() / 1000 + timeoutS
    const out = await restore(c, restoreId, plan.checkpointDir, plan.continued, deadlineTs, opts.log)
    outcome = 'restored'
    // The restore stands: what follows finishes it whatever signal comes (a second one within the
    // command's rules still ends the process at once).
    const finish: Coordinator = {...c, signal: undefined}
    // The crashed attempts of restarts (and of rows the caller starts over) are retired after the
    // restore, while admission is still closed (retire is valid in phase restored, reference
    // 3.3), not before it: the restore goes to processes as freshly started as they came, with no
    // marks, and nothing of those attempts can run before the resume either way. Its own deadline.
    const retireFirst = [...plan.restarted, ...(opts.retireFirst ?? [])]
    if (retireFirst.length) {
      await retire(finish, restoreId, retireFirst, Date.now() / 1000 + timeoutS).catch((err: unknown) => {
        const detail = failureDetail(err)
        throw new ControllerError(
          'participant',
          `restore '${restoreId}' of '${plan.checkpointId}' succeeded everywhere, but retiring the ${retireFirst.length} crashed attempt(s) that start over failed: ${detail}. ` +
            `The fleet is still closed: retire them again with checkpoint ID '${restoreId}', then resume with the restore ID.`,
          {restore_id: restoreId, retire: retireFirst.map(toWire)},
        ).withNext(
          // Short lists as a line to paste; a long one is in the error's details (--json).
          ...(retireFirst.length <= 20 ? [nextStep('retire', ['--id', restoreId, ...retireFirst.flatMap((e) => ['--episode', captureKey(e)])])] : []),
          nextStep('resume', ['--id', restoreId]),
        )
      })
    }
    let resumed = false
    if (!opts.keepClosed) {
      // The restore's deadline may have passed during the restore and the retire: at least 30 s more.
      await resume(finish, restoreId, Math.max(deadlineTs, Date.now() / 1000 + 30)).catch((err: unknown) => {
        const detail = failureDetail(err)
        throw new ControllerError('participant', `restore '${restoreId}' of '${plan.checkpointId}' succeeded everywhere, but resuming it failed: ${detail}. Resume it again with its restore ID.`, {
          restore_id: restoreId,
        }).withNext(nextStep('resume', ['--id', restoreId]))
      })
      resumed = true
    }
    if (c.signal?.aborted) {
      throw new ControllerError(
        'interrupted',
        `interrupted during restore '${restoreId}' of '${plan.checkpointId}', which succeeded everywhere; ${resumed ? 'the fleet was resumed' : 'the fleet is kept closed, as asked'}`,
        {restore_id: restoreId},
      )
    }
    await record('restored', undefined)
    const sizes = new Map(
      c.participants.map((p) => [
        p.server,
        {records: out.replies.get(p.server)?.restored.length ?? null, bytes: plan.verify?.participants.find((v) => v.kind === p.kind && v.instance === p.instance)?.bytes ?? null},
      ]),
    )
    return {...plan, restoreId, restoredByServer: Object.fromEntries([...out.replies].map(([s, r]) => [s, r.restored])), resumed, timings: timer.table(c.participants, sizes)}
  } catch (err) {
    if (err instanceof ControllerError) err.timings = timer.tableIfTimed(c.participants)
    await record(outcome, err)
    throw err
  }
}
