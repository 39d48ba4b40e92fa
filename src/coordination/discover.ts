import {readFile} from 'node:fs/promises'
import {Agent, request} from 'undici'
import {parse as parseYaml} from 'yaml'
import {z} from 'zod'

import {SAFE_ID_PATTERN, clipInput} from '../protocol/episode.js'
import {KINDS, Kind, StatusReply} from '../protocol/wire.js'
import {ControlClient, MAX_REPLY_BYTES, ServerRef, describeTransportError, isConnectionFailure, readCapped} from './client.js'
import {ControllerError, CoordinationError, ParticipantFailure} from './errors.js'

/** Where the candidate servers come from. */
export type FleetSource = {type: 'head'; url: string} | {type: 'servers'; servers: ServerRef[]} | {type: 'file'; path: string}

export interface Participant {
  server: string
  url: string
  kind: Kind
  instance: string
}

export interface DiscoveredParticipant extends Participant {
  status: StatusReply
}

export interface Discovery {
  participants: DiscoveredParticipant[]
  /** Servers that answered 404: not checkpoint participants. */
  skipped: ServerRef[]
  /** Only with `tolerant`: the servers that failed their probe. */
  failures: ParticipantFailure[]
}

const SERVER_GROUPS = ['environment_servers', 'responses_api_models', 'responses_api_agents', 'resources_servers'] as const

/** Parses `NAME=URL`. */
export function parseServerArg(arg: string): ServerRef {
  const eq = arg.indexOf('=')
  if (eq <= 0) throw new ControllerError('input', `--server '${arg}': expected NAME=URL, e.g. policy_model=http://10.0.0.5:8000`)
  return {name: arg.slice(0, eq), url: checkUrl(arg.slice(eq + 1), `--server ${arg.slice(0, eq)}`)}
}

