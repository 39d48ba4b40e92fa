import {createHash} from 'node:crypto'
import {Agent, request} from 'undici'

import {EpisodeId, captureKey, fromCaptureKey, fromWire, nextAttempt} from '../protocol/episode.js'
import {PrepareReport} from '../protocol/wire.js'
import {StoredRecord} from '../storage/participant-store.js'
import {PyValue, isPyDict, pyGet} from '../storage/pyjson.js'
import {ControlError, ControlPlane, ExportedRecord, Participant} from './control-plane.js'
import {RolloutMap, sleep} from './util.js'

/**
 * Simulated episodes behind the participant double. An environment server runs each episode as a
 * chain of steps; every step calls each downstream participant (model, agent, resources) over HTTP,
 * and each of them folds the step into per-episode state. The final result is a digest over all of
 * it, so a restore that loses or duplicates any state on any participant gives a different result.
 */

export function sha(...parts: (string | number)[]): string {
  return createHash('sha256').update(parts.join(':')).digest('hex')
}

abstract class SimBase implements Participant {
  protected closed = false
  private reopenWaiters: (() => void)[] = []
  private listeners: (() => void)[] = []
  protected cp!: ControlPlane
  /** Fault injection: blockers that never clear. */
  stuckBlockers: string[] = []

  constructor(
    readonly kind: string,
    readonly instance: string,
  ) {}

  attach(cp: ControlPlane): void {
    this.cp = cp
  }

  get admissionClosed(): boolean {
    return this.closed
  }

  closeAdmission(): void {
    this.closed = true
    this.changed()
  }

  openAdmission(): void {
    this.closed = false
    const w = this.reopenWaiters
    this.reopenWaiters = []
    for (const f of w) f()
    this.changed()
  }

  /** Resolves once admission is open (immediately if it is). */
  protected whenOpen(signal?: AbortSignal): Promise<void> {
    if (!this.closed) return Promise.resolve()
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason)
      const done = () => {
        signal?.removeEventListener('abort', onAbort)
        resolve()
      }
      const onAbort = () => {
        this.reopenWaiters = this.reopenWaiters.filter((f) => f !== done)
        reject(signal!.reason)
      }
      signal?.addEventListener('abort', onAbort, {once: true})
      this.reopenWaiters.push(done)
    })
  }

  onChange(cb: () => void): void {
    this.listeners.push(cb)
  }

  protected changed(): void {
    for (const f of this.listeners) f()
  }

  /** Retired by a retire mark (also while that retire is still stopping it). */
  protected isRetired(ep: EpisodeId): boolean {
    const mark = this.cp?.retired.get(ep.rolloutId)
    return mark !== undefined && ep.attempt <= mark
  }

  abstract report(): PrepareReport
  abstract exportRecords(scope: ReadonlySet<string> | null): ExportedRecord[]
  abstract validateRecord(key: string, record: PyValue): void
  abstract install(records: StoredRecord[], scope: EpisodeId[]): Promise<void>
  abstract hasLiveState(): boolean
  abstract retire(e: EpisodeId, signal: AbortSignal): Promise<void>
  abstract deleteRestored(keys: string[]): Promise<void>
  abstract restoredKeys(): string[]
  statusExtra(): Record<string, unknown> {
    return {}
  }
}

function episodeIdRecord(e: EpisodeId): Map<string, PyValue> {
  return new Map<string, PyValue>([
    ['rollout_id', e.rolloutId],
    ['attempt', e.attempt],
  ])
}

// ---------------------------------------------------------------- environment

export interface RunBody {
  rollout_id: string
  attempt: number
  input: string
  steps: number
  step_ms: number
  step_mode: 'wait' | 'replay'
  /** Ask the resources server to treat this episode as restart-only (it cannot be captured). */
  restart: boolean
}

export interface RunResult {
  rollout_id: string
  attempt: number
  result: string
  steps: number
  resumed_from_step: number
}

interface Boundary {
  step: number
  acc: string
}

interface LiveEpisode {
  ep: EpisodeId
  key: string
  state: 'stepping' | 'replaying' | 'boundary' | 'parked' | 'closing'
  restart: boolean
  retiring: boolean
  boundary: Boundary | null
  taskDigest: string
  abort: AbortController
  done: Promise<unknown>
}

