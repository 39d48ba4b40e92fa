// Issue 7, item 7: per-stage and per-participant progress, the interrupted phase shown as
// interrupted, and the per-participant timings of checkpoint, commit and restore (built CLI).
import {stat} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {detail, progressMode} from '../../src/cli/progress.js'
import {cli} from '../helpers/cli.js'
import {FULL, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

function servers(fleet: {serverArgs(): string[]}): string[] {
  return fleet.serverArgs().flatMap((s) => ['--server', s])
}

const PLAIN = {GYMCKPT_PROGRESS: 'plain'}

async function busyFleet(rollouts: string[]) {
  const fleet = await startFleet({members: FULL})
  for (const r of rollouts) void fleet.run({rolloutId: r, steps: 400, stepMs: 10})
  await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === rollouts.length)
  return fleet
}

async function recordsBytes(checkpointDir: string, kind: string, instance: string, file: string): Promise<number> {
  return (await stat(path.join(checkpointDir, 'gym', kind, instance, file))).size
}

describe('progress (GYMCKPT_PROGRESS=plain draws it off a terminal too)', () => {
  it('a hung commit names the pending participant and the time left; after SIGINT the commit phase reads interrupted and resume still runs', async () => {
    const fleet = await busyFleet(['a', 'b'])
    fleet.server('policy').faults.add('commit', {type: 'hang'})
    const root = await tempDir()
    let proc: ReturnType<typeof import('node:child_process').spawn> | undefined
    let err = ''
    const run = cli(['checkpoint', ...servers(fleet), '--root', root, '--episodes-file', '-'], {
      input: 'a\nb\n',
      env: PLAIN,
      onSpawn: (p) => {
        proc = p
        p.stderr!.on('data', (d) => (err += d))
      },
    })
    await waitFor(() => /3\/4 replied; waiting for policy · \d+ s to the deadline/.test(err), 20_000, 'the pending participant on stderr')
    proc!.kill('SIGINT')
    const r = await run
    expect(r.code, r.stderr).toBe(130)
    expect(r.stderr).toMatch(/✔ prepare \(environment → model → agent → resources\)/)
    expect(r.stderr).toMatch(/commit and publish \(\d+\.\d s\) \[FAILED: interrupted\]/)
    expect(r.stderr).toMatch(/✔ resume \(resources → agent → model → environment\)/)
    expect(r.stderr).not.toContain('skipped')
    // Each stage of prepare was shown with its server.
    for (const stage of ['environment: 0/1 replied; waiting for env', 'model: 0/1 replied; waiting for policy', 'agent: 0/1 replied; waiting for agent', 'resources: 0/1 replied; waiting for res']) {
      expect(r.stderr).toContain(stage)
    }
  })

  it('prepare interrupted while a stage waits: prepare reads interrupted, commit not run, resume done', async () => {
    const fleet = await busyFleet(['a'])
    fleet.server('agent').faults.add('prepare', {type: 'hang'})
    const root = await tempDir()
    let proc: ReturnType<typeof import('node:child_process').spawn> | undefined
    let err = ''
    const run = cli(['checkpoint', ...servers(fleet), '--root', root, '--episodes-file', '-'], {
      input: 'a\n',
      env: PLAIN,
      onSpawn: (p) => {
        proc = p
        p.stderr!.on('data', (d) => (err += d))
      },
    })
    await waitFor(() => err.includes('agent: 0/1 replied; waiting for agent'), 20_000, 'the agent stage pending')
    proc!.kill('SIGINT')
    const r = await run
    expect(r.code, r.stderr).toBe(130)
    expect(r.stderr).toMatch(/prepare \(environment → model → agent → resources\) \(\d+\.\d s\) \[FAILED: interrupted\]/)
    expect(r.stderr).toMatch(/commit and publish: not run \(interrupted\)/)
    expect(r.stderr).toMatch(/✔ resume/)
  })

  it('without GYMCKPT_PROGRESS, a non-terminal stderr gets no progress; --json never does by default', async () => {
    expect(progressMode(false, {}, false)).toBe('off')
    expect(progressMode(false, {}, true)).toBe('tty')
    expect(progressMode(true, {}, true)).toBe('off')
    expect(progressMode(true, {GYMCKPT_PROGRESS: 'plain'}, false)).toBe('plain')
    expect(progressMode(false, {GYMCKPT_PROGRESS: 'off'}, true)).toBe('off')
    expect(detail({stage: 'model', pending: new Set(['p1', 'p2']), total: 3, stageFailed: [], deadlineTs: 1000}, 990_000)).toBe('model: 1/3 replied; waiting for p1, p2 · 10 s to the deadline')
    expect(detail({stage: 'all', pending: new Set(), total: 2, stageFailed: ['x: timeout'], deadlineTs: 1000}, 990_000)).toBe('1/2 replied, 1 failed (x: timeout); none pending')
  })
})

