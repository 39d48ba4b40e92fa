import {Agent, Dispatcher, errors as undiciErrors, request} from 'undici'
import {z} from 'zod'

import {clipInput} from '../protocol/episode.js'
import {parseErrorBody} from '../protocol/errors.js'
import {CHECKPOINT_ROUTE_PREFIX, Operation, REPLY_SCHEMAS, ReplyOf, StatusReply} from '../protocol/wire.js'
import {ParticipantFailure} from './errors.js'

export interface ServerRef {
  name: string
  url: string
}

interface Limits {
  timeoutMs: number
  /** A signal for one call, aborted with all the others on timeout or interrupt. */
  signal(): AbortSignal
  timedOut(): boolean
  interrupted(): boolean
  dispose(): void
}

export type CallResult<T> = {ok: true; server: string; reply: T} | {ok: false; failure: ParticipantFailure}

export interface ControlClientOptions {
  token: string
  /** Connections kept per participant. */
  connections?: number
  /** Extra seconds a call may take past its deadline, for the reply in flight (Gym: 5). */
  replyGraceSeconds?: number
}

/**
 * Control calls on one dedicated keep-alive dispatcher, never shared with data-plane traffic, so
 * /run calls parked during a checkpoint cannot starve prepare, commit or resume.
 */
/**
 * Calls sent once more after a dropped connection (reset, refused): each is safe to repeat with the
 * same body (reference 9.5: stateless and safe to retry with the same ID; a completed commit
 * replays its reply, one still writing is awaited, 3.5; resume of a resumed ID is idempotent, 3.6).
 * Not restore, whose cleanup must know whether the call landed, nor prepare, which waits long.
 */
const RETRIED_ON_DROP: ReadonlySet<Operation> = new Set(['resume', 'renew', 'retire', 'forget', 'commit'])
const RETRY_AFTER_MS = 200

export class ControlClient {
  readonly dispatcher: Dispatcher
  private readonly auth: string
  private readonly grace: number

  constructor(opts: ControlClientOptions) {
    if (!opts.token) throw new Error('a control token is required')
    this.auth = `Bearer ${opts.token}`
    this.grace = opts.replyGraceSeconds ?? 5
    // No transport timeouts of undici's own (300 s each for headers and body by default): every
    // call is bounded by its deadline plus the grace (exchange), and a prepare may rightly take
    // until its deadline, a commit or restore past it (reference 9.2, 3.8). Idle sockets are let go
    // after 4 s, before uvicorn's 5 s keep-alive closes them under a request.
    this.dispatcher = new Agent({connections: opts.connections ?? 8, keepAliveTimeout: 4_000, keepAliveMaxTimeout: 600_000, pipelining: 1, headersTimeout: 0, bodyTimeout: 0})
  }

  async close(): Promise<void> {
    await this.dispatcher.close().catch(() => {})
  }

  /** Per-call timeout: time left to the deadline plus the reply grace. */
  timeoutMs(deadlineTs: number): number {
    return Math.max(deadlineTs * 1000 - Date.now(), 0) + this.grace * 1000
  }

  /** POSTs the same pre-encoded body bytes to one participant. */
  async call<O extends Operation>(server: ServerRef, op: O, body: Buffer, deadlineTs: number, signal?: AbortSignal): Promise<CallResult<ReplyOf<O>>> {
    return (await this.callAll([server], op, body, deadlineTs, signal))[0]!
  }

  /**
   * POSTs the same body bytes to every server at once. They share one deadline, so they share
   * one timeout signal: no timer per call.
   */
  async callAll<O extends Operation>(
    servers: ServerRef[],
    op: O,
    body: Buffer,
    deadlineTs: number,
    signal?: AbortSignal,
    onResult?: (r: CallResult<ReplyOf<O>>) => void,
  ): Promise<CallResult<ReplyOf<O>>[]> {
    const limits = this.limits(this.timeoutMs(deadlineTs), signal)
    const schema = REPLY_SCHEMAS[op] as unknown as z.ZodType<ReplyOf<O>>
    const once = async (s: ServerRef) => {
      const r = await this.exchange(s, 'POST', op, body, limits, schema)
      if (r.ok || r.failure.code !== 'connection' || !RETRIED_ON_DROP.has(op)) return r
      // A dropped connection, on a call that is safe to send again with the same body: once more.
      await new Promise((res) => setTimeout(res, RETRY_AFTER_MS))
      return this.exchange(s, 'POST', op, body, limits, schema)
    }
    try {
      // onResult hears each server as it settles (per-participant progress and timings).
      return await Promise.all(servers.map((s) => (onResult ? once(s).then((r) => (onResult(r), r)) : once(s))))
    } finally {
      limits.dispose()
    }
  }

  async status(server: ServerRef, timeoutMs: number, signal?: AbortSignal): Promise<CallResult<StatusReply>> {
    const limits = this.limits(timeoutMs, signal)
    try {
      return await this.exchange(server, 'GET', 'status', undefined, limits, StatusReply)
    } finally {
      limits.dispose()
    }
  }

  /**
   * One timer and at most one listener on the caller's signal for a whole stage; each call gets
   * its own AbortController (one listener each), so a fan-out to N servers does not pile N
   * listeners onto one signal.
   */
  private limits(timeoutMs: number, outer?: AbortSignal): Limits {
    const calls = new Set<AbortController>()
    let state: 'running' | 'timeout' | 'interrupted' = 'running'
    const abortAll = (why: 'timeout' | 'interrupted') => {
      if (state !== 'running') return
      state = why
      for (const c of calls) c.abort(new Error(why))
    }
    const ms = Math.max(1, Math.ceil(timeoutMs))
    const timer = setTimeout(() => abortAll('timeout'), ms)
    const onOuter = () => abortAll('interrupted')
    if (outer?.aborted) onOuter()
    else outer?.addEventListener('abort', onOuter, {once: true})
    return {
      timeoutMs: ms,
      signal: () => {
        const c = new AbortController()
        if (state !== 'running') c.abort(new Error(state))
        else calls.add(c)
        return c.signal
      },
      timedOut: () => state === 'timeout',
      interrupted: () => state === 'interrupted',
      dispose: () => {
        clearTimeout(timer)
        outer?.removeEventListener('abort', onOuter)
      },
    }
  }

