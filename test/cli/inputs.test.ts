import {mkdir, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CliResult, cli} from '../helpers/cli.js'
import {FULL, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const STACK_LINE = /^\s{4}at /m
// Several processes start at once; on 2 busy cores one may take a while.
const SLOW = 60_000

/** Exit 2 with an 'input' error whose message starts with `prefix`, in JSON on stdout, and no stack trace anywhere. */
function refusedInput(r: CliResult, prefix: string): void {
  expect(r.code, r.stdout + r.stderr.slice(0, 2000)).toBe(2)
  expect(r.json?.ok).toBe(false)
  expect(r.json.error.code).toBe('input')
  expect(r.json.error.message.startsWith(prefix), r.json.error.message).toBe(true)
  expect(r.stdout + r.stderr).not.toMatch(STACK_LINE)
}

/** Exit 6 with a clear message naming the path, and no stack trace. */
function refusedState(r: CliResult, message: string): void {
  expect(r.code, r.stdout + r.stderr).toBe(6)
  expect(r.json.error.code).toBe('invalid_checkpoint')
  expect(r.json.error.message).toContain(message)
  expect(r.stdout + r.stderr).not.toMatch(STACK_LINE)
}

describe('bad input: exit 2, a message naming what and where, nothing sent, no stack trace', () => {
  it('retire and forget refuse bad episode and rollout lists before contacting the fleet', async () => {
    const fleet = await startFleet({members: FULL})
    const servers = fleet.serverArgs().flatMap((s) => ['--server', s])
    const dir = await tempDir()
    const notUtf8 = path.join(dir, 'eps')
    await writeFile(notUtf8, Buffer.from([0x61, 0x0a, 0x62, 0xff, 0x0a]))
    const huge = 'r'.repeat(24 << 20) + '!'
    const retire = (input: string) => cli(['retire', ...servers, '--episodes', '-', '--json'], {input, timeoutMs: SLOW})
    const [nul, nums, unknownKey, beyond, hugeLine, badBytes, badId, rolloutFile, human] = await Promise.all([
      retire('[null]'),
      retire('[1, 2]'),
      retire('[{"rollout_id": "r", "x": 1}]'),
      retire('ok\nr-a99999999999\n'),
      retire(`${huge}\n`),
      cli(['retire', ...servers, '--episodes', notUtf8, '--json'], {timeoutMs: SLOW}),
      cli(['retire', ...servers, '--episode', 'r', '--id', '../x', '--json'], {timeoutMs: SLOW}),
      cli(['forget', ...servers, '--rollouts', '-', '--json'], {input: 'r7\nr9-a1\n', timeoutMs: SLOW}),
      cli(['retire', ...servers, '--episodes', '-'], {input: '{"rollout_id": ""}\n', timeoutMs: SLOW}),
    ])
    refusedInput(nul, "stdin: array index 0: 'null': not an episode: expected a string (r, r-a2 or r@2) or an object")
    refusedInput(nums, "stdin: array index 0: '1': not an episode")
    refusedInput(unknownKey, `stdin: array index 0: '{"rollout_id":"r","x":1}': not an episode: unknown key 'x'`)
    refusedInput(beyond, "stdin:2: 'r-a99999999999': attempt 99999999999 is beyond the largest attempt, 2147483647")
    refusedInput(hugeLine, `stdin:1: '${'r'.repeat(200)}…' (25165825 characters in all): a rollout ID must match`)
    expect(hugeLine.stdout.length).toBeLessThan(1000)
    expect(hugeLine.stderr.length).toBeLessThan(1000)
    refusedInput(badBytes, `${notUtf8}:2: not UTF-8 text: 'b\ufffd'`)
    refusedInput(badId, "--id '../x': a checkpoint ID is 1 to 128 characters")
    refusedInput(rolloutFile, "stdin:2: 'r9-a1': a rollout ID must not end with the reserved attempt suffix -a<N>")
    expect(human.code).toBe(2)
    expect(human.stdout).toBe('')
    expect(human.stderr).toBe(`error: stdin:1: '{"rollout_id": ""}': not an episode: rollout_id '': the rollout ID is empty\n`)

    // Nothing reached any server; the same fleet does hear a good retire.
    expect(fleet.servers.map((s) => s.journal.length)).toEqual(fleet.servers.map(() => 0))
    const ok = await retire('[{"rollout_id": "r", "attempt": 1}, "s@2", "t-a3", "null"]')
    expect(ok.code, ok.stdout).toBe(0)
    expect(ok.json.episode_count).toBe(4)
    expect(fleet.servers.some((s) => s.journal.some((j) => j.route === 'retire'))).toBe(true)
  }, 120_000)

  it('durations are bounded: --timeout and --probe-timeout out of range exit 2, naming the flag and bound', async () => {
    const args = ['retire', '--server', 'policy_model=http://127.0.0.1:1', '--episode', 'r', '--json']
    const [huge, zero, probe, help] = await Promise.all([
      cli([...args, '--timeout', '99999999999'], {timeoutMs: SLOW}),
      cli([...args, '--timeout', '0'], {timeoutMs: SLOW}),
      cli([...args, '--probe-timeout', '3601'], {timeoutMs: SLOW}),
      cli(['retire', '--help'], {timeoutMs: SLOW}),
    ])
    refusedInput(huge, '--timeout: Expected')
    expect(huge.json.error.message).toContain('Expected an integer less than or equal to 86400 but received: 99999999999')
    expect(huge.stderr).not.toContain('TimeoutOverflowWarning')
    refusedInput(zero, '--timeout: Expected')
    expect(zero.json.error.message).toContain('greater than or equal to 1')
    refusedInput(probe, '--probe-timeout: Expected')
    expect(probe.json.error.message).toContain('less than or equal to 3600')
    expect(help.code).toBe(0)
    expect(help.stdout).toContain('1 to 86400 (1 day)')
    expect(help.stdout).toContain('1 to 3600 (1 hour)')
  }, 120_000)
})

describe('a broken checkpoint root: exit 6 (invalid_checkpoint), a message naming the path and cause, no stack trace', () => {
  it('verify and prune with LATEST a directory, a root that is a file, a gym/ that is a file, LATEST garbage or not UTF-8', async () => {
    const latestDir = await tempDir()
    await mkdir(path.join(latestDir, 'LATEST'))
    const parent = await tempDir()
    const file = path.join(parent, 'file')
    await writeFile(file, 'not a root')
    const gymFile = await tempDir()
    await writeFile(path.join(gymFile, 'gym'), 'x')
    const garbage = await tempDir()
    await writeFile(path.join(garbage, 'LATEST'), 'no such id!\n')
    const bytes = await tempDir()
    await writeFile(path.join(bytes, 'LATEST'), Buffer.from([0x63, 0xff, 0x0a]))
    const run = (...args: string[]) => cli([...args, '--json'], {timeoutMs: SLOW})
    const [vLatest, pLatest, vFile, pFile, vGym, pGarbage, vBytes, humanLatest] = await Promise.all([
      run('verify', latestDir),
      run('prune', latestDir),
      run('verify', file),
      run('prune', file),
      run('verify', gymFile),
      run('prune', garbage, '--yes'),
      run('verify', bytes),
      cli(['verify', latestDir], {timeoutMs: SLOW}),
    ])
    const isDir = `cannot read ${path.join(latestDir, 'LATEST')}: it is a directory, not a file (EISDIR)`
    refusedState(vLatest, isDir)
    refusedState(pLatest, isDir)
    refusedState(vFile, `${file} is not a directory`)
    refusedState(pFile, `checkpoint root ${file} is not a directory`)
    refusedState(vGym, `${path.join(gymFile, 'gym')} is not a directory`)
    refusedState(pGarbage, `${path.join(garbage, 'LATEST')} names no valid checkpoint ID: 'no such id!'`)
    refusedState(vBytes, `${path.join(bytes, 'LATEST')} is not UTF-8 text`)
    expect(humanLatest.code).toBe(6)
    expect(humanLatest.stderr).toBe(`error: ${isDir}\n`)
  }, 120_000)

  it('a LATEST written by echo (trailing newline) keeps working', async () => {
    const root = await tempDir()
    for (const [id, at] of [
      ['c1', 100],
      ['c2', 200],
    ] as const) {
      await mkdir(path.join(root, id, 'gym'), {recursive: true})
      await writeFile(path.join(root, id, 'gymckpt.json'), JSON.stringify({format_version: 1, checkpoint_id: id, created_at: at, continued: [], restarted: [], participants: []}))
    }
    await writeFile(path.join(root, 'LATEST'), 'c1\n')
    const r = await cli(['prune', root, '--keep', '1', '--json'])
    expect(r.code, r.stdout).toBe(0)
    expect(r.json.latest).toBe('c1')
    expect(r.json.keep.map((e: {name: string}) => e.name).sort()).toEqual(['c1', 'c2'])
  })
})
