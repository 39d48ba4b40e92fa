import http from 'node:http'
import {AddressInfo} from 'node:net'
import {readFile, readdir, rm} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {Fleet} from '../../src/control-plane/fleet.js'
import {SimEnvironment} from '../../src/control-plane/sim.js'
import {ControlClient} from '../../src/coordination/client.js'
import {LeaseKeeper, checkpoint, commitAndPublish, prepareOrAbort} from '../../src/coordination/controller.js'
import {restoreCheckpoint} from '../../src/coordination/restore.js'
import {discover} from '../../src/coordination/discover.js'
import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {Coordinator, prepare, resume, retire} from '../../src/coordination/operations.js'
import {RunTracker} from '../../src/coordination/runs.js'
import {FULL, FULL_PARTICIPANTS, TOKEN, checkpointedFleet, control, coordinatorFor, later, soon, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

function client(opts: {grace?: number; token?: string} = {}): ControlClient {
  const c = new ControlClient({token: opts.token ?? TOKEN, replyGraceSeconds: opts.grace})
  later(() => c.close())
  return c
}

async function rawServer(handler: http.RequestListener): Promise<string> {
  const s = http.createServer(handler)
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()))
  later(async () => {
    s.closeAllConnections()
    await new Promise((r) => s.close(r))
  })
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`
}

function firstArrival(fleet: Fleet, name: string, route: string): number {
  const e = fleet.server(name).journal.find((j) => j.route === route)
  if (!e) throw new Error(`${name} never received ${route}`)
  return e.at
}

describe('discover', () => {
  it('skips 404 servers, sorts by kind then name, and keeps no non-participant', async () => {
    const fleet = await startFleet({members: FULL})
    const d = await discover(
      client(),
      fleet.servers.map((s) => ({name: s.name, url: s.url})),
    )
    expect(d.participants.map((p) => [p.server, p.kind])).toEqual([
      ['env', 'environment'],
      ['policy', 'model'],
      ['agent', 'agent'],
      ['res', 'resources'],
    ])
    expect(d.skipped.map((s) => s.name)).toEqual(['judge'])
  })

  it('reports every failing server together: down, silent, unknown kind, wrong token', async () => {
    const fleet = await startFleet({members: FULL.slice(0, 2)})
    const planner = await rawServer((_q, res) => {
      res.writeHead(200, {'content-type': 'application/json'})
      res.end(JSON.stringify({kind: 'planner', instance: 'p', phase: 'idle', report: {ready: true}}))
    })
    const silent = await rawServer(() => {})
    const down = await rawServer(() => {})
    const downUrl = down.replace(/:\d+$/, ':1')
    const err = await discover(client(), [...fleet.servers.map((s) => ({name: s.name, url: s.url})), {name: 'planner', url: planner}, {name: 'silent', url: silent}, {name: 'down', url: downUrl}], {
      probeTimeoutMs: 1500,
    }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(CoordinationError)
    const e = err as CoordinationError
    expect(e.code).toBe('discovery')
    expect(e.message).toContain('checkpoint discover failed on 3 participant(s)')
    expect(e.message).toContain("planner: HTTP 200 unknown_kind unknown participant kind 'planner'")
    expect(e.message).toContain('silent: no status reply within 1.5 seconds')
    expect(e.message).toMatch(/down: connection refused .* after 3 tries/)

    const bad = await discover(
      client({token: 'wrong'}),
      fleet.servers.map((s) => ({name: s.name, url: s.url})),
    ).catch((x: unknown) => x)
    expect((bad as ControllerError).code).toBe('unauthorized')
    expect((bad as Error).message).not.toContain('wrong')

    // A 401 without Gym's envelope (an auth proxy in front, a framework's own body) refuses it too.
    for (const s of fleet.servers) s.faults.add('status', {type: 'status', status: 401, body: '{"detail":"Not authenticated"}'}, 3)
    const proxied = (await discover(
      client(),
      fleet.servers.map((s) => ({name: s.name, url: s.url})),
    ).catch((x: unknown) => x)) as CoordinationError
    expect(proxied.code).toBe('unauthorized')
    expect(proxied.failures.every((f) => f.status === 401 && f.code === 'unauthorized')).toBe(true)
  })

  it('a fleet without a policy model fails discovery', async () => {
    const fleet = await startFleet({members: [FULL[0]!, FULL[2]!]})
    await expect(
      discover(
        client(),
        fleet.servers.map((s) => ({name: s.name, url: s.url})),
      ),
    ).rejects.toThrow('deployment: no policy model takes part in checkpoints')
  })
})

describe('fan-out order and bodies', () => {
  it('prepares environment → model → agent → resources, resumes in reverse, commits everywhere with one body', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    void fleet.run({rolloutId: 'a', steps: 100, stepMs: 5})
    await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === 1)
    const out = await checkpoint(c, {root, episodes: [{rolloutId: 'a', attempt: 0}], timeoutS: 10})
    const order = (route: string) => ['env', 'policy', 'agent', 'res'].sort((x, y) => firstArrival(fleet, x, route) - firstArrival(fleet, y, route))
    expect(order('prepare')).toEqual(['env', 'policy', 'agent', 'res'])
    expect(order('resume')).toEqual(['res', 'agent', 'policy', 'env'])
    const bodies = new Set(['env', 'policy', 'agent', 'res'].map((n) => fleet.server(n).journal.find((j) => j.route === 'commit')!.body))
    expect(bodies.size).toBe(1)
    expect(JSON.parse([...bodies][0]!)).toEqual({
      checkpoint_id: out.checkpointId,
      deadline_ts: expect.any(Number),
      checkpoint_dir: path.join(root, out.checkpointId),
      episode_ids: [{rollout_id: 'a', attempt: 0}],
    })
    expect((await readdir(root)).sort()).toEqual(['LATEST', out.checkpointId])
    for (const s of c.participants) expect((await control(s.url, 'status')).json.phase).toBe('idle')
  })

  it('retires environment, then agent, then model and resources; an empty list makes no call', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    expect(await retire(c, 'retire', [], soon())).toBe(0)
    expect(fleet.servers.every((s) => !s.journal.some((j) => j.route === 'retire'))).toBe(true)
    await retire(c, 'retire', [{rolloutId: 'x', attempt: 1}], soon())
    const t = (n: string) => firstArrival(fleet, n, 'retire')
    expect(t('env')).toBeLessThan(t('agent'))
    expect(t('agent')).toBeLessThan(Math.min(t('policy'), t('res')))
  })

  it('stops at the first stage that is not ready; later stages are never called', async () => {
    const fleet = await startFleet({members: FULL})
    fleet.server('policy').participant!.stuckBlockers = ['held-1']
    const c = await coordinatorFor(fleet)
    const r = await prepare(c, 'c1', Date.now() / 1000 + 0.3)
    expect(r.prepared).toBe(false)
    expect(r.blockers()).toEqual({policy: {blockers: ['held-1'], blockerCount: 1}})
    expect(r.notReached).toEqual(['agent', 'res'])
    expect(fleet.server('agent').journal.some((j) => j.route === 'prepare')).toBe(false)
    // Resume fences the never-reached servers too, so a late prepare of c1 is refused there.
    await resume(c, 'c1', soon())
    expect((await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'c1', deadline_ts: soon()})).json.error.code).toBe('stale_checkpoint')
  })

  it('a stage that fails reopens the earlier stages and fences the later ones', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('agent').faults.add('prepare', {type: 'status', status: 500})
    const err = await prepareOrAbort(c, 'c1', soon()).catch((e: unknown) => e)
    expect((err as Error).message).toMatch(/^checkpoint prepare failed on 1 participant\(s\): agent: HTTP 500/)
    for (const n of ['env', 'policy', 'agent', 'res']) expect((await control(fleet.server(n).url, 'status')).json.phase).toBe('idle')
    expect((await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'c1', deadline_ts: soon()})).json.error.code).toBe('stale_checkpoint')
  })

  it('resume goes on past a failing participant and reports it', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare(c, 'c1', soon())
    fleet.server('policy').faults.add('resume', {type: 'status', status: 500})
    const err = await resume(c, 'c1', soon()).catch((e: unknown) => e)
    expect((err as Error).message).toBe(
      "checkpoint resume failed on 1 participant(s): policy: HTTP 500 Internal Server Error. the other participants were resumed; resume 'c1' again; an unreachable participant resumes itself when its lease expires",
    )
    for (const n of ['env', 'agent', 'res']) expect((await control(fleet.server(n).url, 'status')).json.phase).toBe('idle')
    await resume(c, 'c1', soon())
    expect((await control(fleet.server('policy').url, 'status')).json.phase).toBe('idle')
  })
})

describe('checkpoint: failures always end resumed, nothing half-published', () => {
  it('a participant failing its commit: every participant resumed, no manifest, no LATEST', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500, body: '<html>boom</html>'})
    const err = await checkpoint(c, {root, checkpointId: 'c1', episodes: [], timeoutS: 10}).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(CoordinationError)
    expect((err as Error).message).toContain('checkpoint commit failed on 1 participant(s): agent: HTTP 500 <html>boom</html>')
    for (const s of c.participants) expect((await control(s.url, 'status')).json).toMatchObject({phase: 'idle', checkpoint_id: null})
    expect(await readdir(root)).toEqual(['c1'])
    expect(await readdir(path.join(root, 'c1'))).toEqual(['gym'])
  })

  it('a crash mid-commit (reply lost after the write) is sent again with the same body and replays: the commit succeeds', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    await prepare(c, 'c1', soon())
    fleet.server('res').faults.add('commit', {type: 'drop-after'})
    const out = await commitAndPublish(c, {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon()})
    expect(out.published).toBe(true)
    const commits = fleet.server('res').journal.filter((j) => j.route === 'commit')
    expect(commits).toHaveLength(2)
    expect(commits[1]!.body).toBe(commits[0]!.body)
    expect((await readdir(path.join(root, 'c1'))).sort()).toEqual(['gym', 'gymckpt.json'])
    // Dropped twice: the failure is reported, nothing published.
    await resume(c, 'c1', soon())
    await prepare(c, 'c2', soon())
    fleet.server('res').faults.add('commit', {type: 'drop'}, 2)
    const err = await commitAndPublish(c, {checkpointId: 'c2', root, episodes: [], restarts: [], deadlineTs: soon()}).catch((e: unknown) => e)
    expect((err as Error).message).toContain('res: connection closed before a reply')
    expect(await readdir(path.join(root, 'c2'))).toEqual(['gym'])
    await resume(c, 'c2', soon())
  })

  it('a resume whose connection drops once is sent again: the checkpoint closes cleanly', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('agent').faults.add('resume', {type: 'drop'})
    const out = await checkpoint(c, {root: await tempDir(), timeoutS: 10, episodes: []})
    expect(out.published).toBe(true)
    for (const s of fleet.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.phase, s.name).toBe('idle')
  })

  it('a participant that hangs is reported once the deadline plus grace passes, and the fleet is resumed', async () => {
    const fleet = await startFleet({members: FULL})
    const d = await coordinatorFor(fleet)
    const c: Coordinator = {...d, client: client({grace: 0.2})}
    fleet.server('agent').faults.add('prepare', {type: 'hang'})
    const t0 = Date.now()
    const err = await checkpoint(c, {root: await tempDir(), checkpointId: 'c1', episodes: [], timeoutS: 0.5}).catch((e: unknown) => e)
    // The time left to the deadline plus the grace when the call was sent: 0.7 s at most, less on a loaded machine.
    expect((err as Error).message).toMatch(/prepare failed on 1 participant\(s\): agent: no reply within 0\.[1-7] seconds/)
    expect(Date.now() - t0).toBeLessThan(5000)
    for (const n of ['env', 'policy', 'res']) expect((await control(fleet.server(n).url, 'status')).json.phase).toBe('idle')
  })

  it('SIGINT-style abort during prepare resumes the fleet and reports interrupted', async () => {
    const fleet = await startFleet({members: FULL})
    fleet.server('policy').participant!.stuckBlockers = ['slow']
    const d = await coordinatorFor(fleet)
    const abort = new AbortController()
    setTimeout(() => abort.abort(), 200)
    const err = await checkpoint({...d, signal: abort.signal}, {root: await tempDir(), checkpointId: 'c1', episodes: [], timeoutS: 30}).catch((e: unknown) => e)
    expect((err as ControllerError).code).toBe('interrupted')
    for (const s of d.participants) expect((await control(s.url, 'status')).json.phase).toBe('idle')
  })

  it('the lease keeper renews every lease while the checkpoint is open', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare(c, 'c1', soon(1))
    const before = (await control(fleet.server('env').url, 'status')).json.lease_expires_at
    const k = new LeaseKeeper(c, 'c1', 30, 100, () => {}).start()
    await waitFor(() => fleet.server('res').journal.filter((j) => j.route === 'renew').length >= 2, 3000, 'renewals')
    await k.stop()
    expect((await control(fleet.server('env').url, 'status')).json.lease_expires_at).toBeGreaterThan(before + 50)
    await resume(c, 'c1', soon())
  })

  it('a /run that replies while the commit fan-out runs is complete, not continued (found by the model-based test)', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const tracker = new RunTracker()
    let reply!: () => void
    tracker.track({rolloutId: 'quick', attempt: 0}, new Promise<void>((r) => (reply = r)))
    // The commit takes 200 ms; the reply lands 50 ms into it, before the wait for replies starts.
    fleet.server('policy').faults.add('commit', {type: 'delay', ms: 200})
    const root = await tempDir()
    const p = checkpoint(c, {root, tracker, timeoutS: 10})
    await waitFor(() => fleet.servers.some((s) => s.journal.some((j) => j.route === 'commit')), 5000, 'the commit')
    await new Promise((r) => setTimeout(r, 50))
    reply()
    const out = await p
    expect(out.awaitedRuns).toEqual([])
    expect(out.continued).toEqual([])
    const manifest = JSON.parse(await readFile(path.join(out.checkpointDir, 'gymckpt.json'), 'utf8'))
    expect(manifest.continued).toEqual([])
  })

  it('waits for /run replies already on the wire before building the rollout set', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const tracker = new RunTracker()
    let finished = false
    // An outstanding /run the participants no longer hold: its reply is on its way, and comes
    // 50 ms after the checkpoint starts waiting for replies (not after a fixed time, which a
    // loaded machine's prepare could outlast).
    let reply!: () => void
    tracker.track(
      {rolloutId: 'late', attempt: 0},
      new Promise<void>((r) => (reply = r)).then(() => (finished = true)),
    )
    const wait = tracker.waitForReplies.bind(tracker)
    tracker.waitForReplies = (...args) => {
      const waiting = wait(...args)
      setTimeout(reply, 50)
      return waiting
    }
    const out = await checkpoint(c, {root: await tempDir(), tracker, timeoutS: 10})
    expect(finished).toBe(true)
    expect(out.awaitedRuns).toEqual([{rolloutId: 'late', attempt: 0}])
    // Its reply came after prepare: it is complete, not continued.
    expect(out.continued).toEqual([])
  })
})

/** Episodes a and b checkpointed mid-flight, then every server crashed. */
const checkpointed = () => checkpointedFleet()

describe('restore', () => {
  it('restores every participant, resumes, and names the replacements', async () => {
    const {root} = await checkpointed()
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    const r = await restoreCheckpoint(c, {location: root, timeoutS: 10})
    expect(r.replacements).toEqual([
      {rolloutId: 'a', attempt: 1},
      {rolloutId: 'b', attempt: 1},
    ])
    expect(r.restoredByServer).toEqual({env: ['a-a1', 'b-a1'], policy: ['a-a1', 'b-a1'], agent: ['a-a1', 'b-a1'], res: ['a-a1', 'b-a1']})
    for (const s of c.participants) expect((await control(s.url, 'status')).json.phase).toBe('idle')
    const cont = await fresh.run({rolloutId: 'a', attempt: 1, steps: 60, stepMs: 0})
    expect(cont.status).toBe(200)
    expect((cont.body as {resumed_from_step: number}).resumed_from_step).toBeGreaterThan(0)
  })

  it('all or nothing: one participant failing makes every participant that may have installed state retire the replacement attempts, and resumes all', async () => {
    const {root} = await checkpointed()
    const latest = (await readdir(root)).find((f) => f.startsWith('ckpt-'))!
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    fresh.server('agent').faults.add('restore', {type: 'status', status: 500})
    const err = await restoreCheckpoint(c, {location: path.join(root, latest), timeoutS: 10}).catch((e: unknown) => e)
    expect((err as Error).message).toMatch(/^checkpoint restore failed on 1 participant\(s\): agent: HTTP 500/)
    const marks: Record<string, number> = {}
    for (const s of c.participants) {
      const st = (await control(s.url, 'status')).json
      expect(st.phase).toBe('idle')
      marks[s.server] = st.retired_rollouts
    }
    // The agent's restore failed inside (a 500 may come half way through an install): the
    // replacement attempts are retired there too, as everywhere else.
    expect(marks).toEqual({env: 2, policy: 2, agent: 2, res: 2})
    expect((await fresh.run({rolloutId: 'a', attempt: 1})).status).toBe(409)
    expect((await fresh.run({rolloutId: 'a', attempt: 2, steps: 2, stepMs: 1})).status).toBe(200)
  })

  it('verification failure sends nothing', async () => {
    const {root} = await checkpointed()
    const latest = (await readdir(root)).find((f) => f.startsWith('ckpt-'))!
    await rm(path.join(root, latest, 'gym', 'agent'), {recursive: true})
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    const err = await restoreCheckpoint(c, {location: root, timeoutS: 10}).catch((e: unknown) => e)
    expect((err as ControllerError).code).toBe('invalid_checkpoint')
    expect((err as Error).message).toContain('participant agent committed but its directory is missing')
    expect(fresh.servers.some((s) => s.journal.some((j) => j.route === 'restore'))).toBe(false)
  })
})

describe('restored state across the next checkpoint', () => {
  it('exports restored episodes the scope continues (by replacement attempt) and deletes the rest without refusing them', async () => {
    const {root} = await checkpointed()
    const fresh = await startFleet({members: FULL})
    const c2 = await coordinatorFor(fresh)
    await restoreCheckpoint(c2, {location: root, timeoutS: 10})
    // Neither replacement has been dispatched; the next checkpoint continues only a@1, letting b's
    // restored state go on purpose (without dropRestored that scope is refused: restored-scope.test.ts).
    const root2 = await tempDir()
    const out = await checkpoint(c2, {root: root2, timeoutS: 10, episodes: [{rolloutId: 'a', attempt: 1}], dropRestored: true})
    // Every participant replied (the loop below would pass on no replies at all).
    expect([...out.replies.keys()].sort()).toEqual(FULL_PARTICIPANTS)
    for (const r of out.replies.values()) expect(r.episode_ids).toEqual(['a-a1'])
    const env = (await control(fresh.server('env').url, 'status')).json
    expect(env.restored_pending).toEqual(['a-a1'])
    expect(env.retired_rollouts).toBe(0)
    // b's state is gone, but b@1 is not refused: the controller may start it over as that attempt.
    const b = await fresh.run({rolloutId: 'b', attempt: 1, steps: 60, stepMs: 0})
    expect(b.status).toBe(200)
    expect((b.body as {resumed_from_step: number}).resumed_from_step).toBe(0)
    const a = await fresh.run({rolloutId: 'a', attempt: 1, steps: 60, stepMs: 0})
    expect((a.body as {resumed_from_step: number}).resumed_from_step).toBeGreaterThan(0)
  })
})
