import {ChildProcess} from 'node:child_process'
import {readFile, readdir} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {Fleet} from '../../src/control-plane/fleet.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {assertRestorable, planRestore} from '../../src/coordination/restore.js'
import {FaultRowId, row, rowsTestedIn} from '../fault-matrix.rows.js'
import {CliResult, cli} from '../helpers/cli.js'
import {
  OnTestFinished,
  Scope,
  allIn,
  assertNothingLost,
  controlCalls,
  fakeParticipant,
  faultOnce,
  liveEpisodes,
  mountTmpfs,
  phases,
  publishSome,
  remount,
  sentIds,
  serverFlags,
  tree,
} from '../helpers/fault-matrix.js'
import {control, waitFor} from '../helpers/fleet.js'

/**
 * The fault matrix rows where the built CLI runs as a process: signals, separate processes,
 * malicious replies. Sequential (concurrent tests time out on a loaded 2-core host); each test
 * owns its fleet, root and processes through a Scope. Every server listens on 127.0.0.1 port 0,
 * every process is killed when its test ends.
 */

const covered = new Set<FaultRowId>()
const EPISODES = ['a', 'b']
const INPUT = EPISODES.join('\n')
const PARTICIPANTS = ['env', 'policy', 'agent', 'res'] as const
const TEST_MS = 60_000

function expectExit(id: FaultRowId, r: CliResult, proc?: ChildProcess): void {
  covered.add(id)
  const exit = row(id).exit
  if (exit === 'killed') {
    expect(r.code).toBeNull()
    expect(proc?.signalCode).toBe('SIGKILL')
    return
  }
  expect(exit, `${id}: exit ${r.code}\n${r.stdout.slice(0, 2000)}\n${r.stderr.slice(0, 2000)}`).toContain(r.code)
  // A documented failure, never a crash: one JSON document on stdout, no stack trace.
  expect(r.json?.ok).toBe(false)
  expect(r.json.error.exit_code).toBe(r.code)
  expect(r.stderr).not.toMatch(/\n\s+at /)
}

/** Runs the CLI (killed at the end of the test if still running). */
function run(scope: Scope, args: string[], opts: {input?: string; onSpawn?: (p: ChildProcess) => void} = {}): Promise<CliResult> {
  return cli(args, {input: opts.input, timeoutMs: 45_000, onSpawn: (p) => (scope.process(p), opts.onSpawn?.(p))})
}

/** Runs the CLI and sends `sig` once `when()` holds; returns its result. */
async function runSignalled(scope: Scope, args: string[], sig: NodeJS.Signals, when: () => boolean | Promise<boolean>, input?: string): Promise<{r: CliResult; proc: ChildProcess}> {
  let proc: ChildProcess | undefined
  let ended: CliResult | undefined
  const running = run(scope, args, {input, onSpawn: (p) => (proc = p)})
  void running.then((r) => (ended = r))
  await waitFor(async () => ended !== undefined || (await when()), 30_000, `the moment to send ${sig}`)
  if (ended) throw new Error(`the command ended before ${sig} was sent: exit ${ended.code}\n${ended.stdout}\n${ended.stderr}`)
  proc!.kill(sig)
  return {r: await running, proc: proc!}
}

async function latest(root: string): Promise<string> {
  return (await readFile(path.join(root, 'LATEST'), 'utf8').catch(() => '')).trim()
}

/** A fleet with two live episodes and two published checkpoints of them. */
async function publishedFleet(scope: Scope, opts: {leaseGraceSeconds?: number} = {}): Promise<{fleet: Fleet; root: string; history: string[]}> {
  const fleet = await scope.fleet({controlPlane: opts.leaseGraceSeconds ? {leaseGraceSeconds: opts.leaseGraceSeconds} : undefined})
  await liveEpisodes(fleet, EPISODES)
  const root = await scope.dir()
  const history = await publishSome(await scope.coordinator(fleet), root, EPISODES)
  return {fleet, root, history}
}

/** Every one of `servers` was sent a resume under `id`. */
function resumedEverywhere(fleet: Fleet, id: string, servers: readonly string[] = PARTICIPANTS): void {
  expect(Object.fromEntries(servers.map((n) => [n, sentIds(fleet.server(n), 'resume').includes(id)]))).toEqual(Object.fromEntries(servers.map((n) => [n, true])))
}

