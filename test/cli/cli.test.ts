import {readFile, readdir, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {cli} from '../helpers/cli.js'
import {FULL, TOKEN, control, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

function servers(fleet: {serverArgs(): string[]}): string[] {
  return fleet.serverArgs().flatMap((s) => ['--server', s])
}

function noSecret(r: {stdout: string; stderr: string}): void {
  expect(r.stdout).not.toContain(TOKEN)
  expect(r.stderr).not.toContain(TOKEN)
}

// Each test starts up to a dozen CLI processes one after another; on 2 cores shared with the rest
// of the suite, one can take a few seconds to start.
describe('gymckpt CLI (built, run as a process)', {timeout: 120_000}, () => {
  it('--help documents the commands and the exit-code table', async () => {
    const r = await cli(['--help'])
    expect(r.code).toBe(0)
    for (const c of ['checkpoint', 'commit', 'demo', 'discover', 'fleet', 'forget', 'prepare', 'prune', 'renew', 'restore', 'resume', 'retire', 'status', 'verify']) expect(r.stdout).toContain(c)
    const h = await cli(['checkpoint', '--help'])
    expect(h.stdout).toContain('EXIT CODES')
    expect(h.stdout).toMatch(/5\s+prepare missed its deadline/)
  })

  it('discover --json: one JSON document on stdout, participants in Gym order, never the token', async () => {
    const fleet = await startFleet({members: FULL, head: true})
    const r = await cli(['discover', '--head', fleet.headUrl!, '--json'])
    expect(r.code).toBe(0)
    expect(r.json.ok).toBe(true)
    expect(r.json.participants.map((p: {server: string}) => p.server)).toEqual(['env', 'policy', 'agent', 'res'])
    expect(r.json.skipped.map((s: {server: string}) => s.server)).toEqual(['judge'])
    expect(r.json).toMatchObject({ok: true, schema_version: 3, warnings: []})
    noSecret(r)
    const human = await cli(['status', ...servers(fleet)])
    expect(human.code).toBe(0)
    expect(human.stdout).toMatch(/SERVER\s+KIND\s+PHASE/)
    expect(human.stdout).toMatch(/policy\s+model\s+idle/)
  })

  it('prepare, commit and resume as separate processes, then verify offline', async () => {
    const fleet = await startFleet({members: FULL})
    for (const r of ['a', 'b']) void fleet.run({rolloutId: r, steps: 400, stepMs: 10})
    await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === 2)
    const root = await tempDir()
    const prep = await cli(['prepare', ...servers(fleet), '--json'])
    expect(prep.code, prep.stderr).toBe(0)
    const id = prep.json.checkpoint_id
    expect(id).toMatch(/^ckpt-\d{8}T\d{6}-[0-9a-f]{8}$/)
    const episodes = path.join(await tempDir(), 'episodes.txt')
    await writeFile(episodes, '# in flight\na\n{"rollout_id": "b", "attempt": 0}\n')
    const commit = await cli(['commit', ...servers(fleet), '--root', root, '--episodes', episodes, '--json'])
    expect(commit.code, commit.stderr).toBe(0)
    expect(commit.json).toMatchObject({
      checkpoint_id: id,
      published: true,
      continued: [
        {rollout_id: 'a', attempt: 0},
        {rollout_id: 'b', attempt: 0},
      ],
    })
    expect((await readFile(path.join(root, 'LATEST'), 'utf8')).trim()).toBe(id)
    const resume = await cli(['resume', ...servers(fleet), '--json'])
    expect(resume.code).toBe(0)
    expect(resume.json.checkpoint_id).toBe(id)
    for (const s of fleet.servers.slice(0, 4)) expect((await control(s.url, 'status')).json.phase).toBe('idle')

    const v = await cli(['verify', root, '--json'])
    expect(v.code).toBe(0)
    expect(v.json).toMatchObject({valid: true, checkpoint_id: id, continued_count: 2})

    const envDir = path.join(root, id, 'gym', 'environment', 'env')
    const m = JSON.parse(await readFile(path.join(envDir, 'manifest.json'), 'utf8'))
    await writeFile(path.join(envDir, m.records_file), 'truncated')
    const bad = await cli(['verify', root, '--json'])
    expect(bad.code).toBe(6)
    expect(bad.json.ok).toBe(false)
    expect(bad.json.error.code).toBe('invalid_checkpoint')
    expect(bad.json.error.message).toContain(envDir)
    const human = await cli(['verify', root])
    expect(human.code).toBe(6)
    expect(human.stderr).toContain('error:')
  })

  it('checkpoint one-shot from a fleet file with episodes on stdin, then restore --dry-run and restore into a fresh fleet', async () => {
    const fleet = await startFleet({members: FULL})
    void fleet.run({rolloutId: 'a', steps: 300, stepMs: 10})
    await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === 1)
    const root = await tempDir()
    const fleetFile = path.join(await tempDir(), 'fleet.yaml')
    await writeFile(fleetFile, `servers:\n${fleet.servers.map((s) => `  ${s.name}: ${s.url}`).join('\n')}\n`)
    const ck = await cli(['checkpoint', '--fleet', fleetFile, '--root', root, '--episodes', '-', '--json'], {input: 'a\n'})
    expect(ck.code, ck.stderr).toBe(0)
    expect(ck.json.continued).toEqual([{rollout_id: 'a', attempt: 0}])
    await fleet.crash()

    const fresh = await startFleet({members: FULL})
    const dry = await cli(['restore', root, ...servers(fresh), '--dry-run', '--json'])
    expect(dry.code, dry.stdout).toBe(0)
    expect(dry.json).toMatchObject({dry_run: true, valid: true, replacements: [{rollout_id: 'a', attempt: 1}]})
    expect(fresh.servers.some((s) => s.journal.some((j) => j.route === 'restore'))).toBe(false)
    const r = await cli(['restore', root, ...servers(fresh), '--json'])
    expect(r.code, r.stdout).toBe(0)
    expect(r.json).toMatchObject({checkpoint_id: ck.json.checkpoint_id, resumed: true, replacements: [{rollout_id: 'a', attempt: 1}]})
    expect((await fresh.run({rolloutId: 'a', attempt: 1, steps: 300, stepMs: 0})).status).toBe(200)
  })

  it('fleet runs a rehearsal fleet in its own process that the other commands drive, until SIGINT', async () => {
    const dir = await tempDir()
    const fleetFile = path.join(dir, 'fleet.yaml')
    let proc: ReturnType<typeof import('node:child_process').spawn> | undefined
    const run = cli(['fleet', '--write-fleet', fleetFile, '--fault', 'policy_model:commit:status:503', '--json'], {
      onSpawn: (p) => (proc = p),
      timeoutMs: 60_000,
    })
    await waitFor(async () => (await readFile(fleetFile, 'utf8').catch(() => '')).includes('judge_model'), 20_000, 'fleet file')
    const d = await cli(['discover', '--fleet', fleetFile, '--json'])
    expect(d.json.participants.map((p: {server: string}) => p.server)).toEqual(['weather_env', 'policy_model', 'simple_agent', 'weather_resources'])
    const failed = await cli(['checkpoint', '--episodes-file', '/dev/null', '--fleet', fleetFile, '--root', dir, '--json'])
    expect(failed.code).toBe(4)
    expect(failed.json.error.message).toContain('policy_model: HTTP 503')
    const ok = await cli(['checkpoint', '--episodes-file', '/dev/null', '--fleet', fleetFile, '--root', dir, '--json'])
    expect(ok.code, ok.stdout).toBe(0)
    proc!.kill('SIGINT')
    const r = await run
    expect(r.code).toBe(0)
    expect(JSON.parse(r.stdout.split('\n')[0]!).servers).toHaveLength(5)
    noSecret(r)
  })

  it('renew extends every lease of an open checkpoint', async () => {
    const fleet = await startFleet({members: FULL})
    const prep = await cli(['prepare', ...servers(fleet), '--timeout', '5', '--json'])
    const id = prep.json.checkpoint_id
    const r = await cli(['renew', ...servers(fleet), '--id', id, '--timeout', '3600', '--json'])
    expect(r.code).toBe(0)
    expect(r.json.participants).toHaveLength(4)
    for (const t of r.json.participants.map((p: {lease_expires_at: number}) => p.lease_expires_at) as number[]) expect(t).toBeGreaterThan(Date.now() / 1000 + 3600)
    expect((await cli(['resume', ...servers(fleet), '--id', id])).code).toBe(0)
  })

  it('prune is a dry run unless --yes', async () => {
    const fleet = await startFleet({members: FULL})
    const root = await tempDir()
    for (let i = 0; i < 3; i++) expect((await cli(['checkpoint', '--episodes-file', '/dev/null', ...servers(fleet), '--root', root, '--json'])).code).toBe(0)
    const latest = (await readFile(path.join(root, 'LATEST'), 'utf8')).trim()
    const dry = await cli(['prune', root, '--keep', '1', '--json'])
    expect(dry.code).toBe(0)
    expect(dry.json.dry_run).toBe(true)
    expect(dry.json.remove).toHaveLength(2)
    expect(await readdir(root)).toHaveLength(4)
    const real = await cli(['prune', root, '--keep', '1', '--yes'])
    expect(real.code).toBe(0)
    expect((await readdir(root)).sort()).toEqual(['LATEST', latest])
    expect((await cli(['verify', root])).code).toBe(0)
  })

  it('retire and forget', async () => {
    const fleet = await startFleet({members: FULL})
    const r = await cli(['retire', ...servers(fleet), '--episode', 'r7', '--episode', 'r9@1', '--json'])
    expect(r.code, r.stdout).toBe(0)
    expect(r.json).toEqual({ok: true, schema_version: 3, warnings: [], dry_run: false, episode_count: 2, participant_count: 4})
    expect((await control(fleet.server('res').url, 'status')).json.retired_rollouts).toBe(2)
    const f = await cli(['forget', ...servers(fleet), '--rollout', 'r7', '--rollout', 'r9', '--json'])
    expect(f.code).toBe(0)
    expect((await control(fleet.server('res').url, 'status')).json.retired_rollouts).toBe(0)
  })

  describe('errors: a clear message, the documented exit code, JSON on stdout', () => {
    it('no token (2), empty token file (2), wrong token (7)', async () => {
      const fleet = await startFleet({members: FULL})
      const none = await cli(['status', ...servers(fleet), '--json'], {env: {NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: undefined}})
      expect(none.code).toBe(2)
      expect(none.json.error.message).toBe('no control token: set NEMO_GYM_CHECKPOINT_CONTROL_TOKEN or pass --token-file FILE')
      const dir = await tempDir()
      await writeFile(path.join(dir, 'empty'), '\n')
      const empty = await cli(['status', ...servers(fleet), '--token-file', path.join(dir, 'empty')])
      expect(empty.code).toBe(2)
      expect(empty.stderr).toContain('is empty')
      await writeFile(path.join(dir, 'tok'), TOKEN + '\n')
      const viaFile = await cli(['status', ...servers(fleet), '--token-file', path.join(dir, 'tok')], {env: {NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: undefined}})
      expect(viaFile.code).toBe(0)
      const wrong = await cli(['status', ...servers(fleet), '--json'], {env: {NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: 'not-the-token'}})
      expect(wrong.code).toBe(7)
      expect(wrong.json.error.details.failures[0]).toMatchObject({server: 'agent', status: 401, code: 'unauthorized'})
      expect(wrong.stdout).not.toContain('not-the-token')
    })

    it('a server that is down (3), a bad --server (2), a bad episodes line (2), an unknown flag (2)', {timeout: 90_000}, async () => {
      const fleet = await startFleet({members: FULL})
      const down = await cli(['discover', ...servers(fleet), '--server', 'ghost=http://127.0.0.1:1', '--json'])
      expect(down.code).toBe(3)
      expect(down.json.error.message).toContain('ghost: connection refused')
      // status still shows the servers that answered, and the one that did not.
      const st = await cli(['status', ...servers(fleet), '--server', 'ghost=http://127.0.0.1:1', '--json'])
      expect(st.code).toBe(3)
      expect(st.json.error.details.participants).toHaveLength(4)
      expect(st.json.error.details.failures).toEqual([expect.objectContaining({server: 'ghost', code: 'connection'})])
      const human = await cli(['status', ...servers(fleet), '--server', 'ghost=http://127.0.0.1:1'])
      expect(human.code).toBe(3)
      expect(human.stdout).toMatch(/ghost\s+\?\s+UNREACHABLE\s+connection refused/)
      expect(human.stdout).toMatch(/policy\s+model\s+idle/)
      const badArg = await cli(['discover', '--server', 'nourl', '--json'])
      expect(badArg.code).toBe(2)
      expect(badArg.json.error.message).toContain("--server 'nourl': expected NAME=URL")
      const dir = await tempDir()
      await writeFile(path.join(dir, 'eps'), 'a\nb-a1\nc@x\n')
      const badEp = await cli(['commit', ...servers(fleet), '--root', dir, '--episodes', path.join(dir, 'eps'), '--json'])
      expect(badEp.code).toBe(2)
      expect(badEp.json.error.message).toBe(`${path.join(dir, 'eps')}:3: 'c@x': attempt 'x' is not a non-negative integer`)
      const nothing = await cli(['commit', ...servers(fleet), '--root', dir, '--json'])
      expect(nothing.code).toBe(8)
      expect(nothing.json.error.message).toBe('no participant has an open checkpoint; nothing was sent. Prepare one first.')
      expect(nothing.json.error.next).toEqual([`gymckpt prepare --root ${dir} ${servers(fleet).join(' ')}`])
      // prepare takes no episode flags: the printed line leaves them out, so it works when pasted.
      const scoped = await cli(['commit', ...servers(fleet), '--root', dir, '--episodes-file', '/dev/null', '--json'])
      expect(scoped.json.error.next).toEqual([`gymckpt prepare --root ${dir} ${servers(fleet).join(' ')}`])
      const unknown = await cli(['status', '--frobnicate'])
      expect(unknown.code).toBe(2)
      // The fleet double's flags are checked before anything starts: exit 2, the value named.
      for (const [args, message] of [
        [['--member', 'e=planet'], '--member: e=planet: expected NAME=KIND with KIND one of environment, model, agent, resources, none'],
        [['--member', 'a=model', '--member', 'a=environment'], '--member a: named twice; every member needs its own name'],
        [['--fault', 'env:status:status:99'], "--fault: invalid fault 'status:status:99': HTTP status 99 is not 100 to 599"],
      ] as const) {
        const bad = await cli(['fleet', ...args, '--json'])
        expect(bad.code, args.join(' ')).toBe(2)
        expect(bad.json.error.message).toBe(message)
      }
    })

    it('prepare that misses its deadline exits 5 with the blockers and leaves the fleet resumed', async () => {
      const fleet = await startFleet({members: FULL})
      fleet.server('agent').participant!.stuckBlockers = ['r7']
      const r = await cli(['checkpoint', '--episodes-file', '/dev/null', ...servers(fleet), '--root', await tempDir(), '--timeout', '1', '--json'])
      expect(r.code).toBe(5)
      expect(r.json.error.details.blockers).toEqual([{server: 'agent', blockers: ['r7'], blocker_count: 1}])
      expect(r.json.error.details.not_reached).toEqual(['res'])
      for (const s of fleet.servers.slice(0, 4)) expect((await control(s.url, 'status')).json.phase).toBe('idle')
    })

    it('a participant failing its commit exits 4 naming it; the fleet is resumed', async () => {
      const fleet = await startFleet({members: FULL})
      fleet.server('policy').faults.add('commit', {type: 'status', status: 500})
      const r = await cli(['checkpoint', '--episodes-file', '/dev/null', ...servers(fleet), '--root', await tempDir(), '--json'])
      expect(r.code).toBe(4)
      expect(r.json.error.message).toContain('checkpoint commit failed on 1 participant(s): policy: HTTP 500')
      for (const s of fleet.servers.slice(0, 4)) expect((await control(s.url, 'status')).json.phase).toBe('idle')
    })

    it('SIGINT during a checkpoint resumes the fleet and exits 130', async () => {
      const fleet = await startFleet({members: FULL})
      fleet.server('policy').participant!.stuckBlockers = ['slow']
      const root = await tempDir()
      const r = await cli(['checkpoint', '--episodes-file', '/dev/null', ...servers(fleet), '--root', root, '--timeout', '60', '--json'], {
        onSpawn: (p) => {
          void waitFor(() => fleet.server('policy').journal.some((j) => j.route === 'prepare'), 20_000).then(() => p.kill('SIGINT'))
        },
      })
      expect(r.code).toBe(130)
      expect(r.json.error.code).toBe('interrupted')
      for (const s of fleet.servers.slice(0, 4)) expect((await control(s.url, 'status')).json.phase).toBe('idle')
      expect(await readdir(root)).toEqual([])
    })
  })
})
