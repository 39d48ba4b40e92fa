import {randomBytes} from 'node:crypto'
import {isAscii} from 'node:buffer'
import {FSWatcher, createReadStream, watch} from 'node:fs'
import {lstat, mkdir, mkdtemp, open, readFile, readdir, rm, stat} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import {request} from 'undici'
import {z} from 'zod'

import {clipInput, fromCaptureKey, toWire} from '../protocol/episode.js'
import {EpisodeIdWire} from '../protocol/episode-schema.js'
import {ErrorEnvelope} from '../protocol/errors.js'
import {CHECKPOINT_ROUTE_PREFIX, KINDS, MAX_REPORTED_BLOCKERS, Operation, PHASES, ReplyOf, StatusReply} from '../protocol/wire.js'
import {CheckpointStateError} from '../storage/errors.js'
import {MANIFEST_FILE, encodeManifest, participantDir, readParticipantState} from '../storage/participant-store.js'
import {pyDumps, pyLoads} from '../storage/pyjson.js'
import {describeFsError} from '../storage/root.js'
import {ONE_RECORD_PER_EPISODE} from '../storage/verify.js'
import {CallResult, ControlClient, ServerRef, describeTransportError} from './client.js'
import {DiscoveredParticipant, Discovery, isSafeComponent} from './discover.js'
import {ControllerError, CoordinationError, ParticipantFailure, failureMessage} from './errors.js'
import {restoreBlockers} from './restore.js'

/**
 * `gymckpt conformance`: checks a checkpoint participant against the protocol (the reference's
 * sections named per check), as csi-sanity does for CSI drivers. Safe checks send only reads and
 * requests a conforming participant refuses before any state change; destructive checks drive the
 * whole phase machine and are meant for a staging fleet. Whatever a check opened is resumed before
 * the run ends, also when a check fails or the run is interrupted.
 */

export type CheckOutcome = 'pass' | 'fail' | 'skip'

export interface CheckDef {
  id: string
  /** The reference sections the rule comes from. */
  section: string
  rule: string
  /** Changes participant state (prepare, commit, resume, retire): only with --destructive. */
  destructive: boolean
}

export interface CheckResult extends CheckDef {
  /** null when the result is about the run, not one participant (e.g. skipped without --destructive). */
  server: string | null
  result: CheckOutcome
  message: string
}

const c = (id: string, section: string, rule: string, destructive = false): CheckDef => ({id, section, rule, destructive})

/** Every check, in report order. */
export const CHECKS: readonly CheckDef[] = [
  c('auth.missing-bearer', '§1', 'GET status without Authorization → 401 {"error": {"code": "unauthorized"}}'),
  c('auth.wrong-bearer', '§1', 'GET status with a wrong bearer token → 401 {"error": {"code": "unauthorized"}}'),
  c('auth.exact-bearer', '§1', 'the header must be exactly "Bearer <token>": "bearer <token>" and "Bearer  <token>" → 401'),
  c('auth.post-bearer', '§1', 'a valid POST body (resume of a new ID) with a wrong bearer → 401 unauthorized'),
  c('status.reply', '§4.1', 'GET status → 200 object: kind, instance, phase, checkpoint_id (string|null), lease_expires_at (number|null), retired_rollouts (int ≥ 0), report'),
  c('status.kind', '§4.1', 'kind is environment, model, agent or resources'),
  c('status.instance', '§4.1, §7.1', 'instance is a safe path component (^[A-Za-z0-9][A-Za-z0-9._-]*$, ≤ 128 characters), one per kind in the fleet'),
  c('status.phase', '§3.1', 'phase is idle, preparing, prepared, committed or restored; checkpoint_id and lease_expires_at are null exactly when idle'),
  c('report.schema', '§5.1', 'report: ready (bool), blockers (string[]), blocker_count (int ≥ 0), counts ({string: int}), restarts (string[])'),
  c('report.blockers', '§5.1', 'blocker_count ≥ len(blockers); at most 100 blockers listed'),
  c('report.restarts', '§5.1, §2.1', 'every restart is a capture key naming a valid EpisodeId'),
  c('refuse.unknown-field', '§1, §2', 'a body with an unknown key (prepare, resume, commit, inside an EpisodeId) → 422'),
  c('refuse.checkpoint-id', '§2', "checkpoint_id empty, '../x', '.x', '-x', 'a/b', 129 characters or a number → 422 (prepare and resume)"),
  c('refuse.deadline', '§2', 'deadline_ts NaN, Infinity, -Infinity, 1e999, "soon", null or missing → 422'),
  c('refuse.episode-id', '§2.1', 'EpisodeId with the reserved -a<N> suffix, an unsafe or empty rollout_id, attempt -1 or 1.5, or a capture-key string → 422'),
  c('refuse.empty-lists', '§2', 'retire without episode_ids, forget without rollout_ids → 422'),
  c('retire.forget', '§4.4, §4.5, §6', 'from idle: retire of a new rollout → 200 and retired_rollouts + 1; forget → 200 and the mark is gone', true),
  c('phase.prepare', '§3.1, §4.2', 'prepare from idle → 200 {"phase": "prepared", report}; status: prepared under that ID, lease past deadline_ts', true),
  c('phase.prepare-replay', '§3.3', 'prepare of the prepared ID again → 200 prepared (the remembered result)', true),
  c('lease.renew', '§3.7, §4.3', 'renew → 200 lease_expires_at ≥ deadline_ts; an earlier deadline never moves the lease back', true),
  c('fence.conflict', '§3.2', 'prepare of another ID while one is open → 409 checkpoint_conflict', true),
  c('outside.retire-open', '§3.2, §4.4', 'retire while a checkpoint is open → 409 invalid_phase', true),
  c('outside.forget-open', '§3.2, §4.5', 'forget while a checkpoint is open → 409 invalid_phase', true),
  c('commit.restart-in-scope', '§4.6', 'a commit scope naming a reported restart → 409 restart_in_scope', true),
  c('commit.reply', '§4.6', 'commit into a new directory → 200 {"phase": "committed", manifest (own kind, instance, the ID), episode_ids}; status committed', true),
  c('store.manifest', '§7.2', "manifest.json: sorted keys, indent 1, ASCII, no trailing newline; schema_version 1; equal to the commit reply's manifest", true),
  c(
    'store.records',
    '§7.1, §7.4',
    "one records-<sha256>.jsonl named for its content's digest = records_sha256, record_count lines each ending in \\n, episode_ids = its sorted unique keys (one record per episode on environment and model; agent and resources write one per session, §7.6); no other files",
    true,
  ),
  c('store.lines', '§7.4', 'each record line is Python json.dumps output (", " and ": ", ASCII escapes, key order kept), episode_id first', true),
  c('store.manifest-last', '§7.3', 'the manifest is written after the records file', true),
  c('commit.replay', '§3.4, §3.5', 'commit again with equal arguments → the same reply', true),
  c('commit.conflict', '§3.5', 'commit of the committed ID with another scope → 409 checkpoint_conflict (skipped where the first reply is replayed: Gym version A)', true),
  c('commit.export-once', '§3.5, §4.6', 'a replayed or refused commit exports and writes nothing: the participant directory is unchanged', true),
  c('phase.resume', '§3.6', 'resume of the open ID → {"phase": "idle", "idempotent": false}; status idle, checkpoint_id and lease null', true),
  c('phase.resume-again', '§3.6', 'resume of a resumed ID → {"phase": "idle", "idempotent": true}', true),
  c('fence.stale-prepare', '§3.2, §3.6', 'prepare of a resumed ID → 409 stale_checkpoint', true),
  c('fence.resume-unknown', '§3.6', 'resume of a never-seen ID from idle → idempotent true, and a later prepare of it → 409 stale_checkpoint', true),
  c('fence.window', '§3.1', 'an ID stays fenced while 63 newer IDs are resumed (the last 64 are kept)', true),
]

