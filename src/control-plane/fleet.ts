import {Agent, request} from 'undici'

import {ControlPlaneOptions} from './control-plane.js'
import {HeadServer} from './head.js'
import {ParticipantServer} from './server.js'
import {RunResult, SimDownstream, SimEnvironment, SimParticipant} from './sim.js'

export type MemberKind = 'environment' | 'model' | 'agent' | 'resources' | 'none'

export interface FleetMember {
  name: string
  kind: MemberKind
}

/** The embedded default: one server of each kind, plus a judge model that takes no part. */
export const MEMBER_KINDS: readonly MemberKind[] = ['environment', 'model', 'agent', 'resources', 'none']

/** A member as `NAME=KIND`. */
export function parseMember(spec: string): FleetMember {
  const eq = spec.indexOf('=')
  const [name, kind] = [spec.slice(0, eq), spec.slice(eq + 1)]
  if (eq <= 0 || !MEMBER_KINDS.includes(kind as MemberKind)) throw new Error(`${spec}: expected NAME=KIND with KIND one of ${MEMBER_KINDS.join(', ')}`)
  return {name, kind: kind as MemberKind}
}

export const DEFAULT_FLEET: FleetMember[] = [
  {name: 'weather_env', kind: 'environment'},
  {name: 'policy_model', kind: 'model'},
  {name: 'simple_agent', kind: 'agent'},
  {name: 'weather_resources', kind: 'resources'},
  {name: 'judge_model', kind: 'none'},
]

export interface FleetOptions {
  token: string
  members?: FleetMember[]
  controlPlane?: ControlPlaneOptions
  /** Start the head-server double too. */
  head?: boolean
  /** Simulated latency of each downstream call, ms. */
  callMs?: number
}

export interface RunRequest {
  rolloutId: string
  attempt?: number
  input?: string
  steps?: number
  stepMs?: number
  stepMode?: 'wait' | 'replay'
  restart?: boolean
}

/** A whole simulated Gym deployment on loopback. */
export class Fleet {
  private readonly data = new Agent({connections: 256})
  private constructor(
    readonly servers: ParticipantServer[],
    readonly head: HeadServer | null,
  ) {}

  static async start(opts: FleetOptions): Promise<Fleet> {
    const members = opts.members ?? DEFAULT_FLEET
    const names = new Set<string>()
    for (const m of members) {
      if (names.has(m.name)) throw new Error(`fleet member '${m.name}' is named twice`)
      names.add(m.name)
    }
    const servers = members.map((m) => {
      let p: SimParticipant | null = null
      if (m.kind === 'environment') p = new SimEnvironment(m.name)
      else if (m.kind !== 'none') {
        const d = new SimDownstream(m.kind, m.name)
        d.callMs = opts.callMs ?? 0
        p = d
      }
      return new ParticipantServer({name: m.name, token: opts.token, participant: p, controlPlane: opts.controlPlane})
    })
    await Promise.all(servers.map((s) => s.listen()))
    const downstream = servers.filter((s) => s.participant instanceof SimDownstream).map((s) => ({name: s.name, url: s.url}))
    for (const s of servers) if (s.participant instanceof SimEnvironment) s.participant.downstream = downstream
    let head: HeadServer | null = null
    if (opts.head) {
      head = new HeadServer(members.map((m, i) => ({name: m.name, kind: m.kind, url: servers[i]!.url})))
      await head.listen()
    }
    return new Fleet(servers, head)
  }

  get headUrl(): string | null {
    return this.head?.url ?? null
  }

  server(name: string): ParticipantServer {
    const s = this.servers.find((x) => x.name === name)
    if (!s) throw new Error(`no fleet member '${name}'`)
    return s
  }

  get environments(): ParticipantServer[] {
    return this.servers.filter((s) => s.participant instanceof SimEnvironment)
  }

  /** `NAME=URL` for every server, as `--server` takes them. */
  serverArgs(): string[] {
    return this.servers.map((s) => `${s.name}=${s.url}`)
  }

  /** Sends one /run to the (first) environment server; resolves with its reply, or status 0 when none came. */
  async run(r: RunRequest, envName?: string): Promise<{status: number; body: RunResult | {error?: {code: string; detail: string}}}> {
    const env = envName ? this.server(envName) : this.environments[0]
    if (!env) throw new Error('the fleet has no environment server')
    let res
    try {
      res = await request(`${env.url}/run`, {
        method: 'POST',
        dispatcher: this.data,
        headers: {'content-type': 'application/json'},
        body: JSON.stringify({
          _ng_rollout_id: r.rolloutId,
          _ng_attempt_index: r.attempt ?? 0,
          input: r.input ?? r.rolloutId,
          steps: r.steps ?? 3,
          step_ms: r.stepMs ?? 10,
          step_mode: r.stepMode ?? 'wait',
          restart: r.restart ?? false,
        }),
      })
    } catch (err) {
      // A crashed or closed fleet: no reply. Callers see it as status 0, never as a rejection.
      return {status: 0, body: {error: {code: 'connection', detail: (err as Error).message}}}
    }
    let text: string
    try {
      text = await res.body.text()
    } catch (err) {
      return {status: 0, body: {error: {code: 'connection', detail: (err as Error).message}}}
    }
    let body: unknown
    try {
      body = JSON.parse(text)
    } catch {
      body = {error: {code: 'http_' + res.statusCode, detail: text}}
    }
    return {status: res.statusCode, body: body as RunResult}
  }

  async close(): Promise<void> {
    await Promise.all([...this.servers.map((s) => s.close()), this.head?.close()])
    await this.data.destroy().catch(() => {})
  }

  /** Every process dies at once: connections cut, in-memory state lost. */
  async crash(): Promise<void> {
    await Promise.all([...this.servers.map((s) => s.crash()), this.head?.close()])
    await this.data.destroy().catch(() => {})
  }
}
