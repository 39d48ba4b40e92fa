import {mkdir, readFile, readdir, utimes, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it, vi} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import type {CollectStats} from '../../src/coordination/collect.js'
import {runCollectDemo} from '../../src/demo/collect-scenario.js'
import {readCheckpointSummary} from '../../src/storage/root.js'
import {
  CollectorProcess,
  expectNoAttemptTwice,
  expectSameAsUninterrupted,
  forgetsSent,
  highestAttempts,
  inProcess,
  makeRows,
  readDispatched,
  readOutput,
  retiresSent,
  runsSent,
  uninterrupted,
  watchStarts,
  workdir,
} from '../helpers/collect-kit.js'
import {FULL, control, coordinatorFor, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const CKPT_DIR = /^ckpt-\d{8}T\d{6}-[0-9a-f]{8}$/

/**
 * The rows of every test here (their uninterrupted results are computed once): 16 rows of 4 to 13
 * steps, so some finish and new ones start while others run on; `stepMs` per step.
 */
function rowsOf(stepMs: number) {
  return makeRows(16, {stepMs}).map((r, i) => ({...r, steps: 4 + (i % 4) * 3}))
}

async function checkpointDirs(root: string): Promise<string[]> {
  return (await readdir(root)).filter((n) => CKPT_DIR.test(n)).sort()
}

/** A fleet whose environment refuses its first `times` /run calls with 409 admission_closed (another controller's checkpoint). */
async function admissionRefusingFleet(times: number) {
  const fleet = await startFleet({members: FULL})
  const refused = JSON.stringify({error: {code: 'admission_closed', detail: 'a checkpoint is open'}})
  fleet.server('env').faults.add('run', {type: 'status', status: 409, body: refused}, times)
  return fleet
}

describe('collect: checkpoints while rows run', () => {
  it('checkpoints on a timer, lays the root out as Gym does, keeps two, and the output equals an uninterrupted run', async () => {
    const rows = rowsOf(25)
    const [reference, fleet, w] = await Promise.all([uninterrupted(rows), startFleet({members: FULL}), tempDir().then((d) => workdir(d, rows))])
    const c = await coordinatorFor(fleet)
    const started = watchStarts(fleet.server('env'))
    const {collector} = await inProcess(c, fleet, w, {concurrency: 5, checkpointEveryMs: 250})
    const out = await collector.run()

    expect(out.end).toBe('finished')
    expect(out.checkpoints).toBeGreaterThanOrEqual(3)
    expect(out.checkpointsFailed + out.checkpointsMissed).toBe(0)
    expect(out.pausesMs).toHaveLength(out.checkpoints)
    expect(out.failed + out.retried + out.restores).toBe(0)
    expectSameAsUninterrupted(await readOutput(w.output), reference)
    // (A /run that reached the server while a checkpoint was open was refused before it ran, and may go again.)
    expectNoAttemptTwice(started)
    expect(started).toHaveLength(16)

    // Gym's layout: LATEST without newline; dispatched.jsonl; collection.json with exactly Gym's keys.
    const latest = await readFile(path.join(w.root, 'LATEST'), 'utf8')
    expect(latest).toBe(out.lastCheckpointId)
    const log = await readDispatched(w.root)
    expect(log.runId).toMatch(/^[0-9a-f]{32}$/)
    expect(log.runId).toBe(out.runId)
    expect(log.entries.map(([r]) => r).sort()).toEqual(rows.map((r) => r._ng_rollout_id).sort())
    expect(log.entries.every(([, a]) => a === 0)).toBe(true)
    const manifest = JSON.parse(await readFile(path.join(w.root, latest, 'collection.json'), 'utf8'))
    expect(Object.keys(manifest)).toEqual(['checkpoint_id', 'run_id', 'created_at', 'continued', 'restarted'])
    expect(manifest).toMatchObject({checkpoint_id: latest, run_id: out.runId, restarted: []})
    expect(typeof manifest.created_at).toBe('number')
    // The two newest published checkpoints stay; older and partial ones are gone; the lock is released.
    const dirs = await checkpointDirs(w.root)
    expect(dirs.length).toBeLessThanOrEqual(2)
    expect(dirs).toContain(latest)
    expect(await readdir(w.root)).not.toContain('collector.pid')
    for (const s of fleet.servers.slice(0, 4)) expect((await control(s.url, 'status')).json).toMatchObject({phase: 'idle', checkpoint_id: null})
  })

  it('requestCheckpoint (SIGUSR1) checkpoints the rows in flight and goes on; a checkpoint with a participant down fails and the run goes on', async () => {
    // A resources server that no episode calls: it can be down while every /run still works.
    const fleet = await startFleet({members: [...FULL, {name: 'res2', kind: 'resources'}]})
    const env = fleet.server('env').participant as SimEnvironment
    env.downstream = env.downstream.filter((d) => d.name !== 'res2')
    // Slower rows than the other tests (240 to 780 ms each): the second checkpoint must find rows
    // still running after the first one was published and a server crashed.
    const rows = rowsOf(60)
    const [reference, w] = await Promise.all([uninterrupted(rows), tempDir().then((d) => workdir(d, rows))])
    const c = await coordinatorFor(fleet)
    let stats: CollectStats | undefined
    const {collector} = await inProcess(c, fleet, w, {concurrency: 4, onProgress: (s) => (stats = s)})
    const done = collector.run()
    await waitFor(() => [...env.episodes.values()].filter((e) => (e.boundary?.step ?? 0) >= 2).length >= 2, 10_000, 'episodes past step 2')
    collector.requestCheckpoint()
    await waitFor(async () => (await readFile(path.join(w.root, 'LATEST'), 'utf8').catch(() => null)) !== null, 10_000, 'LATEST')
    const first = await readFile(path.join(w.root, 'LATEST'), 'utf8')
    const summary = await readCheckpointSummary(path.join(w.root, first))
    // Only rows in flight are continued (at attempt 0), and they were at a boundary past step 0.
    expect(summary!.continued.length).toBeGreaterThanOrEqual(1)
    expect(summary!.continued.length).toBeLessThanOrEqual(4)
    expect(summary!.continued.every((e) => e.attempt === 0)).toBe(true)

    // LATEST moves before the fleet is resumed: crash only once that checkpoint is over.
    await waitFor(() => stats?.checkpoints === 1, 10_000, 'the first checkpoint to end')
    await fleet.server('res2').crash()
    // A checkpoint request with nothing in flight is skipped, not failed: ask while rows run.
    await waitFor(() => (stats?.inFlight ?? 0) >= 1 && (stats?.queued ?? 0) >= 1, 10_000, 'rows in flight and queued after the crash')
    collector.requestCheckpoint()
    const out = await done
    expect(out.end).toBe('finished')
    expect(out.checkpoints).toBe(1)
    expect(out.checkpointsFailed).toBe(1)
    expect(await readFile(path.join(w.root, 'LATEST'), 'utf8')).toBe(first)
    expectSameAsUninterrupted(await readOutput(w.output), reference)
    // Nothing was left closed by the failed checkpoint.
    for (const s of fleet.servers.slice(0, 4)) expect((await control(s.url, 'status')).json.phase).toBe('idle')
  })

  it('a checkpoint published whose resume then fails on one participant counts as taken, and the run goes on', async () => {
    // A resources server that no episode calls: it can stay closed while every /run still works.
    const fleet = await startFleet({members: [...FULL, {name: 'res2', kind: 'resources'}]})
    const env = fleet.server('env').participant as SimEnvironment
    env.downstream = env.downstream.filter((d) => d.name !== 'res2')
    fleet.server('res2').faults.add('resume', {type: 'status', status: 500}, Infinity)
    const rows = rowsOf(60)
    const [reference, w] = await Promise.all([uninterrupted(rows), tempDir().then((d) => workdir(d, rows))])
    const c = await coordinatorFor(fleet)
    let stats: CollectStats | undefined
    const {collector, logs} = await inProcess(c, fleet, w, {concurrency: 4, onProgress: (s) => (stats = s)})
    const done = collector.run()
    // A request with nothing in flight is skipped: ask while rows run and more wait.
    await waitFor(() => (stats?.inFlight ?? 0) >= 2 && (stats?.queued ?? 0) >= 1, 10_000, 'rows in flight and queued')
    collector.requestCheckpoint()
    const out = await done
    expect(out.checkpoints).toBe(1)
    expect(out.checkpointsFailed + out.checkpointsMissed).toBe(0)
    expect(await readFile(path.join(w.root, 'LATEST'), 'utf8')).toBe(out.lastCheckpointId)
    expect(logs.find((l) => l.startsWith(`checkpoint ${out.lastCheckpointId}: published, but`))).toMatch(/res2: HTTP 500/)
    expect(logs.some((l) => l.startsWith('checkpoint not taken'))).toBe(false)
    expectSameAsUninterrupted(await readOutput(w.output), reference)
  })

  it('a participant whose resume failed after a published checkpoint is resumed again, with backoff, while the run goes on', async () => {
    const fleet = await startFleet({members: [...FULL, {name: 'res2', kind: 'resources'}]})
    const env = fleet.server('env').participant as SimEnvironment
    env.downstream = env.downstream.filter((d) => d.name !== 'res2')
    // The checkpoint's own resume and the first retry fail; the second retry succeeds.
    fleet.server('res2').faults.add('resume', {type: 'status', status: 500}, 2)
    const rows = rowsOf(100)
    const [reference, w] = await Promise.all([uninterrupted(rows), tempDir().then((d) => workdir(d, rows))])
    const c = await coordinatorFor(fleet)
    let stats: CollectStats | undefined
    const {collector, logs} = await inProcess(c, fleet, w, {concurrency: 4, onProgress: (s) => (stats = s)})
    const done = collector.run()
    await waitFor(() => (stats?.inFlight ?? 0) >= 2 && (stats?.queued ?? 0) >= 1, 10_000, 'rows in flight and queued')
    collector.requestCheckpoint()
    const out = await done
    expect(out.checkpoints).toBe(1)
    const id = out.lastCheckpointId!
    expect(logs.find((l) => l.startsWith(`checkpoint ${id}: published, but`))).toMatch(/res2: HTTP 500/)
    const retried = logs.filter((l) => l.startsWith(`resuming checkpoint ${id} again failed; next try in 2 s: `))
    expect(retried).toHaveLength(1)
    expect(retried[0]).toMatch(/res2: HTTP 500/)
    const resumed = `checkpoint ${id}: resumed on every participant`
    expect(logs).toContain(resumed)
    // 1 s after the failed resume, then 2 s after the failed retry (the rows ran ~5 s in all), timed
    // by when env got each resume (every try resumes every participant; res2's faulted ones are not
    // journaled). Not by the log lines: one can come well after the try it reports (a loaded machine
    // once logged the checkpoint's outcome 70 ms after its resume had failed).
    const resumes = fleet.server('env').journal.filter((j) => j.route === 'resume')
    const tries = resumes.map((j) => j.at)
    expect(tries).toHaveLength(3)
    expect(tries[1]! - tries[0]!).toBeGreaterThanOrEqual(950)
    expect(tries[2]! - tries[1]!).toBeGreaterThanOrEqual(1950)
    expect(out.done).toBe(rows.length)
    expect(fleet.server('res2').controlPlane!.phase).toBe('idle')
    expectSameAsUninterrupted(await readOutput(w.output), reference)
  })

  it('a participant that hangs on the resume tried again holds up neither the rows nor a stop', async () => {
    const fleet = await startFleet({members: [...FULL, {name: 'res2', kind: 'resources'}]})
    const env = fleet.server('env').participant as SimEnvironment
    env.downstream = env.downstream.filter((d) => d.name !== 'res2')
    // The checkpoint's own resume fails on res2; every try after it hangs (until its deadline + 5 s).
    fleet.server('res2').faults.add('resume', {type: 'status', status: 500}, 1).add('resume', {type: 'hang'}, Infinity)
    const rows = makeRows(40, {stepMs: 100})
    const w = await workdir(await tempDir(), rows)
    let hungAt = Infinity
    const c = await coordinatorFor(fleet)
    const onCall = (e: {operation: string; server: string; ms: number | null}) => {
      if (e.operation === 'resume' && e.server === 'res2' && e.ms === null && logs.some((l) => l.includes('published, but'))) hungAt = Math.min(hungAt, performance.now())
    }
    let stats: CollectStats | undefined
    const {collector, logs} = await inProcess({...c, onCall}, fleet, w, {concurrency: 4, timeoutS: 3, onProgress: (s) => (stats = s)})
    const done = collector.run()
    await waitFor(() => (stats?.inFlight ?? 0) >= 2 && (stats?.queued ?? 0) >= 1, 10_000, 'rows in flight and queued')
    collector.requestCheckpoint()
    await waitFor(() => hungAt < Infinity, 10_000, 'the resume tried again, hanging on res2')
    // Rows are still sent while that try hangs (it takes 3 + 5 s).
    const sentAfter = () => fleet.server('env').journal.filter((j) => j.route === 'run' && j.at > hungAt).length
    await waitFor(() => sentAfter() >= 2, 4000, 'rows sent while the resume hangs')
    // A checkpoint asked for meanwhile is not taken: the last one is still open on res2.
    collector.requestCheckpoint()
    await waitFor(() => logs.some((l) => l.startsWith('checkpoint not taken: checkpoint ')), 4000, 'the checkpoint skipped')
    const stopAt = performance.now()
    collector.requestStop()
    const out = await done
    // The hanging try is cut short; one try of 3 s (+ 5 s grace) more, then the run stops.
    expect(performance.now() - stopAt).toBeLessThan(12_000)
    expect(out.end).toBe('stopped')
    expect(out.stopCheckpointed).toBe(false)
    expect(out.checkpoints).toBe(1)
    expect(out.checkpointsFailed).toBe(1)
    expect(logs).toContain(`resuming checkpoint ${out.lastCheckpointId} again: the try in flight was cut short by the end of the run`)
    expect(logs).toContain(`stopping without a new checkpoint: checkpoint ${out.lastCheckpointId} is still open on a participant (LATEST names it)`)
    expect(await readFile(path.join(w.root, 'LATEST'), 'utf8')).toBe(out.lastCheckpointId)
  }, 40_000)

  it('a /run refused with admission_closed is sent again after a pause that doubles, not in a loop', async () => {
    const fleet = await admissionRefusingFleet(3)
    const rows = rowsOf(5)
    const [reference, w] = await Promise.all([uninterrupted(rows), tempDir().then((d) => workdir(d, rows))])
    const c = await coordinatorFor(fleet)
    const at: [string, number][] = []
    const {collector} = await inProcess(c, fleet, w, {concurrency: 1, log: (m) => at.push([m, performance.now()])})
    const out = await collector.run()
    expect(out.done).toBe(rows.length)
    // The first row refused three times, 100, 200 and 400 ms apart at least, then run; never retired.
    const refusals = at.filter(([m]) => /refused \(admission closed\): sending again in \d+ ms$/.test(m))
    expect(refusals.map(([m]) => m)).toEqual([
      '/run of r00 refused (admission closed): sending again in 100 ms',
      '/run of r00 refused (admission closed): sending again in 200 ms',
      '/run of r00 refused (admission closed): sending again in 400 ms',
    ])
    expect(refusals[1]![1] - refusals[0]![1]).toBeGreaterThanOrEqual(95)
    expect(refusals[2]![1] - refusals[1]![1]).toBeGreaterThanOrEqual(195)
    expect(runsSent(fleet.server('env'))[0]).toEqual(['r00', 0])
    expect(out.retried).toBe(0)
    expect((await readDispatched(w.root)).entries.filter(([r]) => r === 'r00')).toHaveLength(4)
    expectSameAsUninterrupted(await readOutput(w.output), reference)
  })

  it('a wall clock that steps back during an admission pause does not stall the run (the wake-up is armed again)', async () => {
    // A timer counts from the event loop's own clock, so it can fire before Date.now() reaches
    // the time it was set for (here: the wall clock steps back 300 ms, as an NTP correction
    // does). With nothing else in flight, the loop must arm its wake-up again, not wait forever.
    const fleet = await admissionRefusingFleet(1)
    const rows = rowsOf(2)
    const [reference, w] = await Promise.all([uninterrupted(rows), tempDir().then((d) => workdir(d, rows))])
    const c = await coordinatorFor(fleet)
    const realNow = Date.now.bind(Date)
    const logs: string[] = []
    const log = (m: string) => {
      logs.push(m)
      if (m.includes('refused (admission closed)')) vi.spyOn(Date, 'now').mockImplementation(() => realNow() - 300)
    }
    try {
      const {collector} = await inProcess(c, fleet, w, {concurrency: 1, log})
      const out = await collector.run()
      expect(out.done).toBe(rows.length)
      expect(logs.filter((m) => m.includes('refused (admission closed)'))).toEqual(['/run of r00 refused (admission closed): sending again in 100 ms'])
      expect((await readDispatched(w.root)).entries.filter(([r]) => r === 'r00')).toHaveLength(2)
      expectSameAsUninterrupted(await readOutput(w.output), reference)
    } finally {
      vi.restoreAllMocks()
    }
  })

  it('a checkpoint whose commit fails on one participant is not published, the fleet is resumed, and the run goes on', async () => {
    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env').participant as SimEnvironment
    const rows = rowsOf(25)
    const [reference, w] = await Promise.all([uninterrupted(rows), tempDir().then((d) => workdir(d, rows))])
    fleet.server('policy').faults.add('commit', {type: 'status', status: 500})
    const c = await coordinatorFor(fleet)
    const {collector, logs} = await inProcess(c, fleet, w, {concurrency: 4})
    const done = collector.run()
    await waitFor(() => env.episodes.size >= 2, 10_000, 'episodes running')
    collector.requestCheckpoint()
    await waitFor(() => logs.some((l) => l.startsWith('checkpoint not taken')), 10_000, 'the failed checkpoint')
    expect(await readdir(w.root)).not.toContain('LATEST')
    collector.requestCheckpoint()
    const out = await done
    expect(out.checkpointsFailed).toBe(1)
    expect(out.checkpoints).toBe(1)
    expectSameAsUninterrupted(await readOutput(w.output), reference)
  })

  it('requestStop (SIGTERM) checkpoints the rows in flight, then ends stopped with LATEST naming that checkpoint', async () => {
    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env').participant as SimEnvironment
    const rows = rowsOf(25)
    const w = await workdir(await tempDir(), rows)
    const c = await coordinatorFor(fleet)
    const {collector} = await inProcess(c, fleet, w, {concurrency: 5})
    const done = collector.run()
    await waitFor(() => [...env.episodes.values()].filter((e) => (e.boundary?.step ?? 0) >= 1).length >= 3, 10_000, 'episodes past step 1')
    collector.requestStop()
    const out = await done
    expect(out.end).toBe('stopped')
    expect(out.stopCheckpointed).toBe(true)
    expect(out.checkpoints).toBe(1)
    expect(out.done).toBeLessThan(16)
    expect(await readFile(path.join(w.root, 'LATEST'), 'utf8')).toBe(out.lastCheckpointId)
    const summary = await readCheckpointSummary(path.join(w.root, out.lastCheckpointId!))
    expect(summary!.continued.length).toBeGreaterThanOrEqual(1)
    // Nothing was dispatched after the stop: the log names only rows that were in flight or done.
    const outputIds = new Set((await readOutput(w.output)).map((r) => r._ng_rollout_id))
    const continued = new Set(summary!.continued.map((e) => e.rollout_id))
    const logged = (await readDispatched(w.root)).entries.map(([r]) => r)
    expect(logged.filter((r) => !outputIds.has(r) && !continued.has(r))).toEqual([])
    expect(logged.length).toBeLessThan(16)
    expect(await readdir(w.root)).not.toContain('collector.pid')

    // Preempted again right after its restore, before it sends anything: that stop checkpoint
    // continues the restored rows no replacement has claimed, named by their replacement attempt.
    await fleet.crash()
    const fleet2 = await startFleet({members: FULL})
    const second = (await inProcess(await coordinatorFor(fleet2), fleet2, w, {concurrency: 1, resume: true})).collector
    second.requestStop()
    const out2 = await second.run()
    expect(out2).toMatchObject({end: 'stopped', stopCheckpointed: true, restores: 1, checkpoints: 1})
    expect(runsSent(fleet2.server('env'))).toEqual([])
    const open = summary!.continued.filter((e) => !outputIds.has(e.rollout_id))
    const summary2 = await readCheckpointSummary(path.join(w.root, out2.lastCheckpointId!))
    expect(summary2!.continued.map((e) => [e.rollout_id, e.attempt]).sort()).toEqual(open.map((e) => [e.rollout_id, e.attempt + 1]).sort())

    // The third run restores that one: the same rows go on from their boundaries at attempt + 2.
    await fleet2.crash()
    const fleet3 = await startFleet({members: FULL})
    const third = (await inProcess(await coordinatorFor(fleet3), fleet3, w, {concurrency: 4, resume: true})).collector
    const out3 = await third.run()
    expect(out3).toMatchObject({end: 'finished', restores: 1, failed: 0})
    const output = await readOutput(w.output)
    expectSameAsUninterrupted(output, await uninterrupted(rows))
    const sent3 = new Map(runsSent(fleet3.server('env')))
    for (const e of open) expect(sent3.get(e.rollout_id), e.rollout_id).toBe(e.attempt + 2)
    expect(output.filter((o) => open.some((e) => e.rollout_id === o._ng_rollout_id) && o.resumed_from_step > 0).length).toBeGreaterThanOrEqual(1)
  })

  it('a stop request when no row is left to run ends finished, not stopped after a checkpoint that was never taken', async () => {
    const fleet = await startFleet({members: FULL})
    const rows = rowsOf(25).slice(0, 3)
    const w = await workdir(await tempDir(), rows)
    // Every row is in the output already (an earlier run wrote them and was never logged here).
    await writeFile(w.output, rows.map((r) => JSON.stringify({_ng_rollout_id: r._ng_rollout_id, result: 'x'})).join('\n') + '\n')
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {resume: true})
    collector.requestStop()
    const out = await collector.run()
    expect(out.checkpoints).toBe(0)
    expect(out.lastCheckpointId).toBeNull()
    // 'stopped' with stopCheckpointed makes the command exit 75 ("stopped after checkpoint 'null';
    // continue with --resume") though there is nothing to continue.
    expect({end: out.end, stopCheckpointed: out.stopCheckpointed}).toEqual({end: 'finished', stopCheckpointed: false})
  })

  it('a prepare that misses its deadline resumes the fleet; the run goes on and the next checkpoint is taken', async () => {
    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env').participant as SimEnvironment
    const rows = rowsOf(40)
    const [reference, w] = await Promise.all([uninterrupted(rows), tempDir().then((d) => workdir(d, rows))])
    const {collector, logs} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 4, timeoutS: 1})
    const done = collector.run()
    await waitFor(() => env.episodes.size >= 2, 10_000, 'episodes running')
    env.stuckBlockers = ['stuck-episode']
    collector.requestCheckpoint()
    await waitFor(() => logs.some((l) => l.startsWith('checkpoint not taken')), 10_000, 'the missed checkpoint')
    expect(logs.find((l) => l.startsWith('checkpoint not taken'))).toContain('stuck-episode')
    env.stuckBlockers = []
    collector.requestCheckpoint()
    const out = await done
    expect(out).toMatchObject({end: 'finished', checkpointsMissed: 1, checkpointsFailed: 0, checkpoints: 1})
    expectSameAsUninterrupted(await readOutput(w.output), reference)
  })

  it('counts every row it wrote: the outcome says done = rows even when the last rows finish together', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    // Rows that all finish at once: the last replies' appends are still running when the last one settles.
    for (let k = 0; k < 4; k++) {
      const rows = makeRows(64, {steps: 2, stepMs: 5, prefix: `k${k}-`}).map((r) => ({...r, steps: 2}))
      const w = await workdir(await tempDir(), rows)
      const {collector} = await inProcess(c, fleet, w, {concurrency: 64})
      const out = await collector.run()
      expect((await readOutput(w.output)).length).toBe(64)
      expect(out.done, `round ${k}: rows written 64, outcome.done ${out.done}`).toBe(64)
    }
  })

  it('after a checkpoint, prunes as Gym does: partial checkpoints older than LATEST and leftover dot files go', async () => {
    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env').participant as SimEnvironment
    const rows = rowsOf(25).slice(0, 6)
    const w = await workdir(await tempDir(), rows)
    const old = new Date(Date.now() - 3600_000)
    const partial = path.join(w.root, 'ckpt-20200101T000000-0badf00d')
    await mkdir(path.join(partial, 'gym', 'environment', 'env'), {recursive: true})
    await utimes(partial, old, old)
    const dots = ['.LATEST.0badf00d', '.dispatched.jsonl.0badf00d', '.collector.pid.0badf00d']
    for (const d of dots) {
      await writeFile(path.join(w.root, d), 'x')
      await utimes(path.join(w.root, d), old, old)
    }
    await writeFile(path.join(w.root, 'notes.txt'), 'mine')
    // Fresh: the temp file of another collector starting on this root, which must learn the root is held.
    await writeFile(path.join(w.root, '.collector.pid.0fee1e55'), '4242')
    const {collector} = await inProcess(await coordinatorFor(fleet), fleet, w, {concurrency: 3})
    const done = collector.run()
    await waitFor(() => env.episodes.size >= 2, 10_000, 'episodes running')
    collector.requestCheckpoint()
    const out = await done
    expect(out.checkpoints).toBe(1)
    const left = await readdir(w.root)
    expect(left).not.toContain(path.basename(partial))
    expect(left).toContain('notes.txt')
    expect(left).toContain('.collector.pid.0fee1e55')
    expect(
      left.filter((n) => dots.includes(n)),
      'leftover dot files',
    ).toEqual([])
  })

  it('a /run whose connection drops is never resent: it is retired everywhere and sent as the next attempt, then forgotten', async () => {
    const fleet = await startFleet({members: FULL})
    const rows = rowsOf(5).slice(0, 10)
    const [reference, w] = await Promise.all([uninterrupted(rows), tempDir().then((d) => workdir(d, rows))])
    // The second /run to arrive runs to its end but its reply is lost; the fifth is cut before it runs.
    const env = fleet.server('env')
    let n = 0
    const original = env.faults.take.bind(env.faults)
    env.faults.take = (route: string) => {
      if (route !== 'run') return original(route)
      n++
      return n === 2 ? {type: 'drop-after'} : n === 5 ? {type: 'drop'} : undefined
    }
    const c = await coordinatorFor(fleet)
    const {collector} = await inProcess(c, fleet, w, {concurrency: 2})
    const out = await collector.run()

    expect(out.end).toBe('finished')
    expect(out.retried).toBe(2)
    expect(out.failed).toBe(0)
    const sent = runsSent(env)
    expectNoAttemptTwice(sent)
    const output = await readOutput(w.output)
    expectSameAsUninterrupted(output, reference)
    const retried = output.filter((r) => r._ng_attempt_index === 1).map((r) => r._ng_rollout_id as string)
    expect(retried).toHaveLength(2)
    expect(output.filter((r) => r._ng_attempt_index > 1)).toEqual([])
    // drop-after: the first attempt reached the server and ran; drop: it never arrived. Either
    // way the row went again as attempt 1, once.
    const perRow = retried.map((r) => sent.filter(([x]) => x === r).map(([, a]) => a)).sort((a, b) => b.length - a.length)
    expect(perRow).toEqual([[0, 1], [1]])
    // Retired everywhere before the retry, then forgotten once the retry replied.
    for (const s of fleet.servers.slice(0, 4)) {
      expect(retiresSent(s).sort()).toEqual(retried.map((r) => [r, 0]).sort())
      expect([...new Set(forgetsSent(s))].sort()).toEqual([...retried].sort())
      expect((await control(s.url, 'status')).json.retired_rollouts).toBe(0)
    }
    // The log names both attempts of each retried row.
    const log = await readDispatched(w.root)
    for (const r of retried)
      expect(log.entries.filter(([x]) => x === r)).toEqual([
        [r, 0],
        [r, 1],
      ])
  })
})

