import http from 'node:http'
import {AddressInfo} from 'node:net'
import {readdir} from 'node:fs/promises'

import {describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {cli} from '../helpers/cli.js'
import {FULL, TOKEN, later, startFleet, startServer, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const servers = (fleet: {serverArgs(): string[]}) => fleet.serverArgs().flatMap((s) => ['--server', s])

/** A policy model that answers GET status without a bearer: it fails auth.missing-bearer only. */
async function noAuthOnStatus(): Promise<string> {
  const inner = await startServer('p', 'model')
  const proxy = http.createServer((req, res) => {
    const headers: Record<string, string> = {'content-type': 'application/json', authorization: req.headers.authorization ?? `Bearer ${TOKEN}`}
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      void fetch(inner.url + req.url, {method: req.method, headers, body: req.method === 'POST' ? Buffer.concat(chunks) : undefined})
        .then(async (r) => {
          res.writeHead(r.status, {'content-type': 'application/json'})
          res.end(await r.text())
        })
        .catch(() => res.destroy())
    })
  })
  await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r))
  later(() => new Promise((r) => proxy.close(r)))
  return `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`
}

describe('gymckpt conformance (built, run as a process)', () => {
  it('exits 0 on the built-in fleet: a table of checks (safe), and the whole report with --json (destructive)', async () => {
    const fleet = await startFleet({members: FULL})
    const human = await cli(['conformance', ...servers(fleet)])
    expect(human.code, human.stderr).toBe(0)
    expect(human.stdout).toMatch(/CHECK\s+SECTION\s+SERVER\s+RESULT\s+MESSAGE/)
    expect(human.stdout).toMatch(/auth\.missing-bearer\s+§1\s+env\s+pass\s+401 unauthorized/)
    expect(human.stdout).toMatch(/phase\.prepare\s+§3\.1, §4\.2\s+\*\s+skip/)
    expect(human.stderr).toMatch(/conformance: 64 passed, 0 failed, 21 skipped on 4 participant\(s\)/)
    expect(human.stdout + human.stderr).not.toContain(TOKEN)

    const dir = await tempDir()
    const json = await cli(['conformance', ...servers(fleet), '--destructive', '--dir', dir, '--json'])
    expect(json.code, json.stderr).toBe(0)
    expect(json.json).toMatchObject({ok: true, passed: true, destructive: true, interrupted: false, checkpoint_dir: null})
    expect(json.json.participants.map((p: {server: string}) => p.server)).toEqual(['env', 'policy', 'agent', 'res'])
    expect(json.json.checks.filter((c: {result: string}) => c.result === 'fail')).toEqual([])
    expect(json.json.counts.pass).toBeGreaterThan(130)
    expect(json.json.checks[0]).toEqual({id: 'auth.missing-bearer', section: '§1', rule: expect.stringContaining('401'), server: 'env', result: 'pass', message: '401 unauthorized'})
    expect(await readdir(dir)).toEqual([])
    for (const s of fleet.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
  })

  it('exits 4 naming the failing check and server; --json carries the report', async () => {
    const url = await noAuthOnStatus()
    const r = await cli(['conformance', '--server', `p=${url}`])
    expect(r.code).toBe(4)
    expect(r.stdout).toMatch(/auth\.missing-bearer\s+§1\s+p\s+FAIL\s+without Authorization: HTTP 200/)
    expect(r.stderr).toContain('fail auth.missing-bearer on p: §1 GET status without Authorization')
    expect(r.stderr).toContain('error: 1 conformance check(s) failed: auth.missing-bearer (p)')
    const j = await cli(['conformance', '--server', `p=${url}`, '--json'])
    expect(j.code).toBe(4)
    expect(j.json).toMatchObject({ok: false, error: {code: 'participant', exit_code: 4}})
    expect(j.json.error.details.checks.filter((c: {result: string}) => c.result === 'fail').map((c: {id: string}) => c.id)).toEqual(['auth.missing-bearer'])
  })

  it('--destructive is refused (exit 8, nothing sent) on a fleet holding live work; bad --only exits 2; --list needs no fleet', async () => {
    const fleet = await startFleet({members: FULL})
    void fleet.run({rolloutId: 'busy', steps: 400, stepMs: 10})
    await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === 1)
    const r = await cli(['conformance', ...servers(fleet), '--destructive'])
    expect(r.code).toBe(8)
    expect(r.stderr).toMatch(/env holds 1 episodes.*add --force; nothing was sent/)
    expect(fleet.servers.flatMap((s) => s.journal.filter((j) => !['status', 'run', 'data'].includes(j.route)))).toEqual([])
    expect((await cli(['conformance', ...servers(fleet), '--only', 'nope'])).code).toBe(2)
    const list = await cli(['conformance', '--list', '--only', 'fence', '--json'])
    expect(list.code).toBe(0)
    expect(list.json.checks.map((c: {id: string}) => c.id)).toEqual(['fence.conflict', 'fence.stale-prepare', 'fence.resume-unknown', 'fence.window'])
  })

  it('SIGINT mid-check: exits 130 and every participant is resumed', async () => {
    const fleet = await startFleet({members: FULL})
    // The policy model holds its checkpoint open while its renew (sent only while prepared) is delayed.
    fleet.server('policy').faults.add('renew', {type: 'delay', ms: 1500})
    const policy = fleet.server('policy').controlPlane!
    const r = await cli(['conformance', ...servers(fleet), '--destructive', '--json'], {
      onSpawn: (p) => {
        void waitFor(() => policy.phase === 'prepared', 15_000, 'policy prepared').then(() => p.kill('SIGINT'))
      },
    })
    expect(r.code).toBe(130)
    expect(r.json).toMatchObject({ok: false, error: {code: 'interrupted', exit_code: 130}})
    expect(r.json.error.details.interrupted).toBe(true)
    // The delayed renew lands after the resume: it is refused as stale, and nothing stays open.
    await new Promise((res) => setTimeout(res, 1600))
    for (const s of fleet.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
  })
})
