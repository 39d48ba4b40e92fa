import {timingSafeEqual} from 'node:crypto'
import http from 'node:http'
import {AddressInfo, Socket} from 'node:net'
import {z} from 'zod'

import {RolloutIdSchema} from '../protocol/episode-schema.js'
import {errorEnvelope} from '../protocol/errors.js'
import {CHECKPOINT_ROUTE_PREFIX, OPERATIONS, Operation, REQUEST_SCHEMAS} from '../protocol/wire.js'
import {CheckpointStateError} from '../storage/errors.js'
import {ControlError, ControlPlane, ControlPlaneOptions} from './control-plane.js'
import {Faults} from './faults.js'
import {SimDownstream, SimEnvironment, SimParticipant} from './sim.js'
import {sleep} from './util.js'

const MAX_BODY = 64 << 20

/** A downstream step call from an environment (built once: zod schemas are costly to build). */
const StepBodySchema = z.object({step: z.number().int(), acc: z.string(), seed: z.boolean().optional(), restart: z.boolean().optional(), replay: z.boolean().optional()})

export const RunBodySchema = z.object({
  /** Explicit, or derived as Gym derives it: `<_ng_task_index>-<_ng_rollout_index>`. */
  _ng_rollout_id: RolloutIdSchema.optional(),
  _ng_task_index: z.number().int().min(0).optional(),
  _ng_rollout_index: z.number().int().min(0).optional(),
  _ng_attempt_index: z.number().int().min(0).default(0),
  input: z.string().default(''),
  steps: z.number().int().min(1).max(100_000).default(3),
  step_ms: z.number().min(0).max(600_000).default(20),
  step_mode: z.enum(['wait', 'replay']).default('wait'),
  restart: z.boolean().default(false),
})

class HttpReply {
  constructor(
    readonly status: number,
    readonly body: unknown,
    readonly headers: Record<string, string> = {},
  ) {}
}

export interface ParticipantServerOptions {
  name: string
  token: string
  /** null: a server without checkpoint routes (404 on every control route), like a judge model. */
  participant: SimParticipant | null
  controlPlane?: ControlPlaneOptions
}

/** One simulated Gym server on 127.0.0.1: control routes, data plane, fault injection. */
export class ParticipantServer {
  readonly name: string
  readonly faults = new Faults()
  /** Every request received, in order (route, arrival time, raw body): for tests and rehearsals. */
  readonly journal: {route: string; at: number; body: string}[] = []
  readonly participant: SimParticipant | null
  readonly controlPlane: ControlPlane | null
  private readonly token: Buffer
  private readonly server: http.Server
  private readonly sockets = new Set<Socket>()
  private url_: string | null = null

  constructor(opts: ParticipantServerOptions) {
    if (!opts.token) throw new Error('a participant needs a non-empty control token')
    this.name = opts.name
    this.token = Buffer.from(`Bearer ${opts.token}`)
    this.participant = opts.participant
    this.controlPlane = opts.participant ? new ControlPlane(opts.participant, opts.controlPlane) : null
    if (this.participant && this.controlPlane) this.participant.attach(this.controlPlane)
    this.server = http.createServer((req, res) => void this.handle(req, res))
    this.server.keepAliveTimeout = 5000
    this.server.on('connection', (s) => {
      this.sockets.add(s)
      s.on('close', () => this.sockets.delete(s))
    })
  }

  get url(): string {
    if (!this.url_) throw new Error(`${this.name} is not listening`)
    return this.url_
  }

