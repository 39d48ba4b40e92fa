// More rules of src/coordination/collect.ts, from the survivors of its first mutation run
// (2026-12-04): what a root held by another collector or by an earlier run refuses, how --resume
// starts (no log, another run's LATEST, its own checkpoint, a failed or refused restore), how many
// /run calls go out at once, which /run replies count as failed and what the failure says, a row
// that fails for good, a retire or forget that fails, when retired rows are forgotten, checkpoint
// and stop requests at their edges, an interrupt, the resume tried again (and its timer), the
// prune's name rules, and a result that cannot be written (a bug this file found).
import {mkdir, readFile, readdir, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it, vi} from 'vitest'

import {Fleet} from '../../src/control-plane/fleet.js'
import {SimEnvironment} from '../../src/control-plane/sim.js'
import {CollectStats, Collector} from '../../src/coordination/collect.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {ResultsFile, readRows} from '../../src/storage/collector.js'
import {readCheckpointSummary} from '../../src/storage/root.js'
import type {CallEvent} from '../../src/coordination/operations.js'
import {Workdir, forgetsSent, inProcess, makeRows, readDispatched, readOutput, retiresSent, runsSent, workdir} from '../helpers/collect-kit.js'
import {rejection} from '../helpers/errors.js'
import {FULL, control, coordinatorFor, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const RUN_A = 'a'.repeat(32)

/** Rows that finish fast: `n` of 2 to 4 steps of 5 ms. */
const quickRows = (n: number) => makeRows(n, {steps: 2, stepMs: 5})

async function setup(n: number): Promise<{fleet: Fleet; w: Workdir}> {
  const [fleet, w] = await Promise.all([startFleet({members: FULL}), tempDir().then((d) => workdir(d, quickRows(n)))])
  return {fleet, w}
}

/** The rows of the output as [rollout, attempt], sorted. */
async function written(w: Workdir): Promise<[string, number][]> {
  return (await readOutput(w.output)).map((r): [string, number] => [r._ng_rollout_id as string, r._ng_attempt_index as number]).sort()
}

/** Every participant idle, with no retired-rollout mark left. */
async function expectFleetClean(fleet: Fleet): Promise<void> {
  for (const s of fleet.servers.slice(0, 4)) expect((await control(s.url, 'status')).json, s.name).toMatchObject({phase: 'idle', checkpoint_id: null, retired_rollouts: 0})
}

describe('collect: a root that is not free', () => {
  it('a root held by another live collector is refused, naming its pid and the root; nothing is sent or logged', async () => {
    const {fleet, w} = await setup(2)
    // The test runner's parent process: alive, and not this process.
    await writeFile(path.join(w.root, 'collector.pid'), String(process.ppid))
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w)
    const err = await rejection(collector.run(), ControllerError)
    expect(err.code).toBe('input')
    expect(err.message).toBe(`another collector (pid ${process.ppid}) holds ${w.root}: stop it first, or remove ${path.join(w.root, 'collector.pid')} if that process is not a collector`)
    expect(runsSent(fleet.server('env'))).toEqual([])
    expect((await readdir(w.root)).sort()).toEqual(['collector.pid'])
    expect(await readFile(path.join(w.root, 'collector.pid'), 'utf8')).toBe(String(process.ppid))
  })

  it('without --resume, a root holding an earlier run’s dispatch log is refused, naming the root; the log is left as it was', async () => {
    const {fleet, w} = await setup(2)
    const log = `{"run_id": "${RUN_A}"}\n["r00", 0]\n`
    await writeFile(path.join(w.root, 'dispatched.jsonl'), log)
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w)
    const err = await rejection(collector.run(), ControllerError)
    expect(err.code).toBe('input')
    expect(err.message).toBe(`${w.root} holds the dispatch log of an earlier run: pass --resume to continue it, or use another --root`)
    expect(runsSent(fleet.server('env'))).toEqual([])
    expect(await readFile(path.join(w.root, 'dispatched.jsonl'), 'utf8')).toBe(log)
    // The lock is released.
    expect(await readdir(w.root)).toEqual(['dispatched.jsonl'])
  })
})