export interface Downstream {
  name: string
  url: string
}

export function taskDigest(input: string, steps: number): string {
  return createHash('sha256').update(JSON.stringify({input, steps})).digest('hex')
}

export class SimEnvironment extends SimBase {
  readonly episodes = new RolloutMap<LiveEpisode>()
  readonly restoredPending = new RolloutMap<{boundary: Boundary | null; taskDigest: string}>()
  downstream: Downstream[] = []
  private readonly data = new Agent({connections: 64, keepAliveTimeout: 10_000})

  constructor(instance: string) {
    super('environment', instance)
  }

  async destroy(): Promise<void> {
    for (const e of this.episodes.values()) e.abort.abort(new Error('server stopped'))
    await this.data.destroy().catch(() => {})
  }

  report(): PrepareReport {
    const blockers: string[] = [...this.stuckBlockers]
    const restarts: string[] = []
    for (const e of this.episodes.values()) {
      if (e.retiring) blockers.push(e.key)
      else if (e.restart) restarts.push(e.key)
      else if (e.state === 'stepping' || e.state === 'closing') blockers.push(e.key)
    }
    blockers.sort()
    return {ready: blockers.length === 0, blockers, blocker_count: blockers.length, counts: {episodes: this.episodes.size}, restarts: restarts.sort()}
  }

  exportRecords(scope: ReadonlySet<string> | null): ExportedRecord[] {
    const out: ExportedRecord[] = []
    const rec = (ep: EpisodeId, digest: string, b: Boundary | null): ExportedRecord => ({
      episode: ep,
      record: new Map<string, PyValue>([
        ['episode_id', episodeIdRecord(ep)],
        ['task_digest', digest],
        [
          'boundary',
          b
            ? new Map<string, PyValue>([
                ['step', b.step],
                ['acc', b.acc],
              ])
            : null,
        ],
      ]),
    })
    // Gym's rule: every live episode held at a boundary, whatever the scope; only restored state
    // no replacement has claimed is cut to the scope (and deleted after the write).
    for (const e of this.episodes.values()) {
      if (e.restart || e.retiring || this.isRetired(e.ep)) continue
      out.push(rec(e.ep, e.taskDigest, e.boundary))
    }
    for (const [key, r] of this.restoredPending) {
      if (scope && !scope.has(key)) continue
      out.push(rec(fromCaptureKey(key), r.taskDigest, r.boundary))
    }
    return out
  }

  validateRecord(_key: string, record: PyValue): void {
    const digest = pyGet(record, 'task_digest')
    if (typeof digest !== 'string' || !/^[0-9a-f]{64}$/.test(digest)) throw new Error('task_digest is not a sha256 hex digest')
    const b = pyGet(record, 'boundary')
    if (b === null) return
    if (!isPyDict(b) || typeof pyGet(b, 'step') !== 'number' || typeof pyGet(b, 'acc') !== 'string') throw new Error('boundary must be null or {step, acc}')
  }

  async install(records: StoredRecord[]): Promise<void> {
    for (const r of records) {
      const b = pyGet(r.record, 'boundary')
      this.restoredPending.set(captureKey(nextAttempt(fromCaptureKey(r.key))), {
        taskDigest: pyGet(r.record, 'task_digest') as string,
        boundary: b ? {step: pyGet(b, 'step') as number, acc: pyGet(b, 'acc') as string} : null,
      })
    }
  }

  hasLiveState(): boolean {
    // Restored state no replacement has claimed is live too: a second restore must not replace it.
    return this.episodes.size > 0 || this.restoredPending.size > 0
  }

  async retire(e: EpisodeId): Promise<void> {
    const waits: Promise<unknown>[] = []
    for (const key of this.episodes.keysOf(e.rolloutId)) {
      const live = this.episodes.get(key)!
      if (live.ep.attempt > e.attempt) continue
      // A retry of a retire cut short waits again without cancelling a second time.
      if (!live.retiring) {
        live.retiring = true
        live.abort.abort(new ControlError('stale_attempt', `attempt ${live.ep.attempt} of '${live.ep.rolloutId}' was retired`))
      }
      waits.push(live.done.catch(() => {}))
    }
    this.changed()
    await Promise.all(waits)
    for (const key of this.restoredPending.keysOf(e.rolloutId)) {
      if (fromCaptureKey(key).attempt <= e.attempt) this.restoredPending.delete(key)
    }
  }