describe('per-participant timings', () => {
  it('checkpoint --json: prepare, commit and resume ms, records and bytes per participant; the table on stderr', async () => {
    const fleet = await busyFleet(['a', 'b', 'c'])
    const root = await tempDir()
    const r = await cli(['checkpoint', ...servers(fleet), '--root', root, '--episodes-file', '-', '--json'], {input: 'a\nb\n'})
    expect(r.code, r.stderr).toBe(0)
    const t = r.json.timings
    expect(t.map((x: {server: string}) => x.server)).toEqual(['env', 'policy', 'agent', 'res'])
    for (const row of t) {
      for (const k of ['prepare_ms', 'commit_ms', 'resume_ms']) expect(Number.isInteger(row[k]) && row[k] >= 0, `${row.server} ${k}`).toBe(true)
      expect(row.restore_ms).toBeNull()
      const m = r.json.participants.find((p: {server: string}) => p.server === row.server).manifest
      expect(row.records).toBe(m.record_count)
      expect(row.bytes).toBe(await recordsBytes(r.json.checkpoint_dir, m.kind, m.instance, m.records_file))
    }
    // The environment holds all three live episodes; the scope holds two.
    expect(t.find((x: {server: string}) => x.server === 'policy').records).toBe(2)

    const human = await cli(['checkpoint', ...servers(fleet), '--root', root, '--episodes-file', '-'], {input: 'a\n'})
    expect(human.code, human.stderr).toBe(0)
    expect(human.stderr).toMatch(/SERVER\s+KIND\s+INSTANCE\s+PREPARE_MS\s+COMMIT_MS\s+RESUME_MS\s+RECORDS\s+BYTES/)
    expect(human.stderr).not.toContain('RESTORE_MS')
    expect(human.stdout.trim().split('\n')).toHaveLength(1)
  })

  it('commit --json times the commit only; restore --json times restore and resume, records = what each installed', async () => {
    const fleet = await busyFleet(['a', 'b'])
    const root = await tempDir()
    const prep = await cli(['prepare', ...servers(fleet), '--json'])
    expect(prep.code, prep.stderr).toBe(0)
    const commit = await cli(['commit', ...servers(fleet), '--root', root, '--episodes-file', '-', '--json'], {input: 'a\nb\n'})
    expect(commit.code, commit.stderr).toBe(0)
    for (const row of commit.json.timings) {
      expect(row.prepare_ms).toBeNull()
      expect(row.resume_ms).toBeNull()
      expect(row.commit_ms).toBeGreaterThanOrEqual(0)
      expect(row.records).toBe(commit.json.participants.find((p: {server: string}) => p.server === row.server).manifest.record_count)
    }
    expect((await cli(['resume', ...servers(fleet), '--id', prep.json.checkpoint_id])).code).toBe(0)
    await fleet.crash()

    const fresh = await startFleet({members: FULL})
    // Progress on stderr (plain), the result alone on stdout.
    const r = await cli(['restore', root, ...servers(fresh), '--json'], {env: PLAIN})
    expect(r.code, r.stderr).toBe(0)
    expect(r.stderr).toMatch(/✔ preflight \(fresh fleet, verify the checkpoint\)/)
    expect(r.stderr).toContain('retire the crashed attempts of restarts: not run')
    expect(r.stderr).toMatch(/✔ restore \(\d+\.\d s\)/)
    expect(r.stderr).toMatch(/✔ resume \(resources → agent → model → environment\)/)
    expect(r.stderr).toContain('environment: 0/1 replied; waiting for env')
    const verify = await cli(['verify', root, '--json'])
    for (const row of r.json.timings) {
      expect(row.prepare_ms).toBeNull()
      expect(row.commit_ms).toBeNull()
      expect(row.restore_ms).toBeGreaterThanOrEqual(0)
      expect(row.resume_ms).toBeGreaterThanOrEqual(0)
      expect(row.records).toBe(r.json.restored.find((x: {server: string}) => x.server === row.server).restored.length)
      expect(row.bytes).toBe(verify.json.participants.find((p: {kind: string; instance: string}) => p.kind === row.kind && p.instance === row.instance).bytes)
    }
    expect(r.json.timings.find((x: {server: string}) => x.server === 'policy').records).toBe(2)

    const keepClosed = await startFleet({members: FULL})
    const closed = await cli(['restore', root, ...servers(keepClosed), '--no-resume', '--json'])
    expect(closed.code, closed.stderr).toBe(0)
    for (const row of closed.json.timings) expect(row.resume_ms).toBeNull()
  })
})