type Signal = 'SIGINT' | 'SIGTERM' | 'SIGKILL'
const ALL_SIGNALS: Signal[] = ['SIGINT', 'SIGTERM', 'SIGKILL']
const rowOf = (sig: Signal, phase: string) => `${sig.toLowerCase()}-${phase}` as FaultRowId
const idOf = (sig: Signal, phase: string) => `ckpt-${sig.toLowerCase()}-${phase}`
const allIdle = (fleet: Fleet) => fleet.servers.every((s) => !s.controlPlane || s.controlPlane.phase === 'idle')

describe('fault matrix: the CLI interrupted or killed', () => {
  it.for(ALL_SIGNALS)('%s during prepare (a stuck blocker on the model)', {timeout: TEST_MS}, async (sig, {onTestFinished, expect}) => {
    const scope = new Scope(onTestFinished)
    // With SIGKILL the fleet is left closed: a short lease (deadline 6 s + grace 1 s) reopens it.
    const {fleet, root, history} = await publishedFleet(scope, {leaseGraceSeconds: sig === 'SIGKILL' ? 1 : undefined})
    fleet.server('policy').participant!.stuckBlockers = ['slow']
    const id = idOf(sig, 'prepare')
    const args = ['checkpoint', ...serverFlags(fleet), '--root', root, '--id', id, '--timeout', sig === 'SIGKILL' ? '6' : '60', '--episodes', '-', '--json']
    const {r, proc} = await runSignalled(scope, args, sig, () => sentIds(fleet.server('policy'), 'prepare').includes(id), INPUT)
    expectExit(rowOf(sig, 'prepare'), r, proc)
    if (sig === 'SIGKILL') {
      expect(await phases(fleet)).toEqual({env: `prepared ${id}`, policy: `preparing ${id}`, agent: 'idle', res: 'idle'})
      // Lease expiry (deadline + grace) reopens every participant by itself.
      await waitFor(() => allIdle(fleet), 15_000, 'lease expiry')
    } else {
      expect(r.json.error.code).toBe('interrupted')
      resumedEverywhere(fleet, id)
    }
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    expect(await assertNothingLost(root, history)).toBe(history.at(-1))
    expect(await readdir(root)).not.toContain(id)
  })

  it.for(ALL_SIGNALS)('%s during commit (a participant still writing)', {timeout: TEST_MS}, async (sig, {onTestFinished, expect}) => {
    const scope = new Scope(onTestFinished)
    const {fleet, root, history} = await publishedFleet(scope)
    const hung = faultOnce(fleet.server('policy'), 'commit', {type: 'hang'})
    const id = idOf(sig, 'commit')
    const args = ['checkpoint', ...serverFlags(fleet), '--root', root, '--id', id, '--timeout', '60', '--episodes', '-', '--json']
    const others = ['env', 'agent', 'res']
    const {r, proc} = await runSignalled(scope, args, sig, () => hung() && others.every((n) => fleet.server(n).controlPlane!.phase === 'committed'), INPUT)
    expectExit(rowOf(sig, 'commit'), r, proc)
    if (sig === 'SIGKILL') {
      expect(await phases(fleet)).toEqual({env: `committed ${id}`, policy: `prepared ${id}`, agent: `committed ${id}`, res: `committed ${id}`})
      const resumed = await run(scope, ['resume', ...serverFlags(fleet), '--id', id, '--json'])
      expect(resumed.code, resumed.stdout).toBe(0)
    } else {
      expect(r.json.error.code).toBe('interrupted')
      resumedEverywhere(fleet, id)
    }
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    expect(await assertNothingLost(root, history)).toBe(history.at(-1))
    // The records written so far are there, unpublished: no controller manifest.
    expect((await tree(path.join(root, id))).filter((f) => f.endsWith('manifest.json'))).toEqual([
      'gym/agent/agent/manifest.json',
      'gym/environment/env/manifest.json',
      'gym/resources/res/manifest.json',
    ])
    expect(await readdir(path.join(root, id))).toEqual(['gym'])
  })

  // SIGINT and SIGTERM at this point: the next describe.
  it.for(['SIGKILL'] as const)('%s after publishing, before resume', {timeout: TEST_MS}, async (sig, {onTestFinished, expect}) => {
    const scope = new Scope(onTestFinished)
    const {fleet, root, history} = await publishedFleet(scope)
    // Resume goes resources first: hold it there.
    const hung = faultOnce(fleet.server('res'), 'resume', {type: 'hang'})
    const id = idOf(sig, 'resume')
    const args = ['checkpoint', ...serverFlags(fleet), '--root', root, '--id', id, '--timeout', '60', '--episodes', '-', '--json']
    const {r, proc} = await runSignalled(scope, args, sig, async () => hung() && (await latest(root)) === id, INPUT)
    expectExit(rowOf(sig, 'before-resume'), r, proc)
    expect(await phases(fleet)).toEqual(allIn(fleet, `committed ${id}`))
    const resumed = await run(scope, ['resume', ...serverFlags(fleet), '--id', id, '--json'])
    expect(resumed.code, resumed.stdout).toBe(0)
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    // The new checkpoint stays published, and it verifies.
    expect(await assertNothingLost(root, [...history, id])).toBe(id)
  })

  it.for(ALL_SIGNALS)('%s during restore (a participant still restoring)', {timeout: TEST_MS}, async (sig, {onTestFinished, expect}) => {
    const scope = new Scope(onTestFinished)
    const {fleet: old, root, history} = await publishedFleet(scope)
    await old.crash()
    const fleet = await scope.fleet()
    const hung = faultOnce(fleet.server('policy'), 'restore', {type: 'hang'})
    const others = ['env', 'agent', 'res']
    const {r, proc} = await runSignalled(scope, ['restore', root, ...serverFlags(fleet), '--json'], sig, () => hung() && others.every((n) => fleet.server(n).controlPlane!.phase === 'restored'))
    expectExit(rowOf(sig, 'restore'), r, proc)
    const restoreId = sentIds(fleet.server('env'), 'restore')[0]!
    expect(restoreId).toMatch(/^restore-[0-9a-f]{12}$/)
    if (sig === 'SIGKILL') {
      expect(await phases(fleet)).toEqual({env: `restored ${restoreId}`, policy: 'idle', agent: `restored ${restoreId}`, res: `restored ${restoreId}`})
      const resumed = await run(scope, ['resume', ...serverFlags(fleet), '--json'])
      expect(resumed.code, resumed.stdout).toBe(0)
      expect(resumed.json.checkpoint_id).toBe(restoreId)
    } else {
      expect(r.json.error.code).toBe('interrupted')
      resumedEverywhere(fleet, restoreId)
      // What the three participants installed was retired there; the model, idle with no reply,
      // may have stopped half way through an install, so its replacement attempts are retired too.
      const retired = await Promise.all(PARTICIPANTS.map(async (n) => [n, (await control(fleet.server(n).url, 'status')).json.retired_rollouts]))
      expect(Object.fromEntries(retired)).toEqual({env: 2, policy: 2, agent: 2, res: 2})
    }
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    expect(await assertNothingLost(root, history)).toBe(history.at(-1))
    // The operator's next step: this fleet is no longer fresh, so a new restore refuses it.
    const refused = await planRestore(await scope.coordinator(fleet), {location: root})
      .then(assertRestorable)
      .catch((e: unknown) => e)
    expect(refused).toBeInstanceOf(ControllerError)
    expect((refused as ControllerError).code).toBe('fleet_state')
  })
})