  async deleteRestored(keys: string[]): Promise<void> {
    for (const k of keys) this.restoredPending.delete(k)
  }

  restoredKeys(): string[] {
    return [...this.restoredPending.keys()].sort()
  }

  override statusExtra(): Record<string, unknown> {
    return {restored_pending: this.restoredKeys()}
  }

  /** The data-plane /run. Throws ControlError for refusals. */
  run(body: RunBody): Promise<RunResult> {
    const ep = fromWire(body)
    const key = captureKey(ep)
    this.cp.checkAttempt(ep)
    if (this.admissionClosed) throw new ControlError('admission_closed', 'a checkpoint is open; send the /run again after resume')
    if (this.episodes.has(key)) throw new ControlError('checkpoint_error', `episode '${key}' is already running`)
    const digest = taskDigest(body.input, body.steps)
    const restored = this.restoredPending.get(key)
    if (restored && restored.taskDigest !== digest) throw new ControlError('checkpoint_error', `episode '${key}' was restored for another task (digest mismatch)`)
    this.restoredPending.delete(key)
    const live: LiveEpisode = {
      ep,
      key,
      state: 'stepping',
      restart: false,
      retiring: false,
      boundary: restored?.boundary ?? null,
      taskDigest: digest,
      abort: new AbortController(),
      done: Promise.resolve(),
    }
    this.episodes.set(key, live)
    const done = this.drive(live, body).finally(() => {
      this.episodes.delete(key)
      this.changed()
    })
    live.done = done
    this.changed()
    return done
  }

  private async drive(live: LiveEpisode, body: RunBody): Promise<RunResult> {
    const signal = live.abort.signal
    const from = live.boundary?.step ?? 0
    let acc = live.boundary?.acc ?? sha('start', body.rollout_id, body.input)
    for (let step = from + 1; step <= body.steps; step++) {
      live.state = body.step_mode === 'replay' ? 'replaying' : 'stepping'
      this.changed()
      await sleep(body.step_ms, signal)
      if (body.step_mode === 'replay' && this.admissionClosed && !live.restart) {
        // A replay step that ends while a checkpoint is open leaves the boundary before the step.
        live.state = 'parked'
        this.changed()
        await this.whenOpen(signal)
        live.state = 'stepping'
      }
      const seed = step === 1
      const replies = await Promise.all(this.downstream.map((d) => this.callStep(d, live.key, {step, acc, seed, restart: body.restart, replay: body.step_mode === 'replay'}, signal)))
      if (replies.some((r) => r.restart)) live.restart = true
      acc = sha(acc, step, ...replies.map((r) => r.digest))
      live.boundary = {step, acc}
      live.state = 'boundary'
      this.changed()
      if (this.admissionClosed && !live.restart) {
        live.state = 'parked'
        this.changed()
        await this.whenOpen(signal)
      }
    }
    live.state = 'closing'
    this.changed()
    await Promise.all(this.downstream.map((d) => this.post(d, `/ng-rollout/${live.key}/close`, {}, signal)))
    return {rollout_id: body.rollout_id, attempt: body.attempt, result: acc, steps: body.steps, resumed_from_step: from}
  }

  private async callStep(d: Downstream, key: string, body: object, signal: AbortSignal): Promise<{digest: string; restart: boolean}> {
    const res = await this.post(d, `/ng-rollout/${key}/step`, body, signal)
    return {digest: (res.json as {digest: string}).digest, restart: res.headers['x-ng-checkpoint-restart'] === '1'}
  }

  private async post(d: Downstream, path: string, body: object, signal: AbortSignal): Promise<{json: unknown; headers: Record<string, unknown>}> {
    const res = await request(d.url + path, {
      method: 'POST',
      dispatcher: this.data,
      body: JSON.stringify(body),
      headers: {'content-type': 'application/json'},
      signal,
    })
    const text = await res.body.text()
    if (res.statusCode !== 200) {
      let code = 'checkpoint_error'
      try {
        code = (JSON.parse(text) as {error: {code: string}}).error.code
      } catch {}
      throw new ControlError(code as 'checkpoint_error', `${d.name}${path} answered ${res.statusCode}: ${text.slice(0, 200)}`)
    }
    return {json: JSON.parse(text), headers: res.headers}
  }
}

