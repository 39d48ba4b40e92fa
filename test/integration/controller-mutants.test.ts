// Rules of src/coordination/controller.ts that no other in-process test holds (issue 12): per
// participant timings, the text and next steps after a close, the preflight of a prepare, the
// blockers message, keepClosed, commitAndPublish without publication or with Gym's collection.json,
// and the phases checkpoint() reports.
import {readFile, readdir} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CallTimer, afterClose, checkpoint, checkRoot, closeCheckpoint, commitAndPublish, openCheckpoints, prepareOrAbort, preparePreflight} from '../../src/coordination/controller.js'
import {ControllerError, CoordinationError, nextStep} from '../../src/coordination/errors.js'
import {CallEvent, Coordinator, prepare, resume} from '../../src/coordination/operations.js'
import {StatusReply} from '../../src/protocol/wire.js'
import {FULL, control, coordinatorFor, soon, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const ev = (server: string, operation: CallEvent['operation'], ms: number | null): CallEvent => ({operation, stage: 'all', server, deadlineTs: 1, ms})

async function phases(urls: string[]): Promise<string[]> {
  return Promise.all(urls.map(async (u) => (await control(u, 'status')).json.phase as string))
}

describe('CallTimer', () => {
  it("sums each server's settled calls per operation, rounds them, and leaves the rest null", () => {
    const heard: CallEvent[] = []
    const t = new CallTimer()
    const base = {participants: [], onCall: (e: CallEvent) => heard.push(e)} as unknown as Coordinator
    const w = t.wrap(base)
    expect(w.participants).toBe(base.participants)
    const events = [
      ev('a', 'prepare', null),
      ev('a', 'prepare', 10.4),
      ev('a', 'prepare', 0.3),
      ev('a', 'commit', 2.5),
      ev('b', 'resume', 7),
      ev('b', 'renew', 100),
      ev('c', 'restore', 0),
      ev('d', 'prepare', null),
    ]
    for (const e of events) w.onCall!(e)
    // The caller's own onCall still hears every event, sent ones too.
    expect(heard).toEqual(events)
    const p = (server: string) => ({server, url: 'http://x', kind: 'model' as const, instance: `i-${server}`})
    const rows = t.table([p('b'), p('a'), p('c'), p('d')], new Map([['a', {records: 3, bytes: 40}]]))
    expect(rows).toEqual([
      {server: 'b', kind: 'model', instance: 'i-b', prepareMs: null, commitMs: null, restoreMs: null, resumeMs: 7, records: null, bytes: null},
      {server: 'a', kind: 'model', instance: 'i-a', prepareMs: 11, commitMs: 3, restoreMs: null, resumeMs: null, records: 3, bytes: 40},
      {server: 'c', kind: 'model', instance: 'i-c', prepareMs: null, commitMs: null, restoreMs: 0, resumeMs: null, records: null, bytes: null},
      {server: 'd', kind: 'model', instance: 'i-d', prepareMs: null, commitMs: null, restoreMs: null, resumeMs: null, records: null, bytes: null},
    ])
    expect(t.table([p('a')])[0]).toMatchObject({records: null, bytes: null, prepareMs: 11})
  })

  it('wraps a coordinator without its own onCall', () => {
    const t = new CallTimer()
    const w = t.wrap({participants: []} as unknown as Coordinator)
    w.onCall!(ev('a', 'commit', 4))
    expect(t.table([{server: 'a', url: 'u', kind: 'agent', instance: 'x'}])[0]!.commitMs).toBe(4)
  })
})

describe('closing a checkpoint', () => {
  it('afterClose: resumed is closed for good with nothing to run; a failure names each server and the resume to run', () => {
    expect(afterClose('c1', {resumed: true, failures: []})).toEqual({text: "the fleet was resumed (checkpoint 'c1' is closed for good)", next: []})
    const a = afterClose('c1', {
      resumed: false,
      failures: [
        {server: 'p', status: 500, code: 'boom', message: 'bad'},
        {server: 'q', status: null, code: null, message: 'connection refused'},
      ],
    })
    expect(a.text).toBe("resuming 'c1' failed on p (HTTP 500 boom bad), q (connection refused); the others were resumed. A participant that stays unreachable reopens by itself when its lease expires")
    expect(a.next).toEqual([nextStep('resume', ['--id', 'c1'])])
  })

  it('closeCheckpoint never throws: a failing resume comes back as failures, logged', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare(c, 'c1', soon())
    fleet.server('policy').faults.add('resume', {type: 'status', status: 500})
    const log: string[] = []
    const out = await closeCheckpoint(c, 'c1', soon(), (m) => log.push(m))
    expect(out.resumed).toBe(false)
    expect(out.failures.map((f) => [f.server, f.status])).toEqual([['policy', 500]])
    expect(log).toEqual([expect.stringMatching(/^resume of 'c1' failed: checkpoint resume failed on 1 participant\(s\): policy: HTTP 500/)])
    expect(await closeCheckpoint(c, 'c1', soon())).toEqual({resumed: true, failures: []})
    // An error that is not a fan-out failure is reported against the whole fleet.
    const broken = {...c, participants: [{...c.participants[0]!, kind: 'environment' as const, url: 'not a url'}]}
    const out2 = await closeCheckpoint(broken, 'c1', soon())
    expect(out2.resumed).toBe(false)
    expect(out2.failures.length).toBe(1)
  })
})