const BY_ID = new Map(CHECKS.map((d) => [d.id, d]))

/**
 * The checks `--only` selects: exact IDs, or a group before the dot (`fence` selects every
 * `fence.*`). No selection is every check. An unknown name is an input error (nothing is sent).
 */
export function selectChecks(only?: readonly string[]): CheckDef[] {
  if (!only?.length) return [...CHECKS]
  const picked = new Set<string>()
  for (const name of only) {
    const hits = CHECKS.filter((d) => d.id === name || d.id.startsWith(`${name}.`))
    if (hits.length === 0) {
      const groups = [...new Set(CHECKS.map((d) => d.id.split('.')[0]))].join(', ')
      throw new ControllerError('input', `--only ${clipInput(name)}: no such check; give a check ID (see --list or the README) or a group: ${groups}`)
    }
    for (const h of hits) picked.add(h.id)
  }
  return CHECKS.filter((d) => picked.has(d.id))
}

export interface ConformanceOptions {
  client: ControlClient
  /** For the raw calls (an exact status body, odd bodies); never printed. */
  token: string
  discovery: Discovery
  checks?: readonly CheckDef[]
  destructive?: boolean
  /** Run destructive checks on participants that hold live work. */
  force?: boolean
  /** Keep the temporary checkpoint directory (its path is in the report). */
  keepDir?: boolean
  /** Parent of the temporary checkpoint directory; every participant must see it at the same path. */
  dir?: string
  /** Bound of each call and each deadline_ts sent, in seconds. */
  timeoutS?: number
  signal?: AbortSignal
  /** Participants checked at once. */
  concurrency?: number
}

export interface ConformanceReport {
  passed: boolean
  destructive: boolean
  interrupted: boolean
  /** The kept temporary checkpoint directory (--keep-dir), else null. */
  checkpointDir: string | null
  participants: {server: string; kind: string; instance: string}[]
  results: CheckResult[]
  counts: Record<CheckOutcome, number>
}

export type Outcome = {result: CheckOutcome; message: string}
const pass = (message: string): Outcome => ({result: 'pass', message})
const fail = (message: string): Outcome => ({result: 'fail', message})
const skip = (message: string): Outcome => ({result: 'skip', message})

class Interrupted extends Error {}

/** Status fields that a tolerant reader defaults; conformance reads them as sent. */
const StrictStatus = z.looseObject({
  kind: z.string(),
  instance: z.string(),
  phase: z.string(),
  checkpoint_id: z.string().nullable(),
  lease_expires_at: z.number().nullable(),
  retired_rollouts: z.number().int().min(0),
  report: z.looseObject({}),
})
const StrictReport = z.looseObject({
  ready: z.boolean(),
  blockers: z.array(z.string()),
  blocker_count: z.number().int().min(0),
  counts: z.record(z.string(), z.number().int()),
  restarts: z.array(z.string()),
})
const StrictCommitReply = z.looseObject({
  phase: z.literal('committed'),
  manifest: z.looseObject({
    schema_version: z.literal(1),
    kind: z.string(),
    instance: z.string(),
    checkpoint_id: z.string(),
    records_file: z.string(),
    records_sha256: z.string().regex(/^[0-9a-f]{64}$/),
    record_count: z.number().int().min(0),
  }),
  episode_ids: z.array(z.string()),
})
/** A resume reply as sent: the client reads a missing `idempotent` as false. */
const StrictResumeReply = z.looseObject({phase: z.literal('idle'), idempotent: z.boolean()})
/** Checks that read a successful commit. */
const AFTER_COMMIT = ['store.manifest', 'store.records', 'store.lines', 'store.manifest-last', 'commit.replay', 'commit.conflict', 'commit.export-once']
const RECORDS_NAME = /^records-[0-9a-f]{64}\.jsonl$/

function issue(err: z.ZodError): string {
  const i = err.issues[0]
  return `${i?.path.join('.') || '(root)'}: ${i?.message}`
}

interface RawReply {
  status: number | null
  text: string
  json: unknown
  /** Why no reply came (transport error, timeout). */
  error?: string
}

function describeRaw(r: RawReply): string {
  if (r.status === null) return `no reply (${r.error})`
  const env = ErrorEnvelope.safeParse(r.json)
  if (env.success) return `HTTP ${r.status} ${env.data.error.code}`
  if (r.json !== undefined) return `HTTP ${r.status} ${clipInput(JSON.stringify(r.json), 120)}`
  return `HTTP ${r.status} ${clipInput(r.text, 80)}`
}

function describeCall(r: CallResult<unknown>): string {
  return r.ok ? `200 ${clipInput(JSON.stringify(r.reply), 120)}` : failureMessage(r.failure)
}

function refusedWith(r: CallResult<unknown>, status: number, code: string): boolean {
  return !r.ok && r.failure.status === status && r.failure.code === code
}

/** Keys sorted at every level: replies compared as values, not as byte strings. */
function canonical(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) =>
    x && typeof x === 'object' && !Array.isArray(x) ? Object.fromEntries(Object.entries(x as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) : x,
  )
}

function firstDifference(got: string, want: string): string {
  let i = 0
  while (i < got.length && i < want.length && got[i] === want[i]) i++
  return `at character ${i}: got ${JSON.stringify(got.slice(i, i + 24))}, expected ${JSON.stringify(want.slice(i, i + 24))}`
}

const ms = (s: number) => s * 1000
const now = () => Date.now() / 1000

/** One participant under test: its probes, what they may have opened, and the cleanup. */
class Session {
  private n = 0
  private readonly tag = randomBytes(4).toString('hex')
  /** Every checkpoint ID sent in a body that could open a checkpoint (prepare, commit, restore). */
  private readonly sent = new Set<string>()
  /** Rollouts a retire may have marked. */
  private readonly marked = new Set<string>()
  private readonly ref: ServerRef

  constructor(
    private readonly run: Run,
    readonly p: DiscoveredParticipant,
  ) {
    this.ref = {name: p.server, url: p.url}
  }

  private get timeoutS(): number {
    return this.run.timeoutS
  }

  freshId(): string {
    return `conformance-${this.tag}-${++this.n}`
  }

  freshRollout(): string {
    return `conformance-${this.tag}-r${++this.n}`
  }

  private put(id: string, o: Outcome): void {
    this.run.record(id, this.p.server, o)
  }

  private want(id: string): boolean {
    return this.run.want.has(id)
  }

  /** Runs one check's own probes (only when selected); an unexpected error fails that check. */
  private async check(id: string, fn: () => Promise<Outcome>): Promise<void> {
    if (!this.want(id)) return
    let o: Outcome
    try {
      o = await fn()
    } catch (err) {
      if (err instanceof Interrupted) throw err
      o = fail(`unexpected error: ${clipInput((err as Error).message)}`)
    }
    this.put(id, o)
  }

  private live(): void {
    if (this.run.signal?.aborted) throw new Interrupted()
  }

  // ---------------------------------------------------------------- transport
  // `cleanup` calls ignore the interrupt signal: they run after it, to resume what was opened.