// ---------------------------------------------------------------- downstream (model, agent, resources)

export interface Session {
  ep: EpisodeId
  chain: string
  calls: number
  restart: boolean
  restored: boolean
  /** Opaque session state carried through checkpoints byte for byte (tool outputs, transcripts). */
  payload?: PyValue
  /**
   * The last step, when the environment ran it in replay mode: its number and the chain before it.
   * A replay step does not hold a checkpoint back, so the checkpoint may hold this session after
   * the step and the environment before it; after a restore the environment runs the step again,
   * and running it again from `before` leaves the session as one run of it did (Gym's downstream
   * work for a replay step is replay-safe: the model cuts held generations, resources serve only
   * replay-safe requests). Exported as `replay_step` and `replay_before`.
   */
  replay?: {step: number; before: string}
}

export class SimDownstream extends SimBase {
  readonly sessions = new RolloutMap<Session>()
  private readonly inflight = new RolloutMap<{count: number; abort: AbortController; done: Promise<void>[]}>()
  /** Simulated work per call, in ms. */
  callMs = 0
  /** Simulated time a step call spends on the way here, before admission is checked, in ms. */
  latencyMs = 0

  constructor(kind: 'model' | 'agent' | 'resources', instance: string) {
    super(kind, instance)
  }

  report(): PrepareReport {
    const blockers = [...this.stuckBlockers, ...[...this.inflight.keys()].filter((k) => !this.sessions.get(k)?.restart)].sort()
    const restarts = [...this.sessions.values()]
      .filter((s) => s.restart)
      .map((s) => captureKey(s.ep))
      .sort()
    let inflight = 0
    for (const f of this.inflight.values()) inflight += f.count
    return {ready: blockers.length === 0, blockers, blocker_count: blockers.length, counts: {sessions: this.sessions.size, inflight}, restarts}
  }

  exportRecords(scope: ReadonlySet<string> | null): ExportedRecord[] {
    const out: ExportedRecord[] = []
    // Gym's rule: agent and resources export every live session whatever the scope; the policy
    // model, which keeps a ledger of every episode it served, exports only the scope. Restored
    // sessions no replacement has claimed are cut to the scope on every kind.
    const cut = this.kind === 'model'
    for (const [key, s] of this.sessions) {
      if (s.restart || this.isRetired(s.ep)) continue
      if (scope && (cut || s.restored) && !scope.has(key)) continue
      out.push({
        episode: s.ep,
        record: new Map<string, PyValue>([
          ['episode_id', episodeIdRecord(s.ep)],
          ['session_id', key],
          [
            'state',
            new Map<string, PyValue>([
              ['chain', s.chain],
              ['calls', s.calls],
              ...(s.payload === undefined ? [] : [['payload', s.payload] as [string, PyValue]]),
              ...(s.replay === undefined ? [] : [['replay_step', s.replay.step] as [string, PyValue], ['replay_before', s.replay.before] as [string, PyValue]]),
            ]),
          ],
        ]),
      })
    }
    return out
  }

  /** The model's staging keys: one token-store key per call an exported session made (`<capture key>/call-<n>`), sorted. */
  commitReplyExtras(exported: ExportedRecord[]): {staging_keys?: string[]} {
    if (this.kind !== 'model') return {}
    const keys: string[] = []
    for (const r of exported) {
      const calls = pyGet(pyGet(r.record, 'state'), 'calls') as number
      for (let n = 1; n <= calls; n++) keys.push(`${captureKey(r.episode)}/call-${n}`)
    }
    return {staging_keys: keys.sort()}
  }

  validateRecord(_key: string, record: PyValue): void {
    const st = pyGet(record, 'state')
    if (!isPyDict(st) || typeof pyGet(st, 'chain') !== 'string' || typeof pyGet(st, 'calls') !== 'number') throw new Error('state must be {chain, calls}')
    const step = pyGet(st, 'replay_step')
    const before = pyGet(st, 'replay_before')
    if ((step === undefined) !== (before === undefined) || (step !== undefined && (typeof step !== 'number' || typeof before !== 'string')))
      throw new Error('replay_step and replay_before must come together, a number and a string')
  }

