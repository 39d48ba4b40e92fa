import {createHash} from 'node:crypto'
import {appendFile, mkdtemp, readFile, readdir, rm, stat, unlink, utimes, writeFile} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {ParticipantServer} from '../../src/control-plane/server.js'
import {SimDownstream, SimEnvironment} from '../../src/control-plane/sim.js'
import {ControlClient} from '../../src/coordination/client.js'
import {CHECKS, ConformanceReport, runConformance, selectChecks} from '../../src/coordination/conformance.js'
import {discover} from '../../src/coordination/discover.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {RolloutIdSchema} from '../../src/protocol/episode-schema.js'
import {CheckpointId, ResumeRequest} from '../../src/protocol/wire.js'
import {encodeManifest, participantDir} from '../../src/storage/participant-store.js'
import {FULL, TOKEN, later, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'
import {Answer, Fault, Own, Req, VALID, authorized, err, faulty as proxied} from '../helpers/conformance-proxy.js'

// ---------------------------------------------------------------- a participant that breaks one rule
// The real double behind a small proxy on 127.0.0.1 that rewrites exactly one behaviour.

const phase = (inner: ParticipantServer) => inner.controlPlane!.phase
const activeId = (inner: ParticipantServer) => inner.controlPlane!.checkpointId

/** The shared proxy, with `before` acting on well-authorized requests only: the auth checks stay unaffected. */
function faulty(own: Own, fault: Fault, opts: {resumedIdsKept?: number; kind?: 'model' | 'agent' | 'resources'} = {}): Promise<{url: string; inner: ParticipantServer}> {
  const before = fault.before
  return proxied(own, before ? {...fault, before: (r, inner) => (authorized(r) ? before(r, inner) : undefined)} : fault, opts)
}

async function check(
  servers: {name: string; url: string}[],
  opts: {destructive?: boolean; force?: boolean; only?: string[]; keepDir?: boolean; dir?: string; own?: Own; signal?: AbortSignal} = {},
): Promise<ConformanceReport> {
  const own = opts.own ?? later
  const client = new ControlClient({token: TOKEN})
  own(() => client.close())
  let dir = opts.dir
  if (!dir) {
    const d = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-conformance-test-'))
    own(() => rm(d, {recursive: true, force: true}))
    dir = d
  }
  const discovery = await discover(client, servers, {tolerant: true, probeTimeoutMs: 5000})
  return runConformance({
    client,
    token: TOKEN,
    discovery,
    checks: selectChecks(opts.only),
    destructive: opts.destructive,
    force: opts.force,
    keepDir: opts.keepDir,
    dir,
    timeoutS: 10,
    signal: opts.signal,
  })
}

const failing = (r: ConformanceReport) => [...new Set(r.results.filter((x) => x.result === 'fail').map((x) => x.id))].sort()

/** Commit hooks that act once per checkpoint, on the participant's first successful commit of it. */
function onFirstCommit(fn: (r: Req, a: Answer, inner: ParticipantServer, pdir: string) => Promise<Answer | void>): Fault {
  const done = new Map<string, Answer>()
  return {
    async after(r, a, inner) {
      if (r.op !== 'commit' || a.status !== 200) return a
      const id = r.json.checkpoint_id as string
      if (done.has(id)) return done.get(id)!.json === null ? a : done.get(id)!
      const pdir = participantDir(r.json.checkpoint_dir, inner.participant!.kind, inner.participant!.instance)
      const out = (await fn(r, a, inner, pdir)) ?? null
      done.set(id, out ?? {status: 0, json: null})
      return out ?? a
    },
  }
}

const sha = (b: string | Buffer) => createHash('sha256').update(b).digest('hex')
const known: Record<string, string[]> = {
  prepare: ['checkpoint_id', 'deadline_ts'],
  resume: ['checkpoint_id', 'deadline_ts'],
  renew: ['checkpoint_id', 'deadline_ts'],
  commit: ['checkpoint_id', 'deadline_ts', 'checkpoint_dir', 'episode_ids'],
  retire: ['checkpoint_id', 'deadline_ts', 'episode_ids'],
  forget: ['checkpoint_id', 'deadline_ts', 'rollout_ids'],
}
const pick = (o: Record<string, unknown>, keys: string[]) => Object.fromEntries(Object.entries(o).filter(([k]) => keys.includes(k)))

/** Tracks what a participant prepared and resumed, for faults that depend on it. */
function tracking(make: (seen: {prepared: Set<string>; resumed: Set<string>}) => Fault): Fault {
  const seen = {prepared: new Set<string>(), resumed: new Set<string>()}
  const f = make(seen)
  return {
    ...f,
    async after(r, a, inner) {
      const out = f.after ? await f.after(r, a, inner) : a
      if (r.op === 'prepare' && a.status === 200 && a.json.phase === 'prepared') seen.prepared.add(r.json.checkpoint_id)
      if (r.op === 'resume' && a.status === 200 && a.json.idempotent === false) seen.resumed.add(r.json.checkpoint_id)
      return out
    },
  }
}

interface Row {
  mode: 'safe' | 'destructive'
  force?: boolean
  /** Why the fault breaks the rule, in words. */
  fault: string
  make: (own: Own) => Promise<{url: string; inner: ParticipantServer}>
}

/** check id -> a participant that breaks exactly that rule. */
const TABLE: Record<string, Row> = {
  'auth.missing-bearer': {mode: 'safe', fault: 'GET status without Authorization is answered', make: (own) => faulty(own, {auth: (r) => r.auth ?? VALID})},
  'auth.wrong-bearer': {
    mode: 'safe',
    fault: 'GET status accepts any bearer token',
    make: (own) => faulty(own, {auth: (r) => (r.method === 'GET' && /^Bearer [0-9a-f]{32}$/.test(r.auth ?? '') ? VALID : r.auth)}),
  },
  'auth.exact-bearer': {
    mode: 'safe',
    fault: 'the scheme is compared case-insensitively and spaces are collapsed',
    make: (own) => faulty(own, {auth: (r) => (r.auth && /^bearer\s+/i.test(r.auth) && r.auth.replace(/^bearer\s+/i, '') === TOKEN ? VALID : r.auth)}),
  },
  'auth.post-bearer': {mode: 'safe', fault: 'POST routes accept any bearer token', make: (own) => faulty(own, {auth: (r) => (r.method === 'POST' && r.auth ? VALID : r.auth)})},
  'status.reply': {
    mode: 'safe',
    fault: 'status leaves lease_expires_at out',
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'status' && a.status === 200 ? (delete a.json.lease_expires_at, a) : a)}),
  },
  'status.kind': {
    mode: 'safe',
    fault: "status reports kind 'judge'",
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'status' && a.status === 200 ? {...a, json: {...a.json, kind: 'judge'}} : a)}),
  },
  'status.instance': {
    mode: 'safe',
    fault: "status reports instance '../p'",
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'status' && a.status === 200 ? {...a, json: {...a.json, instance: '../p'}} : a)}),
  },
  'status.phase': {
    mode: 'safe',
    fault: "status reports phase 'paused'",
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'status' && a.status === 200 ? {...a, json: {...a.json, phase: 'paused'}} : a)}),
  },
  'report.schema': {mode: 'safe', fault: 'the report leaves counts out', make: (own) => faulty(own, {after: (r, a) => (r.op === 'status' && a.status === 200 ? (delete a.json.report.counts, a) : a)})},
  'report.blockers': {
    mode: 'safe',
    fault: 'blocker_count 1 with 2 blockers listed',
    make: (own) =>
      faulty(own, {after: (r, a) => (r.op === 'status' && a.status === 200 ? {...a, json: {...a.json, report: {...a.json.report, ready: false, blockers: ['b1', 'b2'], blocker_count: 1}}} : a)}),
  },
  'report.restarts': {
    mode: 'safe',
    fault: "a restart 'no/key' that is no capture key",
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'status' && a.status === 200 ? {...a, json: {...a.json, report: {...a.json.report, restarts: ['no/key']}}} : a)}),
  },
  'refuse.unknown-field': {
    mode: 'safe',
    fault: 'unknown keys are dropped instead of refused',
    make: (own) =>
      faulty(own, {
        body: (r) => {
          if (!r.json || typeof r.json !== 'object' || !known[r.op]) return r.body
          const b = pick(r.json, known[r.op]!)
          if (Array.isArray(b.episode_ids)) b.episode_ids = b.episode_ids.map((e: any) => (e && typeof e === 'object' ? pick(e, ['rollout_id', 'attempt']) : e))
          return JSON.stringify(b)
        },
      }),
  },
  'refuse.checkpoint-id': {
    mode: 'safe',
    fault: 'any checkpoint_id is accepted',
    make: (own) =>
      faulty(own, {
        before: (r) =>
          r.method === 'POST' && r.json && typeof r.json.deadline_ts === 'number' && !CheckpointId.safeParse(r.json.checkpoint_id).success
            ? {status: 200, json: {phase: 'idle', idempotent: true}}
            : undefined,
      }),
  },
  'refuse.deadline': {
    mode: 'safe',
    fault: 'a deadline_ts that is not a finite number is accepted',
    make: (own) =>
      faulty(own, {
        before: (r) =>
          r.op === 'prepare' && (!r.json || !Number.isFinite(r.json.deadline_ts))
            ? {status: 200, json: {phase: 'prepared', report: {ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: []}}}
            : undefined,
      }),
  },
  'refuse.episode-id': {
    mode: 'safe',
    fault: 'EpisodeIds are not validated (rollout_id and attempt)',
    make: (own) =>
      faulty(own, {
        before: (r) =>
          r.op === 'commit' &&
          Array.isArray(r.json?.episode_ids) &&
          r.json.episode_ids.some((e: any) => typeof e !== 'object' || !RolloutIdSchema.safeParse(e.rollout_id).success || !(Number.isInteger(e.attempt) && e.attempt >= 0))
            ? {status: 200, json: {phase: 'committed'}}
            : undefined,
      }),
  },
  'refuse.empty-lists': {
    mode: 'safe',
    fault: 'retire and forget accept empty lists',
    make: (own) =>
      faulty(own, {
        before: (r) =>
          r.op === 'retire' && r.json?.episode_ids?.length === 0
            ? {status: 200, json: {retired: []}}
            : r.op === 'forget' && r.json?.rollout_ids?.length === 0
              ? {status: 200, json: {forgotten: []}}
              : undefined,
      }),
  },
  'retire.forget': {
    mode: 'destructive',
    fault: 'forget answers 200 but keeps the mark',
    make: (own) =>
      faulty(own, {before: (r, inner) => (r.op === 'forget' && r.json?.rollout_ids?.length && phase(inner) === 'idle' ? {status: 200, json: {forgotten: [...r.json.rollout_ids].sort()}} : undefined)}),
  },
  'phase.prepare': {
    mode: 'destructive',
    fault: 'status of a prepared participant shows a lease that has already expired',
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'status' && a.status === 200 && a.json.phase === 'prepared' ? {...a, json: {...a.json, lease_expires_at: Date.now() / 1000}} : a)}),
  },
  'phase.prepare-replay': {
    mode: 'destructive',
    fault: 'a prepare of the prepared ID is refused (409 invalid_phase)',
    make: (own) => faulty(own, {before: (r, inner) => (r.op === 'prepare' && phase(inner) === 'prepared' && activeId(inner) === r.json?.checkpoint_id ? err(409, 'invalid_phase') : undefined)}),
  },
  'lease.renew': {
    mode: 'destructive',
    fault: 'renew replies a lease 100 s before its deadline',
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'renew' && a.status === 200 ? {...a, json: {lease_expires_at: r.json.deadline_ts - 100}} : a)}),
  },
  'fence.conflict': {
    mode: 'destructive',
    fault: 'a prepare of another ID while one is open is answered 200 prepared',
    make: (own) =>
      faulty(own, {
        before: (r, inner) =>
          r.op === 'prepare' && activeId(inner) !== null && activeId(inner) !== r.json?.checkpoint_id
            ? {status: 200, json: {phase: 'prepared', report: {ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: []}}}
            : undefined,
      }),
  },
  'outside.retire-open': {
    mode: 'destructive',
    fault: 'retire is accepted while a checkpoint is open',
    make: (own) => faulty(own, {before: (r, inner) => (r.op === 'retire' && r.json?.episode_ids?.length && phase(inner) !== 'idle' ? {status: 200, json: {retired: ['x']}} : undefined)}),
  },
  'outside.forget-open': {
    mode: 'destructive',
    fault: 'forget is accepted while a checkpoint is open',
    make: (own) => faulty(own, {before: (r, inner) => (r.op === 'forget' && r.json?.rollout_ids?.length && phase(inner) !== 'idle' ? {status: 200, json: {forgotten: ['x']}} : undefined)}),
  },
  'commit.restart-in-scope': {
    mode: 'destructive',
    force: true,
    fault: "reports restart 'ghost' and still commits a scope naming it",
    make: (own) =>
      faulty(own, {
        after: (r, a) => ((r.op === 'status' || r.op === 'prepare') && a.status === 200 && a.json.report ? {...a, json: {...a.json, report: {...a.json.report, restarts: ['ghost']}}} : a),
      }),
  },
  'commit.reply': {
    mode: 'destructive',
    fault: "the commit reply says phase 'prepared'",
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'commit' && a.status === 200 ? {...a, json: {...a.json, phase: 'prepared'}} : a)}),
  },
  'store.manifest': {
    mode: 'destructive',
    fault: 'manifest.json written as JSON.stringify(m, null, 2) with a trailing newline',
    make: (own) =>
      faulty(
        own,
        onFirstCommit(async (_r, _a, _i, pdir) => {
          const file = path.join(pdir, 'manifest.json')
          const m = JSON.parse(await readFile(file, 'utf8'))
          await unlink(file)
          await writeFile(file, JSON.stringify(m, null, 2) + '\n')
        }),
      ),
  },
  'store.records': {
    mode: 'destructive',
    fault: 'a record appended to the records file after its digest was taken',
    make: (own) =>
      faulty(
        own,
        onFirstCommit(async (_r, a, _i, pdir) => {
          const file = path.join(pdir, a.json.manifest.records_file)
          const before = await stat(file)
          await appendFile(file, '{"episode_id": {"rollout_id": "zz", "attempt": 0}}\n')
          await utimes(file, before.atime, before.mtime)
        }),
      ),
  },
  'store.lines': {
    mode: 'destructive',
    fault: 'records written as compact JSON ({"episode_id":{...}}), everything else consistent',
    make: (own) =>
      faulty(
        own,
        onFirstCommit(async (r, a, _i, pdir) => {
          const line = '{"episode_id":{"rollout_id":"zz","attempt":0}}\n'
          const name = `records-${sha(line)}.jsonl`
          await unlink(path.join(pdir, a.json.manifest.records_file))
          await writeFile(path.join(pdir, name), line)
          const manifest = {...a.json.manifest, records_file: name, records_sha256: sha(line), record_count: 1}
          await unlink(path.join(pdir, 'manifest.json'))
          await writeFile(path.join(pdir, 'manifest.json'), encodeManifest(manifest))
          void r
          return {status: 200, json: {...a.json, manifest, episode_ids: ['zz']}}
        }),
      ),
  },
  'store.manifest-last': {
    mode: 'destructive',
    fault: 'manifest.json rewritten first, then the records file',
    make: (own) =>
      faulty(
        own,
        onFirstCommit(async (_r, a, _i, pdir) => {
          const m = path.join(pdir, 'manifest.json')
          const rec = path.join(pdir, a.json.manifest.records_file)
          const [mb, rb] = [await readFile(m), await readFile(rec)]
          await unlink(m)
          await unlink(rec)
          await writeFile(m, mb)
          await new Promise((res) => setTimeout(res, 30))
          await writeFile(rec, rb)
        }),
      ),
  },
  'commit.replay': {
    mode: 'destructive',
    fault: 'a commit retried with equal arguments is refused (409 invalid_phase)',
    make: (own) =>
      faulty(own, {
        before: (r, inner) =>
          r.op === 'commit' && phase(inner) === 'committed' && activeId(inner) === r.json?.checkpoint_id && r.json.episode_ids?.length === 0 ? err(409, 'invalid_phase') : undefined,
      }),
  },
  'commit.conflict': {
    mode: 'destructive',
    fault: 'a completed commit retried with another scope is refused with 409 invalid_phase, not checkpoint_conflict',
    make: (own) =>
      faulty(own, {
        before: (r, inner) =>
          r.op === 'commit' && phase(inner) === 'committed' && activeId(inner) === r.json?.checkpoint_id && r.json.episode_ids?.length === 1 ? err(409, 'invalid_phase') : undefined,
      }),
  },
  'commit.export-once': {
    mode: 'destructive',
    fault: 'a replayed commit exports again and writes a second records file',
    make: (own) => {
      const seen = new Set<string>()
      return faulty(own, {
        after: async (r, a, inner) => {
          if (r.op !== 'commit' || a.status !== 200) return a
          if (seen.has(r.json.checkpoint_id)) {
            const line = '{"episode_id": {"rollout_id": "again", "attempt": 0}}\n'
            await writeFile(path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), `records-${sha(line)}.jsonl`), line)
          }
          seen.add(r.json.checkpoint_id)
          return a
        },
      })
    },
  },
  'phase.resume': {
    mode: 'destructive',
    fault: 'resume always replies idempotent true',
    make: (own) => faulty(own, {after: (r, a) => (r.op === 'resume' && a.status === 200 ? {...a, json: {...a.json, idempotent: true}} : a)}),
  },
  'phase.resume-again': {
    mode: 'destructive',
    fault: 'a second resume of an ID is refused (409 stale_checkpoint)',
    make: (own) =>
      faulty(
        own,
        tracking((seen) => ({before: (r) => (r.op === 'resume' && seen.resumed.has(r.json?.checkpoint_id) ? err(409, 'stale_checkpoint') : undefined)})),
      ),
  },
  'fence.stale-prepare': {
    mode: 'destructive',
    fault: 'a prepare of a prepared-then-resumed ID is answered 200 prepared',
    make: (own) =>
      faulty(
        own,
        tracking((seen) => ({
          before: (r) =>
            r.op === 'prepare' && seen.prepared.has(r.json?.checkpoint_id) && seen.resumed.has(r.json.checkpoint_id)
              ? {status: 200, json: {phase: 'prepared', report: {ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: []}}}
              : undefined,
        })),
      ),
  },
  'fence.resume-unknown': {
    mode: 'destructive',
    fault: 'a resume from idle of a never-seen ID is answered but fences nothing',
    make: (own) =>
      faulty(
        own,
        tracking((seen) => ({
          before: (r, inner) =>
            r.op === 'resume' && ResumeRequest.safeParse(r.json).success && phase(inner) === 'idle' && !seen.prepared.has(r.json.checkpoint_id)
              ? {status: 200, json: {phase: 'idle', idempotent: true}}
              : undefined,
        })),
      ),
  },
  'fence.window': {mode: 'destructive', fault: 'only the last 8 resumed IDs are kept', make: (own) => faulty(own, {}, {resumedIdsKept: 8})},
}