  /**
   * A raw request: the exact body text and Authorization header given (null: none). The reply is
   * read as sent, which the typed client cannot do: it fills defaults in and refuses odd bodies.
   */
  async raw(method: 'GET' | 'POST', route: string, body: string | undefined, authorization: string | null, cleanup = false): Promise<RawReply> {
    const signal = cleanup ? undefined : this.run.signal
    const headers: Record<string, string> = {}
    if (authorization !== null) headers.authorization = authorization
    if (body !== undefined) headers['content-type'] = 'application/json'
    const signals = [AbortSignal.timeout(ms(this.timeoutS))]
    if (signal) signals.push(signal)
    let r: RawReply
    try {
      const res = await request(`${this.p.url.replace(/\/$/, '')}${CHECKPOINT_ROUTE_PREFIX}/${route}`, {
        method,
        headers,
        body,
        dispatcher: this.run.client.dispatcher,
        signal: AbortSignal.any(signals),
      })
      const text = await res.body.text()
      let json: unknown
      try {
        json = JSON.parse(text)
      } catch {
        json = undefined
      }
      r = {status: res.statusCode, text, json}
    } catch (err) {
      r = {status: null, text: '', json: undefined, error: signal?.aborted ? 'interrupted' : describeTransportError(err)}
    }
    if (!cleanup) this.live()
    return r
  }

  /** A raw POST with the valid bearer; `id` is the checkpoint ID it carries, if it may open one. */
  private rawPost(op: Operation, body: string | Record<string, unknown>, id?: string): Promise<RawReply> {
    const opens = op === 'prepare' || op === 'commit' || op === 'restore'
    const carried = id ?? (typeof body === 'string' ? undefined : body.checkpoint_id)
    if (opens && carried !== undefined) this.sent.add(String(carried))
    return this.raw('POST', op, typeof body === 'string' ? body : JSON.stringify(body), this.run.auth)
  }

  /** A well-formed call through the controller's own client (tolerant reply parsing). */
  async call<O extends Operation>(op: O, body: Record<string, unknown>, cleanup = false): Promise<CallResult<ReplyOf<O>>> {
    if (op === 'prepare' || op === 'commit' || op === 'restore') this.sent.add(String(body.checkpoint_id))
    // The client's timeout is the time left to this deadline plus its reply grace.
    const d = typeof body.deadline_ts === 'number' ? body.deadline_ts : Infinity
    const r = await this.run.client.call(this.ref, op, Buffer.from(JSON.stringify(body)), Math.min(d, now() + this.timeoutS), cleanup ? undefined : this.run.signal)
    // A retire that was not refused (or got no reply) may have marked its rollouts.
    if (op === 'retire' && (r.ok || r.failure.status === null)) for (const e of body.episode_ids as {rollout_id: string}[]) this.marked.add(e.rollout_id)
    if (!cleanup) this.live()
    return r
  }

  private deadline(): number {
    return now() + this.timeoutS
  }

  /** Status as the controller reads it (tolerant); null when it cannot be read. */
  async status(cleanup = false): Promise<StatusReply | null> {
    const r = await this.run.client.status(this.ref, ms(this.timeoutS), cleanup ? undefined : this.run.signal)
    if (!cleanup) this.live()
    return r.ok ? r.reply : null
  }

  /**
   * A resume whose reply is read as sent: `idempotent` is the reply's own boolean, null when the
   * reply is no 200 {"phase": "idle", "idempotent": <bool>} (the client would default it to false).
   */
  private async resumeAsSent(id: string): Promise<RawReply & {idempotent: boolean | null}> {
    const r = await this.rawPost('resume', {checkpoint_id: id, deadline_ts: this.deadline()})
    const parsed = r.status === 200 ? StrictResumeReply.safeParse(r.json) : null
    return {...r, idempotent: parsed?.success ? parsed.data.idempotent : null}
  }

  /** Resumes an ID a refused-by-rule prepare opened anyway, so the next checks start idle. */
  private async undo(id: string): Promise<void> {
    await this.call('resume', {checkpoint_id: id, deadline_ts: this.deadline()})
  }

  // ---------------------------------------------------------------- safe checks

  async safe(dupes: ReadonlySet<string>): Promise<void> {
    const auth = this.run.auth
    const bearerRefused = async (authorization: string | null, method: 'GET' | 'POST' = 'GET', route = 'status', body?: string): Promise<string | null> => {
      const r = await this.raw(method, route, body, authorization)
      if (r.status !== 401) return describeRaw(r)
      const env = ErrorEnvelope.safeParse(r.json)
      if (!env.success || env.data.error.code !== 'unauthorized') return `401, but the body is not {"error": {"code": "unauthorized", …}}: ${clipInput(r.text, 120)}`
      return null
    }
    const wrong = `Bearer ${randomBytes(16).toString('hex')}`
    await this.check('auth.missing-bearer', async () => {
      const bad = await bearerRefused(null)
      return bad ? fail(`without Authorization: ${bad}`) : pass('401 unauthorized')
    })
    await this.check('auth.wrong-bearer', async () => {
      const bad = await bearerRefused(wrong)
      return bad ? fail(`with a wrong token: ${bad}`) : pass('401 unauthorized')
    })
    await this.check('auth.exact-bearer', async () => {
      const token = auth.slice('Bearer '.length)
      for (const [what, header] of [
        ['"bearer <token>"', `bearer ${token}`],
        ['"Bearer  <token>" (two spaces)', `Bearer  ${token}`],
      ] as const) {
        const bad = await bearerRefused(header)
        if (bad) return fail(`${what}: ${bad}`)
      }
      return pass('401 for "bearer <token>" and "Bearer  <token>"')
    })
    await this.check('auth.post-bearer', async () => {
      // A resume of a new ID is harmless even if wrongly accepted: it only fences that ID.
      const bad = await bearerRefused(wrong, 'POST', 'resume', JSON.stringify({checkpoint_id: this.freshId(), deadline_ts: this.deadline()}))
      return bad ? fail(`resume with a wrong token: ${bad}`) : pass('401 unauthorized')
    })

    const st = await this.raw('GET', 'status', undefined, auth)
    const parsed = st.status === 200 ? StrictStatus.safeParse(st.json) : null
    this.put(
      'status.reply',
      st.status !== 200 ? fail(describeRaw(st)) : parsed!.success ? pass(`${this.p.kind}/${this.p.instance} ${parsed!.data.phase}`) : fail(`status reply ${issue(parsed!.error)}`),
    )
    const json = (st.status === 200 && st.json && typeof st.json === 'object' ? st.json : {}) as Record<string, unknown>
    const kind = json.kind
    this.put(
      'status.kind',
      typeof kind === 'string' && (KINDS as readonly string[]).includes(kind) ? pass(kind) : fail(`kind ${clipInput(JSON.stringify(kind) ?? 'missing')} is not one of ${KINDS.join(', ')}`),
    )
    const instance = json.instance
    this.put(
      'status.instance',
      typeof instance !== 'string' || !isSafeComponent(instance)
        ? fail(`instance ${clipInput(JSON.stringify(instance) ?? 'missing')} is not a safe path component`)
        : dupes.has(this.p.server)
          ? fail(`another participant also reports ${this.p.kind}/${instance}: both would write gym/${this.p.kind}/${instance}`)
          : pass(instance),
    )
    const phase = json.phase
    this.put(
      'status.phase',
      typeof phase !== 'string' || !(PHASES as readonly string[]).includes(phase)
        ? fail(`phase ${clipInput(JSON.stringify(phase) ?? 'missing')} is not one of ${PHASES.join(', ')}`)
        : // A missing field is status.reply's to report; here only the values that were sent count.
          'checkpoint_id' in json && (json.checkpoint_id === null) !== (phase === 'idle')
          ? fail(`phase ${phase} with checkpoint_id ${JSON.stringify(json.checkpoint_id)}: it must be null exactly when idle`)
          : 'lease_expires_at' in json && (json.lease_expires_at === null) !== (phase === 'idle')
            ? fail(`phase ${phase} with lease_expires_at ${JSON.stringify(json.lease_expires_at)}: it must be null exactly when idle`)
            : pass(phase === 'idle' ? 'idle' : `${phase} under ${String(json.checkpoint_id)}`),
    )
    this.reportChecks(json.report, 'status')

    await this.refusals()
  }