describe('openCheckpoints', () => {
  const st = (phase: string, checkpoint_id: string | null) => ({phase, checkpoint_id}) as StatusReply
  it('groups servers by the checkpoint they hold open, skipping idle ones and the one excepted', () => {
    const m = new Map([
      ['a', st('prepared', 'x')],
      ['b', st('idle', null)],
      ['c', st('preparing', 'x')],
      ['d', st('prepared', 'y')],
      ['e', st('prepared', 'mine')],
    ])
    expect([...openCheckpoints(m, 'mine')]).toEqual([
      ['x', ['a (prepared)', 'c (preparing)']],
      ['y', ['d (prepared)']],
    ])
    expect([...openCheckpoints(m).keys()]).toEqual(['x', 'y', 'mine'])
  })
})

describe('preparePreflight', () => {
  it('another checkpoint open anywhere: fleet_state naming it and its servers, a resume per ID, nothing sent', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare({...c, participants: c.participants.filter((p) => p.kind === 'environment')}, 'old', soon())
    const err = (await preparePreflight(c, 'new').catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.code).toBe('fleet_state')
    expect(err.message).toBe(
      "another checkpoint is open: 'old' on env (prepared); nothing was sent. Finish it first: commit it (gymckpt commit --id ID --root ROOT --episodes-file FILE) or resume it, unless another controller is still working on it.",
    )
    expect(err.details).toEqual({open: [{checkpoint_id: 'old', participants: ['env (prepared)']}]})
    expect(err.next).toEqual([nextStep('resume', ['--id', 'old'])])
    expect(fleet.servers.flatMap((s) => s.journal.filter((j) => j.route === 'prepare' && JSON.parse(j.body).checkpoint_id === 'new'))).toEqual([])
    // The same ID open is no obstacle (a retried prepare).
    await preparePreflight(c, 'old')
    await resume(c, 'old', soon())
    await preparePreflight(c, 'new')
  })

  it('a participant that does not answer: discovery error, nothing sent', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('res').faults.add('status', {type: 'status', status: 503})
    const err = (await preparePreflight(c, 'c1').catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.operation).toBe('discover')
    expect(err.message).toMatch(/^checkpoint discover failed on 1 participant\(s\): res: HTTP 503 .*\. every participant must answer before checkpoint 'c1' is prepared; nothing was sent$/)
  })
})

describe('prepareOrAbort when blockers stay', () => {
  it('names at most five blockers per server with the count, resumes everyone, and says what to do', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('policy').participant!.stuckBlockers = ['b1', 'b2', 'b3', 'b4', 'b5', 'b6']
    const err = (await prepareOrAbort(c, 'c1', soon(0.6)).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('not_prepared')
    expect(err.message).toBe(
      "checkpoint 'c1' was not prepared before its deadline; blockers: policy: 6 (b1, b2, b3, b4, b5, …). the fleet was resumed (checkpoint 'c1' is closed for good); wait for the blockers or retire them, then checkpoint again (a new ID).",
    )
    expect(err.details).toEqual({checkpoint_id: 'c1', blockers: [{server: 'policy', blockers: ['b1', 'b2', 'b3', 'b4', 'b5', 'b6'], blocker_count: 6}], not_reached: ['agent', 'res']})
    expect(err.next).toEqual([])
    expect(await phases(c.participants.map((p) => p.url))).toEqual(['idle', 'idle', 'idle', 'idle'])
  })

  it('five blockers or fewer are listed without an ellipsis; keepClosed leaves the fleet closed and says how to reopen it', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('env').participant!.stuckBlockers = ['b1', 'b2', 'b3', 'b4', 'b5']
    const err = (await prepareOrAbort(c, 'c1', soon(0.6), {keepClosed: true}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('not_prepared')
    expect(err.message).toBe("checkpoint 'c1' was not prepared before its deadline; blockers: env: 5 (b1, b2, b3, b4, b5). The fleet is left closed for inspection: resume 'c1' when done.")
    expect(err.next).toEqual([nextStep('status'), nextStep('resume', ['--id', 'c1'])])
    expect((await control(fleet.server('env').url, 'status')).json).toMatchObject({phase: 'preparing', checkpoint_id: 'c1'})
    await resume(c, 'c1', soon())
  })

  it('a prepare stage that fails while a resume also fails: the error says which resume to run', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    fleet.server('agent').faults.add('prepare', {type: 'status', status: 500})
    fleet.server('env').faults.add('resume', {type: 'status', status: 500})
    const err = (await prepareOrAbort(c, 'c1', soon()).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.operation).toBe('prepare')
    expect(err.failures.map((f) => f.server)).toEqual(['agent'])
    expect(err.message).toMatch(/\. resuming 'c1' failed on env \(HTTP 500 .*\); the others were resumed\. /)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    await resume(c, 'c1', soon())
  })
})

