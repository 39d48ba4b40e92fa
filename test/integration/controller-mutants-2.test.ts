// More rules of src/coordination/controller.ts (issue 12), from the survivors of its first run:
// sizes per participant, a commit reply naming no capture key, the unscoped commit, deadlines of
// the closing resume, separators of the messages, the publish gate's details, write failures.
import {mkdir, readFile, readdir} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {ControlClient} from '../../src/coordination/client.js'
import {LeaseKeeper, checkpoint, closeCheckpoint, commitAndPublish, prepareOrAbort, preparePreflight} from '../../src/coordination/controller.js'
import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {CallEvent, Coordinator, prepare, resume} from '../../src/coordination/operations.js'
import {captureKey} from '../../src/protocol/episode.js'
import {FULL, TOKEN, coordinatorFor, fakeParticipant, later, soon, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

/** Episodes running on the fleet, each at a boundary, so a commit writes real records. */
async function live(fleet: Awaited<ReturnType<typeof startFleet>>, ids: string[]): Promise<void> {
  const env = fleet.server('env').participant as SimEnvironment
  for (const r of ids) void fleet.run({rolloutId: r, steps: 400, stepMs: 5}).catch(() => {})
  await waitFor(() => env.episodes.size === ids.length && [...env.episodes.values()].every((e) => e.boundary !== null), 5000, 'episodes at a boundary')
}

/** A participant that answers every control call, and commit with `commitReply(checkpointDir)`. */

const liarReply = (kind: string, instance: string) => (dir: string) => ({
  phase: 'committed',
  manifest: {schema_version: 1, kind, instance, checkpoint_id: path.basename(dir), records_file: `records-${'0'.repeat(64)}.jsonl`, records_sha256: '0'.repeat(64), record_count: 0},
  episode_ids: [],
})

describe('checkpoint with real records', () => {
  it("each participant's bytes are its own records file's; the continued episodes are the scope, in the controller's order", async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await live(fleet, ['r2', 'r1'])
    const root = await tempDir()
    const t0 = Date.now() / 1000
    const out = await checkpoint(c, {
      root,
      checkpointId: 'c1',
      timeoutS: 10,
      episodes: [
        {rolloutId: 'r2', attempt: 0},
        {rolloutId: 'r1', attempt: 0},
      ],
    })
    const t1 = Date.now() / 1000
    const sizes = new Map<string, number>()
    for (const t of out.timings) {
      const m = out.replies.get(t.server)!.manifest
      sizes.set(t.server, (await readFile(path.join(root, 'c1', 'gym', m.kind, m.instance, m.records_file))).length)
      expect(t.bytes, t.server).toBe(sizes.get(t.server))
    }
    // The sizes differ between participants, so a row cannot have taken another's.
    expect(new Set(sizes.values()).size).toBeGreaterThan(1)
    const committed = [...new Set([...out.replies.values()].flatMap((r) => r.episode_ids))].sort()
    expect(committed).toEqual(['r1', 'r2'])
    expect(out.continued.map(captureKey)).toEqual(['r2', 'r1'])
    const manifest = JSON.parse(await readFile(path.join(root, 'c1', 'gymckpt.json'), 'utf8'))
    expect(manifest.created_at).toBeGreaterThanOrEqual(t0)
    expect(manifest.created_at).toBeLessThanOrEqual(t1)
    await fleet.crash()
  })
})