  /** report.schema, report.blockers and report.restarts, on a status or prepare reply's report. */
  private reportChecks(report: unknown, where: string): void {
    const schema = StrictReport.safeParse(report)
    this.put('report.schema', schema.success ? pass(`${where} report`) : fail(`${where} report ${issue(schema.error)}`))
    const r = (report && typeof report === 'object' ? report : {}) as Record<string, unknown>
    const blockers = r.blockers
    const count = r.blocker_count
    this.put(
      'report.blockers',
      !Array.isArray(blockers) || typeof count !== 'number'
        ? skip(`${where} report has no blockers list or blocker_count (see report.schema)`)
        : count < blockers.length
          ? fail(`blocker_count ${count} < ${blockers.length} blockers listed`)
          : blockers.length > MAX_REPORTED_BLOCKERS
            ? fail(`${blockers.length} blockers listed; at most ${MAX_REPORTED_BLOCKERS} (blocker_count carries the full number)`)
            : pass(`${blockers.length} listed, blocker_count ${count}`),
    )
    const restarts = r.restarts
    if (!Array.isArray(restarts)) this.put('report.restarts', skip(`${where} report has no restarts list (see report.schema)`))
    else {
      let bad: string | null = null
      for (const k of restarts) {
        try {
          if (typeof k !== 'string') throw new Error('not a string')
          fromCaptureKey(k)
        } catch (err) {
          bad = `${clipInput(JSON.stringify(k))}: ${(err as Error).message}`
          break
        }
      }
      this.put('report.restarts', bad ? fail(`restart ${bad}`) : pass(`${restarts.length} restart(s)`))
    }
  }

  /** Bodies every version of Gym refuses with 422 before looking at any state. */
  private async refusals(): Promise<void> {
    type Variant = [what: string, op: Operation, body: string | Record<string, unknown>, id?: string]
    const expect422 = async (variants: Variant[]): Promise<Outcome> => {
      for (const [what, op, body, id] of variants) {
        const r = await this.rawPost(op, body, id)
        // Wrongly accepted: whatever it opened is resumed before the next probe.
        if (r.status === 200 && op === 'prepare') await this.undo(id ?? String((body as Record<string, unknown>).checkpoint_id))
        if (r.status !== 422) return fail(`${op} with ${what}: ${describeRaw(r)} (want 422)`)
      }
      return pass(`${variants.length} bodies refused with 422`)
    }
    const nowhere = path.join(os.tmpdir(), `gymckpt-conformance-nowhere-${this.tag}`)
    // A past deadline: a prepare wrongly accepted returns at once and is resumed right away.
    const past = () => now() - 1
    const extra = {conformance_unknown_field: true}
    await this.check('refuse.unknown-field', () =>
      expect422([
        ['an unknown key', 'prepare', {checkpoint_id: this.freshId(), deadline_ts: past(), ...extra}],
        ['an unknown key', 'resume', {checkpoint_id: this.freshId(), deadline_ts: this.deadline(), ...extra}],
        ['an unknown key', 'commit', {checkpoint_id: this.freshId(), deadline_ts: this.deadline(), checkpoint_dir: nowhere, episode_ids: [], ...extra}],
        [
          'an unknown key in an EpisodeId',
          'commit',
          {checkpoint_id: this.freshId(), deadline_ts: this.deadline(), checkpoint_dir: nowhere, episode_ids: [{rollout_id: this.freshRollout(), attempt: 0, ...extra}]},
        ],
      ]),
    )
    await this.check('refuse.checkpoint-id', () => {
      const t = this.tag
      const ids: [string, unknown][] = [
        ['an empty checkpoint_id', ''],
        [`checkpoint_id '../conformance-${t}'`, `../conformance-${t}`],
        [`checkpoint_id '.conformance-${t}'`, `.conformance-${t}`],
        [`checkpoint_id '-conformance-${t}'`, `-conformance-${t}`],
        [`checkpoint_id 'conformance-${t}/x'`, `conformance-${t}/x`],
        ['a 129-character checkpoint_id', `conformance-${t}-`.padEnd(129, 'x')],
        ['a number as checkpoint_id', Number.parseInt(t, 16)],
      ]
      return expect422(ids.flatMap(([what, id]) => (['prepare', 'resume'] as const).map((op): Variant => [what, op, {checkpoint_id: id, deadline_ts: op === 'prepare' ? past() : this.deadline()}])))
    })
    await this.check('refuse.deadline', () =>
      expect422(
        (
          [
            ['NaN', 'NaN'],
            ['Infinity', 'Infinity'],
            ['-Infinity', '-Infinity'],
            ['1e999', '1e999'],
            ['"soon"', '"soon"'],
            ['null', 'null'],
            ['missing', null],
          ] as const
        ).map(([what, d]): Variant => {
          const id = this.freshId()
          return [`deadline_ts ${what}`, 'prepare', `{"checkpoint_id": "${id}"${d === null ? '' : `, "deadline_ts": ${d}`}}`, id]
        }),
      ),
    )
    await this.check('refuse.episode-id', () => {
      const r = this.freshRollout()
      const variants: [string, unknown][] = [
        ['a rollout_id with the reserved -a1 suffix', {rollout_id: `${r}-a1`, attempt: 0}],
        ["rollout_id '../x'", {rollout_id: '../x', attempt: 0}],
        ['an empty rollout_id', {rollout_id: '', attempt: 0}],
        ['attempt -1', {rollout_id: r, attempt: -1}],
        ['attempt 1.5', {rollout_id: r, attempt: 1.5}],
        ['a capture-key string instead of an object', r],
      ]
      // commit of a new ID: were the body accepted, the phase rule would still refuse it (409).
      return expect422(
        variants.map(([what, e]): Variant => [`an EpisodeId with ${what}`, 'commit', {checkpoint_id: this.freshId(), deadline_ts: this.deadline(), checkpoint_dir: nowhere, episode_ids: [e]}]),
      )
    })
    await this.check('refuse.empty-lists', () =>
      expect422([
        ['episode_ids []', 'retire', {checkpoint_id: this.freshId(), deadline_ts: this.deadline(), episode_ids: []}],
        ['rollout_ids []', 'forget', {checkpoint_id: this.freshId(), deadline_ts: this.deadline(), rollout_ids: []}],
      ]),
    )
  }

  // ---------------------------------------------------------------- destructive checks