describe('collect --resume when the crashed run published nothing of its own', () => {
  it('a root with no dispatch log: every row starts at attempt 0, nothing is retired, restored or forgotten', async () => {
    const {fleet, w} = await setup(3)
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {resume: true})
    const out = await collector.run()
    expect(out).toMatchObject({end: 'finished', done: 3, restores: 0, retried: 0, failed: 0})
    expect(runsSent(fleet.server('env')).sort()).toEqual([
      ['r00', 0],
      ['r01', 0],
      ['r02', 0],
    ])
    expect(await written(w)).toEqual([
      ['r00', 0],
      ['r01', 0],
      ['r02', 0],
    ])
    expect(retiresSent(fleet.server('env'))).toEqual([])
    expect(forgetsSent(fleet.server('env'))).toEqual([])
    expect(logs.filter((l) => l.startsWith('resuming run'))).toEqual([])
  })

  for (const [what, manifest] of [
    [
      'LATEST is another run’s checkpoint',
      JSON.stringify({checkpoint_id: 'ckpt-20260101T000000-0000000b', run_id: 'b'.repeat(32), created_at: 1, continued: [{rollout_id: 'r00', attempt: 0}], restarted: []}),
    ],
    ['LATEST’s collection.json names no run', JSON.stringify({checkpoint_id: 'ckpt-20260101T000000-0000000b', run_id: 7, created_at: 1, continued: [{rollout_id: 'r00', attempt: 0}], restarted: []})],
    ['LATEST’s collection.json is not JSON', '{"run_id": "' + RUN_A],
  ] as const) {
    it(`${what}: nothing is restored; each logged unfinished row is retired, then starts over one attempt later; done rows never run again`, async () => {
      const {fleet, w} = await setup(4)
      // The crashed run (RUN_A) sent r00@0, r01@0..2 and r03@0; r03 is in the output.
      await writeFile(path.join(w.root, 'dispatched.jsonl'), `{"run_id": "${RUN_A}"}\n["r00", 0]\n["r01", 0]\n["r01", 2]\n["r01", 1]\n["r03", 0]\n`)
      await writeFile(w.output, JSON.stringify({_ng_rollout_id: 'r03', _ng_attempt_index: 0, result: 'earlier'}) + '\n')
      const ckpt = 'ckpt-20260101T000000-0000000b'
      await mkdir(path.join(w.root, ckpt))
      await writeFile(path.join(w.root, ckpt, 'collection.json'), manifest)
      await writeFile(path.join(w.root, 'LATEST'), ckpt)
      const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {resume: true})
      const out = await collector.run()
      expect(out).toMatchObject({end: 'finished', done: 4, total: 4, restores: 0, restoresFailed: 0, failed: 0})
      expect(logs).toContain(`resuming run ${RUN_A}: it published no checkpoint of its own; 3 unfinished row(s) start over`)
      const env = fleet.server('env')
      for (const s of fleet.servers.slice(0, 4))
        expect(retiresSent(s).sort(), s.name).toEqual([
          ['r00', 0],
          ['r01', 2],
        ])
      expect(runsSent(env).sort()).toEqual([
        ['r00', 1],
        ['r01', 3],
        ['r02', 0],
      ])
      expect(await written(w)).toEqual([
        ['r00', 1],
        ['r01', 3],
        ['r02', 0],
        ['r03', 0],
      ])
      // The new log starts with the highest attempt of each unfinished row the old one named.
      const log = await readDispatched(w.root)
      expect(log.runId).toBe(out.runId)
      expect(log.runId).not.toBe(RUN_A)
      expect(log.entries.slice(0, 2)).toEqual([
        ['r00', 0],
        ['r01', 2],
      ])
      expect(log.entries.slice(2).sort()).toEqual([
        ['r00', 1],
        ['r01', 3],
        ['r02', 0],
      ])
      // Retired rollouts are forgotten at the end, everywhere; the fresh one never was retired.
      for (const s of fleet.servers.slice(0, 4)) expect([...new Set(forgetsSent(s))].sort(), s.name).toEqual(['r00', 'r01'])
      await expectFleetClean(fleet)
    })
  }
})

describe('collect: dispatch', () => {
  it('sends at most --concurrency /run calls at once, and that many while rows wait', async () => {
    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env').participant as SimEnvironment
    let running = 0
    let most = 0
    const run = env.run.bind(env)
    env.run = async (body) => {
      most = Math.max(most, ++running)
      try {
        return await run(body)
      } finally {
        running--
      }
    }
    const w = await workdir(await tempDir(), makeRows(9, {steps: 3, stepMs: 20}))
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 3})
    const out = await collector.run()
    expect(out.done).toBe(9)
    expect(most).toBe(3)
  })

  it('a 200 whose body is JSON but a string or a number fails the attempt as not a result', async () => {
    const {fleet, w} = await setup(1)
    const env = fleet.server('env')
    env.faults.add('run', {type: 'status', status: 200, body: '"done"'}).add('run', {type: 'status', status: 200, body: '7'})
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 1, maxAttempts: 3})
    expect(await collector.run()).toMatchObject({end: 'finished', done: 1, retried: 2, failed: 0})
    expect(logs.filter((l) => l.includes(' failed: '))).toEqual(['/run of r00 failed: HTTP 200  "done"', '/run of r00-a1 failed: HTTP 200  7'])
    expect(await written(w)).toEqual([['r00', 2]])
  })

  it('a --run-url with a trailing slash reaches /run', async () => {
    const {fleet, w} = await setup(2)
    const collector = new Collector(await coordinatorFor(fleet), {
      rows: await readRows(w.input),
      root: w.root,
      output: await ResultsFile.open(w.output, {resume: false}),
      runUrl: fleet.server('env').url + '/',
      concurrency: 2,
      checkpointEveryMs: null,
      timeoutS: 30,
      maxAttempts: 3,
      resume: false,
      log: () => {},
    })
    const out = await collector.run()
    expect(out).toMatchObject({done: 2, retried: 0})
    expect(runsSent(fleet.server('env')).sort()).toEqual([
      ['r00', 0],
      ['r01', 0],
    ])
  })
})