const serversOf = (fleet: {servers: {name: string; url: string}[]}) => fleet.servers.map((s) => ({name: s.name, url: s.url}))

describe('collect --resume after a crash (collector SIGKILLed, every server crashed)', () => {
  it('the crashed run published LATEST: restore it; continued rows go on at attempt + 1, restarts and rows sent after it start over one attempt later, finished rows never run again', async () => {
    // r03 cannot be captured by its resources server (a restart), and runs long.
    const rows = rowsOf(40).map((r) => (r._ng_rollout_id === 'r03' ? {...r, steps: 40, restart: true} : r))
    const [reference, fleet1, w] = await Promise.all([uninterrupted(rows), startFleet({members: FULL}), tempDir().then((d) => workdir(d, rows))])
    const run1 = new CollectorProcess({servers: serversOf(fleet1), input: w.input, output: w.output, root: w.root, concurrency: 4, checkpointEveryMs: null, resume: false})
    await run1.waitFor('2 rows done', (m) => 'progress' in m && m.progress.done >= 2)
    run1.signal('SIGUSR1')
    const line = (await run1.waitFor('a checkpoint', (m) => 'log' in m && m.log.startsWith('checkpoint ckpt-'))) as {log: string}
    const ckptId = /^checkpoint (\S+):/.exec(line.log)![1]!
    const {continued, restarted} = (await readCheckpointSummary(path.join(w.root, ckptId)))!
    expect(restarted).toEqual([{rollout_id: 'r03', attempt: 0}])
    const inCkpt = new Set([...continued, ...restarted].map((e) => e.rollout_id))
    // Crash as soon as one row sent after the checkpoint is still running: waiting for more gave a
    // loaded machine time to finish every continued row first, leaving nothing to continue.
    await waitFor(
      async () => {
        const done = new Set((await readOutput(w.output)).map((r) => r._ng_rollout_id))
        return new Set((await readDispatched(w.root)).entries.map(([r]) => r).filter((r) => !inCkpt.has(r) && !done.has(r))).size >= 1
      },
      15_000,
      'rows dispatched after the checkpoint',
    )
    await run1.kill()
    await fleet1.crash()

    const done1 = new Set((await readOutput(w.output)).map((r) => r._ng_rollout_id as string))
    const log1 = highestAttempts((await readDispatched(w.root)).entries)
    const restored = continued.filter((e) => !done1.has(e.rollout_id))
    const sentAfter = [...log1.keys()].filter((r) => !inCkpt.has(r) && !done1.has(r))
    expect(restored.length, 'rows to continue from the checkpoint').toBeGreaterThanOrEqual(1)
    expect(sentAfter.length, 'rows sent after the checkpoint').toBeGreaterThanOrEqual(1)
    expect(done1.has('r03')).toBe(false)
    const startOver = [...sentAfter, 'r03']
    expect(done1.size).toBeLessThan(16)

    const fleet2 = await startFleet({members: FULL})
    const {collector} = await inProcess(await coordinatorFor(fleet2), fleet2, w, {concurrency: 4, resume: true})
    const out = await collector.run()
    expect(out.end).toBe('finished')
    expect(out.restores).toBe(1)
    const output = await readOutput(w.output)
    expectSameAsUninterrupted(output, reference)

    const env2 = fleet2.server('env')
    const sent = runsSent(env2)
    expectNoAttemptTwice(sent)
    const attemptsSent = new Map(sent)
    // Finished rows never run again.
    expect(sent.filter(([r]) => done1.has(r))).toEqual([])
    // Continued rows: next attempt, from their boundary.
    for (const e of restored) expect(attemptsSent.get(e.rollout_id), e.rollout_id).toBe(e.attempt + 1)
    const fromBoundary = output.filter((r) => restored.some((e) => e.rollout_id === r._ng_rollout_id) && r.resumed_from_step > 0)
    expect(fromBoundary.length).toBeGreaterThanOrEqual(1)
    // Rows sent after the checkpoint: their logged attempt retired on the fresh fleet first, then
    // started over from input one attempt later.
    const retired = new Set(retiresSent(env2).map(([r, a]) => `${r}@${a}`))
    for (const r of startOver) {
      expect(attemptsSent.get(r), r).toBe(log1.get(r)! + 1)
      expect(retired.has(`${r}@${log1.get(r)}`), `${r} retired`).toBe(true)
      expect(output.find((x) => x._ng_rollout_id === r)!.resumed_from_step).toBe(0)
    }
    // Rows never sent: attempt 0.
    for (const [r, a] of sent) if (!log1.has(r)) expect(a, r).toBe(0)
    // Restored and retired rollouts are forgotten by the end.
    const forgotten = new Set(forgetsSent(env2))
    for (const r of [...restored.map((e) => e.rollout_id), ...startOver]) expect(forgotten.has(r), `${r} forgotten`).toBe(true)
    for (const s of fleet2.servers.slice(0, 4)) expect((await control(s.url, 'status')).json).toMatchObject({phase: 'idle', retired_rollouts: 0})
  }, 60_000)

  it('a restore that fails on one participant is cleaned up, and its rows start over from input two attempts later (Gym collector, reference 9.7 C.5)', async () => {
    const rows = rowsOf(40)
    const [reference, fleet1, w] = await Promise.all([uninterrupted(rows), startFleet({members: FULL}), tempDir().then((d) => workdir(d, rows))])
    const env1 = fleet1.server('env').participant as SimEnvironment
    const first = (await inProcess(await coordinatorFor(fleet1), fleet1, w, {concurrency: 4})).collector
    const running = first.run()
    await waitFor(() => [...env1.episodes.values()].filter((e) => (e.boundary?.step ?? 0) >= 1).length >= 3, 10_000, 'episodes past step 1')
    first.requestStop()
    const stopped = await running
    expect(stopped.stopCheckpointed).toBe(true)
    const continued = (await readCheckpointSummary(path.join(w.root, stopped.lastCheckpointId!)))!.continued
    const done1 = new Set((await readOutput(w.output)).map((r) => r._ng_rollout_id as string))
    const open = continued.filter((e) => !done1.has(e.rollout_id))
    expect(open.length).toBeGreaterThanOrEqual(1)
    await fleet1.crash()

    const fleet2 = await startFleet({members: FULL})
    fleet2.server('agent').faults.add('restore', {type: 'status', status: 500})
    const {collector} = await inProcess(await coordinatorFor(fleet2), fleet2, w, {concurrency: 4, resume: true})
    const out = await collector.run().catch((err: Error) => err)
    expect(out, 'the run goes on after the failed restore').not.toBeInstanceOf(Error)
    expect((out as {end: string}).end).toBe('finished')
    expectSameAsUninterrupted(await readOutput(w.output), reference)
    const sent = new Map(runsSent(fleet2.server('env')))
    for (const e of open) expect(sent.get(e.rollout_id), e.rollout_id).toBe(e.attempt + 2)
  })

  it('a later run crashed before its own first checkpoint: every unfinished row starts over, nothing is restored', async () => {
    const rows = rowsOf(40)
    const [reference, fleet1, w] = await Promise.all([uninterrupted(rows), startFleet({members: FULL}), tempDir().then((d) => workdir(d, rows))])
    const cfg = {input: w.input, output: w.output, root: w.root, concurrency: 4, checkpointEveryMs: null}
    const run1 = new CollectorProcess({...cfg, servers: serversOf(fleet1), resume: false})
    await run1.waitFor('1 row done', (m) => 'progress' in m && m.progress.done >= 1)
    run1.signal('SIGUSR1')
    await run1.waitFor('a checkpoint', (m) => 'log' in m && m.log.startsWith('checkpoint ckpt-'))
    await run1.kill()
    await fleet1.crash()
    const latest = await readFile(path.join(w.root, 'LATEST'), 'utf8')

    // Run 2 restores it, then crashes before it takes a checkpoint of its own.
    const fleet2 = await startFleet({members: FULL})
    const run2 = new CollectorProcess({...cfg, servers: serversOf(fleet2), resume: true})
    const done1 = (await readOutput(w.output)).length
    await run2.waitFor('2 more rows done', (m) => 'progress' in m && m.progress.done >= done1 + 2)
    await run2.kill()
    await fleet2.crash()
    expect(run2.logs().some((l) => l.includes(`restoring checkpoint '${latest}'`))).toBe(true)
    expect(await readFile(path.join(w.root, 'LATEST'), 'utf8')).toBe(latest)
    const done2 = new Set((await readOutput(w.output)).map((r) => r._ng_rollout_id as string))
    const log2 = highestAttempts((await readDispatched(w.root)).entries)
    const unfinishedLogged = [...log2.keys()].filter((r) => !done2.has(r))
    expect(unfinishedLogged.length).toBeGreaterThanOrEqual(1)

    const fleet3 = await startFleet({members: FULL})
    const before = done2.size
    const {collector} = await inProcess(await coordinatorFor(fleet3), fleet3, w, {concurrency: 4, resume: true})
    const out = await collector.run()
    expect(out.end).toBe('finished')
    expect(out.restores).toBe(0)
    const output = await readOutput(w.output)
    expectSameAsUninterrupted(output, reference)
    // Nothing restored: every row of this run started from step 0, one attempt after its last one.
    expect(output.slice(before).filter((r) => r.resumed_from_step !== 0)).toEqual([])
    const env3 = fleet3.server('env')
    const sent = runsSent(env3)
    expectNoAttemptTwice(sent)
    expect(sent.filter(([r]) => done2.has(r))).toEqual([])
    for (const [r, a] of sent) expect(a, r).toBe(log2.has(r) ? log2.get(r)! + 1 : 0)
    expect(retiresSent(env3).sort()).toEqual(unfinishedLogged.map((r) => [r, log2.get(r)]).sort())
    for (const s of fleet3.servers.slice(0, 4)) expect((await control(s.url, 'status')).json).toMatchObject({phase: 'idle', retired_rollouts: 0})
  }, 60_000)
})

describe('demo --scenario collect (runs the built CLI: npm run build first, as npm test does)', () => {
  it('SIGKILL the collector and every server mid-run, restart the fleet fresh, collect --resume: the output equals an uninterrupted run row for row', async () => {
    const r = await runCollectDemo({rows: 12, steps: 4, stepMs: 30, restarts: 1, dir: await tempDir()})
    expect(r.missing, 'rows lost').toEqual([])
    expect(r.duplicated, 'rows duplicated').toEqual([])
    expect(r.mismatches, 'rows that differ').toEqual([])
    expect(r.ok).toBe(true)
    expect(r.doneBeforeCrash).toBeGreaterThanOrEqual(3)
    expect(r.doneBeforeCrash + r.continued + r.startedOver + r.neverStarted).toBe(12)
    // The restart and the row sent after the checkpoint start over.
    expect(r.startedOver).toBeGreaterThanOrEqual(2)
    expect(r.neverStarted).toBeGreaterThanOrEqual(1)
    expect(await readFile(path.join(r.root, 'LATEST'), 'utf8')).toMatch(CKPT_DIR)
  }, 60_000)
})