describe('untrusted commit replies and the publish gate', () => {
  it('a commit reply naming an episode that is no capture key fails the commit, naming the server; nothing is published', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const odd = await fakeParticipant('resources', 'odd', (dir) => ({...liarReply('resources', 'odd')(dir), episode_ids: ['../escape']}))
    const withOdd: Coordinator = {...c, participants: [...c.participants, {server: 'odd', url: odd, kind: 'resources', instance: 'odd'}]}
    const root = await tempDir()
    const err = (await checkpoint(withOdd, {root, checkpointId: 'c1', episodes: [], timeoutS: 10}).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.operation).toBe('commit')
    expect(err.failures).toEqual([{server: 'odd', status: 200, code: 'bad_reply', message: expect.stringMatching(/^commit reply names episode '\.\.\/escape', which is no capture key: ./)}])
    expect(await readFile(path.join(root, 'LATEST'), 'utf8').catch(() => null)).toBeNull()
  })

  it('every problem of the publish gate is named, separated, and kept in the details', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const l1 = await fakeParticipant('resources', 'liar1', liarReply('resources', 'liar1'))
    const l2 = await fakeParticipant('resources', 'liar2', liarReply('resources', 'liar2'))
    const withLiars: Coordinator = {
      ...c,
      participants: [...c.participants, {server: 'liar1', url: l1, kind: 'resources', instance: 'liar1'}, {server: 'liar2', url: l2, kind: 'resources', instance: 'liar2'}],
    }
    const root = await tempDir()
    const err = (await checkpoint(withLiars, {root, checkpointId: 'c1', episodes: [], timeoutS: 10}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('invalid_checkpoint')
    const details = err.details as {checkpoint_dir: string; problems: {severity: string; where: string; message: string}[]}
    expect(details.checkpoint_dir).toBe(path.join(root, 'c1'))
    // Each missing participant once (the controller manifest names them; no second list does).
    expect(details.problems).toEqual([
      {severity: 'error', where: 'gym/resources/liar1', message: 'participant liar1 committed but its directory is missing'},
      {severity: 'error', where: 'gym/resources/liar2', message: 'participant liar2 committed but its directory is missing'},
    ])
    expect(err.message).toContain(
      `so it was not published (LATEST is unchanged); its controller manifest was set aside as gymckpt.refused.json, so it is not listed as published: ${details.problems.map((p) => `${p.where}: ${p.message}`).join('; ')}`,
    )
  })

  it('a LATEST that cannot be replaced: invalid_checkpoint naming it, after the manifest was written', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    await mkdir(path.join(root, 'LATEST', 'x'), {recursive: true})
    const err = (await checkpoint(c, {root, checkpointId: 'c1', episodes: [], timeoutS: 10}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toMatch(new RegExp(`^cannot publish ${esc(path.join(root, 'c1'))}: replacing ${esc(path.join(root, 'LATEST'))} failed: .+; the fleet was resumed`))
    expect(await readFile(path.join(root, 'c1', 'gymckpt.json'), 'utf8')).toMatch(/"checkpoint_id": "c1"/)
  })

  it('a collection.json that cannot be written: invalid_checkpoint, LATEST not moved', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    await mkdir(path.join(root, 'c1', 'collection.json', 'x'), {recursive: true})
    await prepare(c, 'c1', soon())
    const {commitAndPublish} = await import('../../src/coordination/controller.js')
    const err = (await commitAndPublish(c, {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon(), collectionRunId: 'run'}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toMatch(
      new RegExp(
        `^cannot write ${esc(path.join(root, 'c1', 'collection.json'))}: .+; LATEST was not moved; its controller manifest was set aside as gymckpt.refused.json and collection.refused.json, so it is not listed as published$`,
      ),
    )
    expect(await readdir(path.join(root, 'c1'))).toContain('gymckpt.refused.json')
    expect(await readFile(path.join(root, 'LATEST'), 'utf8').catch(() => null)).toBeNull()
    await resume(c, 'c1', soon())
  })
})

describe('deadlines and messages of closing and preparing', () => {
  it('closeCheckpoint resumes with at least 30 s, whatever deadline it was given', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare(c, 'c1', soon())
    const t0 = Date.now() / 1000
    expect(await closeCheckpoint(c, 'c1', t0 - 100)).toEqual({resumed: true, failures: []})
    for (const s of fleet.servers.filter((x) => x.controlPlane)) {
      const body = JSON.parse(s.journal.find((j) => j.route === 'resume')!.body)
      expect(body.deadline_ts, s.name).toBeGreaterThanOrEqual(t0 + 30)
    }
  })

  it('checkpoint resumes with its own timeout from when the resume starts', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    let t = 0
    await checkpoint(c, {root: await tempDir(), checkpointId: 'c1', episodes: [], timeoutS: 100, onPhase: (p, s) => p === 'resume' && s === 'start' && (t = Date.now() / 1000)})
    const body = JSON.parse(fleet.server('env').journal.find((j) => j.route === 'resume')!.body)
    expect(body.deadline_ts).toBeGreaterThanOrEqual(t + 100)
  })

  it('keepClosedOnBlockers leaves the fleet closed when prepare misses its deadline', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('env').participant!.stuckBlockers = ['b']
    const err = (await checkpoint(c, {root: await tempDir(), checkpointId: 'c1', episodes: [], timeoutS: 0.6, keepClosedOnBlockers: true}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('not_prepared')
    expect(err.message).toMatch(/The fleet is left closed for inspection: resume 'c1' when done\.$/)
    expect(fleet.server('env').controlPlane!.phase).toBe('preparing')
    await resume(c, 'c1', soon())
  })

  it('the preflight lists every open checkpoint and its servers, separated', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const only = (...names: string[]) => ({...c, participants: c.participants.filter((p) => names.includes(p.server))})
    // Prepared directly on single participants (no stage order needed for the preflight).
    await fleet.server('env').controlPlane!.prepare({checkpoint_id: 'old1', deadline_ts: soon()})
    await fleet.server('policy').controlPlane!.prepare({checkpoint_id: 'old1', deadline_ts: soon()})
    await fleet.server('agent').controlPlane!.prepare({checkpoint_id: 'old2', deadline_ts: soon()})
    const err = (await preparePreflight(c, 'new').catch((e: unknown) => e)) as ControllerError
    expect(err.message).toMatch(/^another checkpoint is open: 'old1' on env \(prepared\), policy \(prepared\); 'old2' on agent \(prepared\); nothing was sent\./)
    await resume(only('env', 'policy'), 'old1', soon())
    await resume(only('agent'), 'old2', soon())
  })

  it('blockers of several servers are separated; an interrupted prepare says so', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('env').participant!.stuckBlockers = ['b1']
    const err = (await prepareOrAbort(c, 'c1', soon(0.6)).catch((e: unknown) => e)) as ControllerError
    expect(err.message).toMatch(/blockers: env: 1 \(b1\)\. the fleet was resumed/)
    const wide = await startFleet({
      members: [
        {name: 'e1', kind: 'environment'},
        {name: 'e2', kind: 'environment'},
        {name: 'm', kind: 'model'},
      ],
    })
    const wc = await coordinatorFor(wide)
    wide.server('e1').participant!.stuckBlockers = ['x']
    wide.server('e2').participant!.stuckBlockers = ['y']
    const err2 = (await prepareOrAbort(wc, 'c2', soon(0.6)).catch((e: unknown) => e)) as ControllerError
    expect(err2.message).toMatch(/blockers: e1: 1 \(x\); e2: 1 \(y\)\. /)
    const abort = new AbortController()
    wide.server('e1').participant!.stuckBlockers = ['slow']
    // Interrupted once the prepare that waits for e1's blocker is on its way.
    const onCall = (e: CallEvent) => {
      if (e.operation === 'prepare' && e.server === 'e1' && e.ms === null) setImmediate(() => abort.abort())
    }
    const p = prepareOrAbort({...wc, signal: abort.signal, onCall}, 'c3', soon(30))
    const err3 = (await p.catch((e: unknown) => e)) as ControllerError
    expect(err3.code).toBe('interrupted')
    expect(err3.message).toBe("interrupted while preparing 'c3'; the fleet was resumed (checkpoint 'c3' is closed for good)")
  })
})

