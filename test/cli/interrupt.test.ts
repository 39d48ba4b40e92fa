// SIGINT while checkpoint's preflight waits on a participant's status: the interrupt is reported
// (exit 130, nothing sent), not an unreachable fleet (exit 3). The full suite found it: an abort
// that landed during the preflight was reported as a discovery failure.
import {describe, expect, it} from 'vitest'

import type {Fault} from '../../src/control-plane/faults.js'
import {cli} from '../helpers/cli.js'
import {FULL, control, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

describe('an interrupt during the preflight', {timeout: 60_000}, () => {
  it('checkpoint: SIGINT while a status call of the preflight hangs exits 130 as interrupted, nothing prepared', async () => {
    const fleet = await startFleet({members: FULL})
    const res = fleet.server('res')
    // Discovery's status call is answered; the preflight's (the second) hangs.
    let calls = 0
    const take = res.faults.take.bind(res.faults)
    res.faults.take = (route: string): Fault | undefined => (route === 'status' && ++calls === 2 ? {type: 'hang'} : take(route))
    let proc: ReturnType<typeof import('node:child_process').spawn> | undefined
    const run = cli(['checkpoint', '--episodes-file', '/dev/null', ...fleet.serverArgs().flatMap((s) => ['--server', s]), '--root', await tempDir(), '--json'], {onSpawn: (p) => (proc = p)})
    await waitFor(() => calls >= 2, 30_000, 'the preflight status call')
    proc!.kill('SIGINT')
    const r = await run
    expect(r.code, r.stdout).toBe(130)
    expect(r.json.error).toMatchObject({code: 'interrupted', message: expect.stringContaining('nothing was sent')})
    for (const s of fleet.servers.filter((x) => x.name !== 'judge')) {
      expect(s.journal.map((j) => j.route).filter((x) => x !== 'status')).toEqual([])
      expect((await control(s.url, 'status')).json.phase).toBe('idle')
    }
  })
})

describe('one signal delivered twice', {timeout: 60_000}, () => {
  it('checkpoint: two SIGINTs 5 ms apart (a terminal and a wrapper forwarding it) are one interrupt: the fleet is resumed, exit 130', async () => {
    const fleet = await startFleet({members: FULL})
    // An episode in a long step: prepare waits for its boundary.
    void fleet.run({rolloutId: 'slow', steps: 2, stepMs: 30_000})
    await waitFor(() => fleet.server('env').participant!.report().blockers.length === 1, 10_000, 'the episode running')
    let proc: ReturnType<typeof import('node:child_process').spawn> | undefined
    const run = cli(['checkpoint', '--episode', 'slow', ...fleet.serverArgs().flatMap((s) => ['--server', s]), '--root', await tempDir(), '--timeout', '60', '--json'], {onSpawn: (p) => (proc = p)})
    await waitFor(() => fleet.server('env').journal.some((j) => j.route === 'prepare'), 30_000, 'prepare sent')
    proc!.kill('SIGINT')
    await new Promise((r) => setTimeout(r, 5))
    proc!.kill('SIGINT')
    const r = await run
    expect(r.code, r.stderr).toBe(130)
    expect(r.json.error.code).toBe('interrupted')
    expect(r.stderr).not.toContain('exiting at once')
    for (const s of fleet.servers.filter((x) => x.controlPlane)) expect((await control(s.url, 'status')).json.phase, s.name).toBe('idle')
    expect(fleet.server('env').journal.some((j) => j.route === 'resume')).toBe(true)
  })
})

describe('a fan-out cut short by the interrupt', {timeout: 60_000}, () => {
  it('discover and resume: SIGINT while a call hangs exits 130 as interrupted (not 3 or 4), naming what was cut short', async () => {
    const fleet = await startFleet({members: FULL})
    const args = fleet.serverArgs().flatMap((s) => ['--server', s])
    for (const [command, route, calls] of [
      [['discover'], 'status', () => 1],
      [['resume', '--id', 'ck-x'], 'resume', () => fleet.server('res').journal.filter((j) => j.route === 'status').length],
    ] as const) {
      const res = fleet.server('res')
      let hung = false
      const take = res.faults.take.bind(res.faults)
      // Discovery's status call hangs for discover; the resume call hangs for resume.
      res.faults.take = (r: string): Fault | undefined => (r === route && !hung ? ((hung = true), {type: 'hang'}) : take(r))
      let proc: ReturnType<typeof import('node:child_process').spawn> | undefined
      const run = cli([...command, ...args, '--json'], {onSpawn: (p) => (proc = p)})
      await waitFor(() => hung && calls() >= 1, 30_000, `${route} sent`)
      await new Promise((r) => setTimeout(r, 100))
      proc!.kill('SIGINT')
      const r = await run
      expect(r.code, `${command[0]}: ${r.stdout}`).toBe(130)
      expect(r.json.error.code).toBe('interrupted')
      expect(r.json.error.message).toMatch(/^interrupted: /)
      expect(r.json.error.details.failures.find((f: {server: string}) => f.server === 'res').code).toBe('interrupted')
      res.faults.take = take
    }
  })
})