function checkUrl(url: string, where: string): string {
  let u: URL
  try {
    u = new URL(url)
  } catch {
    throw new ControllerError('input', `${where}: '${url}' is not a URL`)
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new ControllerError('input', `${where}: '${url}' is not an http(s) URL`)
  return url.replace(/\/$/, '')
}

const FleetFile = z.object({
  servers: z.record(z.string(), z.union([z.string(), z.object({url: z.string()})])),
})

/** Reads a fleet YAML file: `servers: {NAME: URL | {url: URL}}`. */
export async function readFleetFile(path: string): Promise<ServerRef[]> {
  let text: string
  try {
    text = await readFile(path, 'utf8')
  } catch (err) {
    throw new ControllerError('input', `cannot read fleet file ${path}: ${(err as Error).message}`)
  }
  let doc: unknown
  try {
    doc = parseYaml(text)
  } catch (err) {
    throw new ControllerError('input', `fleet file ${path} is not YAML: ${(err as Error).message.split('\n')[0]}`)
  }
  const parsed = FleetFile.safeParse(doc)
  if (!parsed.success) {
    const i = parsed.error.issues[0]
    throw new ControllerError('input', `fleet file ${path}: ${i?.path.join('.') || '(root)'}: ${i?.message}; expected 'servers: {NAME: URL}'`)
  }
  return Object.entries(parsed.data.servers).map(([name, v]) => ({name, url: checkUrl(typeof v === 'string' ? v : v.url, `fleet file ${path}: servers.${name}`)}))
}

/**
 * Reads a Gym head server: candidate names are the top-level config keys holding a server group;
 * addresses come from `/server_instances`, else from the config's own host/port.
 */
export async function readHeadServer(headUrl: string, timeoutMs: number): Promise<ServerRef[]> {
  const base = checkUrl(headUrl, '--head')
  const agent = new Agent({connections: 2})
  const get = async (path: string): Promise<string> => {
    try {
      const res = await request(base + path, {dispatcher: agent, signal: AbortSignal.timeout(timeoutMs)})
      const text = await readCapped(res.body, MAX_REPLY_BYTES)
      if (text === null) throw new ControllerError('discovery', `head server ${base}${path} answered more than ${MAX_REPLY_BYTES / (1 << 20)} MiB; it was not read`)
      if (res.statusCode !== 200) throw new ControllerError('discovery', `head server ${base}${path} answered HTTP ${res.statusCode}`)
      return text
    } catch (err) {
      if (err instanceof ControllerError) throw err
      throw new ControllerError('discovery', `head server ${base}${path}: ${describeTransportError(err)}`)
    }
  }
  try {
    const yamlText = await get('/global_config_dict_yaml')
    let cfgText = yamlText
    try {
      const j = JSON.parse(yamlText) as unknown
      if (typeof j === 'string') cfgText = j
    } catch {}
    let cfg: unknown
    try {
      cfg = parseYaml(cfgText)
    } catch (err) {
      throw new ControllerError('discovery', `head server global config is not YAML: ${(err as Error).message.split('\n')[0]}`)
    }
    if (!cfg || typeof cfg !== 'object') throw new ControllerError('discovery', 'head server global config is not a mapping')
    const fromConfig = new Map<string, string | null>()
    for (const [name, v] of Object.entries(cfg as Record<string, unknown>)) {
      if (!v || typeof v !== 'object') continue
      const group = SERVER_GROUPS.find((g) => g in (v as object))
      if (!group) continue
      const inner = Object.values(((v as Record<string, unknown>)[group] ?? {}) as Record<string, {host?: string; port?: number}>)[0]
      fromConfig.set(name, inner?.host && inner?.port ? `http://${inner.host}:${inner.port}` : null)
    }
    let instances: {name?: string; process_name?: string; config_path?: string; url?: string; host?: string; port?: number}[] = []
    try {
      const parsed = JSON.parse(await get('/server_instances')) as unknown
      if (Array.isArray(parsed)) instances = parsed
    } catch (err) {
      const unplaced = [...fromConfig].filter(([, u]) => u === null).map(([name]) => name)
      if (fromConfig.size === 0 || unplaced.length)
        throw err instanceof ControllerError
          ? err
          : new ControllerError(
              'discovery',
              `head server ${base}/server_instances answered something that is not JSON, and the global config gives ${unplaced.length ? `no host and port for ${unplaced.slice(0, 5).join(', ')}${unplaced.length > 5 ? ', …' : ''}` : 'no server'}: ` +
                'fix the head server, or name each server with --server NAME=URL (or --fleet FILE)',
            )
    }
    return [...fromConfig.entries()].map(([name, cfgUrl]) => {
      // Gym's head server lists each process under its top-level config key as `process_name`
      // (and `config_path`); its `name` is the implementation key, which servers of one
      // implementation share. `name` is matched only where an entry has neither.
      const inst = instances.find((i) => (i.process_name ?? i.config_path ?? i.name) === name)
      const url = inst?.url ?? (inst?.host && inst.port ? `http://${inst.host}:${inst.port}` : cfgUrl)
      if (!url) throw new ControllerError('discovery', `head server names '${name}' but gives no address for it`)
      return {name, url: checkUrl(url, `head server entry ${name}`)}
    })
  } finally {
    await agent.close().catch(() => {})
  }
}

export async function resolveSource(source: FleetSource, timeoutMs: number): Promise<ServerRef[]> {
  if (source.type === 'servers') return source.servers
  if (source.type === 'file') return readFleetFile(source.path)
  return readHeadServer(source.url, timeoutMs)
}

export interface DiscoverOptions {
  /** Connection tries per server (Gym: 3). */
  tries?: number
  /** Bound on one server's whole probe (Gym: 60 s). */
  probeTimeoutMs?: number
  signal?: AbortSignal
  /** Report failing servers in the result instead of failing (for status displays only). */
  tolerant?: boolean
}

export const KIND_ORDER: readonly Kind[] = KINDS

/** A kind or instance name that is one safe directory name (the protocol's ID rule). */
export function isSafeComponent(name: string): boolean {
  return name.length <= 128 && SAFE_ID_PATTERN.test(name)
}

export function sortParticipants<T extends {kind: Kind; server: string}>(ps: T[]): T[] {
  return [...ps].sort((a, b) => KIND_ORDER.indexOf(a.kind) - KIND_ORDER.indexOf(b.kind) || a.server.localeCompare(b.server))
}

/**
 * Probes every candidate's status concurrently. Any failure fails discovery: an unreachable
 * participant makes every later checkpoint unsafe, so none is silently dropped.
 */
export async function discover(client: ControlClient, servers: ServerRef[], opts: DiscoverOptions = {}): Promise<Discovery> {
  const tries = opts.tries ?? 3
  const probeMs = opts.probeTimeoutMs ?? 60_000
  const dup = servers.find((s, i) => servers.findIndex((t) => t.name === s.name) !== i)
  if (dup) throw new ControllerError('input', `server '${dup.name}' is named twice`)
  if (servers.length === 0) throw new ControllerError('input', 'no servers to discover: give --head, --server NAME=URL or --fleet FILE')
  const failures: ParticipantFailure[] = []
  const participants: DiscoveredParticipant[] = []
  const skipped: ServerRef[] = []
  await Promise.all(
    servers.map(async (s) => {
      const until = Date.now() + probeMs
      for (let attempt = 1; ; attempt++) {
        const left = until - Date.now()
        const r = left > 0 ? await client.status(s, left, opts.signal) : {ok: false as const, failure: {server: s.name, status: null, code: 'timeout', message: ''}}
        if (r.ok) {
          const kind = r.reply.kind
          const instance = r.reply.instance
          if (!(KINDS as readonly string[]).includes(kind)) {
            failures.push({server: s.name, status: 200, code: 'unknown_kind', message: `unknown participant kind '${clipInput(kind)}'`})
          } else if (!isSafeComponent(instance)) {
            // The instance names the participant's directory under the checkpoint: '../x' or 'a/b'
            // would put its files outside it (Gym's store refuses such names too, section 7.1).
            failures.push({
              server: s.name,
              status: 200,
              code: 'unsafe_instance',
              message: `instance '${clipInput(instance)}' is not a safe path component (${SAFE_ID_PATTERN.source}, at most 128 characters)`,
            })
          } else participants.push({server: s.name, url: s.url, kind: kind as Kind, instance, status: r.reply})
          return
        }
        const f = r.failure
        if (f.status === 404) return void skipped.push(s)
        if (f.code === 'timeout') {
          return void failures.push({...f, message: `no status reply within ${(probeMs / 1000).toString()} seconds`})
        }
        if (isConnectionFailure(f) && attempt < tries) {
          await new Promise((res) => setTimeout(res, Math.min(200 * attempt, Math.max(0, until - Date.now()))))
          continue
        }
        return void failures.push(isConnectionFailure(f) ? {...f, message: `${f.message} after ${attempt} tries`} : f)
      }
    }),
  )
  // Two participants of one kind and instance would write into one directory.
  const byDir = new Map<string, string>()
  for (const p of sortParticipants(participants)) {
    const dir = `${p.kind}/${p.instance}`
    const first = byDir.get(dir)
    if (first) failures.push({server: p.server, status: 200, code: 'duplicate_instance', message: `reports ${dir}, as ${first} does: both would write gym/${dir}`})
    else byDir.set(dir, p.server)
  }
  if (!participants.some((p) => p.kind === 'model') && !failures.some((f) => f.code !== 'unknown_kind')) {
    failures.push({server: 'deployment', status: null, code: 'no_model', message: 'no policy model takes part in checkpoints'})
  }
  if (failures.length && !opts.tolerant) throw new CoordinationError('discover', failures, 'every participant must answer before a checkpoint is safe')
  return {participants: sortParticipants(participants), skipped, failures: [...failures].sort((a, b) => a.server.localeCompare(b.server))}
}