describe('gymckpt conformance against the built-in double', () => {
  it('every check passes (or is skipped with its reason) on a fleet of every kind, safe and destructive, and leaves it idle', async () => {
    const fleet = await startFleet({members: FULL})
    const servers = fleet.servers.map((s) => ({name: s.name, url: s.url}))
    const safe = await check(servers)
    expect(failing(safe)).toEqual([])
    expect(safe.participants.map((p) => p.server)).toEqual(['env', 'policy', 'agent', 'res'])
    // Safe checks on every participant; destructive ones once each, skipped with the reason.
    for (const d of CHECKS.filter((x) => !x.destructive)) expect(safe.results.filter((r) => r.id === d.id && r.result === 'pass').map((r) => r.server)).toEqual(['env', 'policy', 'agent', 'res'])
    expect(safe.results.filter((r) => r.result === 'skip')).toHaveLength(CHECKS.filter((x) => x.destructive).length)
    expect(safe.results.filter((r) => r.result === 'skip').every((r) => r.server === null && /--destructive/.test(r.message))).toBe(true)

    const scratch = await tempDir()
    const full = await check(servers, {destructive: true, dir: scratch})
    expect(full.results.filter((r) => r.result === 'fail')).toEqual([])
    expect(full.destructive).toBe(true)
    // Idle participants report no restart and export nothing: those two are skipped, with why.
    const skipped = full.results.filter((r) => r.result === 'skip')
    expect([...new Set(skipped.map((r) => r.id))].sort()).toEqual(['commit.restart-in-scope', 'store.lines'])
    expect(skipped.find((r) => r.id === 'commit.restart-in-scope')!.message).toMatch(/reports no restart/)
    for (const d of CHECKS.filter((x) => x.destructive && !['commit.restart-in-scope', 'store.lines'].includes(x.id))) {
      expect(
        full.results.filter((r) => r.id === d.id && r.result === 'pass').map((r) => r.server),
        d.id,
      ).toEqual(['env', 'policy', 'agent', 'res'])
    }
    for (const s of fleet.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null, lease_expires_at: null, retired_rollouts: 0})
    expect(await readdir(scratch)).toEqual([])
  })

  it('refuses --destructive on a fleet holding live work; with --force checks restart_in_scope and real record lines', async () => {
    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env').participant as SimEnvironment
    const run = fleet.run({rolloutId: 'rs', steps: 100_000, stepMs: 5, restart: true})
    await waitFor(() => env.report().restarts.length === 1 && (fleet.server('res').participant as SimDownstream).report().restarts.length === 1)
    const servers = fleet.servers.map((s) => ({name: s.name, url: s.url}))
    const refused = (await check(servers, {destructive: true}).catch((e: unknown) => e)) as ControllerError
    expect(refused).toBeInstanceOf(ControllerError)
    expect(refused.code).toBe('fleet_state')
    expect(refused.message).toMatch(/env holds 1 episodes.*runs 1 restart.*nothing was sent/)
    expect(fleet.servers.flatMap((s) => s.journal.filter((j) => !['status', 'run', 'data'].includes(j.route)))).toEqual([])

    const forced = await check(servers, {destructive: true, force: true})
    expect(forced.results.filter((r) => r.result === 'fail')).toEqual([])
    const by = (id: string) => Object.fromEntries(forced.results.filter((r) => r.id === id).map((r) => [r.server, r.result]))
    expect(by('commit.restart-in-scope')).toEqual({env: 'pass', policy: 'skip', agent: 'skip', res: 'pass'})
    // The agent exports every live session whatever the scope: a real record, checked byte for byte.
    expect(by('store.lines')).toMatchObject({agent: 'pass'})
    expect(forced.results.find((r) => r.id === 'store.lines' && r.server === 'agent')!.message).toMatch(/1 line\(s\) re-encode/)
    for (const s of fleet.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
    await fleet.close()
    await run
  })

  it('--only selects checks and groups; an unknown name is an input error', () => {
    expect(selectChecks(['fence']).map((c) => c.id)).toEqual(['fence.conflict', 'fence.stale-prepare', 'fence.resume-unknown', 'fence.window'])
    expect(selectChecks(['auth.wrong-bearer', 'store.lines']).map((c) => c.id)).toEqual(['auth.wrong-bearer', 'store.lines'])
    expect(() => selectChecks(['nope'])).toThrow(/--only nope: no such check/)
    expect(new Set(CHECKS.map((c) => c.id)).size).toBe(CHECKS.length)
  })
})