describe('collect: /run replies that are failures', () => {
  it('a 200 whose body is not a JSON object, and a 409 other than admission_closed, each fail the attempt: retired, sent again as the next attempt, the log naming the reply', async () => {
    const {fleet, w} = await setup(1)
    const env = fleet.server('env')
    const stale = JSON.stringify({error: {code: 'stale_attempt', detail: 'attempt 1 of r00 is retired'}})
    // admission_closed, but not a 409: the /run was not refused at the door.
    const closed = JSON.stringify({error: {code: 'admission_closed', detail: 'closed'}})
    env.faults
      .add('run', {type: 'status', status: 200, body: '[1, 2]'})
      .add('run', {type: 'status', status: 200, body: 'not json'})
      .add('run', {type: 'status', status: 409, body: stale})
      .add('run', {type: 'status', status: 503, body: closed})
      .add('run', {type: 'status', status: 502, body: ''})
      .add('run', {type: 'drop'})
    const snapshots: CollectStats[] = []
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 1, maxAttempts: 7, onProgress: (s) => snapshots.push(s)})
    const out = await collector.run()
    expect(out).toMatchObject({end: 'finished', done: 1, retried: 6, failed: 0})
    expect(logs.filter((l) => l.includes(' failed: '))).toEqual([
      '/run of r00 failed: HTTP 200  [1, 2]',
      '/run of r00-a1 failed: HTTP 200  not json',
      `/run of r00-a2 failed: HTTP 409 stale_attempt ${stale}`,
      `/run of r00-a3 failed: HTTP 503 admission_closed ${closed}`,
      '/run of r00-a4 failed: HTTP 502',
      expect.stringMatching(/^\/run of r00-a5 failed: no reply: \S/),
    ])
    expect(await written(w)).toEqual([['r00', 6]])
    expect(retiresSent(env).sort()).toEqual([0, 1, 2, 3, 4, 5].map((a) => ['r00', a]))
    // Forgotten once, after the attempt that replied.
    expect(forgetsSent(env)).toEqual(['r00'])
    // A failed attempt waiting to be retired counts as queued.
    expect(snapshots.every((s) => s.queued >= 0)).toBe(true)
    expect(snapshots.some((s) => s.inFlight === 0 && s.done === 0 && s.queued === 1)).toBe(true)
  })

  it('a row whose /run fails --max-attempts times fails for good: counted, named with its attempts and the last error (cut to 200 characters), and not sent again', async () => {
    const {fleet, w} = await setup(2)
    const env = fleet.server('env')
    const detail = 'x'.repeat(300)
    const body = JSON.stringify({error: {code: 'internal', detail}})
    // One /run at a time: r00@0 (fails), r01@0, r00@1 (fails).
    let n = 0
    const take = env.faults.take.bind(env.faults)
    env.faults.take = (route: string) => (route === 'run' && ++n % 2 === 1 ? {type: 'status', status: 500, body} : take(route))
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 1, maxAttempts: 2})
    const out = await collector.run()
    const error = `HTTP 500 internal ${body.slice(0, 200)}`
    expect(out).toMatchObject({end: 'finished', done: 1, failed: 1, retried: 1})
    expect(out.failedRows).toEqual([{rollout_id: 'r00', attempts: 2, error}])
    expect(logs).toContain(`/run of r00-a1 failed: ${error}`)
    expect(await written(w)).toEqual([['r01', 0]])
    expect(retiresSent(env).sort()).toEqual([
      ['r00', 0],
      ['r00', 1],
    ])
    const log = await readDispatched(w.root)
    expect(log.entries.filter(([r]) => r === 'r00')).toEqual([
      ['r00', 0],
      ['r00', 1],
    ])
    // The failed row is forgotten at the end, as every retired one.
    expect(forgetsSent(env)).toEqual(['r00'])
    await expectFleetClean(fleet)
  })

  it('a retire of failed attempts that fails is tried again after 1 s; the row goes on as the next attempt once it is retired', async () => {
    const {fleet, w} = await setup(1)
    const env = fleet.server('env')
    env.faults.add('run', {type: 'status', status: 500})
    fleet.server('agent').faults.add('retire', {type: 'status', status: 500})
    const at = new Map<string, number>()
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 1, log: (m) => at.set(m, performance.now())})
    const out = await collector.run()
    expect(out).toMatchObject({done: 1, retried: 1, failed: 0})
    const failed = logs.find((l) => l.startsWith('retire of 1 failed attempt(s) failed, retrying in 1 s: '))
    expect(failed).toMatch(/agent: HTTP 500/)
    expect(await written(w)).toEqual([['r00', 1]])
    // Tried twice on env (its stage came first both times), and only the second try reached res.
    expect(retiresSent(env)).toEqual([
      ['r00', 0],
      ['r00', 0],
    ])
    const sentAt = env.journal.filter((j) => j.route === 'run').map((j) => j.at)
    expect(sentAt).toHaveLength(1)
    expect(sentAt[0]! - at.get(failed!)!).toBeGreaterThanOrEqual(950)
  })

  it('a forget that fails is logged and tried again; every mark is gone at the end', async () => {
    const {fleet, w} = await setup(3)
    const env = fleet.server('env')
    env.faults.add('run', {type: 'status', status: 500})
    fleet.server('res').faults.add('forget', {type: 'status', status: 500})
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 1})
    const out = await collector.run()
    expect(out).toMatchObject({done: 3, retried: 1})
    expect(logs.filter((l) => l.startsWith('forget of'))).toHaveLength(1)
    expect(logs.find((l) => l.startsWith('forget of'))).toMatch(/^forget of 1 rollout\(s\) failed; will retry: .*res: HTTP 500/)
    expect(forgetsSent(env)).toEqual(['r00', 'r00'])
    await expectFleetClean(fleet)
  })
})