  async destructive(scratch: string): Promise<void> {
    const base = await this.status()
    const retired0 = base?.retired_rollouts ?? 0
    await this.check('retire.forget', async () => {
      const r = this.freshRollout()
      const ret = await this.call('retire', {checkpoint_id: this.freshId(), deadline_ts: this.deadline(), episode_ids: [{rollout_id: r, attempt: 0}]})
      if (!ret.ok) return fail(`retire of a new rollout from idle: ${describeCall(ret)}`)
      const st1 = await this.status()
      if (st1?.retired_rollouts !== retired0 + 1) return fail(`after the retire, retired_rollouts is ${st1?.retired_rollouts}, not ${retired0 + 1}`)
      const fg = await this.call('forget', {checkpoint_id: this.freshId(), deadline_ts: this.deadline(), rollout_ids: [r]})
      if (!fg.ok) return fail(`forget: ${describeCall(fg)}`)
      const st2 = await this.status()
      if (st2?.retired_rollouts !== retired0) return fail(`after the forget, retired_rollouts is ${st2?.retired_rollouts}, not ${retired0}: the mark stayed`)
      this.marked.delete(r)
      return pass(`retired_rollouts ${retired0} → ${retired0 + 1} → ${retired0}`)
    })

    const a = this.freshId()
    const dl = this.deadline()
    const prep = await this.rawPost('prepare', {checkpoint_id: a, deadline_ts: dl})
    const afterPrep = await this.status()
    const prepared = afterPrep?.phase === 'prepared' && afterPrep.checkpoint_id === a
    {
      const pj = (prep.json ?? {}) as Record<string, unknown>
      let o: Outcome
      if (prep.status !== 200) o = fail(`prepare: ${describeRaw(prep)}`)
      else if (pj.phase !== 'prepared') {
        const rep = (pj.report ?? {}) as {blockers?: unknown}
        o = fail(
          `prepare replied phase ${JSON.stringify(pj.phase)}${pj.phase === 'preparing' ? `: not ready by the deadline, blockers ${clipInput(JSON.stringify(rep.blockers) ?? 'missing', 120)} (is the fleet idle?)` : ''}`,
        )
      } else {
        const schema = StrictReport.safeParse(pj.report)
        if (!schema.success) o = fail(`prepare reply report ${issue(schema.error)}`)
        else if (!prepared) o = fail(`after prepare, status is ${afterPrep ? `${afterPrep.phase} under ${afterPrep.checkpoint_id}` : 'unreadable'}, not prepared under ${a}`)
        else if (afterPrep.lease_expires_at === null || afterPrep.lease_expires_at < dl) o = fail(`lease_expires_at ${afterPrep.lease_expires_at} is before deadline_ts ${dl.toFixed(3)}`)
        else o = pass(`prepared under ${a}, lease ${Math.round(afterPrep.lease_expires_at - dl)} s past the deadline`)
      }
      this.put('phase.prepare', o)
    }
    const needPrepared = skip(`needs a prepared checkpoint, and prepare of ${a} did not leave the participant prepared (see phase.prepare)`)
    if (!prepared) {
      for (const id of [
        'phase.prepare-replay',
        'lease.renew',
        'fence.conflict',
        'outside.retire-open',
        'outside.forget-open',
        'commit.restart-in-scope',
        'commit.reply',
        ...AFTER_COMMIT,
        'phase.resume',
        'phase.resume-again',
        'fence.stale-prepare',
      ])
        this.put(id, needPrepared)
      await this.undo(a)
    } else {
      await this.whilePrepared(a, dl, scratch, prep.json)
      const res = await this.resumeAsSent(a)
      const st = await this.status()
      this.put(
        'phase.resume',
        res.status !== 200
          ? fail(`resume: ${describeRaw(res)}`)
          : res.idempotent !== false
            ? fail(`resume replied ${describeRaw(res)}, want {"phase": "idle", "idempotent": false}`)
            : !st || st.phase !== 'idle' || st.checkpoint_id !== null || st.lease_expires_at !== null
              ? fail(`after resume, status is ${st ? `phase ${st.phase}, checkpoint_id ${st.checkpoint_id}, lease_expires_at ${st.lease_expires_at}` : 'unreadable'}`)
              : pass('idle, idempotent false; checkpoint_id and lease null'),
      )
      await this.check('phase.resume-again', async () => {
        const again = await this.resumeAsSent(a)
        return again.idempotent === true ? pass('idle, idempotent true') : fail(`second resume: ${describeRaw(again)}, want {"phase": "idle", "idempotent": true}`)
      })
      await this.check('fence.stale-prepare', async () => {
        const r = await this.call('prepare', {checkpoint_id: a, deadline_ts: this.deadline()})
        if (r.ok) await this.undo(a)
        return refusedWith(r, 409, 'stale_checkpoint') ? pass('409 stale_checkpoint') : fail(`prepare of resumed ${a}: ${describeCall(r)}`)
      })
    }

    await this.check('fence.resume-unknown', async () => {
      const id = this.freshId()
      const r = await this.resumeAsSent(id)
      if (r.idempotent !== true) return fail(`resume of a never-seen ID from idle: ${describeRaw(r)}, want {"phase": "idle", "idempotent": true}`)
      const p = await this.call('prepare', {checkpoint_id: id, deadline_ts: this.deadline()})
      if (p.ok) await this.undo(id)
      return refusedWith(p, 409, 'stale_checkpoint')
        ? pass('idempotent resume fenced it: prepare → 409 stale_checkpoint')
        : fail(`prepare after that resume: ${describeCall(p)}: the resume did not fence the ID`)
    })

    await this.check('fence.window', async () => {
      const x = this.freshId()
      const p = await this.call('prepare', {checkpoint_id: x, deadline_ts: this.deadline()})
      if (!p.ok || p.reply.phase !== 'prepared') {
        await this.undo(x)
        return skip(`could not prepare ${x}: ${describeCall(p)}`)
      }
      await this.undo(x)
      const first = await this.call('prepare', {checkpoint_id: x, deadline_ts: this.deadline()})
      if (!refusedWith(first, 409, 'stale_checkpoint')) {
        if (first.ok) await this.undo(x)
        return skip(`${x} was not fenced even right after its resume (see fence.stale-prepare)`)
      }
      const newer = Array.from({length: 63}, () => this.freshId())
      for (let i = 0; i < newer.length; i += 8) {
        const batch = await Promise.all(newer.slice(i, i + 8).map((id) => this.call('resume', {checkpoint_id: id, deadline_ts: this.deadline()})))
        const bad = batch.find((r) => !r.ok)
        if (bad) return skip(`resume of a never-seen ID failed: ${describeCall(bad)}`)
      }
      const last = await this.call('prepare', {checkpoint_id: x, deadline_ts: this.deadline()})
      if (last.ok) await this.undo(x)
      return refusedWith(last, 409, 'stale_checkpoint')
        ? pass('still 409 stale_checkpoint after 63 newer resumed IDs')
        : fail(`after 63 newer resumed IDs, prepare of ${x}: ${describeCall(last)}: fewer than 64 resumed IDs are kept`)
    })
  }

