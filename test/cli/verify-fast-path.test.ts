// bin/run.js answers a fully specified `verify` without loading oclif (issue 7, item 3). It must be
// indistinguishable from oclif's path: for each command line, the same exit code, stdout and
// stderr with the fast path and with GYMCKPT_NO_FAST_PATH=1; and lines it does not take (help,
// another flag, a bad --id, the root from GYMCKPT_ROOT) still work, through oclif.
import {spawnSync} from 'node:child_process'
import {readdir, readFile, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {fastVerifyArgs} from '../../src/cli/fast-verify.js'
import {BIN, cli} from '../helpers/cli.js'
import {FULL, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

/** Node's warnings name the process (under vitest, NODE_ENV=test, oclif warns on a flag error). */
const samePid = (s: string) => s.replace(/\(node:\d+\)/g, '(node:PID)')

async function bothPaths(args: string[], env: Record<string, string> = {}) {
  const fast = await cli(args, {env})
  const slow = await cli(args, {env: {...env, GYMCKPT_NO_FAST_PATH: '1'}})
  expect({code: fast.code, stdout: fast.stdout, stderr: samePid(fast.stderr)}, args.join(' ')).toEqual({code: slow.code, stdout: slow.stdout, stderr: samePid(slow.stderr)})
  return fast
}

async function checkpointRoot(): Promise<{root: string; id: string}> {
  const fleet = await startFleet({members: FULL})
  const root = await tempDir()
  const r = await cli(['checkpoint', '--episodes-file', '/dev/null', ...fleet.serverArgs().flatMap((s) => ['--server', s]), '--root', root, '--json'])
  expect(r.code).toBe(0)
  return {root, id: r.json.checkpoint_id}
}

describe('verify without oclif: the same answers as through oclif', {timeout: 120_000}, () => {
  it('a valid checkpoint, every spelling the fast path takes', async () => {
    const {root, id} = await checkpointRoot()
    for (const args of [
      ['verify', root],
      ['verify', root, '--json'],
      ['verify', '--json', root, '--no-color'],
      ['verify', root, '--id', id],
      ['verify', root, `--id=${id}`, '--json'],
      ['verify', '--root', root],
      ['verify', `--root=${root}`, root, '--json'],
      ['verify', path.join(root, id), '--color'],
    ]) {
      const r = await bothPaths(args)
      expect(r.code, args.join(' ')).toBe(0)
    }
    // Colour forced on: the same escape codes either way.
    expect((await bothPaths(['verify', root], {NO_COLOR: '', FORCE_COLOR: '1'})).stdout).toContain('\u001b[')
    // The flag beats the environment, either way round.
    expect((await bothPaths(['verify', root, '--no-color'], {NO_COLOR: '', FORCE_COLOR: '1'})).stdout).not.toContain('\u001b[')
    expect((await bothPaths(['verify', root, '--color'], {NO_COLOR: '1', FORCE_COLOR: '0'})).stdout).toContain('\u001b[32mvalid\u001b[39m')
  })

  it('failures: an invalid checkpoint, an unknown ID, a missing directory exit as through oclif, JSON and human', async () => {
    const {root, id} = await checkpointRoot()
    const dir = path.join(root, id, 'gym', 'environment')
    const [instance] = await readdir(dir)
    const records = (await readdir(path.join(dir, instance!))).find((f) => f.startsWith('records-'))!
    const file = path.join(dir, instance!, records)
    await writeFile(file, (await readFile(file, 'utf8')) + '{"broken":\n')
    for (const args of [
      ['verify', root],
      ['verify', root, '--json'],
      ['verify', root, '--id', 'nope'],
      ['verify', root, '--id', 'nope', '--json'],
      ['verify', path.join(root, 'missing')],
      ['verify', path.join(root, 'missing'), '--json'],
    ]) {
      const r = await bothPaths(args)
      expect(r.code, args.join(' ')).toBe(6)
    }
  })

  it('lines it leaves to oclif still work: help, a bad --id, an unknown flag, two roots, the root from GYMCKPT_ROOT', async () => {
    const {root} = await checkpointRoot()
    expect((await bothPaths(['verify', '--help'])).code).toBe(0)
    expect((await bothPaths(['verify', root, '--id', 'a/b', '--json'])).code).toBe(2)
    expect((await bothPaths(['verify', root, '--frobnicate'])).code).toBe(2)
    expect((await bothPaths(['verify', root, '--root', path.join(root, 'x'), '--json'])).code).toBe(2)
    expect((await bothPaths(['verify', '--json'], {GYMCKPT_ROOT: root})).code).toBe(0)
  })
})

describe('the fast path is taken', {timeout: 60_000}, () => {
  it('verify of a named checkpoint loads no oclif module; with GYMCKPT_NO_FAST_PATH=1 it does', async () => {
    const {root} = await checkpointRoot()
    const loads = async (env: Record<string, string>) => {
      const trace = path.join(await tempDir(), 'trace.txt')
      const r = spawnSync(process.execPath, ['--import', path.resolve('bench/trace-imports.mjs'), BIN, 'verify', root], {env: {...process.env, ...env, TRACE_FILE: trace}, encoding: 'utf8'})
      expect(r.status, r.stderr).toBe(0)
      return (await readFile(trace, 'utf8')).split('\n').filter((u) => u.includes('/node_modules/@oclif/core/')).length
    }
    expect(await loads({})).toBe(0)
    expect(await loads({GYMCKPT_NO_FAST_PATH: '1'})).toBeGreaterThan(0)
  })
})

describe('fastVerifyArgs: which command lines the fast path takes', () => {
  it.each([
    [['/r'], {location: '/r', id: undefined, json: false}],
    [['/r', '--json', '--no-color'], {location: '/r', id: undefined, json: true}],
    [['--id', 'c1', '/r'], {location: '/r', id: 'c1', json: false}],
    [['--id=c1', '--root=/r'], {location: '/r', id: 'c1', json: false}],
    [['/r', '--root', '/r'], {location: '/r', id: undefined, json: false}],
  ])('takes %j', (argv, want) => {
    expect(fastVerifyArgs(argv, {})).toEqual(want)
  })

  it.each([
    [[], 'no checkpoint named (the root may come from the environment or the config file)'],
    [['--json'], 'no checkpoint named'],
    [['/r', '/s'], 'two positionals'],
    [['/r', '--root', '/s'], 'two different roots'],
    [['/r', '--id'], '--id without a value'],
    [['/r', '--id', '--json'], '--id followed by a flag'],
    [['/r', '--id', 'a', '--id', 'b'], '--id twice'],
    [['/r', '--id', 'a/b'], 'an invalid checkpoint ID (oclif names it)'],
    [['/r', '--id', 'x'.repeat(129)], 'a checkpoint ID longer than 128'],
    [['/r', '--help'], 'help'],
    [['/r', '-h'], 'help'],
    [['/r', '--config', 'c.yaml'], 'another flag'],
    [['/r', '--json=true'], 'a boolean flag with a value'],
    [['/r', '--'], 'the end of flags'],
    [[''], 'an empty location'],
  ])('leaves %j to oclif: %s', (argv) => {
    expect(fastVerifyArgs(argv, {})).toBeNull()
  })

  it("leaves everything to oclif when GYMCKPT_CONTENT_TYPE (oclif's JSON switch) is set", () => {
    expect(fastVerifyArgs(['/r'], {GYMCKPT_CONTENT_TYPE: 'json'})).toBeNull()
  })
})