describe('collect --resume: a restore refused before anything was sent stops the command', () => {
  it('into a fleet that holds work, or with a participant that does not answer: the run fails naming why, sends no /run, and leaves the root as it was', async () => {
    const fleet1 = await startFleet({members: FULL})
    const env1 = fleet1.server('env').participant as SimEnvironment
    const w = await workdir(await tempDir(), makeRows(6, {steps: 30, stepMs: 20}))
    const first = (await inProcess(await coordinatorFor(fleet1), fleet1, w, {concurrency: 3})).collector
    const running = first.run()
    await waitFor(() => [...env1.episodes.values()].filter((e) => (e.boundary?.step ?? 0) >= 1).length >= 2, 10_000, 'episodes past step 1')
    first.requestStop()
    const stopped = await running
    expect(stopped).toMatchObject({end: 'stopped', stopCheckpointed: true})
    const root = async () => ({log: await readFile(path.join(w.root, 'dispatched.jsonl'), 'utf8'), latest: await readFile(path.join(w.root, 'LATEST'), 'utf8')})
    const before = await root()
    const sent1 = runsSent(fleet1.server('env')).length

    // The same fleet: its /run calls are still parked there.
    const busy = (await inProcess(await coordinatorFor(fleet1), fleet1, w, {resume: true})).collector
    const err1 = await rejection(busy.run(), ControllerError)
    expect(err1.code).toBe('fleet_state')
    expect(err1.message).toMatch(/^restore refused, nothing was sent: restore needs freshly started servers/)
    expect(runsSent(fleet1.server('env'))).toHaveLength(sent1)
    expect(await root()).toEqual(before)

    // A fresh fleet whose resources server went down after discovery.
    await fleet1.crash()
    const fleet2 = await startFleet({members: FULL})
    const c2 = await coordinatorFor(fleet2)
    await fleet2.server('res').crash()
    const down = (await inProcess(c2, fleet2, w, {resume: true})).collector
    const err2 = await rejection(down.run(), ControllerError)
    expect(err2.code).toBe('discovery')
    expect(err2.message).toMatch(/^checkpoint discover failed on 1 participant\(s\): res: .*every participant must answer before a restore; nothing was sent$/)
    expect(runsSent(fleet2.server('env'))).toEqual([])
    expect(await root()).toEqual(before)
    expect(await readdir(w.root)).not.toContain('collector.pid')
  })
})

/** FULL and a resources server no episode calls: it can fail its resume while every /run works. */
async function fleetWithIdleResources(): Promise<Fleet> {
  const fleet = await startFleet({members: [...FULL, {name: 'res2', kind: 'resources'}]})
  const env = fleet.server('env').participant as SimEnvironment
  env.downstream = env.downstream.filter((d) => d.name !== 'res2')
  return fleet
}

describe('collect: an interrupt of the command (its signal) ends the run', () => {
  it('during a checkpoint: the run fails as interrupted instead of counting a failed checkpoint and going on', async () => {
    const fleet = await startFleet({members: FULL})
    const w = await workdir(await tempDir(), makeRows(6, {steps: 30, stepMs: 20}))
    const ac = new AbortController()
    let stats: CollectStats | undefined
    const {collector} = await inProcess({...(await coordinatorFor(fleet)), signal: ac.signal}, fleet, w, {concurrency: 2, onProgress: (s) => (stats = s)})
    const done = collector.run()
    await waitFor(() => (stats?.inFlight ?? 0) >= 1, 10_000, 'rows in flight')
    ac.abort()
    collector.requestCheckpoint()
    const err = await rejection(done, ControllerError)
    expect(err.code).toBe('interrupted')
    expect(err.message).toMatch(/^interrupted before checkpoint 'ckpt-\S+' was prepared; nothing was sent$/)
    expect(await readdir(w.root)).not.toContain('LATEST')
  })

  it('while a checkpoint whose resume failed is resumed again: the run fails as interrupted, naming that checkpoint', async () => {
    const fleet = await fleetWithIdleResources()
    fleet.server('res2').faults.add('resume', {type: 'status', status: 500}, 1).add('resume', {type: 'hang'}, Infinity)
    // Rows of ~5 s: nothing settles soon after the interrupt to wake the loop.
    const w = await workdir(await tempDir(), makeRows(4, {steps: 100, stepMs: 50}))
    const ac = new AbortController()
    let hung = false
    let stats: CollectStats | undefined
    const c = await coordinatorFor(fleet)
    const onCall = (e: CallEvent) => {
      if (e.operation === 'resume' && e.server === 'res2' && e.ms === null && logs.some((l) => l.includes('published, but'))) hung = true
    }
    const {collector, logs} = await inProcess({...c, signal: ac.signal, onCall}, fleet, w, {concurrency: 2, onProgress: (s) => (stats = s)})
    const done = collector.run()
    await waitFor(() => (stats?.inFlight ?? 0) >= 1, 10_000, 'rows in flight')
    collector.requestCheckpoint()
    await waitFor(() => hung, 10_000, 'the resume tried again, hanging on res2')
    const abortedAt = performance.now()
    ac.abort()
    const err = await rejection(done, ControllerError)
    // At once: the try is cut by the interrupt, and the loop wakes to raise it.
    expect(performance.now() - abortedAt).toBeLessThan(2500)
    expect(await readOutput(w.output)).toEqual([])
    const id = await readFile(path.join(w.root, 'LATEST'), 'utf8')
    expect(err.code).toBe('interrupted')
    expect(err.message).toBe(`interrupted while resuming checkpoint '${id}' again`)
    expect(logs.filter((l) => l.startsWith(`resuming checkpoint ${id} again`))).toEqual([])
  })
})