  /** Everything that needs checkpoint `a` open and prepared; leaves it open (committed or not). */
  private async whilePrepared(a: string, dl: number, scratch: string, prepReply: unknown): Promise<void> {
    await this.check('phase.prepare-replay', async () => {
      const r = await this.call('prepare', {checkpoint_id: a, deadline_ts: dl})
      const st = await this.status()
      if (!r.ok || r.reply.phase !== 'prepared') return fail(`second prepare of ${a}: ${describeCall(r)}`)
      if (st?.phase !== 'prepared' || st.checkpoint_id !== a) return fail(`after the second prepare, status is ${st?.phase} under ${st?.checkpoint_id}`)
      return pass('200 prepared, still prepared')
    })
    await this.check('lease.renew', async () => {
      const later = dl + 60
      const r1 = await this.call('renew', {checkpoint_id: a, deadline_ts: later})
      if (!r1.ok) return fail(`renew: ${describeCall(r1)}`)
      if (r1.reply.lease_expires_at < later) return fail(`renew to deadline_ts ${later.toFixed(3)} replied lease_expires_at ${r1.reply.lease_expires_at}, before the deadline`)
      const r2 = await this.call('renew', {checkpoint_id: a, deadline_ts: dl - 60})
      if (!r2.ok) return fail(`renew with an earlier deadline: ${describeCall(r2)}`)
      if (r2.reply.lease_expires_at < r1.reply.lease_expires_at) return fail(`renew with an earlier deadline moved the lease back from ${r1.reply.lease_expires_at} to ${r2.reply.lease_expires_at}`)
      return pass(`lease ${Math.round(r1.reply.lease_expires_at - later)} s past the deadline; never moved back`)
    })
    await this.check('fence.conflict', async () => {
      const b = this.freshId()
      const r = await this.call('prepare', {checkpoint_id: b, deadline_ts: dl})
      return refusedWith(r, 409, 'checkpoint_conflict') ? pass('409 checkpoint_conflict') : fail(`prepare of ${b} while ${a} is open: ${describeCall(r)}`)
    })
    for (const [id, op] of [
      ['outside.retire-open', 'retire'],
      ['outside.forget-open', 'forget'],
    ] as const) {
      await this.check(id, async () => {
        const rollout = this.freshRollout()
        const body = op === 'retire' ? {checkpoint_id: a, deadline_ts: dl, episode_ids: [{rollout_id: rollout, attempt: 0}]} : {checkpoint_id: a, deadline_ts: dl, rollout_ids: [rollout]}
        const r = await this.call(op, body)
        return refusedWith(r, 409, 'invalid_phase') ? pass('409 invalid_phase') : fail(`${op} while ${a} is prepared: ${describeCall(r)}`)
      })
    }

    const checkpointDir = path.join(scratch, a)
    const pdir = participantDir(checkpointDir, this.p.kind, this.p.instance)
    let commitBody: Record<string, unknown> = {checkpoint_id: a, deadline_ts: dl, checkpoint_dir: checkpointDir, episode_ids: []}
    const st = await this.status()
    const prepRestarts = (prepReply as {report?: {restarts?: unknown}} | undefined)?.report?.restarts
    const restarts = [...(Array.isArray(prepRestarts) ? prepRestarts : []), ...(st?.report.restarts ?? [])].filter((k): k is string => typeof k === 'string')
    // The participant creates its directory (an existing one is fine); watching it shows the order
    // in which its files appear, when the participant writes on this host.
    const events: string[] = []
    await mkdir(pdir, {recursive: true})
    let watcher: FSWatcher | null = null
    try {
      watcher = watch(pdir, (type, name) => {
        if (type === 'rename' && name) events.push(name.toString())
      })
      watcher.on('error', () => {})
    } catch {}
    let committed: RawReply | null = null
    try {
      if (this.want('commit.restart-in-scope')) {
        const valid = restarts.find((k) => {
          try {
            return Boolean(fromCaptureKey(k))
          } catch {
            return false
          }
        })
        if (!valid)
          this.put('commit.restart-in-scope', skip('this participant reports no restart (report.restarts is empty); it can be checked only while it runs a restart-only episode, with --force'))
        else {
          const body = {...commitBody, episode_ids: [toWire(fromCaptureKey(valid))]}
          const r = await this.rawPost('commit', body)
          if (r.status === 200) {
            // It committed: that commit is the checkpoint's, and the checks below read it.
            committed = r
            commitBody = body
          }
          const env = ErrorEnvelope.safeParse(r.json)
          this.put(
            'commit.restart-in-scope',
            r.status === 409 && env.success && env.data.error.code === 'restart_in_scope'
              ? pass(`409 restart_in_scope for reported restart ${valid}`)
              : fail(`commit naming reported restart ${valid}: ${describeRaw(r)}`),
          )
        }
      }
      committed ??= await this.rawPost('commit', commitBody)
    } finally {
      // inotify events reach this process a moment after the reply.
      await new Promise((r) => setTimeout(r, 50))
      watcher?.close()
    }
    const first = committed
    const after = await this.status()
    const reply = first.status === 200 ? StrictCommitReply.safeParse(first.json) : null
    // The files are checked whenever the reply names a manifest, even if the rest of it is off.
    const body = (first.json ?? {}) as {manifest?: unknown; episode_ids?: unknown}
    const parsedManifest = StrictCommitReply.shape.manifest.safeParse(body.manifest)
    const manifest = first.status === 200 && parsedManifest.success ? parsedManifest.data : null
    {
      let o: Outcome
      if (first.status !== 200) o = fail(`commit: ${describeRaw(first)}`)
      else if (!reply!.success) o = fail(`commit reply ${issue(reply!.error)}`)
      else {
        const m = reply!.data.manifest
        if (m.kind !== this.p.kind || m.instance !== this.p.instance || m.checkpoint_id !== a)
          o = fail(`commit reply manifest names ${m.kind}/${m.instance} checkpoint ${m.checkpoint_id}, not ${this.p.kind}/${this.p.instance} checkpoint ${a}`)
        else if (after?.phase !== 'committed' || after.checkpoint_id !== a) o = fail(`after commit, status is ${after?.phase} under ${after?.checkpoint_id}, not committed under ${a}`)
        else o = pass(`committed ${m.record_count} record(s) into ${checkpointDir}`)
      }
      this.put('commit.reply', o)
    }
    if (!manifest) {
      for (const id of AFTER_COMMIT) this.put(id, skip('needs a commit reply with a manifest (see commit.reply)'))
      return
    }
    const m = manifest
    const episodeIds = Array.isArray(body.episode_ids) ? body.episode_ids.map(String) : []
    const unreadable = (err: unknown) => fail(`cannot read ${pdir}: ${describeFsError(err)} (is the checkpoint directory visible to this participant at the same path? see --dir)`)
    await this.check('store.manifest', () => checkManifestFile(pdir, {kind: this.p.kind, instance: this.p.instance, checkpointId: a}, m).catch(unreadable))
    await this.check('store.records', () => checkRecordsFile(pdir, checkpointDir, {kind: this.p.kind, instance: this.p.instance}, m.records_file, episodeIds).catch(unreadable))
    await this.check('store.lines', () => checkRecordLines(path.join(pdir, m.records_file)).catch(unreadable))
    await this.check('store.manifest-last', () => checkManifestLast(pdir, m.records_file, watcher ? events : null).catch(unreadable))

    const before = await snapshot(pdir).catch(() => null)
    await this.check('commit.replay', async () => {
      const again = await this.rawPost('commit', commitBody)
      if (again.status !== 200) return fail(`commit again with equal arguments: ${describeRaw(again)}`)
      return canonical(again.json) === canonical(first.json) ? pass('the same reply') : fail(`a different reply: ${clipInput(JSON.stringify(again.json) ?? again.text, 160)}`)
    })
    await this.check('commit.conflict', async () => {
      const r = await this.rawPost('commit', {...commitBody, episode_ids: [...(commitBody.episode_ids as unknown[]), {rollout_id: this.freshRollout(), attempt: 0}]})
      const env = ErrorEnvelope.safeParse(r.json)
      if (r.status === 409 && env.success && env.data.error.code === 'checkpoint_conflict') return pass('409 checkpoint_conflict')
      // Gym's version A replays a completed commit whatever its arguments (reference 3.5): the
      // first reply again is that version's rule, not a failure; anything else is.
      if (r.status === 200 && canonical(r.json) === canonical(first.json))
        return skip('the first reply replayed: Gym version A replays a completed commit whatever its arguments (B/C and the seed refuse it)')
      return fail(`commit of committed ${a} with another scope: ${describeRaw(r)} (want 409 checkpoint_conflict)`)
    })
    await this.check('commit.export-once', async () => {
      if (!before) return skip(`cannot list ${pdir}`)
      const later = await snapshot(pdir)
      const changed = diffSnapshots(before, later)
      return changed ? fail(`after the replayed and the conflicting commit, ${changed}`) : pass(`${later.size} file(s) unchanged`)
    })
  }

