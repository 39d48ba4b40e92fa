import {EpisodeId, fromCaptureKey, nextAttempt, quoteInput, toWire} from '../protocol/episode.js'
import {Kind, Operation, PrepareReply, ReplyOf, StatusReply} from '../protocol/wire.js'
import type {CallResult, ControlClient} from './client.js'
import {KIND_ORDER, Participant, sortParticipants} from './discover.js'
import {ControllerError, CoordinationError, ParticipantFailure} from './errors.js'

export const PREPARE_ORDER: readonly Kind[] = KIND_ORDER
/** Callers before the servers they call. */
export const RETIRE_ORDER: readonly (readonly Kind[])[] = [['environment'], ['agent'], ['model', 'resources']]

export interface Coordinator {
  client: ControlClient
  participants: Participant[]
  signal?: AbortSignal
  /** Told when a stage starts and finishes (progress rendering lives in the CLI). */
  onStage?: (e: {operation: string; stage: string; servers: string[]; done?: boolean; failures?: number}) => void
  /** Told when each participant's call is sent (`ms` null) and when it settles (timings, per-server progress). */
  onCall?: (e: CallEvent) => void
}

export interface CallEvent {
  operation: Operation
  stage: string
  server: string
  deadlineTs: number
  /** Null when sent; when settled, the milliseconds since the stage's calls were sent. */
  ms: number | null
  ok?: boolean
  /** The failure's code when it failed (`interrupted`, `timeout`, a participant's code). */
  code?: string | null
}

/** Encodes a fan-out body once; the same bytes go to every member of every stage. */
export function encodeBody(body: Record<string, unknown>): Buffer {
  return Buffer.from(JSON.stringify(body), 'utf8')
}

export interface StageResult<O extends Operation> {
  replies: Map<string, ReplyOf<O>>
  failures: ParticipantFailure[]
}

/** Calls every member concurrently, waits for all, and collects every failure. */
export async function fanOut<O extends Operation>(c: Coordinator, op: O, members: Participant[], body: Buffer, deadlineTs: number, stage = 'all'): Promise<StageResult<O>> {
  const servers = members.map((m) => m.server)
  c.onStage?.({operation: op, stage, servers})
  const onCall = c.onCall
  const sent = performance.now()
  if (onCall) for (const server of servers) onCall({operation: op, stage, server, deadlineTs, ms: null})
  const settled = onCall
    ? (r: CallResult<ReplyOf<O>>) => onCall({operation: op, stage, server: r.ok ? r.server : r.failure.server, deadlineTs, ms: performance.now() - sent, ok: r.ok, code: r.ok ? null : r.failure.code})
    : undefined
  const results = await c.client.callAll(
    members.map((m) => ({name: m.server, url: m.url})),
    op,
    body,
    deadlineTs,
    c.signal,
    settled,
  )
  const replies = new Map<string, ReplyOf<O>>()
  const failures: ParticipantFailure[] = []
  for (const r of results) {
    if (r.ok) replies.set(r.server, r.reply)
    else failures.push(r.failure)
  }
  c.onStage?.({operation: op, stage, servers, done: true, failures: failures.length})
  return {replies, failures}
}

function stagesOf(participants: Participant[], order: readonly (readonly Kind[])[]): {name: string; members: Participant[]}[] {
  return order.map((kinds) => ({name: kinds.join('+'), members: sortParticipants(participants.filter((p) => kinds.includes(p.kind)))})).filter((s) => s.members.length > 0)
}

// ---------------------------------------------------------------- prepare

export class PrepareResult {
  constructor(
    readonly checkpointId: string,
    readonly prepared: boolean,
    readonly replies: Map<string, PrepareReply>,
    /** Stages never called because an earlier one was not ready. */
    readonly notReached: string[],
  ) {}

  /** `{server: blockers}` for every participant that did not reach `prepared`. */
  blockers(): Record<string, {blockers: string[]; blockerCount: number}> {
    const out: Record<string, {blockers: string[]; blockerCount: number}> = {}
    for (const [server, r] of this.replies) {
      if (r.phase !== 'prepared') out[server] = {blockers: r.report.blockers, blockerCount: r.report.blocker_count ?? r.report.blockers.length}
    }
    return out
  }

  /** Every reported restart, from prepared participants too. */
  restarts(): EpisodeId[] {
    return restartsOf([...this.replies].map(([server, r]) => [server, r.report.restarts] as const))
  }

  /** The controller's episodes, in its order, minus the restarts: the commit scope. */
  continued(episodes: EpisodeId[]): EpisodeId[] {
    return continuedOf(episodes, this.restarts())
  }
}