  async listen(port = 0, host = '127.0.0.1'): Promise<string> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject)
      this.server.listen(port, host, () => resolve())
    })
    const a = this.server.address() as AddressInfo
    this.url_ = `http://${host}:${a.port}`
    return this.url_
  }

  /** A graceful stop. */
  async close(): Promise<void> {
    this.controlPlane?.close()
    if (this.participant instanceof SimEnvironment) await this.participant.destroy()
    for (const s of this.sockets) s.destroy()
    await new Promise<void>((r) => this.server.close(() => r()))
  }

  /** A crash: every connection is cut, nothing is saved, in-memory state is gone. */
  async crash(): Promise<void> {
    for (const s of this.sockets) s.destroy()
    await this.close()
  }

  private authorized(req: http.IncomingMessage): boolean {
    const got = Buffer.from(req.headers.authorization ?? '')
    return got.length === this.token.length && timingSafeEqual(got, this.token)
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x')
    const route = routeName(url.pathname)
    const fault = route ? this.faults.take(route) : undefined
    if (fault?.type === 'drop') return void req.socket.destroy()
    if (fault?.type === 'hang') return
    if (fault?.type === 'delay') await sleep(fault.ms)
    if (fault?.type === 'status') {
      res.writeHead(fault.status, {'content-type': 'text/plain'})
      return void res.end(fault.body ?? 'Internal Server Error')
    }
    let reply: HttpReply
    try {
      const body = req.method === 'POST' ? await readBody(req) : ''
      if (route) this.journal.push({route, at: performance.now(), body})
      reply = await this.dispatch(req, url.pathname, body)
    } catch (err) {
      reply = errorReply(err)
    }
    if (fault?.type === 'drop-after') return void req.socket.destroy()
    if (res.destroyed) return
    const text = typeof reply.body === 'string' ? reply.body : JSON.stringify(reply.body)
    res.writeHead(reply.status, {'content-type': typeof reply.body === 'string' ? 'text/plain' : 'application/json', ...reply.headers})
    res.end(text)
  }

  private async dispatch(req: http.IncomingMessage, path: string, body: string): Promise<HttpReply> {
    const cp = this.controlPlane
    if (path.startsWith(CHECKPOINT_ROUTE_PREFIX + '/') && cp) {
      const op = path.slice(CHECKPOINT_ROUTE_PREFIX.length + 1)
      if (op === 'status' && req.method === 'GET') {
        if (!this.authorized(req)) return unauthorized()
        return new HttpReply(200, cp.status())
      }
      if ((OPERATIONS as readonly string[]).includes(op) && req.method === 'POST') {
        // As in Gym: the body is validated before the bearer is checked.
        const parsed = parseJson(body, REQUEST_SCHEMAS[op as Operation])
        if (parsed instanceof HttpReply) return parsed
        if (!this.authorized(req)) return unauthorized()
        return new HttpReply(200, await (cp[op as Operation] as (b: unknown) => Promise<unknown>).call(cp, parsed))
      }
      return new HttpReply(405, {detail: 'Method Not Allowed'})
    }
    const p = this.participant
    if (path === '/run' && req.method === 'POST' && p instanceof SimEnvironment) {
      const parsed = parseJson(body, RunBodySchema)
      if (parsed instanceof HttpReply) return parsed
      const rolloutId = parsed._ng_rollout_id ?? (parsed._ng_task_index !== undefined && parsed._ng_rollout_index !== undefined ? `${parsed._ng_task_index}-${parsed._ng_rollout_index}` : null)
      if (rolloutId === null) return new HttpReply(400, {error: {code: 'rollout_id_required', detail: 'a /run body needs _ng_rollout_id, or _ng_task_index and _ng_rollout_index'}})
      const result = await p.run({
        rollout_id: rolloutId,
        attempt: parsed._ng_attempt_index,
        input: parsed.input,
        steps: parsed.steps,
        step_ms: parsed.step_ms,
        step_mode: parsed.step_mode,
        restart: parsed.restart,
      })
      return new HttpReply(200, result)
    }
    const m = /^\/ng-rollout\/([^/]+)\/(step|close)$/.exec(path)
    if (m && req.method === 'POST' && p instanceof SimDownstream) {
      const key = decodeURIComponent(m[1]!)
      if (m[2] === 'close') {
        p.close(key)
        return new HttpReply(200, {})
      }
      const parsed = parseJson(body, StepBodySchema)
      if (parsed instanceof HttpReply) return parsed
      const r = await p.step(key, parsed)
      return new HttpReply(200, {digest: r.digest}, r.restart ? {'x-ng-checkpoint-restart': '1'} : {})
    }
    return new HttpReply(404, {detail: 'Not Found'})
  }
}

function routeName(path: string): string | null {
  if (path.startsWith(CHECKPOINT_ROUTE_PREFIX + '/')) return path.slice(CHECKPOINT_ROUTE_PREFIX.length + 1)
  if (path === '/run') return 'run'
  if (path.startsWith('/ng-rollout/')) return 'data'
  return null
}

function unauthorized(): HttpReply {
  return new HttpReply(401, errorEnvelope('unauthorized', 'missing or invalid checkpoint control bearer token'))
}

/** The framework-shaped 422 (`{"detail": [...]}`), which is not in Gym's error envelope. */
function parseJson<T extends z.ZodType>(body: string, schema: T): z.output<T> | HttpReply {
  let raw: unknown
  try {
    raw = JSON.parse(body)
  } catch {
    return new HttpReply(422, {detail: [{type: 'json_invalid', loc: ['body'], msg: 'JSON decode error', input: body.slice(0, 100)}]})
  }
  const r = schema.safeParse(raw)
  if (r.success) return r.data
  return new HttpReply(422, {
    detail: r.error.issues.map((i) => ({type: i.code, loc: ['body', ...i.path.map((x) => (typeof x === 'symbol' ? String(x) : x))], msg: i.message})),
  })
}

function errorReply(err: unknown): HttpReply {
  if (err instanceof ControlError) return new HttpReply(err.status, errorEnvelope(err.code, err.message))
  if (err instanceof CheckpointStateError) return new HttpReply(422, errorEnvelope('invalid_checkpoint_state', err.message))
  if (err instanceof BodyTooLarge) return new HttpReply(413, {detail: 'Request body too large'})
  // Anything else escapes as a plain-text 500, as in a real server.
  return new HttpReply(500, 'Internal Server Error')
}

class BodyTooLarge extends Error {}

async function readBody(req: http.IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  let n = 0
  for await (const c of req as AsyncIterable<Buffer>) {
    n += c.length
    if (n > MAX_BODY) throw new BodyTooLarge()
    chunks.push(c)
  }
  return Buffer.concat(chunks).toString('utf8')
}