describe('conformance accepts what Gym itself does', () => {
  it('a completed commit replayed whatever its arguments (Gym version A) is skipped with the version named, not failed', async () => {
    const cleanups: (() => Promise<unknown>)[] = []
    try {
      const first = new Map<string, Answer>()
      const {url} = await faulty((fn) => void cleanups.push(fn), {
        before: (r) => (r.op === 'commit' && first.has(r.json?.checkpoint_id) ? first.get(r.json.checkpoint_id) : undefined),
        after: (r, a) => {
          if (r.op === 'commit' && a.status === 200 && !first.has(r.json.checkpoint_id)) first.set(r.json.checkpoint_id, a)
          return a
        },
      })
      const report = await check([{name: 'p', url}], {destructive: true, own: (fn) => void cleanups.push(fn)})
      expect(failing(report)).toEqual([])
      const r = report.results.find((x) => x.id === 'commit.conflict')!
      expect(r.result).toBe('skip')
      expect(r.message).toMatch(/^the first reply replayed: Gym version A replays a completed commit whatever its arguments/)
    } finally {
      for (const fn of cleanups.reverse()) await fn().catch(() => {})
    }
  })

  for (const kind of ['agent', 'resources', 'model'] as const) {
    it(`${kind}: two records of one episode (two sessions) ${kind === 'model' ? 'fail' : 'pass'} store.records`, async () => {
      const cleanups: (() => Promise<unknown>)[] = []
      try {
        // The first commit's files are replaced by a records file holding two sessions of episode s
        // (named for its digest, manifest rewritten to match), and so is its reply.
        const fault = onFirstCommit(async (_r, a, _i, pdir) => {
          for (const f of await readdir(pdir)) await unlink(path.join(pdir, f))
          const text = ['{"episode_id": {"rollout_id": "s", "attempt": 0}, "session": 1}', '{"episode_id": {"rollout_id": "s", "attempt": 0}, "session": 2}'].map((l) => l + '\n').join('')
          const digest = sha(text)
          const manifest = {...a.json.manifest, records_file: `records-${digest}.jsonl`, records_sha256: digest, record_count: 2}
          await writeFile(path.join(pdir, manifest.records_file), text)
          await writeFile(path.join(pdir, 'manifest.json'), encodeManifest(manifest))
          return {status: 200, json: {...a.json, manifest, episode_ids: ['s']}}
        })
        const {url} = await faulty((fn) => void cleanups.push(fn), fault, {kind})
        const report = await check([{name: 'p', url}], {destructive: true, only: ['store.records'], own: (fn) => void cleanups.push(fn)})
        const r = report.results.find((x) => x.id === 'store.records')!
        if (kind === 'model') expect(r.message).toMatch(/holds 1 duplicate record\(s\) of one episode$/)
        expect(r.result, r.message).toBe(kind === 'model' ? 'fail' : 'pass')
      } finally {
        for (const fn of cleanups.reverse()) await fn().catch(() => {})
      }
    })
  }
})

describe('each check fails on a participant that breaks its rule', () => {
  it('the table covers every check', () => {
    expect(Object.keys(TABLE).sort()).toEqual(CHECKS.map((c) => c.id).sort())
  })

  for (const [id, row] of Object.entries(TABLE)) {
    // Rows are independent (each its own participant and directory), so they run side by side.
    it.concurrent(`${id} -> ${row.fault}`, async ({expect}) => {
      const cleanups: (() => Promise<unknown>)[] = []
      const own: Own = (fn) => void cleanups.push(fn)
      try {
        const {url, inner} = await row.make(own)
        const report = await check([{name: 'p', url}], {destructive: row.mode === 'destructive', force: row.force, own})
        expect(failing(report), JSON.stringify(report.results.filter((r) => r.result === 'fail'))).toEqual([id])
        expect(report.passed).toBe(false)
        // Whatever the checks opened was resumed, though a check failed.
        expect(inner.controlPlane!.phase).toBe('idle')
        expect(inner.controlPlane!.checkpointId).toBeNull()
      } finally {
        for (const fn of cleanups.reverse()) await fn().catch(() => {})
      }
    })
  }
})