describe('commitAndPublish', () => {
  it("publish: false writes the participants' state only: no gymckpt.json, LATEST untouched", async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    await prepare(c, 'c1', soon())
    const out = await commitAndPublish(c, {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon(), publish: false})
    expect(out.published).toBe(false)
    expect(await readdir(root)).toEqual(['c1'])
    expect(await readdir(path.join(root, 'c1'))).toEqual(['gym'])
    expect(out.checkpointDir).toBe(path.join(root, 'c1'))
    // Without the publish gate's verify, sizes come from a stat of each records file.
    for (const t of out.timings) {
      const m = out.replies.get(t.server)!.manifest
      expect(t.bytes, t.server).toBe((await readFile(path.join(root, 'c1', 'gym', m.kind, m.instance, m.records_file))).length)
      expect(t.records).toBe(m.record_count)
      expect(t.commitMs).not.toBeNull()
      expect(t.prepareMs).toBeNull()
    }
    await resume(c, 'c1', soon())
  })

  it("a collection run ID also writes Gym's collection.json; controller state is stored in gymckpt.json", async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    await prepare(c, 'c1', soon())
    const restarts = [{rolloutId: 'r', attempt: 0}]
    const out = await commitAndPublish(c, {
      checkpointId: 'c1',
      root,
      episodes: [{rolloutId: 'q', attempt: 0}, ...restarts],
      restarts,
      deadlineTs: soon(),
      collectionRunId: 'run-7',
      controllerState: () => ({done: 3}),
    })
    expect(out.published).toBe(true)
    expect(out.restarted).toEqual(restarts)
    expect(out.continued).toEqual([{rolloutId: 'q', attempt: 0}])
    const ours = JSON.parse(await readFile(path.join(root, 'c1', 'gymckpt.json'), 'utf8'))
    expect(ours.controller_state).toEqual({done: 3})
    expect(ours.restarted).toEqual([{rollout_id: 'r', attempt: 0}])
    expect(ours.participants.map((p: {server: string; kind: string}) => [p.server, p.kind])).toEqual(c.participants.map((p) => [p.server, p.kind]))
    const gym = JSON.parse(await readFile(path.join(root, 'c1', 'collection.json'), 'utf8'))
    expect(gym).toMatchObject({checkpoint_id: 'c1', run_id: 'run-7', created_at: ours.created_at, continued: ours.continued, restarted: ours.restarted})
    expect((await readFile(path.join(root, 'LATEST'), 'utf8')).trim()).toBe('c1')
    // Sizes from the publish gate's verify.
    for (const t of out.timings) {
      const m = out.replies.get(t.server)!.manifest
      expect(t.bytes, t.server).toBe((await readFile(path.join(root, 'c1', 'gym', m.kind, m.instance, m.records_file))).length)
    }
    await resume(c, 'c1', soon())
  })

  it('a commit into an existing manifest is invalid_checkpoint and LATEST does not move', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    await prepare(c, 'c1', soon())
    const plan = {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon()}
    await commitAndPublish(c, {...plan, publish: false})
    const {writeFile} = await import('node:fs/promises')
    await writeFile(path.join(root, 'c1', 'gymckpt.json'), '{}')
    const err = (await commitAndPublish(c, plan).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toMatch(/gymckpt\.json already exists \(2 bytes\); a published checkpoint is never rewritten$/)
    expect(await readdir(root)).toEqual(['c1'])
    await resume(c, 'c1', soon())
  })

  it('a root where the checkpoint directory cannot be made is invalid_checkpoint with the cause', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const {writeFile} = await import('node:fs/promises')
    await writeFile(path.join(root, 'c1'), 'x')
    const err = (await commitAndPublish(c, {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon()}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toBe(`cannot create checkpoint directory ${path.join(root, 'c1')}: it exists and is not a directory (EEXIST)`)
    expect(fleet.servers.some((s) => s.journal.some((j) => j.route === 'commit'))).toBe(false)
  })
})

