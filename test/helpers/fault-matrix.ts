import {ChildProcess, execFileSync} from 'node:child_process'
import {mkdir, mkdtemp, readFile, readdir, rm} from 'node:fs/promises'
import http from 'node:http'
import {AddressInfo} from 'node:net'
import os from 'node:os'
import path from 'node:path'

import {TestContext, expect} from 'vitest'

import {Fault} from '../../src/control-plane/faults.js'
import {Fleet, FleetMember, FleetOptions} from '../../src/control-plane/fleet.js'
import {ParticipantServer} from '../../src/control-plane/server.js'
import {SimDownstream, SimEnvironment} from '../../src/control-plane/sim.js'
import {ControlClient} from '../../src/coordination/client.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {discover} from '../../src/coordination/discover.js'
import {Coordinator} from '../../src/coordination/operations.js'
import {OPERATIONS} from '../../src/protocol/wire.js'
import {verifyCheckpoint} from '../../src/storage/verify.js'
import {TOKEN, control, waitFor} from './fleet.js'

/**
 * Helpers of the fault matrix (test/fault-matrix.rows.ts): published state, fleet phases, fakes.
 *
 * Resources belong to a Scope that releases them when its own test finishes (onTestFinished), in
 * an order that suits them: processes, then servers and clients, then directories.
 */

export type OnTestFinished = TestContext['onTestFinished']

export class Scope {
  private readonly releases: (() => Promise<unknown> | unknown)[] = []

  constructor(onTestFinished: OnTestFinished) {
    onTestFinished(async () => {
      // Processes first, then servers and clients, then directories (last registered first).
      for (const f of this.releases.splice(0).reverse()) await Promise.resolve(f()).catch(() => {})
    })
  }

  defer(fn: () => Promise<unknown> | unknown): void {
    this.releases.push(fn)
  }

  async dir(prefix = 'gymckpt-fault-'): Promise<string> {
    const d = await mkdtemp(path.join(os.tmpdir(), prefix))
    this.defer(() => rm(d, {recursive: true, force: true}))
    return d
  }

  async fleet(opts: Partial<FleetOptions> = {}): Promise<Fleet> {
    const fleet = await Fleet.start({token: TOKEN, members: FULL_FLEET, ...opts})
    this.defer(() => fleet.close())
    return fleet
  }

  async server(name: string, kind: FleetMember['kind']): Promise<ParticipantServer> {
    const p = kind === 'environment' ? new SimEnvironment(name) : kind === 'none' ? null : new SimDownstream(kind, name)
    const s = new ParticipantServer({name, token: TOKEN, participant: p})
    await s.listen()
    this.defer(() => s.close())
    return s
  }

  /** Discovers the fleet's participants in-process (throws what discovery throws). */
  async coordinator(fleet: Fleet, token = TOKEN): Promise<Coordinator> {
    const client = new ControlClient({token})
    this.defer(() => client.close())
    const d = await discover(
      client,
      fleet.servers.map((s) => ({name: s.name, url: s.url})),
      {probeTimeoutMs: 5000},
    )
    return {client, participants: d.participants}
  }

  /** Kills a spawned process (if still running) when the test finishes. */
  process(p: ChildProcess): void {
    this.defer(() => void p.kill('SIGKILL'))
  }
}

/** One participant of each kind and a server that takes no part (as test/helpers/fleet.ts FULL). */
export const FULL_FLEET: FleetMember[] = [
  {name: 'env', kind: 'environment'},
  {name: 'policy', kind: 'model'},
  {name: 'agent', kind: 'agent'},
  {name: 'res', kind: 'resources'},
  {name: 'judge', kind: 'none'},
]

/**
 * Adds a one-shot fault to `route` on `server`; the returned function tells whether a request has
 * met it yet. A hang or delay is taken before the request is journaled, so the journal cannot
 * tell; this wraps the server's own Faults instance to see it taken.
 */
export function faultOnce(server: ParticipantServer, route: string, fault: Fault): () => boolean {
  let met = false
  const faults = server.faults
  const take = faults.take.bind(faults)
  faults.take = (r: string) => {
    const f = take(r)
    if (f === fault) met = true
    return f
  }
  faults.add(route, fault, 1)
  return () => met
}

const env = (f: Fleet) => f.server('env').participant as SimEnvironment

/** `--server NAME=URL` for every server of a fleet (and any extra ones). */
export function serverFlags(fleet: Fleet, extra: {name: string; url: string}[] = [], replace: Record<string, string> = {}): string[] {
  const list = [...fleet.servers.map((s) => ({name: s.name, url: replace[s.name] ?? s.url})), ...extra]
  return list.flatMap((s) => ['--server', `${s.name}=${s.url}`])
}

/** Steps of every live episode: at 200 ms a step, longer than any test. */
export const EPISODE_STEPS = 300

/**
 * Starts long episodes and waits until each holds a boundary, so every checkpoint carries state.
 * A restored episode continues under the same task only with the same `steps`.
 */
export async function liveEpisodes(fleet: Fleet, ids: string[], steps = EPISODE_STEPS): Promise<void> {
  for (const r of ids) void fleet.run({rolloutId: r, steps, stepMs: 200})
  await waitFor(() => ids.every((r) => env(fleet).episodes.get(r)?.boundary != null), 10_000, 'episodes at a boundary')
}

/** Publishes `n` checkpoints in-process; returns every ID LATEST named, oldest first. */
export async function publishSome(c: Coordinator, root: string, episodes: string[], n = 2): Promise<string[]> {
  const ids: string[] = []
  for (let i = 0; i < n; i++) {
    const out = await checkpoint(c, {root, timeoutS: 10, episodes: episodes.map((r) => ({rolloutId: r, attempt: 0}))})
    ids.push(out.checkpointId)
  }
  expect((await readFile(path.join(root, 'LATEST'), 'utf8')).trim()).toBe(ids.at(-1))
  return ids
}