describe('collect: a checkpoint whose resume failed, at a stop', () => {
  it('a stop before the next try makes one short try of its own (5 s, not --timeout), then takes its checkpoint, taken even if its own resume fails', async () => {
    const fleet = await fleetWithIdleResources()
    // The first checkpoint's resume fails, the stop's try succeeds, the stop checkpoint's resume fails.
    fleet.server('res2').faults.add('resume', {type: 'status', status: 500}, 1)
    const w = await workdir(await tempDir(), makeRows(4, {steps: 30, stepMs: 20}))
    let stats: CollectStats | undefined
    let resumedAt = 0
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {
      concurrency: 2,
      onProgress: (s) => (stats = s),
      // Asked for the moment the checkpoint is taken: the try 1 s later never comes.
      log: (m) => {
        if (m.includes(': published, but ')) collector.requestStop()
        if (m.endsWith(': resumed on every participant')) {
          resumedAt = Date.now()
          fleet.server('res2').faults.add('resume', {type: 'status', status: 500}, 1)
        }
      },
    })
    const done = collector.run()
    await waitFor(() => (stats?.inFlight ?? 0) === 2, 10_000, 'rows in flight')
    collector.requestCheckpoint()
    const out = await done
    expect(out).toMatchObject({end: 'stopped', stopCheckpointed: true, checkpoints: 2, checkpointsFailed: 0})
    const first = logs.find((l) => l.includes(': published, but '))!
    const id = /^checkpoint (\S+):/.exec(first)![1]!
    expect(id).not.toBe(out.lastCheckpointId)
    expect(logs).toContain(`checkpoint ${id}: resumed on every participant`)
    expect(logs.filter((l) => l.startsWith(`resuming checkpoint ${id} again`))).toEqual([])
    // The stop checkpoint counts as taken (LATEST names it) though res2 is left closed on it.
    expect(await readFile(path.join(w.root, 'LATEST'), 'utf8')).toBe(out.lastCheckpointId)
    expect(fleet.server('res2').controlPlane!.phase).not.toBe('idle')
    // The stop's try (the refused ones are not journaled).
    const resumes = fleet
      .server('res2')
      .journal.filter((j) => j.route === 'resume')
      .map((j) => JSON.parse(j.body) as {checkpoint_id: string; deadline_ts: number})
    expect(resumes.map((r) => r.checkpoint_id)).toEqual([id])
    // A short deadline: LAST_RESUME_S (5 s), not the run's --timeout (30 s here).
    expect(resumes[0]!.deadline_ts - resumedAt / 1000).toBeLessThanOrEqual(5)
    expect(resumes[0]!.deadline_ts - resumedAt / 1000).toBeGreaterThan(3)
  })
})

describe('collect: checkpoint and stop requests', () => {
  it('a checkpoint asked for before anything was sent is skipped, not taken of nothing; a finished run says it was not stopped', async () => {
    const {fleet, w} = await setup(3)
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w)
    collector.requestCheckpoint()
    const t0 = Date.now()
    const out = await collector.run()
    const wall = Date.now() - t0
    expect(out).toMatchObject({end: 'finished', stopCheckpointed: false, done: 3, checkpoints: 0, checkpointsFailed: 0, lastCheckpointId: null})
    expect(out.wallMs).toBeGreaterThanOrEqual(0)
    expect(out.wallMs).toBeLessThanOrEqual(wall)
    expect(await readdir(w.root)).toEqual(['dispatched.jsonl'])
    expect(logs.filter((l) => l.startsWith('checkpoint'))).toEqual([])
  })

  it('a checkpoint asked for while the only row runs is taken at once: that row continued, its pause and the log line timed', async () => {
    const fleet = await startFleet({members: FULL})
    const w = await workdir(await tempDir(), makeRows(1, {steps: 60, stepMs: 25}))
    let stats: CollectStats | undefined
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {onProgress: (s) => (stats = s)})
    const t0 = Date.now()
    const done = collector.run()
    // The progress shows the row in flight as soon as it is sent.
    await waitFor(() => stats?.inFlight === 1, 10_000, 'the row in flight')
    collector.requestCheckpoint()
    const out = await done
    const wall = Date.now() - t0
    expect(out).toMatchObject({end: 'finished', done: 1, checkpoints: 1})
    const summary = await readCheckpointSummary(path.join(w.root, out.lastCheckpointId!))
    expect(summary!.continued).toEqual([{rollout_id: 'r00', attempt: 0}])
    expect(out.pausesMs).toHaveLength(1)
    expect(out.pausesMs[0]).toBeLessThanOrEqual(wall)
    const line = logs.find((l) => l.startsWith(`checkpoint ${out.lastCheckpointId}: `))!
    const m = /^checkpoint \S+: 1 continued, 0 restarted \((\d+) ms\)$/.exec(line)
    expect(m, line).not.toBeNull()
    expect(Number(m![1])).toBeLessThanOrEqual(wall)
  })

  /** Two long rows, both in flight, then a stop: the outcome and the work dir. */
  async function stopWhileTwoRun(fleet: Fleet): Promise<{out: Awaited<ReturnType<Collector['run']>>; w: Workdir}> {
    const w = await workdir(await tempDir(), makeRows(2, {steps: 60, stepMs: 25}))
    let stats: CollectStats | undefined
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {onProgress: (s) => (stats = s)})
    const done = collector.run()
    await waitFor(() => stats?.inFlight === 2, 10_000, 'both rows in flight')
    collector.requestStop()
    return {out: await done, w}
  }

  it('a stop asked for while the last rows run (none queued) takes its checkpoint and ends stopped', async () => {
    const {out, w} = await stopWhileTwoRun(await startFleet({members: FULL}))
    expect(out).toMatchObject({end: 'stopped', stopCheckpointed: true, checkpoints: 1, done: 0})
    const summary = await readCheckpointSummary(path.join(w.root, out.lastCheckpointId!))
    expect(summary!.continued.map((e) => e.rollout_id).sort()).toEqual(['r00', 'r01'])
    expect(await readOutput(w.output)).toEqual([])
  })

  it('a stop asked for while a failed attempt waits to be retired ends stopped, not finished with the row neither done nor failed', async () => {
    const {fleet, w} = await setup(1)
    fleet.server('env').faults.add('run', {type: 'status', status: 500})
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {
      concurrency: 1,
      // Reported once the failed /run has settled: nothing in flight or queued, its retire waiting.
      onProgress: (s) => {
        if (s.inFlight === 0 && s.done === 0 && s.queued === 1) collector.requestStop()
      },
    })
    const out = await collector.run()
    expect(out).toMatchObject({end: 'stopped', done: 0, failed: 0})
    expect(await readOutput(w.output)).toEqual([])
  })

  it('a stop whose checkpoint is not taken (a commit fails) ends stopped without a checkpoint: nothing to --resume from', async () => {
    const fleet = await startFleet({members: FULL})
    fleet.server('policy').faults.add('commit', {type: 'status', status: 500})
    const {out, w} = await stopWhileTwoRun(fleet)
    expect(out).toMatchObject({end: 'stopped', stopCheckpointed: false, checkpoints: 0, checkpointsFailed: 1})
    expect(await readdir(w.root)).not.toContain('LATEST')
  })

  it('a burst of /run calls refused with admission_closed together waits once (100 ms), not once per refusal', async () => {
    const fleet = await startFleet({members: FULL})
    const refused = JSON.stringify({error: {code: 'admission_closed', detail: 'a checkpoint is open'}})
    fleet.server('env').faults.add('run', {type: 'status', status: 409, body: refused}, 3)
    const w = await workdir(await tempDir(), quickRows(3))
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 3})
    const out = await collector.run()
    expect(out).toMatchObject({done: 3, retried: 0})
    expect(logs.filter((l) => l.includes('refused (admission closed)'))).toHaveLength(1)
    expect(logs.find((l) => l.includes('refused (admission closed)'))).toMatch(/sending again in 100 ms$/)
    expect(await written(w)).toEqual([
      ['r00', 0],
      ['r01', 0],
      ['r02', 0],
    ])
  })
})