/** Every restart the participants reported (`[server, keys]`), each once; a key that does not decode names its server. */
export function restartsOf(lists: Iterable<readonly [string, string[]]>): EpisodeId[] {
  const out: EpisodeId[] = []
  const seen = new Set<string>()
  for (const [server, list] of lists) {
    for (const k of list) {
      if (seen.has(k)) continue
      seen.add(k)
      try {
        out.push(fromCaptureKey(k))
      } catch (err) {
        throw new ControllerError('participant', `${server} reported a restart ${quoteInput(k)} that is not a valid capture key: ${(err as Error).message}`)
      }
    }
  }
  return out
}

/** `episodes` in their order (duplicates kept) minus every restart: one Map lookup per episode. */
export function continuedOf(episodes: EpisodeId[], restarts: EpisodeId[]): EpisodeId[] {
  if (restarts.length === 0) return episodes.slice()
  // Keyed by the rollout ID the episode already holds (no key string built per episode); almost
  // always one restarted attempt per rollout, else the set of them.
  const restarted = new Map<string, number | Set<number>>()
  for (const r of restarts) {
    const a = restarted.get(r.rolloutId)
    if (a === undefined) restarted.set(r.rolloutId, r.attempt)
    else if (typeof a !== 'number') a.add(r.attempt)
    else if (a !== r.attempt) restarted.set(r.rolloutId, new Set([a, r.attempt]))
  }
  return episodes.filter((e) => {
    const a = restarted.get(e.rolloutId)
    return a === undefined || (typeof a === 'number' ? a !== e.attempt : !a.has(e.attempt))
  })
}

/** Prepares stage by stage (environment, model, agent, resources), stopping at the first not ready. */
export async function prepare(c: Coordinator, checkpointId: string, deadlineTs: number): Promise<PrepareResult> {
  const body = encodeBody({checkpoint_id: checkpointId, deadline_ts: deadlineTs})
  const replies = new Map<string, PrepareReply>()
  const stages = stagesOf(
    c.participants,
    PREPARE_ORDER.map((k) => [k]),
  )
  for (let i = 0; i < stages.length; i++) {
    const s = stages[i]!
    const r = await fanOut(c, 'prepare', s.members, body, deadlineTs, s.name)
    if (r.failures.length) throw new CoordinationError('prepare', r.failures, `resume checkpoint '${checkpointId}' before preparing again`)
    for (const [k, v] of r.replies) replies.set(k, v)
    if ([...r.replies.values()].some((v) => v.phase !== 'prepared')) {
      return new PrepareResult(
        checkpointId,
        false,
        replies,
        stages.slice(i + 1).flatMap((x) => x.members.map((m) => m.server)),
      )
    }
  }
  return new PrepareResult(checkpointId, true, replies, [])
}

// ---------------------------------------------------------------- one-shot fan-outs

async function all<O extends Operation>(c: Coordinator, op: O, body: Record<string, unknown>, deadlineTs: number, hint?: string): Promise<Map<string, ReplyOf<O>>> {
  const r = await fanOut(c, op, c.participants, encodeBody(body), deadlineTs)
  if (r.failures.length) throw new CoordinationError(op, r.failures, hint)
  return r.replies
}

export function renew(c: Coordinator, checkpointId: string, deadlineTs: number) {
  return all(c, 'renew', {checkpoint_id: checkpointId, deadline_ts: deadlineTs}, deadlineTs)
}

/** `episodes` null omits the scope (participants then export every live episode they hold). */
export function commit(c: Coordinator, checkpointId: string, checkpointDir: string, episodes: EpisodeId[] | null, deadlineTs: number) {
  const body: Record<string, unknown> = {checkpoint_id: checkpointId, deadline_ts: deadlineTs, checkpoint_dir: checkpointDir}
  if (episodes) body.episode_ids = episodes.map(toWire)
  return all(c, 'commit', body, deadlineTs, `retry the commit with the same directory and scope, or resume '${checkpointId}' and prepare a new checkpoint`)
}

/** Resumes in reverse prepare order, going on past failures; returns the replies and every failure. */
export async function resumeAll(c: Coordinator, checkpointId: string, deadlineTs: number): Promise<StageResult<'resume'>> {
  const body = encodeBody({checkpoint_id: checkpointId, deadline_ts: deadlineTs})
  const replies = new Map<string, ReplyOf<'resume'>>()
  const failures: ParticipantFailure[] = []
  for (const s of stagesOf(
    c.participants,
    [...PREPARE_ORDER].reverse().map((k) => [k]),
  )) {
    const r = await fanOut(c, 'resume', s.members, body, deadlineTs, s.name)
    for (const [k, v] of r.replies) replies.set(k, v)
    failures.push(...r.failures)
  }
  return {replies, failures}
}

/** Resumes in reverse prepare order, going on past failures; raises them all at the end. */
export async function resume(c: Coordinator, checkpointId: string, deadlineTs: number): Promise<Map<string, ReplyOf<'resume'>>> {
  const r = await resumeAll(c, checkpointId, deadlineTs)
  if (r.failures.length)
    throw new CoordinationError('resume', r.failures, `the other participants were resumed; resume '${checkpointId}' again; an unreachable participant resumes itself when its lease expires`)
  return r.replies
}