/**
 * Nothing published was lost: every checkpoint LATEST named before still exists and verifies, and
 * LATEST names a checkpoint that verifies. Returns what LATEST names now.
 */
export async function assertNothingLost(root: string, history: string[]): Promise<string> {
  expect(history.length).toBeGreaterThan(0)
  const latest = (await readFile(path.join(root, 'LATEST'), 'utf8')).trim()
  const ids = [...history, latest]
  const reports = await Promise.all(ids.map((id) => verifyCheckpoint(path.join(root, id))))
  expect(reports.map((r) => ({id: r.checkpointId, ok: r.ok, errors: r.problems.filter((p) => p.severity === 'error')}))).toEqual(ids.map((id) => ({id, ok: true, errors: []})))
  return latest
}

export type PhaseMap = Record<string, string>

/**
 * The phase of every participant as GET status reports it; 'down' when it does not answer
 * (connection refused). Servers that take no part (the judge) are left out.
 */
export async function phases(fleet: Fleet): Promise<PhaseMap> {
  const out: PhaseMap = {}
  for (const s of fleet.servers) {
    if (!s.participant) continue
    out[s.name] = await phaseAt(s.url)
  }
  return out
}

export async function phaseAt(url: string): Promise<string> {
  try {
    const r = await control(url, 'status')
    return r.status === 200 ? `${r.json.phase}${r.json.checkpoint_id ? ` ${r.json.checkpoint_id}` : ''}` : `HTTP ${r.status}`
  } catch {
    return 'down'
  }
}

/** `{server: phase}` with every participant in the same phase. */
export function allIn(fleet: Fleet, phase: string): PhaseMap {
  return Object.fromEntries(fleet.servers.filter((s) => s.participant).map((s) => [s.name, phase]))
}

/** The checkpoint IDs a server was sent an operation under, in order. */
export function sentIds(s: ParticipantServer, route: string): string[] {
  return s.journal.filter((j) => j.route === route).map((j) => JSON.parse(j.body).checkpoint_id as string)
}

/** How many control operations (prepare, commit, resume, …; not status, not data-plane calls) each server was sent. */
export function controlCalls(fleet: Fleet): number[] {
  return fleet.servers.map((s) => s.journal.filter((j) => (OPERATIONS as readonly string[]).includes(j.route)).length)
}

/** Every file and directory under `dir`, relative, sorted. */
export async function tree(dir: string): Promise<string[]> {
  const entries = await readdir(dir, {recursive: true})
  return entries.map((e) => e.split(path.sep).join('/')).sort()
}

/** Mounts a tmpfs on a new directory `dir`; the returned function unmounts it (call it in a finally). */
export async function mountTmpfs(dir: string, options: string): Promise<() => void> {
  await mkdir(dir, {recursive: true})
  execFileSync('mount', ['-t', 'tmpfs', '-o', options, 'tmpfs', dir])
  let mounted = true
  return () => {
    if (!mounted) return
    mounted = false
    execFileSync('umount', [dir])
  }
}

export function remount(dir: string, options: string): void {
  execFileSync('mount', ['-o', `remount,${options}`, dir])
}

// ---------------------------------------------------------------- fake participants

export interface FakeReply {
  status?: number
  /** Sent as is when a string or Buffer, else JSON-encoded. */
  body: unknown
}

export type FakeHandler = (body: string, state: FakeState) => FakeReply

export interface FakeState {
  kind: string
  instance: string
  phase: string
  checkpointId: string | null
}

export interface Fake {
  url: string
  /** Routes received, in order. */
  requests: string[]
  state: FakeState
}

const READY = {ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: []}

/**
 * A tiny node:http participant on 127.0.0.1 port 0 that plays along (prepare → prepared, resume
 * → idle) unless a handler for a route says otherwise; for replies no honest participant sends.
 */
export async function fakeParticipant(scope: Scope, kind: string, instance: string, handlers: Partial<Record<string, FakeHandler>> = {}): Promise<Fake> {
  const state: FakeState = {kind, instance, phase: 'idle', checkpointId: null}
  const requests: string[] = []
  const honest: Record<string, FakeHandler> = {
    status: () => ({body: {kind: state.kind, instance: state.instance, phase: state.phase, checkpoint_id: state.checkpointId, lease_expires_at: null, retired_rollouts: 0, report: READY}}),
    prepare: (b) => {
      state.phase = 'prepared'
      state.checkpointId = JSON.parse(b).checkpoint_id
      return {body: {phase: 'prepared', report: READY}}
    },
    renew: () => ({body: {lease_expires_at: Date.now() / 1000 + 600}}),
    resume: () => {
      const was = state.phase
      state.phase = 'idle'
      state.checkpointId = null
      return {body: {phase: 'idle', idempotent: was === 'idle'}}
    },
  }
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (d: Buffer) => chunks.push(d))
    req.on('end', () => {
      const route = (req.url ?? '').split('/').pop() ?? ''
      requests.push(route)
      const h = handlers[route] ?? honest[route]
      const reply = h ? h(Buffer.concat(chunks).toString('utf8'), state) : {status: 404, body: {detail: 'Not Found'}}
      const raw = typeof reply.body === 'string' || Buffer.isBuffer(reply.body) ? reply.body : JSON.stringify(reply.body)
      res.writeHead(reply.status ?? 200, {'content-type': 'application/json'})
      res.end(raw)
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  scope.defer(
    () =>
      new Promise<void>((r) => {
        server.closeAllConnections()
        server.close(() => r())
      }),
  )
  return {url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, requests, state}
}