describe('collect: forgetting retired rollouts', () => {
  it('a retried row is forgotten once its next attempt replied, while other rows run; a row failed for good stays marked at a stop', async () => {
    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env')
    const sim = env.participant as SimEnvironment
    const run = sim.run.bind(sim)
    // r00 fails at every attempt, r01 at its first; the others run long.
    sim.run = (body) => (body.rollout_id === 'r00' || (body.rollout_id === 'r01' && body.attempt === 0) ? Promise.reject(new Error('boom')) : run(body))
    // mid00 ends about a second in, after r01 is forgotten: the run goes round once more, and
    // must not forget r01 again.
    const rows = [...quickRows(2), ...makeRows(1, {prefix: 'mid', steps: 40, stepMs: 25}), ...makeRows(2, {prefix: 'long', steps: 200, stepMs: 25})]
    const w = await workdir(await tempDir(), rows)
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 5, maxAttempts: 2})
    const done = collector.run()
    await waitFor(() => forgetsSent(env).includes('r01'), 10_000, 'r01 forgotten')
    // (A line being appended may be half there: read again.)
    await waitFor(async () => (await readOutput(w.output).catch(() => [])).some((r) => r._ng_rollout_id === 'mid00'), 10_000, 'mid00 written')
    expect((await readOutput(w.output)).map((r) => r._ng_rollout_id).sort()).toEqual(['mid00', 'r01'])
    expect(forgetsSent(env)).toEqual(['r01'])
    collector.requestStop()
    const out = await done
    expect(out).toMatchObject({end: 'stopped', stopCheckpointed: true, failed: 1, retried: 2})
    expect(out.failedRows.map((r) => r.rollout_id)).toEqual(['r00'])
    expect(forgetsSent(env)).toEqual(['r01'])
    expect((await control(env.url, 'status')).json.retired_rollouts).toBe(1)
  })
})

describe('collect: pruning after a checkpoint', () => {
  it('removes leftover temp files of atomic writes (dot, name, 8 hex), young or old, but not a fresh collector.pid temp nor names that only look alike', async () => {
    const fleet = await startFleet({members: FULL})
    const w = await workdir(await tempDir(), makeRows(1, {steps: 40, stepMs: 25}))
    const gone = ['.LATEST.0badf00d', '.dispatched.jsonl.12345678']
    const kept = ['notes.backup.0badf00d', '.LATEST.0badf00d.keep', '.collector.pid.0fee1e55']
    for (const n of [...gone, ...kept]) await writeFile(path.join(w.root, n), 'x')
    let stats: CollectStats | undefined
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {onProgress: (s) => (stats = s)})
    const done = collector.run()
    await waitFor(() => stats?.inFlight === 1, 10_000, 'the row in flight')
    collector.requestCheckpoint()
    const out = await done
    expect(out.checkpoints).toBe(1)
    const left = await readdir(w.root)
    expect(left.filter((n) => gone.includes(n))).toEqual([])
    expect(left.filter((n) => kept.includes(n)).sort()).toEqual([...kept].sort())
  })
})