  private async exchange<T>(server: ServerRef, method: 'GET' | 'POST', route: string, body: Buffer | undefined, limits: Limits, schema: z.ZodType<T>): Promise<CallResult<T>> {
    const fail = (status: number | null, code: string | null, message: string): CallResult<T> => ({ok: false, failure: {server: server.name, status, code, message}})
    const {timeoutMs} = limits
    const signal = limits.signal()
    let res: Dispatcher.ResponseData
    let text: string
    try {
      res = await request(`${server.url.replace(/\/$/, '')}${CHECKPOINT_ROUTE_PREFIX}/${route}`, {
        method,
        dispatcher: this.dispatcher,
        headers: body ? {authorization: this.auth, 'content-type': 'application/json'} : {authorization: this.auth},
        body,
        signal,
        // Also per call, so no dispatcher default (a shared or replaced one) cuts a call short.
        headersTimeout: 0,
        bodyTimeout: 0,
      })
      const cap = route === 'commit' || route === 'restore' ? MAX_LIST_REPLY_BYTES : MAX_REPLY_BYTES
      const read = await readCapped(res.body, cap)
      if (read === null) {
        res.body.destroy()
        return fail(res.statusCode, 'bad_reply', `${route} reply is larger than ${cap / (1 << 20)} MiB; it was not read`)
      }
      text = read
    } catch (err) {
      if (limits.interrupted()) return fail(null, 'interrupted', 'interrupted')
      if (limits.timedOut()) return fail(null, 'timeout', `no reply within ${(timeoutMs / 1000).toFixed(1)} seconds`)
      return fail(null, 'connection', describeTransportError(err))
    }
    if (res.statusCode >= 300 && res.statusCode < 400) {
      // Not followed: the control token goes only to the address the operator gave (as curl and
      // browsers drop credentials on a redirect elsewhere); an http→https proxy is the usual cause.
      const to = res.headers.location
      const where = typeof to === 'string' && to ? `to ${clipInput(to, 200)}` : 'with no location'
      return fail(res.statusCode, 'redirect', `${where}: not followed (the control token is sent only to the address given); give the server's address as the redirect names it`)
    }
    if (res.statusCode !== 200) {
      const e = parseErrorBody(text)
      // A 401 that is not Gym's envelope (an auth proxy, a framework's own {"detail": ...}) still
      // refuses the token.
      return fail(res.statusCode, e.code ?? (res.statusCode === 401 ? 'unauthorized' : null), e.detail)
    }
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      return fail(200, 'bad_reply', `reply is not JSON: ${text.slice(0, 200)}`)
    }
    if (nestedDeeperThan(json, MAX_REPLY_DEPTH)) return fail(200, 'bad_reply', `${route} reply is nested deeper than ${MAX_REPLY_DEPTH} levels`)
    const parsed = schema.safeParse(json)
    if (!parsed.success) {
      const i = parsed.error.issues[0]
      return fail(200, 'bad_reply', `unexpected ${route} reply: ${i?.path.join('.') || '(root)'}: ${i?.message}`)
    }
    return {ok: true, server: server.name, reply: parsed.data}
  }
}

/**
 * No control reply comes near these sizes (a commit or restore reply lists capture keys: ~2 MB
 * for 100,000 episodes); past them a reply is refused unread, not buffered until the process runs
 * out of memory.
 */
export const MAX_REPLY_BYTES = 64 << 20
export const MAX_LIST_REPLY_BYTES = 512 << 20

/** The body as UTF-8 text, or null once it passes `cap` bytes (the rest is not read). */
export async function readCapped(body: AsyncIterable<Buffer>, cap: number): Promise<string | null> {
  const chunks: Buffer[] = []
  let n = 0
  for await (const chunk of body) {
    n += chunk.length
    if (n > cap) return null
    chunks.push(chunk)
  }
  return Buffer.concat(chunks, n).toString('utf8')
}

/** No control reply nests anywhere near this deep; past it, a reply would break what reads it. */
export const MAX_REPLY_DEPTH = 256

/** Whether a parsed JSON value nests deeper than `max` (iterative: no stack to overflow). */
export function nestedDeeperThan(value: unknown, max: number): boolean {
  const stack: [unknown, number][] = [[value, 0]]
  while (stack.length) {
    const [v, d] = stack.pop()!
    if (v === null || typeof v !== 'object') continue
    if (d >= max) return true
    for (const child of Array.isArray(v) ? v : Object.values(v)) if (child !== null && typeof child === 'object') stack.push([child, d + 1])
  }
  return false
}

export function describeTransportError(err: unknown): string {
  const e = err as NodeJS.ErrnoException & {cause?: NodeJS.ErrnoException}
  const code = e.cause?.code ?? e.code
  if (code === 'ECONNREFUSED') return 'connection refused (is the server running?)'
  if (code === 'ECONNRESET' || err instanceof undiciErrors.SocketError) return 'connection closed before a reply'
  if (code === 'ENOTFOUND') return 'host not found'
  return (e.cause?.message ?? e.message ?? String(err)).slice(0, 200)
}

export function isConnectionFailure(f: ParticipantFailure): boolean {
  return f.status === null && f.code === 'connection'
}