describe('fault matrix: a signal after publishing', () => {
  it.for(['SIGINT', 'SIGTERM'] as const)('%s after publishing, before resume', {timeout: TEST_MS}, async (sig, {onTestFinished, expect}) => {
    const scope = new Scope(onTestFinished)
    const {fleet, root, history} = await publishedFleet(scope)
    // Resume goes resources first: hold it there while the signal arrives.
    const held = faultOnce(fleet.server('res'), 'resume', {type: 'delay', ms: 1500})
    const id = idOf(sig, 'resume')
    const args = ['checkpoint', ...serverFlags(fleet), '--root', root, '--id', id, '--timeout', '60', '--episodes', '-', '--json']
    const {r, proc} = await runSignalled(scope, args, sig, async () => held() && (await latest(root)) === id, INPUT)
    expectExit(rowOf(sig, 'before-resume'), r, proc)
    expect(r.json.error.code).toBe('interrupted')
    resumedEverywhere(fleet, id)
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    expect(await assertNothingLost(root, [...history, id])).toBe(id)
  })
})

describe('fault matrix: a participant fails between prepare and commit (separate processes)', () => {
  const cases = [
    ['member-killed', 'killed'],
    ['member-hung', 'hung'],
    ['member-500', 'answering 500'],
    ['member-restarted', 'restarted empty'],
  ] as const

  it.for(cases)('%s: a participant %s', {timeout: TEST_MS}, async ([id], {onTestFinished, expect}) => {
    const scope = new Scope(onTestFinished)
    const {fleet, root, history} = await publishedFleet(scope)
    const prep = await run(scope, ['prepare', ...serverFlags(fleet), '--timeout', '60', '--json'])
    expect(prep.code, prep.stdout).toBe(0)
    const ckpt = prep.json.checkpoint_id as string
    expect(await phases(fleet)).toEqual(allIn(fleet, `prepared ${ckpt}`))
    const policy = fleet.server('policy')
    const replace: Record<string, string> = {}
    if (id === 'member-killed') await policy.crash()
    if (id === 'member-hung') policy.faults.add('*', {type: 'hang'}, Infinity)
    if (id === 'member-500') policy.faults.add('*', {type: 'status', status: 500}, Infinity)
    const restarted = id === 'member-restarted' ? (await policy.crash(), await scope.server('policy', 'model')) : null
    if (restarted) replace.policy = restarted.url
    const r = await run(scope, ['commit', ...serverFlags(fleet, [], replace), '--root', root, '--episodes', '-', '--probe-timeout', '3', '--json'], {input: INPUT})
    expectExit(id, r)
    expect(r.json.error.message).toContain(`checkpoint '${ckpt}' cannot be committed: policy `)
    // Every reachable participant was resumed under the open ID.
    resumedEverywhere(fleet, ckpt, ['env', 'agent', 'res'])
    if (id === 'member-killed') expect(await phases(fleet)).toEqual({...allIn(fleet, 'idle'), policy: 'down'})
    if (id === 'member-hung' || id === 'member-500') {
      // Still closed where it could not be reached; once it answers again, resume reopens it.
      expect(policy.controlPlane!.phase).toBe('prepared')
      policy.faults.clear()
      const resumed = await run(scope, ['resume', ...serverFlags(fleet), '--id', ckpt, '--json'])
      expect(resumed.code, resumed.stdout).toBe(0)
      expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    }
    if (restarted) {
      expect(await phases(fleet)).toEqual({...allIn(fleet, 'idle'), policy: 'down'})
      expect(sentIds(restarted, 'resume')).toEqual([ckpt])
      expect((await control(restarted.url, 'status')).json.phase).toBe('idle')
    }
    expect(await assertNothingLost(root, history)).toBe(history.at(-1))
    expect(await readdir(root)).not.toContain(ckpt)
  })
})