/**
 * A run stopped (SIGTERM) while its 4 rows ran, its fleet then crashed: the stop checkpoint
 * continues r00..r03 at attempt 0. Returns the workdir, the run's ID and the checkpoint's.
 */
async function stoppedRun(): Promise<{w: Workdir; runId: string; ckpt: string}> {
  const fleet = await startFleet({members: FULL})
  const env = fleet.server('env').participant as SimEnvironment
  const w = await workdir(await tempDir(), makeRows(4, {steps: 40, stepMs: 25}))
  const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 4})
  const done = collector.run()
  await waitFor(() => [...env.episodes.values()].filter((e) => (e.boundary?.step ?? 0) >= 1).length === 4, 10_000, 'every row past step 1')
  collector.requestStop()
  const out = await done
  expect(out).toMatchObject({end: 'stopped', stopCheckpointed: true, done: 0})
  const summary = await readCheckpointSummary(path.join(w.root, out.lastCheckpointId!))
  expect(summary!.continued.map((e) => [e.rollout_id, e.attempt]).sort()).toEqual(['r00', 'r01', 'r02', 'r03'].map((r) => [r, 0]))
  await fleet.crash()
  return {w, runId: out.runId, ckpt: out.lastCheckpointId!}
}

/** The attempts each rollout was sent at, in order. */
function attemptsByRow(sent: [string, number][]): Record<string, number[]> {
  const m: Record<string, number[]> = {}
  for (const [r, a] of sent) (m[r] ??= []).push(a)
  return m
}

describe('collect --resume from the crashed run’s own checkpoint', () => {
  it('a continued row the log does not name is restored; one sent again after the checkpoint starts over; no checkpoint is taken unasked', async () => {
    const {w, runId, ckpt} = await stoppedRun()
    // As a Gym-laid or hand-edited log would have it: r00 never logged, r01 sent again (attempt 1) after the checkpoint.
    const log = await readDispatched(w.root)
    const entries = [...log.entries.filter(([r]) => r !== 'r00'), ['r01', 1]]
    await writeFile(path.join(w.root, 'dispatched.jsonl'), [JSON.stringify({run_id: runId}), ...entries.map((e) => JSON.stringify(e))].join('\n') + '\n')
    const fleet = await startFleet({members: FULL})
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 4, resume: true})
    const out = await collector.run()
    expect(out).toMatchObject({end: 'finished', done: 4, restores: 1, restoresFailed: 0, checkpoints: 0})
    expect(logs).toContain(`resuming run ${runId}: restoring checkpoint '${ckpt}' (3 row(s) continue from it; 1 start over)`)
    expect(attemptsByRow(runsSent(fleet.server('env')))).toEqual({r00: [1], r01: [2], r02: [1], r03: [1]})
    const output = await readOutput(w.output)
    const from = Object.fromEntries(output.map((r) => [r._ng_rollout_id, r.resumed_from_step as number]))
    expect(from.r00).toBeGreaterThan(0)
    expect(from.r01).toBe(0)
    expect(retiresSent(fleet.server('env'))).toEqual([['r01', 1]])
    await expectFleetClean(fleet)
  })

  it('a checkpoint asked for before anything is sent continues the restored rows no replacement has claimed', async () => {
    const {w} = await stoppedRun()
    const fleet = await startFleet({members: FULL})
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 4, resume: true})
    collector.requestCheckpoint()
    const out = await collector.run()
    expect(out).toMatchObject({end: 'finished', done: 4, restores: 1, checkpoints: 1})
    const summary = await readCheckpointSummary(path.join(w.root, out.lastCheckpointId!))
    expect(summary!.continued.map((e) => [e.rollout_id, e.attempt]).sort()).toEqual(['r00', 'r01', 'r02', 'r03'].map((r) => [r, 1]))
  })

  it('a restore that fails: counted and logged; its rows go straight to two attempts later, and are forgotten at the end', async () => {
    const {w, ckpt} = await stoppedRun()
    const fleet = await startFleet({members: FULL})
    fleet.server('agent').faults.add('restore', {type: 'status', status: 500})
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 4, resume: true})
    const out = await collector.run()
    expect(out).toMatchObject({end: 'finished', done: 4, restores: 0, restoresFailed: 1, retried: 0})
    expect(logs.find((l) => l.startsWith(`restore of '${ckpt}' failed; its 4 row(s) start over from input: `))).toMatch(/agent: HTTP 500/)
    expect(attemptsByRow(runsSent(fleet.server('env')))).toEqual({r00: [2], r01: [2], r02: [2], r03: [2]})
    for (const s of fleet.servers.slice(0, 4)) expect([...new Set(forgetsSent(s))].sort(), s.name).toEqual(['r00', 'r01', 'r02', 'r03'])
    await expectFleetClean(fleet)
  })
})

