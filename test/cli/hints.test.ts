import {writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {Fleet} from '../../src/control-plane/fleet.js'
import {SimEnvironment} from '../../src/control-plane/sim.js'
import {CliResult, cli} from '../helpers/cli.js'
import {FULL, control, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

/**
 * Every next step gymckpt prints must work when pasted: each test runs the printed line itself.
 * Lines are printed only with characters that need no quoting here (temp paths, URLs, IDs).
 */
async function fleetFile(fleet: Fleet): Promise<string> {
  const dir = await tempDir()
  const f = path.join(dir, 'fleet.yaml')
  await writeFile(f, `servers:\n${fleet.servers.map((s) => `  ${s.name}: ${s.url}`).join('\n')}\n`)
  return f
}

function argv(line: string): string[] {
  expect(line).toMatch(/^gymckpt /)
  expect(line).not.toMatch(/['"\\]/)
  return line.split(' ').slice(1)
}

async function paste(line: string, input?: string): Promise<CliResult> {
  return cli([...argv(line), '--json'], {input})
}

const phases = async (fleet: Fleet) => Promise.all(fleet.servers.slice(0, 4).map(async (s) => (await control(s.url, 'status')).json.phase as string))

describe('printed next steps work when pasted', () => {
  it('a second prepare while one is open is refused before anything is sent, and names the open checkpoint to resume', async () => {
    const fleet = await startFleet({members: FULL})
    const f = await fleetFile(fleet)
    const first = await cli(['prepare', '--fleet', f, '--id', 'ckpt-first', '--json'])
    expect(first.code, first.stderr).toBe(0)
    const second = await cli(['prepare', '--fleet', f, '--json'])
    expect(second.code).toBe(8)
    expect(second.json.error.message).toMatch(/another checkpoint is open: 'ckpt-first' on env \(prepared\)/)
    expect(second.json.error.next).toEqual([`gymckpt resume --id ckpt-first --fleet ${f}`])
    expect(fleet.servers.flatMap((s) => s.journal.filter((j) => j.route === 'prepare'))).toHaveLength(4)
    const r = await paste(second.json.error.next[0])
    expect(r.code, r.stdout).toBe(0)
    expect(await phases(fleet)).toEqual(['idle', 'idle', 'idle', 'idle'])
  })

  it('prepare prints the commit and resume lines with the fleet flag; both work as printed', async () => {
    const fleet = await startFleet({members: FULL})
    const f = await fleetFile(fleet)
    const root = await tempDir()
    const prep = await cli(['prepare', '--fleet', f, '--root', root, '--json'])
    expect(prep.code, prep.stderr).toBe(0)
    const id = prep.json.checkpoint_id as string
    // The commit line reads its scope from stdin (the trainer's episodes in flight).
    expect(prep.json.next).toEqual([`gymckpt commit --id ${id} --root ${root} --episodes-file - --fleet ${f}`, `gymckpt resume --id ${id} --fleet ${f}`])
    const commit = await paste(prep.json.next[0], '')
    expect(commit.code, commit.stdout).toBe(0)
    expect(commit.json.next).toEqual([`gymckpt resume --id ${id} --fleet ${f}`])
    const resume = await paste(commit.json.next[0])
    expect(resume.code, resume.stdout).toBe(0)
    expect(await phases(fleet)).toEqual(['idle', 'idle', 'idle', 'idle'])
  })

  it('commit without a scope is refused, leaves the fleet prepared, and prints the commit with one and the resume; the commit works as printed', async () => {
    const fleet = await startFleet({members: FULL})
    const f = await fleetFile(fleet)
    const root = await tempDir()
    const prep = await cli(['prepare', '--fleet', f, '--root', root, '--json'])
    const id = prep.json.checkpoint_id as string
    const none = await cli(['commit', '--fleet', f, '--root', root, '--json'])
    expect(none.code).toBe(2)
    expect(none.json.error.message).toMatch(/^no commit scope: the policy model policy refuses/)
    expect(none.json.error.next).toEqual([`gymckpt commit --id ${id} --root ${root} --episodes-file - --fleet ${f}`, `gymckpt resume --id ${id} --fleet ${f}`])
    expect(await phases(fleet)).toEqual(['prepared', 'prepared', 'prepared', 'prepared'])
    const commit = await paste(none.json.error.next[0], '')
    expect(commit.code, commit.stdout).toBe(0)
    expect((await paste(commit.json.next[0])).code).toBe(0)
    expect(await phases(fleet)).toEqual(['idle', 'idle', 'idle', 'idle'])
  })

  it('resume of an ID that is not the open one names the open one, which then works', async () => {
    const fleet = await startFleet({members: FULL})
    const f = await fleetFile(fleet)
    expect((await cli(['prepare', '--fleet', f, '--id', 'ckpt-open', '--json'])).code).toBe(0)
    const bogus = await cli(['resume', '--fleet', f, '--id', 'ckpt-bogus', '--json'])
    expect(bogus.code).toBe(4)
    expect(bogus.json.error.message).toMatch(/hold another checkpoint \(ckpt-open\)/)
    expect(bogus.json.error.next).toEqual([`gymckpt resume --id ckpt-open --fleet ${f}`])
    const r = await paste(bogus.json.error.next[0])
    expect(r.code, r.stdout).toBe(0)
    expect(await phases(fleet)).toEqual(['idle', 'idle', 'idle', 'idle'])
  })

  it('a failed one-shot checkpoint says the fleet was resumed and prints the same command again, which then succeeds', async () => {
    const fleet = await startFleet({members: FULL})
    const f = await fleetFile(fleet)
    const root = await tempDir()
    fleet.server('policy').faults.add('commit', {type: 'status', status: 500})
    const failed = await cli(['checkpoint', '--episodes-file', '/dev/null', '--fleet', f, '--root', root, '--json'])
    expect(failed.code).toBe(4)
    expect(failed.json.error.message).toMatch(/nothing was published; the fleet was resumed/)
    expect(failed.json.error.message).not.toMatch(/retry the commit/)
    expect(failed.json.error.next).toEqual([`gymckpt checkpoint --root ${root} --episodes-file /dev/null --fleet ${f}`])
    expect(await phases(fleet)).toEqual(['idle', 'idle', 'idle', 'idle'])
    const again = await paste(failed.json.error.next[0])
    expect(again.code, again.stdout).toBe(0)
    expect(again.json.published).toBe(true)
    expect(again.json).toMatchObject({schema_version: 3, warnings: []})
    expect(failed.json).toMatchObject({ok: false, schema_version: 3, warnings: []})
  })

  it('a member killed between prepare and commit: commit resumes every reachable participant and names the dead one', async () => {
    const fleet = await startFleet({members: FULL})
    const f = await fleetFile(fleet)
    const root = await tempDir()
    void fleet.run({rolloutId: 'a', steps: 200, stepMs: 5})
    await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === 1)
    const prep = await cli(['prepare', '--fleet', f, '--root', root, '--json'])
    expect(prep.code, prep.stderr).toBe(0)
    await fleet.server('agent').crash()
    const commit = await paste(prep.json.next[0], 'a\n')
    expect(commit.code).toBe(3)
    expect(commit.json.error.message).toMatch(/cannot be committed: agent is down/)
    expect(commit.json.error.message).toMatch(/nothing was committed/)
    const alive = ['env', 'policy', 'res'].map((n) => fleet.server(n).url)
    for (const u of alive) expect((await control(u, 'status')).json.phase).toBe('idle')
    // The one next step: resume again once the agent is back (it names the ID).
    expect(commit.json.error.next).toEqual([`gymckpt resume --id ${prep.json.checkpoint_id} --fleet ${f}`])
  })

  it('restore --no-resume prints the resume line for the restore ID, which reopens the fleet', {timeout: 90_000}, async () => {
    const fleet = await startFleet({members: FULL})
    const f = await fleetFile(fleet)
    const root = await tempDir()
    expect((await cli(['checkpoint', '--episodes-file', '/dev/null', '--fleet', f, '--root', root, '--json'])).code).toBe(0)
    await fleet.crash()
    const fresh = await startFleet({members: FULL})
    const f2 = await fleetFile(fresh)
    const r = await cli(['restore', root, '--fleet', f2, '--no-resume', '--json'])
    expect(r.code, r.stdout).toBe(0)
    expect(r.json.next).toEqual([`gymckpt resume --id ${r.json.restore_id} --fleet ${f2}`])
    expect(await phases(fresh)).toEqual(['restored', 'restored', 'restored', 'restored'])
    const resumed = await paste(r.json.next[0])
    expect(resumed.code, resumed.stdout).toBe(0)
    expect(await phases(fresh)).toEqual(['idle', 'idle', 'idle', 'idle'])
  })
})