async function staged<O extends 'retire' | 'forget'>(c: Coordinator, op: O, body: Buffer, deadlineTs: number): Promise<Map<string, ReplyOf<O>>> {
  const replies = new Map<string, ReplyOf<O>>()
  for (const s of stagesOf(c.participants, RETIRE_ORDER)) {
    const r = await fanOut(c, op, s.members, body, deadlineTs, s.name)
    if (r.failures.length) {
      // Only a participant's invalid_phase says a checkpoint is open; anything else (down, a 500)
      // is named as it is, with what was and was not called.
      const open = r.failures.some((f) => f.code === 'invalid_phase')
      const later = `the stages after ${s.name} were not called; ${op} again once every participant answers (it is idempotent)`
      throw new CoordinationError(op, r.failures, open ? `${op} is refused while a checkpoint is open: resume first, then ${op} again` : later)
    }
    for (const [k, v] of r.replies) replies.set(k, v)
  }
  return replies
}

export const RETIRE_BATCH = 1024

/**
 * What a retire or forget would send, for a dry run: its stages in order, their servers, the
 * number of calls per server, and the participants that would refuse it (a checkpoint open).
 */
export function retirePreview(participants: (Participant & {status?: {phase: string; checkpoint_id: string | null}})[], items: number, checkpointId: string) {
  return {
    stages: stagesOf(participants, RETIRE_ORDER).map((s) => ({stage: s.name, servers: s.members.map((m) => m.server)})),
    calls_per_server: Math.ceil(items / RETIRE_BATCH),
    would_refuse: participants
      .filter((p) => p.status && ((p.status.phase !== 'idle' && p.status.phase !== 'restored') || (p.status.checkpoint_id !== null && p.status.checkpoint_id !== checkpointId)))
      .map((p) => ({server: p.server, phase: p.status!.phase, checkpoint_id: p.status!.checkpoint_id})),
  }
}

/**
 * The deadline of each batch: the first gets `deadlineTs`, every later one the same time from when
 * it is sent (reference 9.6: each retire/forget batch gets now + timeout_s), so a long list does
 * not run its last batches against a deadline the first ones spent.
 */
function batchDeadlines(deadlineTs: number): () => number {
  const budget = deadlineTs - Date.now() / 1000
  let first = true
  return () => {
    if (!first) return Date.now() / 1000 + budget
    first = false
    return deadlineTs
  }
}

/** Retires callers before callees, in batches; an empty list makes no call. */
export async function retire(c: Coordinator, checkpointId: string, episodes: EpisodeId[], deadlineTs: number): Promise<number> {
  const next = batchDeadlines(deadlineTs)
  let n = 0
  for (let i = 0; i < episodes.length; i += RETIRE_BATCH) {
    const batch = episodes.slice(i, i + RETIRE_BATCH)
    const d = next()
    await staged(c, 'retire', encodeBody({checkpoint_id: checkpointId, deadline_ts: d, episode_ids: batch.map(toWire)}), d)
    n += batch.length
  }
  return n
}

export async function forget(c: Coordinator, checkpointId: string, rolloutIds: string[], deadlineTs: number): Promise<number> {
  const ids = [...new Set(rolloutIds)].sort()
  const next = batchDeadlines(deadlineTs)
  for (let i = 0; i < ids.length; i += RETIRE_BATCH) {
    const d = next()
    await staged(c, 'forget', encodeBody({checkpoint_id: checkpointId, deadline_ts: d, rollout_ids: ids.slice(i, i + RETIRE_BATCH)}), d)
  }
  return ids.length
}

export interface RestoreOutcome {
  replies: Map<string, ReplyOf<'restore'>>
  /** Replacement attempts (checkpointed attempt + 1) the controller dispatches next. */
  replacements: EpisodeId[]
}

/**
 * How long a preflight waits for a status reply: as long as discovery's probe (reference 9.3), since
 * a multi-worker server forwards status to a coordinator that may take up to 30 s to answer.
 */
export const STATUS_TIMEOUT_MS = 60_000

/**
 * Every participant's status at once. A participant that does not answer is a failure, not an
 * exception: callers decide what an unreachable member means for them.
 */
export async function statusAll(c: Coordinator, timeoutMs = STATUS_TIMEOUT_MS): Promise<{statuses: Map<string, StatusReply>; failures: ParticipantFailure[]}> {
  const results = await Promise.all(c.participants.map((p) => c.client.status({name: p.server, url: p.url}, timeoutMs, c.signal)))
  const statuses = new Map<string, StatusReply>()
  const failures: ParticipantFailure[] = []
  for (const r of results) {
    if (r.ok) statuses.set(r.server, r.reply)
    else failures.push(r.failure)
  }
  return {statuses, failures}
}