describe('collect: a checkpoint whose resume failed is tried again while rows run', () => {
  it('on time even when the wall clock steps back (the wake-up is armed again), and again after a failed try, long before the rows end', async () => {
    const fleet = await fleetWithIdleResources()
    // The checkpoint's own resume and the first try fail; the second try succeeds.
    fleet.server('res2').faults.add('resume', {type: 'status', status: 500}, 2)
    // Rows of ~5 s: none settles (and wakes the loop) for seconds after the checkpoint.
    const w = await workdir(await tempDir(), makeRows(2, {steps: 100, stepMs: 50}))
    const realNow = Date.now.bind(Date)
    const at = new Map<string, number>()
    let inFlightAtResume = -1
    let stats: CollectStats | undefined
    try {
      const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {
        concurrency: 2,
        onProgress: (s) => (stats = s),
        log: (m) => {
          at.set(m, performance.now())
          // The wall clock steps back 300 ms (an NTP correction) just after the 1 s wake-up was set.
          if (m.includes(': published, but ')) vi.spyOn(Date, 'now').mockImplementation(() => realNow() - 300)
          if (m.endsWith(': resumed on every participant')) inFlightAtResume = stats!.inFlight
        },
      })
      const done = collector.run()
      await waitFor(() => stats?.inFlight === 2, 10_000, 'rows in flight')
      collector.requestCheckpoint()
      const out = await done
      const id = out.lastCheckpointId!
      const published = at.get(logs.find((l) => l.startsWith(`checkpoint ${id}: published, but`))!)!
      const failed = logs.filter((l) => l.startsWith(`resuming checkpoint ${id} again failed; next try in 2 s: `))
      expect(failed).toHaveLength(1)
      expect(at.get(failed[0]!)! - published).toBeLessThan(2500)
      expect(logs).toContain(`checkpoint ${id}: resumed on every participant`)
      expect(inFlightAtResume).toBe(2)
      expect(fleet.server('res2').controlPlane!.phase).toBe('idle')
    } finally {
      vi.restoreAllMocks()
    }
  }, 30_000)
})

describe('collect: one wake-up timer, kept at the earliest time asked for', () => {
  it('a /run refused (admission closed) while the next resume try is 2 s away is sent again after 100 ms, not at that try', async () => {
    const fleet = await fleetWithIdleResources()
    // The checkpoint's own resume and the first try fail: the next try is 2 s after that.
    fleet.server('res2').faults.add('resume', {type: 'status', status: 500}, 2)
    const env = fleet.server('env')
    // One row of ~5 s holds a slot (nothing of it settles meanwhile); short rows flow through the other.
    const rows = [...makeRows(1, {prefix: 'long', steps: 100, stepMs: 50}), ...makeRows(80, {steps: 2, stepMs: 10})]
    const w = await workdir(await tempDir(), rows)
    const refused = JSON.stringify({error: {code: 'admission_closed', detail: 'a checkpoint is open'}})
    const at = new Map<string, number>()
    let stats: CollectStats | undefined
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {
      concurrency: 2,
      onProgress: (s) => (stats = s),
      log: (m) => {
        at.set(m, performance.now())
        // The next /run sent is refused: the wake-up for its resend is asked for while the try's is armed.
        if (/ again failed; next try in 2 s: /.test(m)) env.faults.add('run', {type: 'status', status: 409, body: refused})
      },
    })
    const done = collector.run()
    await waitFor(() => (stats?.inFlight ?? 0) === 2, 10_000, 'rows in flight')
    collector.requestCheckpoint()
    await done
    const refusal = logs.find((l) => l.includes('refused (admission closed): sending again in 100 ms'))!
    expect(refusal).toBeDefined()
    const row = /^\/run of (\S+) refused/.exec(refusal)![1]!
    const resent = env.journal.filter((j) => j.route === 'run' && j.at > at.get(refusal)!).map((j) => ({at: j.at, id: JSON.parse(j.body)._ng_rollout_id as string}))
    expect(resent[0]!.id).toBe(row)
    expect(resent[0]!.at - at.get(refusal)!).toBeLessThan(1000)
  }, 30_000)
})

describe('collect: an output that cannot be written', () => {
  it('a row whose result cannot be appended counts as failed, named with the reason, and no more rows are sent', async () => {
    const fleet = await startFleet({members: FULL})
    const w = await workdir(await tempDir(), makeRows(4, {steps: 2, stepMs: 5}))
    const output = await ResultsFile.open(w.output, {resume: false})
    const logs: string[] = []
    const collector = new Collector(await coordinatorFor(fleet), {
      rows: await readRows(w.input),
      root: w.root,
      output,
      runUrl: fleet.server('env').url,
      concurrency: 1,
      checkpointEveryMs: null,
      timeoutS: 30,
      maxAttempts: 3,
      resume: false,
      log: (m) => logs.push(m),
      // The file is closed under the collector once the first row is written (as a lost disk would fail it).
      onProgress: (s) => {
        if (s.done === 1) void output.close()
      },
    })
    const out = await collector.run()
    // The run stops as on SIGTERM: r02 and r03 are never sent, and --resume runs them (and r01).
    expect(out).toMatchObject({end: 'stopped', total: 4, done: 1, failed: 1})
    expect(logs).toContain('stopping: no more rows are sent while the output cannot be written; fix it, then run again with --resume')
    expect(
      fleet
        .server('env')
        .journal.filter((j) => j.route === 'run')
        .map((j) => JSON.parse(j.body)._ng_rollout_id as string),
    ).toEqual(['r00', 'r01'])
    expect(out.failedRows).toHaveLength(1)
    expect(out.failedRows[0]).toMatchObject({rollout_id: 'r01', attempts: 1})
    expect(out.failedRows[0]!.error).toMatch(new RegExp(`^writing its result to ${w.output.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&')} failed: \\S`))
    expect(logs.filter((l) => l.startsWith('/run of r01 replied, but writing its result to '))).toHaveLength(1)
    expect((await readOutput(w.output)).map((r) => r._ng_rollout_id)).toEqual(['r00'])
  })
})