describe('checkpoint', () => {
  it('reports each phase start and end in order, and a row of timings per participant', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const seen: string[] = []
    const out = await checkpoint(c, {root, checkpointId: 'c1', episodes: [], timeoutS: 10, onPhase: (p, s) => seen.push(`${p}:${s}`)})
    expect(seen).toEqual(['prepare:start', 'prepare:done', 'commit:start', 'commit:done', 'resume:start', 'resume:done'])
    expect(out.prepare.prepared).toBe(true)
    expect(out.timings.map((t) => t.server)).toEqual(c.participants.map((p) => p.server))
    for (const t of out.timings) {
      expect([typeof t.prepareMs, typeof t.commitMs, typeof t.resumeMs, t.restoreMs], t.server).toEqual(['number', 'number', 'number', null])
      const m = out.replies.get(t.server)!.manifest
      expect(t.records).toBe(m.record_count)
      expect(t.bytes).toBe((await readFile(path.join(root, 'c1', 'gym', m.kind, m.instance, m.records_file))).length)
    }
  })

  it('a failed commit reports commit:failed and still resumes; a failed prepare reports prepare:failed', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const seen: string[] = []
    fleet.server('res').faults.add('commit', {type: 'status', status: 500})
    const err = (await checkpoint(c, {root, checkpointId: 'c1', episodes: [], timeoutS: 10, onPhase: (p, s) => seen.push(`${p}:${s}`)}).catch((e: unknown) => e)) as CoordinationError
    expect(seen).toEqual(['prepare:start', 'prepare:done', 'commit:start', 'commit:failed', 'resume:start', 'resume:done'])
    expect(err.message).toMatch(/\. nothing was published; the fleet was resumed \(checkpoint 'c1' is closed for good\); checkpoint again \(under a new ID\)$/)
    seen.length = 0
    fleet.server('res').faults.add('prepare', {type: 'status', status: 500})
    await checkpoint(c, {root, checkpointId: 'c2', episodes: [], timeoutS: 10, onPhase: (p, s) => seen.push(`${p}:${s}`)}).catch(() => {})
    expect(seen).toEqual(['prepare:start', 'prepare:failed'])
  })

  it('a resume that fails after publication: the checkpoint stands, the error says so, resume:failed', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const seen: string[] = []
    fleet.server('agent').faults.add('resume', {type: 'status', status: 500})
    const err = (await checkpoint(c, {root, checkpointId: 'c1', episodes: [], timeoutS: 10, onPhase: (p, s) => seen.push(`${p}:${s}`)}).catch((e: unknown) => e)) as CoordinationError
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.operation).toBe('resume')
    expect(err.message).toMatch(/\. checkpoint 'c1' was committed and published, but resuming 'c1' failed on agent /)
    expect(err.published).toEqual({checkpointId: 'c1', checkpointDir: path.join(root, 'c1')})
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(seen.slice(-2)).toEqual(['resume:start', 'resume:failed'])
    expect((await readFile(path.join(root, 'LATEST'), 'utf8')).trim()).toBe('c1')
    await resume(c, 'c1', soon())
  })

  it('an invalid root is refused before any phase starts', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const seen: string[] = []
    const err = (await checkpoint(c, {root: '  ', onPhase: (p, s) => seen.push(`${p}:${s}`)}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('input')
    expect(err.message).toBe('the checkpoint root is empty: pass --root DIR; nothing was sent')
    expect(seen).toEqual([])
    expect(await checkRoot(path.relative(process.cwd(), await tempDir()))).toMatch(/^\//)
  })
})