  /** Resumes whatever of ours is still open (found by status) and forgets what a retire may have marked. */
  async cleanup(): Promise<void> {
    const resume = (id: string) => this.call('resume', {checkpoint_id: id, deadline_ts: now() + this.timeoutS}, true)
    for (let i = 0; i < 4; i++) {
      const st = await this.status(true)
      if (!st) {
        // Status unreadable: resume every ID we sent (a resume of one never opened only fences it).
        for (const id of this.sent) await resume(id)
        break
      }
      if (st.checkpoint_id === null || !this.sent.has(st.checkpoint_id)) break
      await resume(st.checkpoint_id)
    }
    if (this.marked.size) await this.call('forget', {checkpoint_id: this.freshId(), deadline_ts: now() + this.timeoutS, rollout_ids: [...this.marked].sort()}, true)
  }
}

// ---------------------------------------------------------------- the checkpoint directory

async function checkManifestFile(pdir: string, want: {kind: string; instance: string; checkpointId: string}, replyManifest: Record<string, unknown>): Promise<Outcome> {
  const bytes = await readFile(path.join(pdir, MANIFEST_FILE))
  if (!isAscii(bytes)) return fail('manifest.json holds non-ASCII bytes (json.dumps writes ASCII escapes)')
  const text = bytes.toString('latin1')
  let m: unknown
  try {
    m = JSON.parse(text)
  } catch {
    return fail(`manifest.json is not JSON: ${clipInput(text, 80)}`)
  }
  if (!m || typeof m !== 'object' || Array.isArray(m)) return fail('manifest.json is not a JSON object')
  const expected = encodeManifest(m as Record<string, unknown>)
  if (text !== expected) return fail(`manifest.json is not json.dumps(sort_keys=True, indent=1) output, ${firstDifference(text, expected)}`)
  const o = m as Record<string, unknown>
  if (o.schema_version !== 1) return fail(`schema_version ${JSON.stringify(o.schema_version)}, not 1`)
  if (o.kind !== want.kind || o.instance !== want.instance || o.checkpoint_id !== want.checkpointId)
    return fail(`names ${String(o.kind)}/${String(o.instance)} checkpoint ${String(o.checkpoint_id)}, not ${want.kind}/${want.instance} checkpoint ${want.checkpointId}`)
  if (encodeManifest(replyManifest) !== text) return fail('manifest.json differs from the manifest in the commit reply')
  return pass(`${bytes.length} bytes, sorted keys, indent 1, no trailing newline; equal to the commit reply's`)
}

async function checkRecordsFile(pdir: string, checkpointDir: string, who: {kind: string; instance: string}, recordsFile: string, replyKeys: string[]): Promise<Outcome> {
  if (!RECORDS_NAME.test(recordsFile)) return fail(`records_file ${clipInput(JSON.stringify(recordsFile))} is not records-<sha256 hex>.jsonl`)
  const names = (await readdir(pdir)).sort()
  if (!names.includes(recordsFile)) return fail(`${recordsFile}, named by the manifest, is missing`)
  let read
  try {
    // `within` also checks that the file's name is its content's sha256.
    read = await readParticipantState(pdir, {...who, keep: null, within: checkpointDir})
  } catch (err) {
    if (err instanceof CheckpointStateError) return fail(err.message)
    throw err
  }
  const recordsPath = path.join(pdir, recordsFile)
  if (read.bytes > 0) {
    const fh = await open(recordsPath, 'r')
    try {
      const last = Buffer.alloc(1)
      await fh.read(last, 0, 1, read.bytes - 1)
      if (last[0] !== 0x0a) return fail(`${recordsFile} does not end with a newline: every record line ends with \\n`)
    } finally {
      await fh.close()
    }
  }
  const unique = [...new Set(read.keys)].sort()
  // An agent or resources server writes a record per session: an episode may have several.
  if (unique.length !== read.keys.length && ONE_RECORD_PER_EPISODE.has(who.kind)) return fail(`${recordsFile} holds ${read.keys.length - unique.length} duplicate record(s) of one episode`)
  const want = [...replyKeys]
  if (canonical(unique) !== canonical(want))
    return fail(`the commit reply's episode_ids ${clipInput(JSON.stringify(want), 100)} are not the sorted capture keys of the records ${clipInput(JSON.stringify(unique), 100)}`)
  const extra = names.filter((n) => n !== MANIFEST_FILE && n !== recordsFile)
  if (extra.length) return fail(`other files left in ${pdir}: ${clipInput(extra.join(', '), 160)} (temporary files are removed; one records file per commit)`)
  return pass(`${read.keys.length} record(s), ${read.bytes} bytes; name = content sha256 = records_sha256; record_count matches`)
}

async function* lines(file: string): AsyncGenerator<Buffer> {
  let pending: Buffer[] = []
  for await (const chunk of createReadStream(file, {highWaterMark: 1 << 20}) as AsyncIterable<Buffer>) {
    let start = 0
    for (let nl = chunk.indexOf(0x0a); nl >= 0; nl = chunk.indexOf(0x0a, start)) {
      const piece = chunk.subarray(start, nl)
      yield pending.length ? Buffer.concat([...pending, piece]) : piece
      pending = []
      start = nl + 1
    }
    if (start < chunk.length) pending.push(chunk.subarray(start))
  }
  if (pending.length) yield Buffer.concat(pending)
}

async function checkRecordLines(recordsPath: string): Promise<Outcome> {
  let n = 0
  for await (const line of lines(recordsPath)) {
    n++
    if (!isAscii(line)) return fail(`line ${n} holds non-ASCII bytes (json.dumps escapes them as \\uXXXX)`)
    const text = line.toString('latin1')
    let v
    try {
      v = pyLoads(text)
    } catch (err) {
      return fail(`line ${n} is not JSON: ${clipInput((err as Error).message, 100)}`)
    }
    const again = pyDumps(v)
    if (again !== text) return fail(`line ${n} is not json.dumps output, ${firstDifference(text, again)}`)
    if (!(v instanceof Map)) return fail(`line ${n} is not a JSON object`)
    const first = v.keys().next().value
    if (first !== 'episode_id') return fail(`line ${n}: the first key is ${JSON.stringify(first)}, not "episode_id"`)
    const e = v.get('episode_id')
    if (!(e instanceof Map) || [...e.keys()].join(',') !== 'rollout_id,attempt' || !EpisodeIdWire.safeParse(Object.fromEntries(e)).success) {
      return fail(`line ${n}: episode_id is not {"rollout_id": <rollout ID>, "attempt": <int ≥ 0>}`)
    }
  }
  if (n === 0) return skip('no record was exported (nothing live on this participant), so the line format was not exercised')
  return pass(`${n} line(s) re-encode byte for byte`)
}

/**
 * Two files written one right after the other can get modification times in the wrong order by a
 * fraction of a clock tick: Linux (6.13 on) stamps a file with a coarse clock, or with a finer one
 * when its times were read since its last change. Seen here: 280 µs. Closer than this, the times
 * do not tell the order (the directory's events still do).
 */
export const MTIME_SLACK_NS = 10_000_000n