  async install(records: StoredRecord[]): Promise<void> {
    for (const r of records) {
      const ep = nextAttempt(fromCaptureKey(r.key))
      const st = pyGet(r.record, 'state')
      const payload = pyGet(st, 'payload')
      const step = pyGet(st, 'replay_step')
      this.sessions.set(captureKey(ep), {
        ep,
        chain: pyGet(st, 'chain') as string,
        calls: pyGet(st, 'calls') as number,
        restart: false,
        restored: true,
        ...(payload === undefined ? {} : {payload}),
        ...(step === undefined ? {} : {replay: {step: step as number, before: pyGet(st, 'replay_before') as string}}),
      })
    }
  }

  hasLiveState(): boolean {
    return this.sessions.size > 0 || this.inflight.size > 0
  }

  async retire(e: EpisodeId): Promise<void> {
    const waits: Promise<void>[] = []
    for (const key of this.inflight.keysOf(e.rolloutId)) {
      const f = this.inflight.get(key)!
      const ep = fromCaptureKey(key)
      if (ep.attempt <= e.attempt) {
        f.abort.abort(new ControlError('stale_attempt', `attempt ${ep.attempt} of '${ep.rolloutId}' was retired`))
        waits.push(...f.done)
      }
    }
    await Promise.all(waits.map((w) => w.catch(() => {})))
    for (const key of this.sessions.keysOf(e.rolloutId)) if (this.sessions.get(key)!.ep.attempt <= e.attempt) this.sessions.delete(key)
    this.changed()
  }

  async deleteRestored(keys: string[]): Promise<void> {
    for (const k of keys) if (this.sessions.get(k)?.restored) this.sessions.delete(k)
  }

  restoredKeys(): string[] {
    return [...this.sessions.entries()]
      .filter(([, s]) => s.restored)
      .map(([k]) => k)
      .sort()
  }

  /** The data-plane step call. */
  async step(key: string, body: {step: number; acc: string; seed?: boolean; restart?: boolean; replay?: boolean}): Promise<{digest: string; restart: boolean}> {
    const ep = fromCaptureKey(key)
    this.cp.checkAttempt(ep)
    if (this.latencyMs) await sleep(this.latencyMs)
    const ctl = new AbortController()
    // Requests wait out an open checkpoint instead of being refused; a seed must not mark a
    // restart while one is open, so the restarts a prepare reported stay those of its commit.
    await this.whenOpen(ctl.signal)
    this.cp.checkAttempt(ep)
    let f = this.inflight.get(key)
    if (!f) this.inflight.set(key, (f = {count: 0, abort: ctl, done: []}))
    f.count++
    let release!: () => void
    const done = new Promise<void>((r) => (release = r))
    f.done.push(done)
    this.changed()
    try {
      if (this.callMs) await sleep(this.callMs, f.abort.signal)
      let s = this.sessions.get(key)
      if (!s) {
        if (!body.seed) throw new ControlError('checkpoint_error', `${this.kind} ${this.instance} holds no session for episode '${key}'`)
        s = {ep, chain: sha(this.kind, this.instance, ep.rolloutId), calls: 0, restart: Boolean(body.restart) && this.kind === 'resources', restored: false}
        this.sessions.set(key, s)
      }
      if (s.restored && body.replay && s.replay?.step === body.step) {
        // The replay step the checkpoint caught half done, run again after a restore.
        s.chain = sha(s.replay.before, body.step, body.acc)
      } else {
        s.replay = body.replay ? {step: body.step, before: s.chain} : undefined
        s.chain = sha(s.chain, body.step, body.acc)
        s.calls++
      }
      s.restored = false
      return {digest: s.chain, restart: s.restart}
    } finally {
      f.count--
      f.done = f.done.filter((d) => d !== done)
      if (f.count === 0) this.inflight.delete(key)
      release()
      this.changed()
    }
  }

  close(key: string): void {
    this.sessions.delete(key)
    this.changed()
  }

  override statusExtra(): Record<string, unknown> {
    // As Gym's: the model lists the restored generation cuts no replacement has claimed.
    if (this.kind === 'model') return {restored_generation_cuts: this.restoredKeys()}
    return this.kind === 'resources' ? {mode: 'exported', verify: 'wait'} : {}
  }
}

export type SimParticipant = SimEnvironment | SimDownstream
