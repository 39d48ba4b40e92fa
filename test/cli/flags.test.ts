// Issue 7, item 8: one flag scheme. Episodes are --episode VALUE (repeatable) or --episodes-file
// FILE, rollouts --rollout / --rollouts-file; the root is the positional or --root (or
// GYMCKPT_ROOT) on every command that reads one; --dry-run wherever an action can be previewed.
// The old spellings stay as hidden aliases, so scripts written before keep working.
import {readdir, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {cli} from '../helpers/cli.js'
import {FULL, control, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

function servers(fleet: {serverArgs(): string[]}): string[] {
  return fleet.serverArgs().flatMap((s) => ['--server', s])
}

describe('consistent flags (built CLI)', {timeout: 120_000}, () => {
  it('episodes: --episode values and --episodes-file together on checkpoint; the old --episodes still reads a file', async () => {
    const fleet = await startFleet({members: FULL})
    for (const r of ['a', 'b', 'c']) void fleet.run({rolloutId: r, steps: 100_000, stepMs: 10})
    await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === 3)
    const root = await tempDir()
    const file = path.join(await tempDir(), 'eps.txt')
    await writeFile(file, 'b\n')
    const both = await cli(['checkpoint', ...servers(fleet), '--root', root, '--episode', 'a', '--episodes-file', file, '--json'])
    expect(both.code, both.stderr).toBe(0)
    expect(both.json.continued).toEqual([
      {rollout_id: 'a', attempt: 0},
      {rollout_id: 'b', attempt: 0},
    ])
    const old = await cli(['checkpoint', ...servers(fleet), '--root', root, '--episodes', '-', '--json'], {input: 'c\n'})
    expect(old.code, old.stderr).toBe(0)
    expect(old.json.continued).toEqual([{rollout_id: 'c', attempt: 0}])
    // No scope: refused before prepare (the policy model would refuse the commit), nothing sent.
    const none = await cli(['checkpoint', ...servers(fleet), '--root', root, '--json'])
    expect(none.code).toBe(2)
    expect(none.json.error.message).toBe(
      'no commit scope: the policy model policy refuses a commit that does not name the episodes the controller continues (Gym answers 409 checkpoint_error); pass them with --episode or --episodes-file (an empty file, e.g. /dev/null, when none continue); nothing was sent',
    )
    // No retry line: the same command would fail the same way.
    expect(none.json.error.next ?? []).toEqual([])
    const empty = await cli(['checkpoint', ...servers(fleet), '--root', root, '--episodes-file', '/dev/null', '--json'])
    expect(empty.code, empty.stderr).toBe(0)
    expect(empty.json.continued).toEqual([])
    const bad = await cli(['checkpoint', ...servers(fleet), '--root', root, '--episode', 'x-a1-a2'])
    expect(bad.code).toBe(2)
    expect(bad.stderr).toMatch(/^error: --episode: /)
  })

  it('retire and forget: --episodes-file / --rollouts-file, their old names, and a clear error when nothing is given', async () => {
    const fleet = await startFleet({members: FULL})
    const dir = await tempDir()
    const eps = path.join(dir, 'eps.txt')
    const rollouts = path.join(dir, 'rollouts.txt')
    await writeFile(eps, 'r1\nr2@1\n')
    await writeFile(rollouts, 'r1\nr2\n')
    for (const flag of ['--episodes-file', '--episodes']) {
      const r = await cli(['retire', ...servers(fleet), flag, eps, '--episode', 'r3', '--json'])
      expect(r.code, r.stderr).toBe(0)
      expect(r.json.episode_count).toBe(3)
    }
    expect((await control(fleet.server('env').url, 'status')).json.retired_rollouts).toBe(3)
    for (const flag of ['--rollouts-file', '--rollouts']) {
      const r = await cli(['forget', ...servers(fleet), flag, rollouts, '--rollout', 'r3', '--json'])
      expect(r.code, r.stderr).toBe(0)
      expect(r.json.rollout_count).toBe(3)
    }
    expect((await control(fleet.server('env').url, 'status')).json.retired_rollouts).toBe(0)
    const nothing = await cli(['retire', ...servers(fleet)])
    expect([nothing.code, nothing.stderr]).toEqual([2, 'error: nothing to retire: pass --episode or --episodes-file\n'])
    const nothing2 = await cli(['forget', ...servers(fleet)])
    expect([nothing2.code, nothing2.stderr]).toEqual([2, 'error: nothing to forget: pass --rollout or --rollouts-file\n'])
    // The help shows the new names only.
    const help = await cli(['retire', '--help'])
    expect(help.stdout).toContain('--episodes-file')
    expect(help.stdout).not.toMatch(/--episodes[ =]/)
  })

  it('the root: positional, --root or GYMCKPT_ROOT on list, describe, verify, prune; two different ones are refused', async () => {
    const fleet = await startFleet({members: FULL})
    const root = await tempDir()
    for (let i = 0; i < 3; i++) expect((await cli(['checkpoint', '--episodes-file', '/dev/null', ...servers(fleet), '--root', root, '--json'])).code).toBe(0)
    for (const cmd of ['list', 'describe', 'verify', 'prune']) {
      const a = await cli([cmd, root, '--json'])
      const b = await cli([cmd, '--root', root, '--json'])
      const c = await cli([cmd, '--json'], {env: {GYMCKPT_ROOT: root}})
      expect([a.code, b.code, c.code], `${cmd}: ${a.stderr}${b.stdout}${c.stdout}`).toEqual([0, 0, 0])
      // The same document either way (ages tick between the runs).
      const same = (j: unknown) => JSON.stringify(j, (k, v) => (k === 'age_seconds' ? 0 : v))
      expect(same(b.json)).toBe(same(a.json))
      expect(same(c.json)).toBe(same(a.json))
      const two = await cli([cmd, root, '--root', path.join(root, 'other')])
      expect([two.code, two.stderr], cmd).toEqual([2, `error: two checkpoint roots given, ${root} and --root ${path.join(root, 'other')}: pass one\n`])
    }
    const none = await cli(['list'], {env: {GYMCKPT_ROOT: undefined, GYMCKPT_CONFIG: undefined, GYMCKPT_CONTEXT: undefined, XDG_CONFIG_HOME: path.join(root, 'no-config')}})
    expect(none.code).toBe(2)
    expect(none.stderr).toContain('no checkpoint root')
    const ids = (await cli(['list', root, '--json'])).json.checkpoints.map((c: {checkpoint_id: string}) => c.checkpoint_id)
    const byFlag = await cli(['describe', root, '--id', ids[2], '--json'])
    expect(byFlag.json.checkpoint.checkpoint_id).toBe(ids[2])
    // The root given otherwise: the one positional is the ID.
    for (const r of [await cli(['describe', '--root', root, ids[1], '--json']), await cli(['describe', ids[1], '--json'], {env: {GYMCKPT_ROOT: root}})]) {
      expect(r.code, r.stderr).toBe(0)
      expect(r.json.checkpoint.checkpoint_id).toBe(ids[1])
    }
    const twoIds = await cli(['describe', root, ids[1], '--id', ids[2]])
    expect(twoIds.code).toBe(2)
    expect(twoIds.stderr).toContain('two checkpoint IDs given')
  })

  it('prune takes --dry-run (the default, said out loud), refuses it with --yes, and removes only with --yes', async () => {
    const fleet = await startFleet({members: FULL})
    const root = await tempDir()
    for (let i = 0; i < 3; i++) expect((await cli(['checkpoint', '--episodes-file', '/dev/null', ...servers(fleet), '--root', root, '--json'])).code).toBe(0)
    const dry = await cli(['prune', root, '--keep', '1', '--dry-run', '--json'])
    expect(dry.code, dry.stderr).toBe(0)
    expect(dry.json).toMatchObject({dry_run: true})
    expect(dry.json.remove).toHaveLength(2)
    expect(await readdir(root)).toHaveLength(4)
    const both = await cli(['prune', root, '--dry-run', '--yes'])
    expect(both.code).toBe(2)
    expect(both.stderr).toMatch(/--yes.*--dry-run|--dry-run.*--yes/)
    const real = await cli(['prune', root, '--keep', '1', '--yes', '--json'])
    expect(real.json.dry_run).toBe(false)
    expect(await readdir(root)).toHaveLength(2)
  })

  it("restore's --no-resume keeps --keep-closed as a hidden alias; --dry-run previews", async () => {
    const fleet = await startFleet({members: FULL})
    const root = await tempDir()
    expect((await cli(['checkpoint', '--episodes-file', '/dev/null', ...servers(fleet), '--root', root, '--json'])).code).toBe(0)
    await fleet.crash()
    const fresh = await startFleet({members: FULL})
    const dry = await cli(['restore', root, ...servers(fresh), '--keep-closed', '--dry-run', '--json'])
    expect(dry.code, dry.stderr).toBe(0)
    expect(dry.json.dry_run).toBe(true)
    const r = await cli(['restore', root, ...servers(fresh), '--keep-closed', '--json'])
    expect(r.code, r.stderr).toBe(0)
    expect(r.json.resumed).toBe(false)
    expect((await control(fresh.server('env').url, 'status')).json.phase).toBe('restored')
    const help = await cli(['restore', '--help'])
    expect(help.stdout).toContain('--no-resume')
    expect(help.stdout).not.toContain('--keep-closed')
  })
})