export async function checkManifestLast(pdir: string, recordsFile: string, events: string[] | null): Promise<Outcome> {
  const [m, r] = await Promise.all([stat(path.join(pdir, MANIFEST_FILE), {bigint: true}), stat(path.join(pdir, recordsFile), {bigint: true})])
  if (m.mtimeNs + MTIME_SLACK_NS < r.mtimeNs) return fail(`manifest.json was last written ${(r.mtimeNs - m.mtimeNs) / 1000n} µs before ${recordsFile}: the manifest comes last`)
  if (events?.length) {
    const lastM = events.lastIndexOf(MANIFEST_FILE)
    const lastR = events.lastIndexOf(recordsFile)
    if (lastM >= 0 && lastR >= 0 && lastM < lastR) return fail(`manifest.json appeared in the directory before ${recordsFile}`)
    if (lastM >= 0 && lastR >= 0) return pass('the records file appeared before manifest.json, and was last written before it')
  }
  return pass(
    m.mtimeNs < r.mtimeNs
      ? `the records file was last written before manifest.json (by modification time, within the file system's ${MTIME_SLACK_NS / 1_000_000n} ms of timestamp slack)`
      : 'the records file was last written before manifest.json (by modification time)',
  )
}

async function snapshot(dir: string): Promise<Map<string, string>> {
  const out = new Map<string, string>()
  for (const name of (await readdir(dir)).sort()) {
    const s = await lstat(path.join(dir, name), {bigint: true})
    out.set(name, `ino ${s.ino} size ${s.size} mtime ${s.mtimeNs}`)
  }
  return out
}

function diffSnapshots(a: Map<string, string>, b: Map<string, string>): string | null {
  const added = [...b.keys()].filter((k) => !a.has(k))
  const removed = [...a.keys()].filter((k) => !b.has(k))
  const changed = [...a.keys()].filter((k) => b.has(k) && a.get(k) !== b.get(k))
  if (!added.length && !removed.length && !changed.length) return null
  return [added.length && `new: ${added.join(', ')}`, removed.length && `gone: ${removed.join(', ')}`, changed.length && `rewritten: ${changed.join(', ')}`].filter(Boolean).join('; ')
}

// ---------------------------------------------------------------- the run

interface Run {
  client: ControlClient
  auth: string
  timeoutS: number
  signal?: AbortSignal
  want: ReadonlySet<string>
  record(id: string, server: string | null, o: Outcome): void
}

/** Work that makes a participant unfit for destructive checks: restoreBlockers, less retire marks. */
export function liveWork(st: StatusReply): string[] {
  return restoreBlockers({...st, retired_rollouts: 0})
}

export async function runConformance(o: ConformanceOptions): Promise<ConformanceReport> {
  const checks = o.checks ?? CHECKS
  const want = new Set(checks.map((d) => d.id))
  const results: CheckResult[] = []
  const record = (id: string, server: string | null, out: Outcome) => {
    const def = BY_ID.get(id)
    if (!def) throw new Error(`unknown check ${id}`)
    if (want.has(id)) results.push({...def, server, ...out})
  }
  const run: Run = {client: o.client, auth: `Bearer ${o.token}`, timeoutS: o.timeoutS ?? 30, signal: o.signal, want, record}

  // Discovery already read every status. A server that answered with a status conformance can
  // judge is a result; one that is down, silent or refuses our token cannot be checked at all.
  const fatal: ParticipantFailure[] = []
  for (const f of o.discovery.failures) {
    if (f.code === 'no_model' || f.code === 'duplicate_instance') continue
    if (f.code === 'unknown_kind') record('status.kind', f.server, fail(f.message))
    else if (f.code === 'unsafe_instance') record('status.instance', f.server, fail(f.message))
    else if (f.status !== null && f.code !== 'unauthorized') record('status.reply', f.server, fail(failureMessage(f)))
    else fatal.push(f)
  }
  if (fatal.length) throw new CoordinationError('discover', fatal, 'conformance needs an answer to GET status from every server it checks')
  const targets = o.discovery.participants
  const judged = o.discovery.failures.filter((f) => f.status !== null && f.code !== 'no_model').length
  if (targets.length === 0 && judged === 0) throw new ControllerError('discovery', 'no checkpoint participant among the servers: every one answered 404 on GET …/checkpoint/status')
  const dupes = new Set(o.discovery.failures.filter((f) => f.code === 'duplicate_instance').map((f) => f.server))

  const destructiveChecks = checks.filter((d) => d.destructive)
  const runDestructive = o.destructive === true && destructiveChecks.length > 0 && targets.length > 0
  if (!o.destructive) for (const d of destructiveChecks) record(d.id, null, skip('changes participant state: run with --destructive on a staging fleet'))
  if (runDestructive && !o.force) {
    const busy = targets.map((p) => ({server: p.server, reasons: liveWork(p.status)})).filter((b) => b.reasons.length)
    if (busy.length) {
      throw new ControllerError(
        'fleet_state',
        `conformance --destructive prepares, commits and resumes every participant, and ${busy.length} hold(s) live work: ${busy.map((b) => `${b.server} ${b.reasons.join(', ')}`).join('; ')}. Run it on a staging fleet, or add --force; nothing was sent`,
        {busy},
      )
    }
  }
  let scratch: string | null = null
  if (runDestructive) {
    try {
      scratch = await mkdtemp(path.join(o.dir ?? os.tmpdir(), 'gymckpt-conformance-'))
    } catch (err) {
      throw new ControllerError('input', `cannot create a temporary checkpoint directory under ${o.dir ?? os.tmpdir()}: ${describeFsError(err)}`)
    }
  }

  let interrupted = false
  const errors: unknown[] = []
  try {
    const queue = [...targets]
    const worker = async () => {
      for (let p = queue.shift(); p; p = queue.shift()) {
        const s = new Session(run, p)
        try {
          if (o.signal?.aborted) throw new Interrupted()
          await s.safe(dupes)
          if (scratch) await s.destructive(scratch)
        } catch (err) {
          if (err instanceof Interrupted) interrupted = true
          else errors.push(err)
        } finally {
          // Also after a failed check, an unexpected error or an interrupt.
          await s.cleanup().catch((err: unknown) => errors.push(err))
        }
      }
    }
    await Promise.all(Array.from({length: Math.max(1, Math.min(o.concurrency ?? 8, targets.length))}, worker))
    if (errors.length) throw errors[0]
  } finally {
    if (scratch && !o.keepDir) await rm(scratch, {recursive: true, force: true}).catch(() => {})
  }

  const order = new Map(CHECKS.map((d, i) => [d.id, i]))
  const servers = new Map(targets.map((p, i) => [p.server, i]))
  results.sort((a, b) => order.get(a.id)! - order.get(b.id)! || (a.server === null ? -1 : (servers.get(a.server) ?? 1e9)) - (b.server === null ? -1 : (servers.get(b.server) ?? 1e9)))
  const counts = {pass: 0, fail: 0, skip: 0}
  for (const r of results) counts[r.result]++
  return {
    passed: counts.fail === 0 && !interrupted,
    destructive: runDestructive,
    interrupted,
    checkpointDir: scratch && o.keepDir ? scratch : null,
    participants: targets.map((p) => ({server: p.server, kind: p.kind, instance: p.instance})),
    results,
    counts,
  }
}

/** The --json document of a report (snake_case, as every command's output). */
export function conformanceJson(r: ConformanceReport) {
  return {
    passed: r.passed,
    destructive: r.destructive,
    interrupted: r.interrupted,
    checkpoint_dir: r.checkpointDir,
    participants: r.participants,
    counts: r.counts,
    checks: r.results.map((x) => ({id: x.id, section: x.section, rule: x.rule, server: x.server, result: x.result, message: x.message})),
  }
}
