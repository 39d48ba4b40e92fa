// Issue 7, item 6: every command's --json output (the built CLI, real fleets on 127.0.0.1, real
// temp roots) parses with its documented schema in src/cli/json-schemas.ts. The schemas are
// strict objects, so a field that is not documented fails here; the README's "JSON output"
// section must be exactly what the schemas render.
import {readFile, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'
import {z} from 'zod'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {COMMAND_FIELDS, CommandName, ErrorJson, renderJsonDocs, successSchema} from '../../src/cli/json-schemas.js'
import {CliResult, cli} from '../helpers/cli.js'
import {makeRows, workdir} from '../helpers/collect-kit.js'
import {FULL, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const REPO = path.resolve(import.meta.dirname, '../..')
const seen = new Set<string>()
/** The process tests that ran to their end (a filtered run, -t, checks only what it ran). */
let finished = 0

function servers(fleet: {serverArgs(): string[]}): string[] {
  return fleet.serverArgs().flatMap((s) => ['--server', s])
}

/** Objects keyed by data (a server, a checkpoint ID, a wire count name), not by field names. */
const MAPS = new Set(['restored', 'counts', 'open', 'blockers'])

/** Every field name of a document, nested: the contract is snake_case (no capitals, no dashes). */
function keysOf(v: unknown, at = '$'): string[] {
  if (Array.isArray(v)) return v.flatMap((x, i) => keysOf(x, `${at}[${i}]`))
  if (v === null || typeof v !== 'object') return []
  const map = MAPS.has(at.split('.').pop()!)
  return Object.entries(v).flatMap(([k, x]) => [...(map ? [] : [`${at}.${k}`]), ...keysOf(x, `${at}.${map ? '*' : k}`)])
}

function parses(schema: z.ZodType, r: CliResult, what: string): void {
  expect(r.json, `${what}: stdout is one JSON document: ${r.stdout.slice(0, 400)} ${r.stderr.slice(0, 400)}`).toBeDefined()
  const p = schema.safeParse(r.json)
  if (!p.success) throw new Error(`${what}: --json does not match its documented schema: ${z.prettifyError(p.error)}\n${JSON.stringify(r.json).slice(0, 2000)}`)
  const bad = keysOf(r.json).filter(
    (k) =>
      !/^[a-z0-9_]+$/.test(
        k
          .split('.')
          .pop()!
          .replace(/\[\d+\]$/, ''),
      ),
  )
  expect(bad, `${what}: keys that are not snake_case`).toEqual([])
}

/** Runs one command with --json and checks its success document. */
async function ok(command: CommandName, args: string[], opts: Parameters<typeof cli>[1] = {}): Promise<CliResult> {
  const r = await cli([...command.split(' '), ...args, '--json'], opts)
  expect(r.code, `${command}: ${r.stdout.slice(0, 600)} ${r.stderr.slice(0, 600)}`).toBe(0)
  parses(successSchema(command), r, command)
  seen.add(command)
  return r
}

/** Runs one command with --json that must fail, and checks its error document. */
async function fails(command: string, args: string[], exit: number, opts: Parameters<typeof cli>[1] = {}): Promise<CliResult> {
  const r = await cli([...command.split(' '), ...args, '--json'], opts)
  expect(r.code, `${command}: ${r.stdout.slice(0, 600)}`).toBe(exit)
  parses(ErrorJson, r, `${command} (error)`)
  expect(r.json.error.exit_code).toBe(exit)
  return r
}

describe('the --json contract (every command, parsed with its documented schema)', {timeout: 120_000}, () => {
  it('fleet commands: discover, status, prepare, renew, commit, resume, checkpoint, retire, forget, and their errors', async () => {
    const fleet = await startFleet({members: FULL, head: true})
    for (const r of ['a', 'b']) void fleet.run({rolloutId: r, steps: 100_000, stepMs: 10})
    await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === 2)
    const root = await tempDir()
    const s = servers(fleet)

    const d = await ok('discover', ['--head', fleet.headUrl!])
    expect(d.json.skipped).toEqual([{server: 'judge', url: expect.any(String)}])
    await ok('status', s)
    const prep = await ok('prepare', [...s, '--root', root])
    expect(prep.json.restarted).toEqual([])
    const id = prep.json.checkpoint_id
    await fails('prepare', s, 8)
    const renew = await ok('renew', [...s, '--id', id, '--timeout', '600'])
    expect(renew.json.participants.map((p: {server: string}) => p.server)).toEqual(['env', 'policy', 'agent', 'res'])
    const commit = await ok('commit', [...s, '--root', root, '--episodes-file', '-'], {input: 'a\nb\n'})
    expect(commit.json.participants.map((p: {server: string}) => p.server)).toEqual(['env', 'policy', 'agent', 'res'])
    const resume = await ok('resume', [...s, '--id', id])
    expect(resume.json.participants.every((p: {idempotent: boolean}) => !p.idempotent)).toBe(true)
    await fails('commit', [...s, '--root', root], 8)
    const ck = await ok('checkpoint', [...s, '--root', root, '--episodes-file', '-'], {input: 'a\n'})
    expect(ck.json.timings).toHaveLength(4)

    const dryRetire = await ok('retire', [...s, '--episode', 'zz', '--dry-run'])
    expect(dryRetire.json).toMatchObject({dry_run: true, episode_count: 1, participant_count: 4})
    expect((await ok('retire', [...s, '--episode', 'zz'])).json).toEqual({ok: true, schema_version: 3, warnings: [], dry_run: false, episode_count: 1, participant_count: 4})
    expect((await ok('forget', [...s, '--rollout', 'zz', '--dry-run'])).json).toMatchObject({dry_run: true, rollout_count: 1})
    expect((await ok('forget', [...s, '--rollout', 'zz'])).json).toMatchObject({dry_run: false, rollout_count: 1, participant_count: 4})
    await fails('retire', [...s], 2)
    await fails('status', ['--server', 'x=http://127.0.0.1:1'], 3)
    finished++
  })

  it('restore (dry run and real, its timings) into a fresh fleet, then the offline commands on that root', async () => {
    const fleet = await startFleet({members: FULL})
    void fleet.run({rolloutId: 'a', steps: 100_000, stepMs: 10})
    await waitFor(() => (fleet.server('env').participant as SimEnvironment).episodes.size === 1)
    const root = await tempDir()
    await ok('checkpoint', [...servers(fleet), '--root', root, '--episodes-file', '-'], {input: 'a\n'})
    await ok('checkpoint', [...servers(fleet), '--root', root, '--episodes-file', '-'], {input: 'a\n'})
    await fails('restore', [root, ...servers(fleet)], 8)
    await fleet.crash()

    const fresh = await startFleet({members: FULL})
    const dry = await ok('restore', [root, ...servers(fresh), '--dry-run'])
    expect(dry.json.dry_run).toBe(true)
    const r = await ok('restore', [root, ...servers(fresh)])
    expect(r.json.dry_run).toBe(false)
    expect(r.json.timings.every((t: {restore_ms: number | null}) => t.restore_ms !== null)).toBe(true)

    const v = await ok('verify', [root])
    expect(v.json).toMatchObject({valid: true, continued_count: 1, restarted_count: 0})
    const l = await ok('list', [root])
    expect(l.json.checkpoints).toHaveLength(2)
    expect(l.json.checkpoints[0]).toMatchObject({latest: true, participant_count: 4, checkpoint_id: v.json.checkpoint_id})
    const desc = await ok('describe', [root, '--verify'])
    expect(desc.json.restores.map((x: {outcome: string}) => x.outcome).sort()).toEqual(['refused', 'restored'])
    await ok('describe', [root])
    const dryPrune = await ok('prune', [root, '--keep', '1'])
    expect(dryPrune.json.dry_run).toBe(true)
    expect(dryPrune.json.remove).toHaveLength(1)
    const prune = await ok('prune', [root, '--keep', '1', '--yes'])
    expect(prune.json.dry_run).toBe(false)
    await fails('verify', [path.join(root, 'missing')], 6)
    await fails('list', [path.join(root, 'missing')], 6)
    finished++
  })

  it('config show, conformance (--list and a safe run), collect, demo, fleet', async () => {
    const dir = await tempDir()
    const config = path.join(dir, 'config.yaml')
    await writeFile(config, 'current-context: a\ncontexts:\n  a: {head: http://127.0.0.1:1, root: /tmp/r, token-env: MY_TOKEN}\n')
    const cs = await ok('config show', ['--config', config])
    expect(cs.json.fleet).toEqual({value: {head: 'http://127.0.0.1:1'}, from: expect.stringContaining('context a')})
    await fails('config show', ['--config', path.join(dir, 'nope.yaml')], 2)

    await ok('conformance', ['--list'])
    const fleet = await startFleet({members: FULL})
    await ok('conformance', [...servers(fleet), '--only', 'auth'])

    const rows = makeRows(4, {steps: 2, stepMs: 5})
    const w = await workdir(dir, rows)
    await ok('collect', [...servers(fleet), '--input', w.input, '--output', w.output, '--root', w.root, '--checkpoint-every', 'off'], {timeoutMs: 60_000})

    await ok('demo', ['--episodes', '4', '--steps', '3', '--step-ms', '5', '--restarts', '1', '--root', path.join(dir, 'demo')], {timeoutMs: 60_000})

    // fleet prints its document while it runs, then runs until SIGINT.
    const fleetFile = path.join(dir, 'fleet.yaml')
    let proc: ReturnType<typeof import('node:child_process').spawn> | undefined
    const run = cli(['fleet', '--member', 'e=environment', '--member', 'm=model', '--write-fleet', fleetFile, '--json'], {onSpawn: (p) => (proc = p), timeoutMs: 60_000})
    await waitFor(async () => (await readFile(fleetFile, 'utf8').catch(() => '')).includes('m:'), 20_000, 'fleet file')
    proc!.kill('SIGINT')
    const f = await run
    expect(f.code).toBe(0)
    parses(successSchema('fleet'), {...f, json: JSON.parse(f.stdout)}, 'fleet')
    seen.add('fleet')
    finished++
  })

  afterAll(() => {
    // Only when every test above ran to its end.
    if (finished < 3) return
    expect([...seen].sort()).toEqual(Object.keys(COMMAND_FIELDS).sort())
  })
})

describe('the documented contract', () => {
  it('covers every command of the manifest', async () => {
    const manifest = JSON.parse(await readFile(path.join(REPO, 'oclif.manifest.json'), 'utf8')) as {commands: Record<string, unknown>}
    expect(
      Object.keys(manifest.commands)
        .map((c) => c.replace(':', ' '))
        .sort(),
    ).toEqual(Object.keys(COMMAND_FIELDS).sort())
  })

  it("the README's JSON output section is what the schemas render", async () => {
    const readme = await readFile(path.join(REPO, 'README.md'), 'utf8')
    const m = /<!-- json-schemas:begin -->\n([\s\S]*?)\n<!-- json-schemas:end -->/.exec(readme)
    expect(m, 'README markers <!-- json-schemas:begin/end -->').not.toBeNull()
    expect(m![1]).toBe(renderJsonDocs())
  })

  it('a strict schema refuses an undocumented field, a camelCase leak, an epoch where a time belongs', () => {
    const base = {ok: true, schema_version: 3, warnings: []}
    const verify = successSchema('verify')
    const good = {...base, valid: true, checkpoint_id: 'c', checkpoint_dir: '/c', manifest: null, continued_count: 0, restarted_count: 0, uncovered: [], participants: [], problems: []}
    expect(verify.safeParse(good).success).toBe(true)
    expect(verify.safeParse({...good, extra: 1}).success).toBe(false)
    expect(verify.safeParse({...good, continued_count: undefined, continuedCount: 0}).success).toBe(false)
    const entry = {
      checkpoint_id: 'c',
      checkpoint_dir: '/c',
      state: 'published',
      latest: true,
      manifest: 'gymckpt.json',
      created: '2026-12-03T15:00:00.000Z',
      age_seconds: 1,
      size_bytes: 1,
      participant_count: 1,
      continued_count: 0,
      restarted_count: 0,
      error: null,
    }
    expect(successSchema('list').safeParse({...base, root: '/r', latest: 'c', checkpoints: [entry]}).success).toBe(true)
    expect(successSchema('list').safeParse({...base, root: '/r', latest: 'c', checkpoints: [{...entry, created: 1764774000}]}).success).toBe(false)
    expect(ErrorJson.safeParse({...base, ok: false, error: {code: 'input', exit_code: 2, message: 'm'}}).success).toBe(true)
    expect(ErrorJson.safeParse({...base, ok: false, error: {code: 'nope', exit_code: 2, message: 'm'}}).success).toBe(false)
  })
})
