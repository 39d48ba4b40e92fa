import {ChildProcess} from 'node:child_process'
import {appendFile, cp, mkdir, readFile, readdir, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {RunTracker} from '../../src/coordination/runs.js'
import {CliResult, cli} from '../helpers/cli.js'
import {RowBody, expectNoAttemptTwice, expectSameAsUninterrupted, makeRows, readOutput, retiresSent, runsSent, uninterrupted, workdir} from '../helpers/collect-kit.js'
import {FULL, coordinatorFor, later, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

// Several processes may start at once; on 2 busy cores one may take a while.
const SLOW = 60_000
const STACK_LINE = /^\s{4}at /m

const serverFlags = (fleet: {serverArgs(): string[]}) => fleet.serverArgs().flatMap((s) => ['--server', s])

function collect(fleet: {serverArgs(): string[]}, w: {input: string; output: string; root: string}, extra: string[], onSpawn?: (p: ChildProcess) => void): Promise<CliResult> {
  return cli(['collect', ...serverFlags(fleet), '--input', w.input, '--output', w.output, '--root', w.root, ...extra], {
    timeoutMs: SLOW,
    onSpawn: (p) => {
      later(async () => void p.kill('SIGKILL'))
      onSpawn?.(p)
    },
  })
}

const fileOrNull = (f: string) => readFile(f, 'utf8').catch(() => null)

// Each test runs one to three CLI processes one after another: on 2 busy cores that takes a while.
describe('gymckpt collect (built, run as a process)', {timeout: 60_000}, () => {
  it('exit 0 when every row finished; --json prints the summary; rows named by task and rollout index', async () => {
    const rows = Array.from({length: 10}, (_, i) => ({_ng_task_index: Math.floor(i / 2), _ng_rollout_index: i % 2, input: `q${i}`, steps: 3 + (i % 3), step_ms: 10})) as unknown as RowBody[]
    const [reference, fleet, w] = await Promise.all([uninterrupted(rows), startFleet({members: FULL}), tempDir().then((d) => workdir(d, rows))])
    const r = await collect(fleet, w, ['--agent', 'env', '--concurrency', '4', '--checkpoint-every', 'off', '--json'])
    expect(r.code, r.stderr).toBe(0)
    expect(r.json).toMatchObject({
      ok: true,
      end: 'finished',
      rows: 10,
      done: 10,
      failed: 0,
      retried: 0,
      checkpoints: 0,
      checkpoints_missed: 0,
      checkpoints_failed: 0,
      restores: 0,
      last_checkpoint_id: null,
      failed_rows: [],
    })
    expect(r.json.run_id).toMatch(/^[0-9a-f]{32}$/)
    expect(r.json.wall_ms).toBeGreaterThan(0)
    // One JSON document on stdout, nothing else (notes go to stderr).
    expect(JSON.parse(r.stdout)).toEqual(r.json)
    const output = await readOutput(w.output)
    expectSameAsUninterrupted(output, reference)
    expect(output.map((o) => o._ng_rollout_id).sort()).toEqual(['0-0', '0-1', '1-0', '1-1', '2-0', '2-1', '3-0', '3-1', '4-0', '4-1'])
    expect(output.every((o) => o._ng_attempt_index === 0)).toBe(true)
    expectNoAttemptTwice(runsSent(fleet.server('env')))
    expect(await readdir(w.root)).not.toContain('collector.pid')
  })

  it('SIGUSR1 takes a checkpoint and the run goes on to exit 0', async () => {
    const rows = makeRows(12, {steps: 8, stepMs: 40})
    const [fleet, w] = await Promise.all([startFleet({members: FULL}), tempDir().then((d) => workdir(d, rows))])
    const env = fleet.server('env').participant as SimEnvironment
    const r = await collect(fleet, w, ['--concurrency', '4', '--checkpoint-every', 'off', '--json'], (p) => {
      void waitFor(() => [...env.episodes.values()].some((e) => (e.boundary?.step ?? 0) >= 1), 20_000, 'an episode past step 1').then(() => p.kill('SIGUSR1'))
    })
    expect(r.code, r.stderr).toBe(0)
    expect(r.json.checkpoints).toBe(1)
    expect(r.json.done).toBe(12)
    expect(r.stderr).not.toMatch(/Debugger listening/)
    expect(await fileOrNull(path.join(w.root, 'LATEST'))).toBe(r.json.last_checkpoint_id)
    expect(JSON.parse((await fileOrNull(path.join(w.root, r.json.last_checkpoint_id, 'collection.json')))!).run_id).toBe(r.json.run_id)
  })

  it('SIGTERM checkpoints and exits 75; collect --resume on a fresh fleet finishes with the results of an uninterrupted run', async () => {
    const rows = makeRows(12, {steps: 10, stepMs: 40})
    const [reference, fleet1, w] = await Promise.all([uninterrupted(rows), startFleet({members: FULL}), tempDir().then((d) => workdir(d, rows))])
    const env = fleet1.server('env').participant as SimEnvironment
    const stopped = await collect(fleet1, w, ['--concurrency', '4', '--checkpoint-every', 'off', '--json'], (p) => {
      void waitFor(() => [...env.episodes.values()].filter((e) => (e.boundary?.step ?? 0) >= 2).length >= 2, 20_000, 'episodes past step 2').then(() => p.kill('SIGTERM'))
    })
    expect(stopped.code, stopped.stderr).toBe(75)
    expect(stopped.json.ok).toBe(false)
    expect(stopped.json.error).toMatchObject({code: 'preempted', exit_code: 75, details: {end: 'stopped', checkpoints: 1}})
    expect(stopped.json.error.message).toMatch(/--resume/)
    const id = stopped.json.error.details.last_checkpoint_id
    expect(await fileOrNull(path.join(w.root, 'LATEST'))).toBe(id)
    expect(stopped.stdout + stopped.stderr).not.toMatch(STACK_LINE)
    await fleet1.crash()

    const fleet2 = await startFleet({members: FULL})
    const resumed = await collect(fleet2, w, ['--concurrency', '4', '--checkpoint-every', 'off', '--resume', '--json'])
    expect(resumed.code, resumed.stderr).toBe(0)
    expect(resumed.json).toMatchObject({end: 'finished', restores: 1, rows: 12, failed: 0})
    expectSameAsUninterrupted(await readOutput(w.output), reference)
    expectNoAttemptTwice(runsSent(fleet2.server('env')))
    expect((await readOutput(w.output)).some((o) => o._ng_attempt_index === 1 && o.resumed_from_step >= 2)).toBe(true)
  })

  it('exit 2 for a bad input row, naming the file, the line, the ID and the reserved suffix; nothing sent', async () => {
    const fleet = await startFleet({members: FULL})
    const w = await workdir(await tempDir(), [{_ng_rollout_id: 'ok'}, {_ng_task_index: 1, _ng_rollout_index: 0}, {_ng_rollout_id: 'eval-a2', input: 'x'}])
    const r = await collect(fleet, w, ['--json'])
    expect(r.code).toBe(2)
    expect(r.json.error.code).toBe('input')
    expect(r.json.error.message).toContain(`${w.input}:3`)
    expect(r.json.error.message).toContain('eval-a2')
    expect(r.json.error.message).toContain("'-a2'")
    expect(r.stdout + r.stderr).not.toMatch(STACK_LINE)
    const human = await collect(fleet, {...w, output: w.output + '.2'}, [])
    expect(human.code).toBe(2)
    expect(human.stderr).toContain(`error: ${w.input}:3`)
    for (const s of fleet.servers) expect(s.journal, s.name).toEqual([])
    expect(await readdir(w.root)).toEqual([])

    // A server that is not in the fleet: refused after discovery, before any /run.
    const good = await workdir(await tempDir(), makeRows(2))
    const agent = await collect(fleet, good, ['--agent', 'nosuch', '--json'])
    expect(agent.code).toBe(2)
    expect(agent.json.error.message).toContain('--agent nosuch: no such server in the fleet')
    expect(runsSent(fleet.server('env'))).toEqual([])
  })

  it('exit 2 while another live collector holds the root, touching nothing of its run', async () => {
    const rows = makeRows(4, {steps: 400, stepMs: 50})
    const [fleet, w] = await Promise.all([startFleet({members: FULL}), tempDir().then((d) => workdir(d, rows))])
    const env = fleet.server('env').participant as SimEnvironment
    let holder: ChildProcess | undefined
    const running = collect(fleet, w, ['--concurrency', '4', '--checkpoint-every', 'off'], (p) => (holder = p))
    await waitFor(() => env.episodes.size === 4, 20_000, 'the first collector running')
    const pid = (await fileOrNull(path.join(w.root, 'collector.pid')))!
    expect(Number(pid)).toBe(holder!.pid)
    // The first collector is in the middle of appending a result.
    await appendFile(w.output, '{"_ng_rollout_id": "r00", "res')
    const before = {output: await fileOrNull(w.output), log: await fileOrNull(path.join(w.root, 'dispatched.jsonl'))}

    const [other, again] = await Promise.all([collect(fleet, {...w, output: w.output + '.other'}, ['--json']), collect(fleet, w, ['--resume', '--json'])])
    for (const r of [other, again]) {
      expect(r.code, r.stdout + r.stderr).toBe(2)
      expect(r.json.error.code).toBe('input')
      expect(r.json.error.message).toContain(`another collector (pid ${pid}) holds ${w.root}`)
    }
    expect(await fileOrNull(w.output), 'the first collector output').toBe(before.output)
    expect(await fileOrNull(path.join(w.root, 'dispatched.jsonl'))).toBe(before.log)
    expect(await fileOrNull(path.join(w.root, 'collector.pid'))).toBe(pid)
    expect(runsSent(fleet.server('env'))).toHaveLength(4)
    holder!.kill('SIGKILL')
    await running
  })

  it('collect --resume continues a root laid out by hand in Gym collector format (LATEST without newline, collection.json only)', async () => {
    const rows = makeRows(8, {steps: 8, stepMs: 30})
    const [reference, fleet1, scratch, dir] = await Promise.all([uninterrupted(rows), startFleet({members: FULL}), tempDir(), tempDir()])
    // The participants' part of a real checkpoint of the double: r00..r03 in flight, mid-episode.
    const c1 = await coordinatorFor(fleet1)
    const env1 = fleet1.server('env').participant as SimEnvironment
    const tracker = new RunTracker()
    for (const b of rows.slice(0, 4)) {
      void tracker.track({rolloutId: b._ng_rollout_id!, attempt: 0}, fleet1.run({rolloutId: b._ng_rollout_id!, input: b.input, steps: b.steps, stepMs: b.step_ms}))
    }
    await waitFor(() => env1.episodes.size === 4 && [...env1.episodes.values()].every((e) => (e.boundary?.step ?? 0) >= 2), 20_000, 'episodes past step 2')
    const ck = await checkpoint(c1, {root: scratch, tracker, timeoutS: 30})
    expect(ck.continued.map((e) => e.rolloutId).sort()).toEqual(['r00', 'r01', 'r02', 'r03'])
    await fleet1.crash()

    const w = await workdir(dir, rows)
    const runId = '5f0c0ffee5f0c0ffee5f0c0ffee5f0c0'
    await mkdir(path.join(w.root, ck.checkpointId))
    await cp(path.join(ck.checkpointDir, 'gym'), path.join(w.root, ck.checkpointId, 'gym'), {recursive: true})
    // Written as Python's json.dumps writes them.
    const continued = ['r00', 'r01', 'r02', 'r03'].map((r) => `{"rollout_id": "${r}", "attempt": 0}`).join(', ')
    await writeFile(
      path.join(w.root, ck.checkpointId, 'collection.json'),
      `{"checkpoint_id": "${ck.checkpointId}", "run_id": "${runId}", "created_at": ${(Date.now() / 1000).toFixed(6)}, "continued": [${continued}], "restarted": []}`,
    )
    await writeFile(path.join(w.root, 'LATEST'), ck.checkpointId)
    // r04 and r05 were sent after the checkpoint; r06 and r07 never.
    await writeFile(path.join(w.root, 'dispatched.jsonl'), [`{"run_id": "${runId}"}`, ...['r00', 'r01', 'r02', 'r03', 'r04', 'r05'].map((r) => `["${r}", 0]`)].join('\n') + '\n')
    expect((await readdir(path.join(w.root, ck.checkpointId))).sort()).toEqual(['collection.json', 'gym'])

    const fleet2 = await startFleet({members: FULL})
    const r = await collect(fleet2, w, ['--concurrency', '4', '--checkpoint-every', 'off', '--resume', '--json'])
    expect(r.code, r.stdout + r.stderr).toBe(0)
    expect(r.json).toMatchObject({end: 'finished', restores: 1, done: 8, failed: 0})
    const output = await readOutput(w.output)
    expectSameAsUninterrupted(output, reference)
    const byId = new Map(output.map((o) => [o._ng_rollout_id as string, o]))
    for (const id of ['r00', 'r01', 'r02', 'r03']) expect(byId.get(id), id).toMatchObject({_ng_attempt_index: 1, resumed_from_step: expect.any(Number)})
    expect(['r00', 'r01', 'r02', 'r03'].every((id) => byId.get(id)!.resumed_from_step >= 2)).toBe(true)
    for (const id of ['r04', 'r05']) expect(byId.get(id), id).toMatchObject({_ng_attempt_index: 1, resumed_from_step: 0})
    for (const id of ['r06', 'r07']) expect(byId.get(id), id).toMatchObject({_ng_attempt_index: 0, resumed_from_step: 0})
    expect(retiresSent(fleet2.server('env')).sort()).toEqual([
      ['r04', 0],
      ['r05', 0],
    ])
    expectNoAttemptTwice(runsSent(fleet2.server('env')))
  })
})