/**
 * Retires a different list on each participant, callers before callees, in batches. For cleanups
 * that must touch only what one participant holds; `retire` sends one body to all.
 */
export async function retireEach(c: Coordinator, checkpointId: string, perServer: Map<string, EpisodeId[]>, deadlineTs: number): Promise<void> {
  const targets = c.participants.filter((p) => (perServer.get(p.server)?.length ?? 0) > 0)
  // A cleanup: a stage that fails does not spare the later ones their retires (reference 9.5: a
  // retire failure there is only logged); every failure is raised at the end.
  const failures: ParticipantFailure[] = []
  // Each batch its own deadline, the same budget from when it is sent, as retire() gives them.
  const next = batchDeadlines(deadlineTs)
  for (const s of stagesOf(targets, RETIRE_ORDER)) {
    await Promise.all(
      s.members.map(async (m) => {
        const list = perServer.get(m.server)!
        for (let i = 0; i < list.length; i += RETIRE_BATCH) {
          const d = next()
          const body = encodeBody({checkpoint_id: checkpointId, deadline_ts: d, episode_ids: list.slice(i, i + RETIRE_BATCH).map(toWire)})
          const r = await c.client.call({name: m.server, url: m.url}, 'retire', body, d, c.signal)
          if (!r.ok) return void failures.push(r.failure)
        }
      }),
    )
  }
  if (failures.length) throw new CoordinationError('retire', failures)
}

/**
 * Restores all or nothing. On any failure, each participant whose restore may have installed
 * state retires the replacement attempts: those it reported installing, or, where its reply was
 * lost, it missed its deadline or it failed inside (5xx), all of them (Gym's install outlives the
 * deadline and may stop half way, reference 4.7; Gym's own cleanup retires them everywhere, 9.5).
 * A participant that refused the restore before installing (a busy one: invalid_phase; a state it
 * cannot read: 422) is not touched: it may hold live work. Every participant is resumed, and the
 * restore's own error is raised, never a cleanup error.
 */
export async function restore(c: Coordinator, restoreId: string, checkpointDir: string, episodes: EpisodeId[], deadlineTs: number, log?: (m: string) => void): Promise<RestoreOutcome> {
  const body = encodeBody({checkpoint_id: restoreId, deadline_ts: deadlineTs, checkpoint_dir: checkpointDir, episode_ids: episodes.map(toWire)})
  const r = await fanOut(c, 'restore', c.participants, body, deadlineTs)
  if (r.failures.length === 0) return {replies: r.replies, replacements: episodes.map(nextAttempt)}
  const interrupted = c.signal?.aborted === true
  const cleanup: Coordinator = {...c, signal: undefined}
  const cleanupDeadline = Math.max(deadlineTs, Date.now() / 1000 + 30)
  const installed = new Map<string, EpisodeId[]>()
  for (const [server, reply] of r.replies) installed.set(server, reply.restored.map(fromCaptureKey))
  // Admitted (idle, and fresh by the restore's preflight), then failed: it may have installed any
  // part of the scope, and each replacement attempt there can only be the restore's own.
  for (const f of r.failures) if (f.code === 'deadline_exceeded' || (f.status !== null && f.status >= 500)) installed.set(f.server, episodes.map(nextAttempt))
  // No usable reply (timeout, reset, interrupt, a reply that is not one): the restore may have
  // landed, whole (restored under this ID) or in part (an install that failed half way leaves the
  // participant idle). Either way every replacement attempt there is the restore's own; one that
  // holds another checkpoint or restore never took this one.
  const unknown = r.failures.filter((f) => f.status === null || f.status === 200).map((f) => f.server)
  if (unknown.length) {
    const {statuses} = await statusAll({...cleanup, participants: c.participants.filter((p) => unknown.includes(p.server))})
    for (const [server, st] of statuses) if ((st.phase === 'restored' && st.checkpoint_id === restoreId) || st.phase === 'idle') installed.set(server, episodes.map(nextAttempt))
  }
  try {
    await retireEach(cleanup, restoreId, installed, cleanupDeadline)
  } catch (err) {
    log?.(`restore cleanup: retire of the installed replacement attempts failed: ${(err as Error).message}`)
  }
  try {
    await resume(cleanup, restoreId, cleanupDeadline)
  } catch (err) {
    log?.(`restore cleanup: resume failed: ${(err as Error).message}`)
  }
  if (interrupted) throw new ControllerError('interrupted', `interrupted during restore '${restoreId}'; what it installed was retired and the fleet was resumed`)
  throw new CoordinationError(
    'restore',
    r.failures,
    'what the restore installed was retired and the fleet was resumed; start the continued rollouts over from their inputs at attempt + 2, or restart the servers and restore again',
  )
}