function esc(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
}

// From the first Stryker run over the whole of controller.ts (2026-12-05).
describe('a commit retried elsewhere, an unscoped commit, and what closing does with errors of its own', () => {
  it('a retry into another directory: the participants that committed refuse with checkpoint_conflict, and the error says what the retry must send', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare(c, 'c1', soon())
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const plan = {checkpointId: 'c1', episodes: [], restarts: [], deadlineTs: soon()}
    const first = (await commitAndPublish(c, {...plan, root: await tempDir()}).catch((e: unknown) => e)) as CoordinationError
    expect(first.failures.map((f) => f.server)).toEqual(['agent'])
    // A failure that is no conflict gets no advice about retries.
    expect(first.message).not.toMatch(/a retry of a commit/)
    // The retry: env, policy and res refuse (another directory); res also fails for its own reason.
    fleet.server('res').faults.add('commit', {type: 'status', status: 503})
    const elsewhere = await tempDir()
    const err = (await commitAndPublish(c, {...plan, root: elsewhere}).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.map((f) => [f.server, f.code ?? f.status])).toEqual([
      ['env', 'checkpoint_conflict'],
      ['policy', 'checkpoint_conflict'],
      ['res', 503],
    ])
    expect(err.message).toMatch(
      new RegExp(
        `^checkpoint commit failed on 3 participant\\(s\\): .*\\. a retry of a commit must send the directory and scope of the first try: this one sent ${path.join(elsewhere, 'c1')} and 0 episode\\(s\\)$`,
      ),
    )
  })

  it('an unscoped retry elsewhere (no policy model, no episodes given) says it sent no scope', async () => {
    const fleet = await startFleet({members: FULL})
    const full = await coordinatorFor(fleet)
    const c: Coordinator = {...full, participants: full.participants.filter((p) => p.kind !== 'model')}
    await prepare(c, 'c1', soon())
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const plan = {checkpointId: 'c1', episodes: null, restarts: [], deadlineTs: soon()}
    await expect(commitAndPublish(c, {...plan, root: await tempDir()})).rejects.toThrow(/agent: HTTP 500/)
    const elsewhere = await tempDir()
    const err = (await commitAndPublish(c, {...plan, root: elsewhere}).catch((e: unknown) => e)) as CoordinationError
    expect(err.message).toMatch(new RegExp(`this one sent ${path.join(elsewhere, 'c1')} and no scope$`))
  })

  it('an unscoped commit continues what the participants committed, sorted by key', async () => {
    // Two participants that report one episode each, the first the later key: only a sort puts a
    // before z. Nothing is published (they write no state), so nothing is verified.
    const ids = (episode_ids: string[]) => (dir: string) => ({...liarReply('environment', 'x')(dir), episode_ids})
    const first = await fakeParticipant('environment', 'fz', ids(['z']))
    const second = await fakeParticipant('resources', 'fa', ids(['a']))
    const client = new ControlClient({token: TOKEN})
    later(() => client.close())
    const c: Coordinator = {
      client,
      participants: [
        {server: 'fz', url: first, kind: 'environment', instance: 'fz'},
        {server: 'fa', url: second, kind: 'resources', instance: 'fa'},
      ],
    }
    const out = await commitAndPublish(c, {checkpointId: 'c1', root: await tempDir(), episodes: null, restarts: [], deadlineTs: soon(), publish: false})
    expect([...out.replies.keys()]).toEqual(['fz', 'fa'])
    expect(out.continued.map(captureKey)).toEqual(['a', 'z'])
  })

  it('closeCheckpoint turns an error that names no participant (here a progress callback throwing) into one failure of the fleet', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const out = await closeCheckpoint(
      {
        ...c,
        onStage: () => {
          throw new Error('the progress display broke')
        },
      },
      'c1',
      soon(),
    )
    expect(out).toEqual({resumed: false, failures: [{server: 'fleet', status: null, code: null, message: 'the progress display broke'}]})
  })

  it('a lease keeper never keeps the process alive by itself', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length
    const before = timers()
    const k = new LeaseKeeper(c, 'c1', 60_000, 100, () => {}).start()
    expect(timers()).toBe(before)
    await k.stop()
  })
})
