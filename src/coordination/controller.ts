import {mkdir} from 'node:fs/promises'
import path from 'node:path'

import {EpisodeId, captureKey, fromCaptureKey, toWire} from '../protocol/episode.js'
import {CommitReply} from '../protocol/wire.js'
import {CheckpointStateError} from '../storage/errors.js'
import {ControllerManifest, FORMAT_VERSION, publishLatest, writeControllerManifest} from '../storage/root.js'
import {ControllerError} from './errors.js'
import {Coordinator, PrepareResult, continuedOf, commit, prepare, renew, resume} from './operations.js'
import {RunTracker, newCheckpointId} from './runs.js'

export type Log = (msg: string) => void

/** Renews every lease periodically while a long step (waiting, publishing) runs. */
export class LeaseKeeper {
  private timer: NodeJS.Timeout | null = null
  private running: Promise<unknown> = Promise.resolve()

  constructor(
    private readonly c: Coordinator,
    private readonly checkpointId: string,
    private readonly everyMs: number,
    private readonly extendS: number,
    private readonly log: Log,
  ) {}

  start(): this {
    this.timer = setInterval(() => {
      this.running = renew({...this.c, signal: undefined, onStage: undefined}, this.checkpointId, Date.now() / 1000 + this.extendS).catch((err: Error) => this.log(`lease renewal failed: ${err.message}`))
    }, this.everyMs)
    this.timer.unref()
    return this
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer)
    this.timer = null
    await this.running
  }
}

/**
 * Prepares. When a stage misses its deadline, fails, or is interrupted, resumes every participant
 * (unless keepClosed: then only a missed deadline leaves the fleet closed) and raises:
 * `not_prepared` with each server's blockers, the stage's error, or `interrupted`.
 */
export async function prepareOrAbort(c: Coordinator, id: string, deadlineTs: number, opts: {keepClosed?: boolean; log?: Log} = {}): Promise<PrepareResult> {
  const abort = async () => {
    try {
      await resume({...c, signal: undefined}, id, Math.max(deadlineTs, Date.now() / 1000 + 30))
    } catch (err) {
      opts.log?.(`resume of '${id}' after the failed prepare failed: ${(err as Error).message}`)
    }
  }
  let prep: PrepareResult
  try {
    prep = await prepare(c, id, deadlineTs)
  } catch (err) {
    // Earlier stages are closed: reopen them, and fence the ID on the stages never reached.
    await abort()
    if (c.signal?.aborted) throw new ControllerError('interrupted', `interrupted while preparing '${id}'; the fleet was resumed`)
    throw err
  }
  if (prep.prepared) return prep
  if (!opts.keepClosed) await abort()
  const blockers = prep.blockers()
  const list = Object.entries(blockers)
    .map(([s, b]) => `${s}: ${b.blockerCount} (${b.blockers.slice(0, 5).join(', ')}${b.blockerCount > 5 ? ', …' : ''})`)
    .join('; ')
  throw new ControllerError(
    'not_prepared',
    `checkpoint '${id}' was not prepared before its deadline; blockers: ${list}. ${
      opts.keepClosed ? `The fleet is left closed: resume '${id}' when done inspecting.` : 'The fleet was resumed; retire the blockers or wait, then checkpoint again under a new ID.'
    }`,
    {checkpoint_id: id, blockers, not_reached: prep.notReached},
  )
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
}

/**
 * Commits everywhere at once with scope = continued(episodes), waits for /run replies already on
 * the wire, then writes the controller manifest and publishes LATEST: only after every commit
 * succeeded.
 */
export async function commitAndPublish(c: Coordinator, plan: CommitPlan): Promise<CommitOutcome> {
  const checkpointDir = path.join(path.resolve(plan.root), plan.checkpointId)
  try {
    await mkdir(checkpointDir, {recursive: true})
  } catch (err) {
    throw new ControllerError('input', `cannot create checkpoint directory ${checkpointDir}: ${(err as Error).message}`)
  }
  const scope = plan.episodes ? continuedOf(plan.episodes, plan.restarts) : null
  const replies = await commit(c, plan.checkpointId, checkpointDir, scope, plan.deadlineTs)
  const committed = new Set<string>()
  for (const r of replies.values()) for (const k of r.episode_ids) committed.add(k)
  const restartKeys = new Set(plan.restarts.map(captureKey))
  const awaitedRuns = plan.tracker ? await plan.tracker.waitForReplies(new Set([...committed, ...restartKeys]), plan.deadlineTs * 1000, c.signal) : []
  // A /run that replied after prepare is done, not continued: the rollout set is built after it.
  const replied = new Set(awaitedRuns.map(captureKey))
  const continued = (scope ?? [...committed].sort().map(fromCaptureKey)).filter((e) => !replied.has(captureKey(e)))
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
        return {server: p.server, kind: p.kind, instance: p.instance, manifest: r.manifest, episode_ids: r.episode_ids}
      }),
    }
    if (plan.controllerState) manifest.controller_state = plan.controllerState()
    try {
      await writeControllerManifest(checkpointDir, manifest)
      await publishLatest(path.resolve(plan.root), plan.checkpointId)
    } catch (err) {
      if (err instanceof CheckpointStateError) throw new ControllerError('invalid_checkpoint', err.message)
      throw new ControllerError('invalid_checkpoint', `cannot publish ${checkpointDir}: ${(err as Error).message}`)
    }
  }
  return {checkpointId: plan.checkpointId, checkpointDir, continued, restarted, replies, awaitedRuns, published: publish}
}

export interface CheckpointOptions {
  root: string
  checkpointId?: string
  /** Seconds each phase (prepare+commit, then resume) may take. */
  timeoutS?: number
  episodes?: EpisodeId[] | null
  tracker?: RunTracker
  controllerState?: () => unknown
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
  let keeper: LeaseKeeper | null = null
  let resumeNeeded = true
  let failed = false
  try {
    phase('prepare', 'start')
    // prepareOrAbort resumes by itself when prepare does not succeed.
    resumeNeeded = false
    const prep = await prepareOrAbort(c, id, deadlineTs, {keepClosed: opts.keepClosedOnBlockers, log}).catch((err: unknown) => {
      phase('prepare', 'failed')
      throw err
    })
    resumeNeeded = true
    phase('prepare', 'done')
    keeper = new LeaseKeeper(c, id, opts.renewEveryMs ?? 60_000, timeoutS, log).start()
    phase('commit', 'start')
    const restarts = prep.restarts()
    const episodes = opts.episodes !== undefined ? opts.episodes : opts.tracker ? opts.tracker.candidates() : null
    const outcome = await commitAndPublish(c, {
      checkpointId: id,
      root: opts.root,
      episodes,
      restarts,
      deadlineTs,
      tracker: opts.tracker,
      controllerState: opts.controllerState,
    })
    phase('commit', 'done')
    return {...outcome, prepare: prep}
  } catch (err) {
    failed = true
    if (c.signal?.aborted) throw new ControllerError('interrupted', `interrupted during checkpoint '${id}'; the fleet was resumed`)
    throw err
  } finally {
    await keeper?.stop()
    if (resumeNeeded) {
      phase('resume', 'start')
      try {
        await resume({...c, signal: undefined}, id, Date.now() / 1000 + timeoutS)
        phase('resume', 'done')
      } catch (err) {
        phase('resume', 'failed')
        log(`resume of '${id}' failed: ${(err as Error).message}`)
        // The first error wins; a failed resume after a successful checkpoint is an error too.
        // eslint-disable-next-line no-unsafe-finally
        if (!failed) throw err
      }
    }
  }
}
