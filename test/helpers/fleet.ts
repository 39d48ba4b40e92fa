import http from 'node:http'
import {AddressInfo} from 'node:net'

import {afterEach} from 'vitest'

import {Fleet, FleetMember, FleetOptions} from '../../src/control-plane/fleet.js'
import {ParticipantServer} from '../../src/control-plane/server.js'
import {SimDownstream, SimEnvironment} from '../../src/control-plane/sim.js'
import {ControlClient} from '../../src/coordination/client.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {discover} from '../../src/coordination/discover.js'
import {Coordinator} from '../../src/coordination/operations.js'
import {tempDir} from './tmp.js'

export const TOKEN = 'test-token-0123456789abcdef'

/** One participant of each kind and a server that takes no part, short names for assertions. */
export const FULL: FleetMember[] = [
  {name: 'env', kind: 'environment'},
  {name: 'policy', kind: 'model'},
  {name: 'agent', kind: 'agent'},
  {name: 'res', kind: 'resources'},
  {name: 'judge', kind: 'none'},
]

/** The servers of FULL that have a control plane (every kind but `none`), sorted: who answers a checkpoint. */
export const FULL_PARTICIPANTS = FULL.filter((m) => m.kind !== 'none')
  .map((m) => m.name)
  .sort()

const cleanups: (() => Promise<unknown>)[] = []
afterEach(async () => {
  await Promise.all(cleanups.splice(0).map((f) => f().catch(() => {})))
})

export async function startFleet(opts: Partial<FleetOptions> = {}): Promise<Fleet> {
  const fleet = await Fleet.start({token: TOKEN, ...opts})
  cleanups.push(() => fleet.close())
  return fleet
}

export async function startServer(name: string, kind: FleetMember['kind'], opts: {grace?: number; leaseRetryMs?: number} = {}): Promise<ParticipantServer> {
  const p = kind === 'environment' ? new SimEnvironment(name) : kind === 'none' ? null : new SimDownstream(kind, name)
  const s = new ParticipantServer({name, token: TOKEN, participant: p, controlPlane: {leaseGraceSeconds: opts.grace, leaseRetryMs: opts.leaseRetryMs}})
  await s.listen()
  cleanups.push(() => s.close())
  return s
}

export async function coordinatorFor(fleet: Fleet, token = TOKEN): Promise<Coordinator> {
  const client = new ControlClient({token})
  cleanups.push(() => client.close())
  const d = await discover(
    client,
    fleet.servers.map((s) => ({name: s.name, url: s.url})),
    {probeTimeoutMs: 5000},
  )
  return {client, participants: d.participants}
}

export function later(fn: () => Promise<unknown>): void {
  cleanups.push(fn)
}

/** Raw control call, for testing the participant double's wire behaviour. */
export async function control(url: string, op: string, body?: unknown, token: string | null = TOKEN): Promise<{status: number; json: any; text: string}> {
  const headers: Record<string, string> = {'content-type': 'application/json'}
  if (token !== null) headers.authorization = `Bearer ${token}`
  const res = await fetch(`${url}/ng-control/v1/checkpoint/${op}`, {
    method: op === 'status' ? 'GET' : 'POST',
    headers,
    body: op === 'status' ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  })
  const text = await res.text()
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    json = undefined
  }
  return {status: res.status, json, text}
}

export const soon = (s = 10) => Date.now() / 1000 + s

export async function waitFor(cond: () => boolean | Promise<boolean>, ms = 5000, what = 'condition'): Promise<void> {
  const until = Date.now() + ms
  while (!(await cond())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 10))
  }
}

/**
 * A participant that answers every control route as an idle, ready server of `kind`/`instance`, and
 * commit with whatever `commitReply` returns for the checkpoint directory it was sent: for tests of
 * what the controller trusts of a participant. Closed after the test.
 */
export async function fakeParticipant(kind: string, instance: string, commitReply: (dir: string) => unknown): Promise<string> {
  const server = http.createServer((req, res) => {
    let body = ''
    req.on('data', (d) => (body += d))
    req.on('end', () => {
      const op = (req.url ?? '').split('/').pop()
      const report = {ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: []}
      const reply =
        op === 'status'
          ? {kind, instance, phase: 'idle', checkpoint_id: null, lease_expires_at: null, retired_rollouts: 0, report}
          : op === 'prepare'
            ? {phase: 'prepared', report}
            : op === 'commit'
              ? commitReply(JSON.parse(body).checkpoint_dir)
              : op === 'resume'
                ? {phase: 'idle', idempotent: false}
                : {lease_expires_at: 0}
      res.writeHead(200, {'content-type': 'application/json'}).end(JSON.stringify(reply))
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  later(() => new Promise((r) => server.close(r)))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

/**
 * A fleet of FULL that ran `rollouts` (60 steps of 5 ms) and took a checkpoint continuing each at
 * attempt 0 into a new root, then crashed: what a restore starts from.
 */
export async function checkpointedFleet(rollouts = ['a', 'b']): Promise<{root: string; fleet: Fleet}> {
  const fleet = await startFleet({members: FULL})
  const c = await coordinatorFor(fleet)
  for (const r of rollouts) void fleet.run({rolloutId: r, steps: 60, stepMs: 5})
  await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === rollouts.length)
  const root = await tempDir()
  await checkpoint(c, {root, timeoutS: 10, episodes: rollouts.map((rolloutId) => ({rolloutId, attempt: 0}))})
  await fleet.crash()
  return {root, fleet}
}