describe('fault matrix: the root', () => {
  it('root-read-only: a read-only root exits 2 before anything is sent', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const scope = new Scope(onTestFinished)
    const fleet = await scope.fleet()
    await liveEpisodes(fleet, EPISODES)
    const ro = path.join(await scope.dir(), 'ro')
    const unmount = await mountTmpfs(ro, 'size=1m')
    try {
      const history = await publishSome(await scope.coordinator(fleet), ro, EPISODES)
      remount(ro, 'ro')
      const before = controlCalls(fleet)
      const r = await run(scope, ['checkpoint', '--episodes-file', '/dev/null', ...serverFlags(fleet), '--root', ro, '--json'])
      expectExit('root-read-only', r)
      expect(r.json.error.message).toBe(`checkpoint root ${ro} cannot hold checkpoints: the file system is read-only (EROFS); nothing was sent`)
      expect(controlCalls(fleet)).toEqual(before)
      expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
      expect(await assertNothingLost(ro, history)).toBe(history.at(-1))
    } finally {
      unmount()
    }
  })
})

describe('fault matrix: malicious participant replies never crash the CLI nor write outside the root', () => {
  const deep = (n: number) => '['.repeat(n) + ']'.repeat(n)

  interface Sandbox {
    scope: Scope
    fleet: Fleet
    sandbox: string
    root: string
    history: string[]
    before: number[]
  }

  /** A fleet, and a published root inside an otherwise empty sandbox directory. */
  async function sandboxed(onTestFinished: OnTestFinished): Promise<Sandbox> {
    const scope = new Scope(onTestFinished)
    const fleet = await scope.fleet()
    await liveEpisodes(fleet, EPISODES)
    const sandbox = await scope.dir()
    const root = path.join(sandbox, 'root')
    const history = await publishSome(await scope.coordinator(fleet), root, EPISODES)
    return {scope, fleet, sandbox, root, history, before: controlCalls(fleet)}
  }

  /** `checkpoint` on the fleet plus the fake servers. */
  function checkpointWith(s: Sandbox, fakes: Record<string, string>, input?: string): Promise<CliResult> {
    const extra = Object.entries(fakes).map(([name, url]) => ({name, url}))
    // Without input, an empty scope (the policy model needs one): the replies' keys are still checked.
    return run(s.scope, ['checkpoint', ...serverFlags(s.fleet, extra), '--root', s.root, ...(input ? ['--episodes', '-'] : ['--episodes-file', '/dev/null']), '--json'], {input})
  }

  async function after(id: FaultRowId, s: Sandbox, r: CliResult): Promise<void> {
    expectExit(id, r)
    expect(r.json.error.message).toMatch(/\bevil\b/)
    // Nothing outside the root.
    expect(await readdir(s.sandbox)).toEqual(['root'])
    expect(await phases(s.fleet)).toEqual(allIn(s.fleet, 'idle'))
    expect(await assertNothingLost(s.root, s.history)).toBe(s.history.at(-1))
    // Discovery failed (exit 3): nothing but status probes reached the fleet.
    if (r.code === 3) expect(controlCalls(s.fleet)).toEqual(s.before)
  }

  it('reply-huge: a 50 MB status body that is not JSON', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const s = await sandboxed(onTestFinished)
    const huge = Buffer.alloc(50 << 20, 'x')
    const evil = await fakeParticipant(s.scope, 'resources', 'evil', {status: () => ({body: huge})})
    const r = await checkpointWith(s, {evil: evil.url})
    await after('reply-huge', s, r)
    expect(r.json.error.message).toContain('reply is not JSON')
    expect(r.stdout.length).toBeLessThan(10_000)
  })

  it('reply-deep: a status reply nested 100,000 levels deep', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const s = await sandboxed(onTestFinished)
    const evil = await fakeParticipant(s.scope, 'resources', 'evil', {status: () => ({body: `{"kind": "resources", "instance": "evil", "phase": "idle", "report": ${deep(100_000)}}`})})
    const r = await checkpointWith(s, {evil: evil.url})
    await after('reply-deep', s, r)
    expect(r.json.error.message).toContain('status reply is nested deeper than 256 levels')
  })

  it('status-wrong-types: status fields of the wrong type', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const s = await sandboxed(onTestFinished)
    const evil = await fakeParticipant(s.scope, 'resources', 'evil', {
      status: () => ({body: {kind: 'resources', instance: 'evil', phase: 7, checkpoint_id: 5, retired_rollouts: 'many', report: {ready: 'yes'}}}),
    })
    const r = await checkpointWith(s, {evil: evil.url})
    await after('status-wrong-types', s, r)
    expect(r.json.error.message).toContain('evil: HTTP 200 bad_reply unexpected status reply')
  })

  it('commit-wrong-types: commit fields of the wrong type', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const s = await sandboxed(onTestFinished)
    const evil = await fakeParticipant(s.scope, 'resources', 'evil', {
      commit: () => ({body: {phase: 'committed', manifest: {schema_version: '1', kind: 5, record_count: 'many', records_file: '../../../escape.jsonl'}, episode_ids: 'all'}}),
    })
    const r = await checkpointWith(s, {evil: evil.url}, INPUT)
    await after('commit-wrong-types', s, r)
    expect(r.json.error.message).toContain('evil: HTTP 200 bad_reply unexpected commit reply')
    expect(evil.requests).toContain('resume')
    // The checkpoint's directory holds no controller manifest: nothing was published.
    const dirs = (await readdir(s.root)).filter((d) => !s.history.includes(d) && d !== 'LATEST')
    expect(dirs).toHaveLength(1)
    expect(await readdir(path.join(s.root, dirs[0]!))).toEqual(['gym'])
  })

  it('unsafe-instance: an instance name with ../ or /', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const s = await sandboxed(onTestFinished)
    const up = await fakeParticipant(s.scope, 'resources', '../../escape')
    const slash = await fakeParticipant(s.scope, 'agent', 'a/b')
    const r = await checkpointWith(s, {evil: up.url, evil2: slash.url})
    await after('unsafe-instance', s, r)
    expect(r.json.error.details.failures.map((f: {server: string; code: string}) => [f.server, f.code])).toEqual([
      ['evil', 'unsafe_instance'],
      ['evil2', 'unsafe_instance'],
    ])
    expect([up.requests, slash.requests]).toEqual([['status'], ['status']])
  })

  it('unsafe-kind: a kind with ../ or /', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const s = await sandboxed(onTestFinished)
    const up = await fakeParticipant(s.scope, '../model', 'evil')
    const slash = await fakeParticipant(s.scope, 'model/x', 'evil2')
    const r = await checkpointWith(s, {evil: up.url, evil2: slash.url})
    await after('unsafe-kind', s, r)
    expect(r.json.error.details.failures.map((f: {server: string; code: string}) => [f.server, f.code])).toEqual([
      ['evil', 'unknown_kind'],
      ['evil2', 'unknown_kind'],
    ])
    expect([up.requests, slash.requests]).toEqual([['status'], ['status']])
  })

  it('commit-reply-deep: a commit reply whose manifest holds a field nested 100,000 levels deep', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const s = await sandboxed(onTestFinished)
    const evil = await fakeParticipant(s.scope, 'resources', 'evil', {
      commit: (b) => {
        const dir = JSON.parse(b).checkpoint_dir as string
        const manifest = {
          schema_version: 1,
          kind: 'resources',
          instance: 'evil',
          checkpoint_id: path.basename(dir),
          records_file: `records-${'0'.repeat(64)}.jsonl`,
          records_sha256: '0'.repeat(64),
          record_count: 0,
        }
        return {body: `{"phase": "committed", "manifest": ${JSON.stringify(manifest).slice(0, -1)}, "extra": ${deep(100_000)}}, "episode_ids": []}`}
      },
    })
    const r = await checkpointWith(s, {evil: evil.url}, INPUT)
    await after('commit-reply-deep', s, r)
    expect(r.json.error.message).toMatch(/evil: HTTP 200 bad_reply commit reply is nested deeper than 256 levels/)
    expect(evil.requests).toContain('resume')
  })

  it('commit-bad-keys: a commit reply naming an episode key that is no capture key', {timeout: TEST_MS}, async ({onTestFinished, expect}) => {
    const s = await sandboxed(onTestFinished)
    const evil = await fakeParticipant(s.scope, 'resources', 'evil', {
      commit: (b) => {
        const dir = JSON.parse(b).checkpoint_dir as string
        const manifest = {
          schema_version: 1,
          kind: 'resources',
          instance: 'evil',
          checkpoint_id: path.basename(dir),
          records_file: `records-${'0'.repeat(64)}.jsonl`,
          records_sha256: '0'.repeat(64),
          record_count: 0,
        }
        return {body: {phase: 'committed', manifest, episode_ids: ['../../etc/passwd']}}
      },
    })
    // Every committed key is checked, whatever the scope.
    const r = await checkpointWith(s, {evil: evil.url})
    await after('commit-bad-keys', s, r)
    expect(r.json.error.message).toMatch(/evil: HTTP 200 bad_reply commit reply names episode '\.\.\/\.\.\/etc\/passwd', which is no capture key/)
    expect(evil.requests).toContain('resume')
  })
})

describe('fault matrix coverage', () => {
  it('every CLI row of test/fault-matrix.rows.ts without a known bug has run above', () => {
    expect([...covered].sort()).toEqual(rowsTestedIn('cli'))
  })
})