describe('checkpoint: errors after prepare, and interrupts', () => {
  it('a controller error after the commit keeps its code and details and says the fleet was resumed', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const {mkdir, writeFile} = await import('node:fs/promises')
    await mkdir(path.join(root, 'c1'))
    await writeFile(path.join(root, 'c1', 'gymckpt.json'), '{}')
    const err = (await checkpoint(c, {root, checkpointId: 'c1', episodes: [], timeoutS: 10}).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err).not.toBeInstanceOf(CoordinationError)
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toBe(`${path.join(root, 'c1', 'gymckpt.json')} already exists (2 bytes); a published checkpoint is never rewritten; the fleet was resumed (checkpoint 'c1' is closed for good)`)
    expect(err.next).toEqual([])
    expect(await phases(c.participants.map((p) => p.url))).toEqual(['idle', 'idle', 'idle', 'idle'])
  })

  it('an interrupt during the commit publishes nothing, resumes, and is interrupted', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const abort = new AbortController()
    fleet.server('res').faults.add('commit', {type: 'hang'})
    const onCall = (e: CallEvent) => {
      if (e.operation === 'commit' && e.ms === null) setImmediate(() => abort.abort())
    }
    const err = (await checkpoint({...c, signal: abort.signal, onCall}, {root, checkpointId: 'c1', episodes: [], timeoutS: 10}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('interrupted')
    expect(err.message).toBe("interrupted during checkpoint 'c1'; nothing was published; the fleet was resumed (checkpoint 'c1' is closed for good)")
    expect(await readdir(root)).toEqual(['c1'])
    expect(await phases(c.participants.map((p) => p.url))).toEqual(['idle', 'idle', 'idle', 'idle'])
  })

  it('an interrupt while the fleet is resumed after publication: the checkpoint stands and the caller learns of the interrupt', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const abort = new AbortController()
    const err = (await checkpoint({...c, signal: abort.signal}, {root, checkpointId: 'c1', episodes: [], timeoutS: 10, onPhase: (p, s) => p === 'resume' && s === 'start' && abort.abort()}).catch(
      (e: unknown) => e,
    )) as ControllerError
    expect(err.code).toBe('interrupted')
    expect(err.message).toBe("interrupted after checkpoint 'c1' was published; the fleet was resumed")
    expect(err.details).toEqual({checkpoint_id: 'c1', checkpoint_dir: path.join(root, 'c1'), published: true})
    expect((await readFile(path.join(root, 'LATEST'), 'utf8')).trim()).toBe('c1')
    expect(await phases(c.participants.map((p) => p.url))).toEqual(['idle', 'idle', 'idle', 'idle'])
  })

  it('the lease keeper sends one renew at a time, and stop() cuts a hung one short without logging it as failed', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare(c, 'c1', soon())
    fleet.server('res').faults.add('renew', {type: 'hang'}, Infinity)
    const log: string[] = []
    const {LeaseKeeper} = await import('../../src/coordination/controller.js')
    const {waitFor} = await import('../helpers/fleet.js')
    // Ticks every 20 ms; a renew's own timeout is its deadline (100 s) + 5 s.
    const k = new LeaseKeeper(c, 'c1', 20, 100, (m) => log.push(m)).start()
    await waitFor(() => fleet.server('env').journal.some((j) => j.route === 'renew'), 5000, 'a renewal')
    await new Promise((r) => setTimeout(r, 200))
    // The first renew hangs on res: the ticks since were skipped, not piled up.
    expect(fleet.server('env').journal.filter((j) => j.route === 'renew')).toHaveLength(1)
    const t0 = performance.now()
    await k.stop()
    // Not the hung call's 105 s.
    expect(performance.now() - t0).toBeLessThan(10_000)
    expect(log).toEqual([])
    await resume(c, 'c1', soon())
  })

  it('the lease keeper logs a renewal that fails and goes on renewing', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare(c, 'c1', soon())
    fleet.server('agent').faults.add('renew', {type: 'status', status: 500})
    const log: string[] = []
    const {LeaseKeeper} = await import('../../src/coordination/controller.js')
    const {waitFor} = await import('../helpers/fleet.js')
    const k = new LeaseKeeper(c, 'c1', 20, 100, (m) => log.push(m)).start()
    await waitFor(() => fleet.server('agent').journal.filter((j) => j.route === 'renew').length >= 2, 5000, 'two renewals')
    await k.stop()
    expect(log[0]).toMatch(/^lease renewal failed: checkpoint renew failed on 1 participant\(s\): agent: HTTP 500/)
    const renewed = fleet.server('env').journal.filter((j) => j.route === 'renew').length
    await new Promise((r) => setTimeout(r, 60))
    // Stopped: no renewal after stop() returned.
    expect(fleet.server('env').journal.filter((j) => j.route === 'renew').length).toBe(renewed)
    await resume(c, 'c1', soon())
  })
})
