// Mutation-testing follow-up for src/coordination/conformance.ts (test/EQUIVALENT_MUTANTS.md lists
// what no test can tell apart). conformance.test.ts shows that each check fails on a participant
// breaking its rule; here the verdicts are read with their messages, which must name what was
// wrong, and the paths around them (no reply, odd bodies, skips, cleanup) are driven too. Every
// participant is the real in-process double on 127.0.0.1 behind a small proxy that changes one
// behaviour.
import {createHash} from 'node:crypto'
import {appendFileSync} from 'node:fs'
import {mkdtemp, readdir, rm, unlink, utimes, writeFile} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {ParticipantServer} from '../../src/control-plane/server.js'
import {ControlClient} from '../../src/coordination/client.js'
import {CHECKS, ConformanceReport, checkManifestLast, conformanceJson, runConformance, selectChecks} from '../../src/coordination/conformance.js'
import {Discovery, discover} from '../../src/coordination/discover.js'
import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {encodeManifest, participantDir} from '../../src/storage/participant-store.js'
import {TOKEN, startFleet} from '../helpers/fleet.js'
import {Answer, Fault, Kind, Own, READY, Req, VALID, authorized, err, faulty} from '../helpers/conformance-proxy.js'
import {tempDir} from '../helpers/tmp.js'
import {rejection, thrown} from '../helpers/errors.js'

// ---------------------------------------------------------------- a participant that breaks one rule

const sha = (b: string | Buffer) => createHash('sha256').update(b).digest('hex')

interface CheckOpts {
  destructive?: boolean
  force?: boolean
  only?: string[]
  keepDir?: boolean
  dir?: string
  signal?: AbortSignal
  concurrency?: number
  timeoutS?: number
  /** The client's reply grace past a call's deadline, in seconds (Gym's 5 by default). */
  grace?: number
}

async function discoverAll(own: Own, servers: {name: string; url: string}[], grace?: number): Promise<{client: ControlClient; discovery: Discovery}> {
  const client = new ControlClient({token: TOKEN, replyGraceSeconds: grace})
  own(() => client.close())
  return {client, discovery: await discover(client, servers, {tolerant: true, probeTimeoutMs: 5000, tries: 1})}
}

async function check(own: Own, servers: {name: string; url: string}[], opts: CheckOpts = {}): Promise<ConformanceReport> {
  const {client, discovery} = await discoverAll(own, servers, opts.grace)
  const dir = opts.dir ?? (await scratchDir(own))
  return runConformance({
    client,
    token: TOKEN,
    discovery,
    checks: selectChecks(opts.only),
    destructive: opts.destructive,
    force: opts.force,
    keepDir: opts.keepDir,
    dir,
    timeoutS: opts.timeoutS ?? 10,
    signal: opts.signal,
    concurrency: opts.concurrency,
  })
}

async function scratchDir(own: Own): Promise<string> {
  const d = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-conformance-mutants-'))
  own(() => rm(d, {recursive: true, force: true}))
  return d
}

/** Tags, temporary paths and clock readings replaced, so that messages compare exactly. */
function norm(s: string): string {
  return s
    .replace(/conformance-[0-9a-f]{8}/g, 'conformance-TAG')
    .replace(/\/[^\s,'"]*gymckpt-conformance-[A-Za-z0-9]+/g, 'SCRATCH')
    .replace(/\b1[78]\d{8}(\.\d+)?/g, 'T')
}

/** check id → normalized message (the first result of that check), and its outcome. */
function msgs(r: ConformanceReport): Record<string, string> {
  const out: Record<string, string> = {}
  for (const x of r.results) out[x.id] ??= `${x.result}: ${norm(x.message)}`
  return out
}

/** Runs fn with its own cleanups (tests run side by side: each closes only what it started). */
async function withCleanup<T>(fn: (own: Own) => Promise<T>): Promise<T> {
  const mine: (() => Promise<unknown>)[] = []
  try {
    return await fn((f) => void mine.push(f))
  } finally {
    for (const f of mine.reverse()) await f().catch(() => {})
  }
}

const DUMP = process.env.CONFORMANCE_DUMP === '1'

interface Case {
  name: string
  fault: Fault
  opts?: CheckOpts
  kind?: Kind
  /** Messages expected (normalized), by check ID; every other selected check must pass or skip as listed. */
  want: Record<string, string>
  /** The participant is left idle with no retire mark (default: checked). */
  idle?: boolean
  /** Resumed IDs the participant remembers (the protocol's 64 by default). */
  kept?: number
  /** Further assertions on the requests the participant saw. */
  sent?: (requests: Req[]) => void
}

async function runCase(c: Case): Promise<void> {
  await withCleanup(async (own) => {
    const {url, inner, requests} = await faulty(own, c.fault, {kind: c.kind, resumedIdsKept: c.kept})
    const report = await check(own, [{name: 'p', url}], c.opts)
    const got = msgs(report)
    if (DUMP) appendFileSync('/tmp/conf-dump.jsonl', JSON.stringify({name: c.name, got}) + '\n')
    for (const [id, m] of Object.entries(c.want)) expect(got[id], id).toBe(m)
    c.sent?.(requests)
    if (c.idle !== false) {
      expect(inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null, retired_rollouts: 0})
    }
  })
}

// ---------------------------------------------------------------- the cases

const statusOnly = (fn: (json: any, r: Req) => any): Fault => ({after: (r, a) => (r.op === 'status' && a.status === 200 ? {...a, json: fn(a.json, r)} : a)})
/** Status as discovery sees it unchanged; the session's own reads (the 2nd status request on) changed. */
function laterStatus(fn: (a: Answer) => Answer): Fault {
  let n = 0
  return {after: (r, a) => (r.op === 'status' && ++n > 1 ? fn(a) : a)}
}

const SAFE: Case[] = [
  {
    name: 'status answered without a token: the reply is quoted',
    fault: {auth: (r) => r.auth ?? VALID},
    opts: {only: ['auth.missing-bearer']},
    want: {
      'auth.missing-bearer':
        'fail: without Authorization: HTTP 200 {"kind":"model","instance":"p","phase":"idle","checkpoint_id":null,"lease_expires_at":null,"retired_rollouts":0,"report"… (249 characters in all)',
    },
  },
  {
    name: '401 with another error code',
    fault: {before: (r) => (r.auth === undefined ? err(401, 'forbidden') : undefined)},
    opts: {only: ['auth.missing-bearer']},
    want: {'auth.missing-bearer': 'fail: without Authorization: 401, but the body is not {"error": {"code": "unauthorized", …}}: {"error":{"code":"forbidden","detail":"fault: forbidden"}}'},
  },
  {
    name: 'the connection dropped without a reply',
    fault: {before: (r) => (r.auth === undefined ? {status: 0, json: null} : undefined)},
    opts: {only: ['auth.missing-bearer']},
    want: {'auth.missing-bearer': 'fail: without Authorization: no reply (connection closed before a reply)'},
  },
  {
    name: 'a wrong token answered 403 with a text body',
    fault: {before: (r) => (r.auth !== undefined && r.auth !== VALID && r.method === 'GET' && /^Bearer [0-9a-f]{32}$/.test(r.auth) ? {status: 403, json: 'go away'} : undefined)},
    opts: {only: ['auth.wrong-bearer', 'auth.missing-bearer']},
    want: {'auth.missing-bearer': 'pass: 401 unauthorized', 'auth.wrong-bearer': 'fail: with a wrong token: HTTP 403 go away'},
  },
  {
    name: 'a long non-JSON body is clipped to 80 characters',
    fault: {before: (r) => (r.auth === undefined ? {status: 500, json: 'x'.repeat(200)} : undefined)},
    opts: {only: ['auth.missing-bearer']},
    want: {'auth.missing-bearer': `fail: without Authorization: HTTP 500 ${'x'.repeat(80)}… (200 characters in all)`},
  },
  {
    name: 'a 401 that is not JSON',
    fault: {before: (r) => (r.auth === undefined ? {status: 401, json: 'denied'} : undefined)},
    opts: {only: ['auth.missing-bearer']},
    want: {'auth.missing-bearer': 'fail: without Authorization: 401, but the body is not {"error": {"code": "unauthorized", …}}: denied'},
  },
  {
    name: '"bearer <token>" accepted',
    fault: {auth: (r) => (r.auth === `bearer ${TOKEN}` ? VALID : r.auth)},
    opts: {only: ['auth.exact-bearer']},
    want: {
      'auth.exact-bearer':
        'fail: "bearer <token>": HTTP 200 {"kind":"model","instance":"p","phase":"idle","checkpoint_id":null,"lease_expires_at":null,"retired_rollouts":0,"report"… (249 characters in all)',
    },
  },
  {
    name: '"Bearer  <token>" accepted',
    fault: {auth: (r) => (r.auth === `Bearer  ${TOKEN}` ? VALID : r.auth)},
    opts: {only: ['auth.exact-bearer']},
    want: {
      'auth.exact-bearer':
        'fail: "Bearer  <token>" (two spaces): HTTP 200 {"kind":"model","instance":"p","phase":"idle","checkpoint_id":null,"lease_expires_at":null,"retired_rollouts":0,"report"… (249 characters in all)',
    },
  },
  {
    name: 'a POST with a wrong token answered as with the right one',
    fault: {auth: (r) => (r.method === 'POST' && r.auth ? VALID : r.auth)},
    opts: {only: ['auth.post-bearer']},
    want: {'auth.post-bearer': 'fail: resume with a wrong token: HTTP 200 {"phase":"idle","idempotent":true}'},
  },
]

describe('conformance messages name what was wrong', () => {
  for (const c of SAFE) it.concurrent(c.name, () => runCase(c))
})

const STATUS: Case[] = [
  {
    name: 'status unreadable after discovery: every status check says what is missing',
    fault: laterStatus(() => ({status: 503, json: 'down'})),
    opts: {only: ['status', 'report']},
    want: {
      'status.reply': 'fail: HTTP 503 down',
      'status.kind': 'fail: kind missing is not one of environment, model, agent, resources',
      'status.instance': 'fail: instance missing is not a safe path component',
      'status.phase': 'fail: phase missing is not one of idle, preparing, prepared, committed, restored',
      'report.schema': 'fail: status report (root): Invalid input: expected object, received undefined',
      'report.blockers': 'skip: status report has no blockers list or blocker_count (see report.schema)',
      'report.restarts': 'skip: status report has no restarts list (see report.schema)',
    },
  },
  {
    name: 'status without checkpoint_id and lease_expires_at: status.reply names the first, status.phase judges only what was sent',
    fault: laterStatus((a) => {
      const json = {...a.json}
      delete json.checkpoint_id
      delete json.lease_expires_at
      return {...a, json}
    }),
    opts: {only: ['status']},
    want: {
      'status.reply': 'fail: status reply checkpoint_id: Invalid input: expected string, received undefined',
      'status.kind': 'pass: model',
      'status.instance': 'pass: p',
      'status.phase': 'pass: idle',
    },
  },
  {
    name: 'kind 5',
    fault: laterStatus((a) => ({...a, json: {...a.json, kind: 5}})),
    opts: {only: ['status.kind']},
    want: {'status.kind': 'fail: kind 5 is not one of environment, model, agent, resources'},
  },
  {
    name: 'kind judge after discovery',
    fault: laterStatus((a) => ({...a, json: {...a.json, kind: 'judge'}})),
    opts: {only: ['status.kind']},
    want: {'status.kind': 'fail: kind "judge" is not one of environment, model, agent, resources'},
  },
  {
    name: 'instance ../p after discovery',
    fault: laterStatus((a) => ({...a, json: {...a.json, instance: '../p'}})),
    opts: {only: ['status.instance']},
    want: {'status.instance': 'fail: instance "../p" is not a safe path component'},
  },
  {
    name: 'instance 7',
    fault: laterStatus((a) => ({...a, json: {...a.json, instance: 7}})),
    opts: {only: ['status.instance']},
    want: {'status.instance': 'fail: instance 7 is not a safe path component'},
  },
  {
    name: 'phase paused',
    fault: laterStatus((a) => ({...a, json: {...a.json, phase: 'paused'}})),
    opts: {only: ['status.phase']},
    want: {'status.phase': 'fail: phase "paused" is not one of idle, preparing, prepared, committed, restored'},
  },
  {
    name: 'phase 3',
    fault: laterStatus((a) => ({...a, json: {...a.json, phase: 3}})),
    opts: {only: ['status.phase']},
    want: {'status.phase': 'fail: phase 3 is not one of idle, preparing, prepared, committed, restored'},
  },
  {
    name: 'idle with a checkpoint_id',
    fault: statusOnly((j) => ({...j, checkpoint_id: 'x'})),
    opts: {only: ['status.phase']},
    want: {'status.phase': 'fail: phase idle with checkpoint_id "x": it must be null exactly when idle'},
  },
  {
    name: 'prepared with checkpoint_id null',
    fault: statusOnly((j) => ({...j, phase: 'prepared', lease_expires_at: 5})),
    opts: {only: ['status.phase']},
    want: {'status.phase': 'fail: phase prepared with checkpoint_id null: it must be null exactly when idle'},
  },
  {
    name: 'idle with a lease',
    fault: statusOnly((j) => ({...j, lease_expires_at: 5})),
    opts: {only: ['status.phase']},
    want: {'status.phase': 'fail: phase idle with lease_expires_at 5: it must be null exactly when idle'},
  },
  {
    name: 'prepared without a lease',
    fault: statusOnly((j) => ({...j, phase: 'prepared', checkpoint_id: 'x'})),
    opts: {only: ['status.phase']},
    want: {'status.phase': 'fail: phase prepared with lease_expires_at null: it must be null exactly when idle'},
  },
  {
    name: 'report without blockers',
    fault: statusOnly((j) => ({...j, report: {...j.report, blockers: undefined}})),
    opts: {only: ['report']},
    want: {
      'report.schema': 'fail: status report blockers: Invalid input: expected array, received undefined',
      'report.blockers': 'skip: status report has no blockers list or blocker_count (see report.schema)',
      'report.restarts': 'pass: 0 restart(s)',
    },
  },
  {
    name: 'report without blocker_count',
    fault: statusOnly((j) => ({...j, report: {...j.report, blocker_count: undefined}})),
    opts: {only: ['report']},
    want: {
      'report.schema': 'fail: status report blocker_count: Invalid input: expected number, received undefined',
      'report.blockers': 'skip: status report has no blockers list or blocker_count (see report.schema)',
      'report.restarts': 'pass: 0 restart(s)',
    },
  },
  {
    name: 'blocker_count 1 with 2 blockers listed',
    fault: statusOnly((j) => ({...j, report: {...j.report, ready: false, blockers: ['b1', 'b2'], blocker_count: 1}})),
    opts: {only: ['report.blockers']},
    want: {'report.blockers': 'fail: blocker_count 1 < 2 blockers listed'},
  },
  {
    name: '101 blockers listed',
    fault: statusOnly((j) => ({...j, report: {...j.report, ready: false, blockers: Array.from({length: 101}, (_, i) => `b${i}`), blocker_count: 101}})),
    opts: {only: ['report']},
    want: {'report.schema': 'pass: status report', 'report.blockers': 'fail: 101 blockers listed; at most 100 (blocker_count carries the full number)', 'report.restarts': 'pass: 0 restart(s)'},
  },
  {
    name: '100 blockers listed, blocker_count 100',
    fault: statusOnly((j) => ({...j, report: {...j.report, ready: false, blockers: Array.from({length: 100}, (_, i) => `b${i}`), blocker_count: 100}})),
    opts: {only: ['report']},
    want: {'report.schema': 'pass: status report', 'report.blockers': 'pass: 100 listed, blocker_count 100', 'report.restarts': 'pass: 0 restart(s)'},
  },
  {
    name: '2 blockers, blocker_count 2',
    fault: statusOnly((j) => ({...j, report: {...j.report, ready: false, blockers: ['b1', 'b2'], blocker_count: 2}})),
    opts: {only: ['report']},
    want: {'report.schema': 'pass: status report', 'report.blockers': 'pass: 2 listed, blocker_count 2', 'report.restarts': 'pass: 0 restart(s)'},
  },
  {
    name: 'no restarts list',
    fault: statusOnly((j) => ({...j, report: {...j.report, restarts: undefined}})),
    opts: {only: ['report']},
    want: {
      'report.schema': 'fail: status report restarts: Invalid input: expected array, received undefined',
      'report.blockers': 'pass: 0 listed, blocker_count 0',
      'report.restarts': 'skip: status report has no restarts list (see report.schema)',
    },
  },
  {
    name: 'a restart that is a number',
    fault: laterStatus((a) => ({...a, json: {...a.json, report: {...a.json.report, restarts: ['r-a1', 5, 'x/y']}}})),
    opts: {only: ['report.restarts']},
    want: {'report.restarts': 'fail: restart 5: not a string'},
  },
  {
    name: 'two restarts that are no capture keys',
    fault: statusOnly((j) => ({...j, report: {...j.report, restarts: ['r-a1', 'no/key', 'x/y']}})),
    opts: {only: ['report.restarts']},
    want: {'report.restarts': 'fail: restart "no/key": invalid rollout ID \'no/key\': rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$'},
  },
  {name: 'two valid restarts', fault: statusOnly((j) => ({...j, report: {...j.report, restarts: ['r-a1', 's']}})), opts: {only: ['report.restarts']}, want: {'report.restarts': 'pass: 2 restart(s)'}},
  {
    name: 'a count that is no integer',
    fault: statusOnly((j) => ({...j, report: {...j.report, counts: {sessions: 1.5}}})),
    opts: {only: ['report.schema']},
    want: {'report.schema': 'fail: status report counts.sessions: Invalid input: expected int, received number'},
  },
  {
    name: 'a report that is null',
    fault: laterStatus((a) => ({...a, json: {...a.json, report: null}})),
    opts: {only: ['report']},
    want: {
      'report.schema': 'fail: status report (root): Invalid input: expected object, received null',
      'report.blockers': 'skip: status report has no blockers list or blocker_count (see report.schema)',
      'report.restarts': 'skip: status report has no restarts list (see report.schema)',
    },
  },
  {
    name: 'status answered 500 with a status body',
    fault: laterStatus((a) => ({...a, status: 500})),
    opts: {only: ['status']},
    want: {
      'status.reply': 'fail: HTTP 500 {"kind":"model","instance":"p","phase":"idle","checkpoint_id":null,"lease_expires_at":null,"retired_rollouts":0,"report"… (249 characters in all)',
      'status.kind': 'fail: kind missing is not one of environment, model, agent, resources',
      'status.instance': 'fail: instance missing is not a safe path component',
      'status.phase': 'fail: phase missing is not one of idle, preparing, prepared, committed, restored',
    },
  },
  {
    name: 'a report that is a string',
    fault: laterStatus((a) => ({...a, json: {...a.json, report: 'fine'}})),
    opts: {only: ['report']},
    want: {
      'report.schema': 'fail: status report (root): Invalid input: expected object, received string',
      'report.blockers': 'skip: status report has no blockers list or blocker_count (see report.schema)',
      'report.restarts': 'skip: status report has no restarts list (see report.schema)',
    },
  },
]

describe('status and report checks name the field and value', () => {
  for (const c of STATUS) it.concurrent(c.name, () => runCase(c))
})

/** A participant that accepts exactly the refusal probe `pick` matches (200 with `reply`), and refuses the rest as the double does. */
const acceptOnly = (pick: (r: Req) => boolean, reply: unknown = {phase: 'idle', idempotent: true}): Fault => ({
  before: (r) => (authorized(r) && r.method === 'POST' && pick(r) ? {status: 200, json: reply} : undefined),
})
const PREPARED = {phase: 'prepared', report: READY}
const cid = (r: Req) => r.json?.checkpoint_id
const ep0 = (r: Req) => r.json?.episode_ids?.[0]
const EXTRA = 'conformance_unknown_field'

const REFUSALS: [name: string, check: string, pick: (r: Req) => boolean, reply?: unknown][] = [
  ['prepare with an unknown key', 'refuse.unknown-field', (r) => r.op === 'prepare' && EXTRA in (r.json ?? {}), PREPARED],
  ['resume with an unknown key', 'refuse.unknown-field', (r) => r.op === 'resume' && EXTRA in (r.json ?? {})],
  ['commit with an unknown key', 'refuse.unknown-field', (r) => r.op === 'commit' && EXTRA in (r.json ?? {}), {phase: 'committed'}],
  ['commit with an unknown key in an EpisodeId', 'refuse.unknown-field', (r) => r.op === 'commit' && EXTRA in (ep0(r) ?? {}), {phase: 'committed'}],
  ...(['prepare', 'resume'] as const).flatMap((op): [string, string, (r: Req) => boolean, unknown][] =>
    (
      [
        ['an empty checkpoint_id', (r) => cid(r) === ''],
        ["checkpoint_id '../…'", (r) => typeof cid(r) === 'string' && cid(r).startsWith('../conformance-')],
        ["checkpoint_id '.…'", (r) => typeof cid(r) === 'string' && cid(r).startsWith('.conformance-')],
        ["checkpoint_id '-…'", (r) => typeof cid(r) === 'string' && cid(r).startsWith('-conformance-')],
        ["checkpoint_id '…/x'", (r) => typeof cid(r) === 'string' && /^conformance-[0-9a-f]{8}\/x$/.test(cid(r))],
        ['a 129-character checkpoint_id', (r) => typeof cid(r) === 'string' && cid(r).length === 129 && /^conformance-[0-9a-f]{8}-x+$/.test(cid(r))],
        ['a number as checkpoint_id', (r) => typeof cid(r) === 'number' && cid(r) >= 0],
      ] as [string, (r: Req) => boolean][]
    ).map(([what, pick]): [string, string, (r: Req) => boolean, unknown] => [
      `${op} with ${what}`,
      'refuse.checkpoint-id',
      (r) => r.op === op && pick(r) && (op === 'resume' || r.json.deadline_ts < Date.now() / 1000),
      op === 'prepare' ? PREPARED : undefined,
    ]),
  ),
  ...['NaN', 'Infinity', '-Infinity', '1e999', '"soon"', 'null'].map((d): [string, string, (r: Req) => boolean, unknown] => [
    `prepare with deadline_ts ${d}`,
    'refuse.deadline',
    (r) => r.op === 'prepare' && r.body.endsWith(`"deadline_ts": ${d}}`) && /^\{"checkpoint_id": "conformance-[0-9a-f]{8}-\d+"/.test(r.body),
    PREPARED,
  ]),
  ['prepare without deadline_ts', 'refuse.deadline', (r) => r.op === 'prepare' && /^\{"checkpoint_id": "conformance-[0-9a-f]{8}-\d+"\}$/.test(r.body), PREPARED],
  [
    'an EpisodeId with the reserved suffix',
    'refuse.episode-id',
    (r) => r.op === 'commit' && /^conformance-[0-9a-f]{8}-r\d+-a1$/.test(ep0(r)?.rollout_id) && ep0(r).attempt === 0,
    {phase: 'committed'},
  ],
  ["an EpisodeId with rollout_id '../x'", 'refuse.episode-id', (r) => r.op === 'commit' && ep0(r)?.rollout_id === '../x' && ep0(r).attempt === 0, {phase: 'committed'}],
  ['an EpisodeId with an empty rollout_id', 'refuse.episode-id', (r) => r.op === 'commit' && ep0(r)?.rollout_id === '' && ep0(r).attempt === 0, {phase: 'committed'}],
  ['an EpisodeId with attempt -1', 'refuse.episode-id', (r) => r.op === 'commit' && /^conformance-[0-9a-f]{8}-r\d+$/.test(ep0(r)?.rollout_id) && ep0(r).attempt === -1, {phase: 'committed'}],
  ['an EpisodeId with attempt 1.5', 'refuse.episode-id', (r) => r.op === 'commit' && /^conformance-[0-9a-f]{8}-r\d+$/.test(ep0(r)?.rollout_id) && ep0(r).attempt === 1.5, {phase: 'committed'}],
  ['a capture-key string as EpisodeId', 'refuse.episode-id', (r) => r.op === 'commit' && typeof ep0(r) === 'string' && /^conformance-[0-9a-f]{8}-r\d+$/.test(ep0(r)), {phase: 'committed'}],
  ['retire with episode_ids []', 'refuse.empty-lists', (r) => r.op === 'retire' && Array.isArray(r.json?.episode_ids) && r.json.episode_ids.length === 0, {retired: []}],
  ['forget with rollout_ids []', 'refuse.empty-lists', (r) => r.op === 'forget' && Array.isArray(r.json?.rollout_ids) && r.json.rollout_ids.length === 0, {forgotten: []}],
]

/** What each wrongly accepted probe is reported as (normalized). */
const REFUSAL_WANT: Record<string, string> = {
  'prepare with an unknown key': 'fail: prepare with an unknown key: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'resume with an unknown key': 'fail: resume with an unknown key: HTTP 200 {"phase":"idle","idempotent":true} (want 422)',
  'prepare with an empty checkpoint_id':
    'fail: prepare with an empty checkpoint_id: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'commit with an unknown key': 'fail: commit with an unknown key: HTTP 200 {"phase":"committed"} (want 422)',
  'commit with an unknown key in an EpisodeId': 'fail: commit with an unknown key in an EpisodeId: HTTP 200 {"phase":"committed"} (want 422)',
  "prepare with checkpoint_id '../…'":
    'fail: prepare with checkpoint_id \'../conformance-TAG\': HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  "prepare with checkpoint_id '.…'":
    'fail: prepare with checkpoint_id \'.conformance-TAG\': HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  "prepare with checkpoint_id '-…'":
    'fail: prepare with checkpoint_id \'-conformance-TAG\': HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  "prepare with checkpoint_id '…/x'":
    'fail: prepare with checkpoint_id \'conformance-TAG/x\': HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'resume with an empty checkpoint_id': 'fail: resume with an empty checkpoint_id: HTTP 200 {"phase":"idle","idempotent":true} (want 422)',
  'prepare with a 129-character checkpoint_id':
    'fail: prepare with a 129-character checkpoint_id: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  "resume with checkpoint_id '../…'": 'fail: resume with checkpoint_id \'../conformance-TAG\': HTTP 200 {"phase":"idle","idempotent":true} (want 422)',
  "resume with checkpoint_id '.…'": 'fail: resume with checkpoint_id \'.conformance-TAG\': HTTP 200 {"phase":"idle","idempotent":true} (want 422)',
  'prepare with a number as checkpoint_id':
    'fail: prepare with a number as checkpoint_id: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  "resume with checkpoint_id '-…'": 'fail: resume with checkpoint_id \'-conformance-TAG\': HTTP 200 {"phase":"idle","idempotent":true} (want 422)',
  'prepare with deadline_ts NaN': 'fail: prepare with deadline_ts NaN: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  "resume with checkpoint_id '…/x'": 'fail: resume with checkpoint_id \'conformance-TAG/x\': HTTP 200 {"phase":"idle","idempotent":true} (want 422)',
  'prepare with deadline_ts Infinity':
    'fail: prepare with deadline_ts Infinity: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'resume with a 129-character checkpoint_id': 'fail: resume with a 129-character checkpoint_id: HTTP 200 {"phase":"idle","idempotent":true} (want 422)',
  'prepare with deadline_ts -Infinity':
    'fail: prepare with deadline_ts -Infinity: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'resume with a number as checkpoint_id': 'fail: resume with a number as checkpoint_id: HTTP 200 {"phase":"idle","idempotent":true} (want 422)',
  'prepare with deadline_ts 1e999': 'fail: prepare with deadline_ts 1e999: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'prepare with deadline_ts "soon"':
    'fail: prepare with deadline_ts "soon": HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'prepare with deadline_ts null': 'fail: prepare with deadline_ts null: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'an EpisodeId with the reserved suffix': 'fail: commit with an EpisodeId with a rollout_id with the reserved -a1 suffix: HTTP 200 {"phase":"committed"} (want 422)',
  "an EpisodeId with rollout_id '../x'": 'fail: commit with an EpisodeId with rollout_id \'../x\': HTTP 200 {"phase":"committed"} (want 422)',
  'an EpisodeId with an empty rollout_id': 'fail: commit with an EpisodeId with an empty rollout_id: HTTP 200 {"phase":"committed"} (want 422)',
  'prepare without deadline_ts': 'fail: prepare with deadline_ts missing: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}} (want 422)',
  'an EpisodeId with attempt -1': 'fail: commit with an EpisodeId with attempt -1: HTTP 200 {"phase":"committed"} (want 422)',
  'an EpisodeId with attempt 1.5': 'fail: commit with an EpisodeId with attempt 1.5: HTTP 200 {"phase":"committed"} (want 422)',
  'retire with episode_ids []': 'fail: retire with episode_ids []: HTTP 200 {"retired":[]} (want 422)',
  'a capture-key string as EpisodeId': 'fail: commit with an EpisodeId with a capture-key string instead of an object: HTTP 200 {"phase":"committed"} (want 422)',
  'forget with rollout_ids []': 'fail: forget with rollout_ids []: HTTP 200 {"forgotten":[]} (want 422)',
}

describe('each refusal probe is named when it is wrongly accepted', () => {
  for (const [name, id, pick, reply] of REFUSALS) {
    const c: Case = {name, fault: acceptOnly(pick, reply), opts: {only: [id]}, want: {[id]: REFUSAL_WANT[name]!}}
    it.concurrent(name, () => runCase(c))
  }
})

// ---------------------------------------------------------------- destructive checks

/** A hook on the participant's first successful commit of each checkpoint; later commits replay its answer. */
function onFirstCommit(fn: (r: Req, a: Answer, pdir: string) => Promise<Answer | void>): Fault {
  const done = new Map<string, Answer>()
  return {
    async after(r, a, inner) {
      if (r.op !== 'commit' || a.status !== 200) return a
      const id = r.json.checkpoint_id as string
      if (done.has(id)) return done.get(id)!.json === null ? a : done.get(id)!
      const pdir = participantDir(r.json.checkpoint_dir, inner.participant!.kind, inner.participant!.instance)
      const out = (await fn(r, a, pdir)) ?? null
      done.set(id, out ?? {status: 0, json: null})
      return out ?? a
    },
  }
}

/** The first commit's records file replaced by `text` (named for its digest, manifest and reply to match). */
const recordsAre = (text: string, episodeIds: string[], count = text.split('\n').length - 1) =>
  onFirstCommit(async (_r, a, pdir) => {
    for (const f of await readdir(pdir)) await unlink(path.join(pdir, f))
    const digest = sha(text)
    const manifest = {...a.json.manifest, records_file: `records-${digest}.jsonl`, records_sha256: digest, record_count: count}
    await writeFile(path.join(pdir, manifest.records_file), text, 'latin1')
    await writeFile(path.join(pdir, 'manifest.json'), encodeManifest(manifest))
    return {status: 200, json: {...a.json, manifest, episode_ids: episodeIds}}
  })

/** The first commit's manifest.json replaced by `text` (the reply unchanged unless `reply` says). */
const manifestIs = (text: (m: Record<string, unknown>) => string | Buffer) =>
  onFirstCommit(async (_r, a, pdir) => {
    await unlink(path.join(pdir, 'manifest.json'))
    await writeFile(path.join(pdir, 'manifest.json'), text(a.json.manifest))
  })

/** Answers the n-th (1-based) well-authorized request of `op` itself. */
function nth(op: string, n: number, answer: (r: Req, inner: ParticipantServer) => Answer | undefined): Fault {
  let seen = 0
  return {before: (r, inner) => (authorized(r) && r.op === op && ++seen === n ? answer(r, inner) : undefined)}
}

/** Reports `restarts` in the prepare reply (and in status when `inStatus`), and answers a commit naming `ghost` with `answer`. */
const restarts = (list: unknown[], answer: Answer | null, inStatus = false): Fault => ({
  before: (r) => (authorized(r) && r.op === 'commit' && answer && r.json?.episode_ids?.some((e: any) => e.rollout_id === 'ghost') ? answer : undefined),
  after: (r, a) => ((r.op === 'prepare' || (inStatus && r.op === 'status')) && a.status === 200 && a.json.report ? {...a, json: {...a.json, report: {...a.json.report, restarts: list}}} : a),
})

const D = (only?: string[]): CheckOpts => ({destructive: true, only})
const AFTER = ['store.manifest', 'store.records', 'store.lines', 'store.manifest-last', 'commit.replay', 'commit.conflict', 'commit.export-once']
const LINE = (k: string) => `{"episode_id": {"rollout_id": "${k}", "attempt": 0}}\n`

const DESTRUCTIVE: Case[] = [
  {
    name: 'a prepare with an unknown key opened for real: refuse.unknown-field fails, and the checks after it start idle',
    fault: {body: (r) => (r.op === 'prepare' && EXTRA in (r.json ?? {}) ? JSON.stringify({checkpoint_id: r.json.checkpoint_id, deadline_ts: Date.now() / 1000 + 10}) : r.body)},
    opts: D(['refuse.unknown-field', 'retire.forget']),
    want: {
      'refuse.unknown-field':
        'fail: prepare with an unknown key: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{"sessions":0,"inflight":0},"restart… (127 characters in all) (want 422)',
      'retire.forget': 'pass: retired_rollouts 0 → 1 → 0',
    },
  },
  {
    name: 'a prepare with deadline_ts NaN opened for real: refuse.deadline fails, and the checks after it start idle',
    fault: {body: (r) => (r.op === 'prepare' && r.body.endsWith('"deadline_ts": NaN}') ? r.body.replace('NaN', String(Date.now() / 1000 + 10)) : r.body)},
    opts: D(['refuse.deadline', 'retire.forget']),
    want: {
      'refuse.deadline':
        'fail: prepare with deadline_ts NaN: HTTP 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{"sessions":0,"inflight":0},"restart… (127 characters in all) (want 422)',
      'retire.forget': 'pass: retired_rollouts 0 → 1 → 0',
    },
  },
  {
    name: 'status unreadable when the destructive checks start: retire.forget counts from 0',
    fault: (() => {
      let n = 0
      return {before: (r) => (authorized(r) && r.op === 'status' && ++n === 3 ? {status: 500, json: 'x'} : undefined)}
    })(),
    opts: D(['auth.missing-bearer', 'retire.forget']),
    want: {'auth.missing-bearer': 'pass: 401 unauthorized', 'retire.forget': 'pass: retired_rollouts 0 → 1 → 0'},
  },
  {
    name: 'a participant that keeps no resumed ID: every prepare the fence checks wrongly get is resumed again',
    fault: {},
    kept: 0,
    opts: D(['fence.stale-prepare', 'fence.resume-unknown', 'fence.window']),
    want: {
      'fence.stale-prepare':
        'fail: prepare of resumed conformance-TAG-1: 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{"sessions":0,"inflight":0},"restart… (127 characters in all)',
      'fence.resume-unknown':
        'fail: prepare after that resume: 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{"sessions":0,"inflight":0},"restart… (127 characters in all): the resume did not fence the ID',
      'fence.window': 'skip: conformance-TAG-3 was not fenced even right after its resume (see fence.stale-prepare)',
    },
  },
  {
    name: 'status after the second prepare names another ID',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'prepare' ? (n++, a) : r.op === 'status' && n === 2 ? {...a, json: {...a.json, checkpoint_id: 'other'}} : a)}
    })(),
    opts: D(['phase.prepare-replay']),
    want: {'phase.prepare-replay': 'fail: after the second prepare, status is prepared under other'},
  },
  {
    name: 'timeoutS bounds a raw probe',
    fault: {before: async (r) => void (r.op === 'status' && r.auth === undefined && (await new Promise((res) => setTimeout(res, 1500))))},
    opts: {only: ['auth.missing-bearer'], timeoutS: 1},
    want: {'auth.missing-bearer': 'fail: without Authorization: no reply (The operation was aborted due to timeout)'},
  },
  {
    name: 'retire refused from idle',
    fault: nth('retire', 1, () => err(409, 'invalid_phase')),
    opts: D(['retire.forget']),
    want: {'retire.forget': 'fail: retire of a new rollout from idle: HTTP 409 invalid_phase fault: invalid_phase'},
  },
  {
    name: 'forget answered but the mark kept: the cleanup forgets it once more',
    fault: nth('forget', 1, (r) => ({status: 200, json: {forgotten: [...r.json.rollout_ids]}})),
    opts: D(['retire.forget']),
    want: {'retire.forget': 'fail: after the forget, retired_rollouts is 1, not 0: the mark stayed'},
  },
  {
    name: 'retire and forget done: nothing is left for the cleanup to forget',
    fault: {},
    opts: D(['retire.forget']),
    sent: (requests) => expect(requests.filter((r) => r.op === 'forget')).toHaveLength(1),
    want: {'retire.forget': 'pass: retired_rollouts 0 → 1 → 0'},
  },
  {
    name: 'retire answered without marking',
    fault: nth('retire', 1, () => ({status: 200, json: {retired: ['x']}})),
    opts: D(['retire.forget']),
    want: {'retire.forget': 'fail: after the retire, retired_rollouts is 0, not 1'},
  },
  {
    name: 'forget refused once: the cleanup forgets the mark',
    fault: nth('forget', 1, () => err(409, 'retire_incomplete')),
    opts: D(['retire.forget']),
    want: {'retire.forget': 'fail: forget: HTTP 409 retire_incomplete fault: retire_incomplete'},
  },
  {
    name: 'retire done but its reply lost: the cleanup forgets the mark',
    fault: {after: (r, a) => (r.op === 'retire' && a.status === 200 ? {status: 0, json: null} : a)},
    opts: D(['retire.forget']),
    want: {'retire.forget': 'fail: retire of a new rollout from idle: connection closed before a reply'},
  },
  {
    name: 'prepare refused',
    fault: nth('prepare', 1, () => err(409, 'checkpoint_error')),
    opts: D(['phase.prepare', 'commit.replay', 'fence.stale-prepare']),
    want: {
      'phase.prepare': 'fail: prepare: HTTP 409 checkpoint_error',
      'commit.replay': 'skip: needs a prepared checkpoint, and prepare of conformance-TAG-1 did not leave the participant prepared (see phase.prepare)',
      'fence.stale-prepare': 'skip: needs a prepared checkpoint, and prepare of conformance-TAG-1 did not leave the participant prepared (see phase.prepare)',
    },
  },
  {
    name: 'prepare not ready by the deadline',
    fault: {after: (r, a) => (r.op === 'prepare' && a.status === 200 ? {...a, json: {phase: 'preparing', report: {...READY, ready: false, blockers: ['r7'], blocker_count: 1}}} : a)},
    opts: D(['phase.prepare']),
    want: {'phase.prepare': 'fail: prepare replied phase "preparing": not ready by the deadline, blockers ["r7"] (is the fleet idle?)'},
  },
  {
    name: 'prepare not ready, its reply without a report: phase.prepare fails, the run goes on (it threw a TypeError before)',
    fault: {after: (r, a) => (r.op === 'prepare' && a.status === 200 ? {...a, json: {phase: 'preparing'}} : a)},
    opts: D(['phase.prepare', 'phase.resume']),
    want: {
      'phase.prepare': 'fail: prepare replied phase "preparing": not ready by the deadline, blockers missing (is the fleet idle?)',
      'phase.resume': 'pass: idle, idempotent false; checkpoint_id and lease null',
    },
  },
  {
    name: 'prepare answered 200 with a text body',
    fault: {after: (r, a) => (r.op === 'prepare' && a.status === 200 ? {...a, json: 'ok'} : a)},
    opts: D(['phase.prepare']),
    want: {'phase.prepare': 'fail: prepare replied phase undefined'},
  },
  {
    name: 'status prepared under another ID',
    fault: statusOnly((j) => (j.phase === 'prepared' ? {...j, checkpoint_id: 'other'} : j)),
    opts: D(['phase.prepare', 'phase.prepare-replay']),
    want: {
      'phase.prepare': 'fail: after prepare, status is prepared under other, not prepared under conformance-TAG-1',
      'phase.prepare-replay': 'skip: needs a prepared checkpoint, and prepare of conformance-TAG-1 did not leave the participant prepared (see phase.prepare)',
    },
  },
  {
    name: 'prepare replied idle',
    fault: {after: (r, a) => (r.op === 'prepare' && a.status === 200 ? {...a, json: {...a.json, phase: 'idle'}} : a)},
    opts: D(['phase.prepare']),
    want: {'phase.prepare': 'fail: prepare replied phase "idle"'},
  },
  {
    name: 'prepare reply without counts',
    fault: {after: (r, a) => (r.op === 'prepare' && a.status === 200 ? {...a, json: {...a.json, report: {...a.json.report, counts: undefined}}} : a)},
    opts: D(['phase.prepare']),
    want: {'phase.prepare': 'fail: prepare reply report counts: Invalid input: expected record, received undefined'},
  },
  {
    name: 'status says idle though prepared: prepare undone by a resume',
    fault: {after: (r, a) => (r.op === 'status' && a.status === 200 ? {...a, json: {...a.json, phase: 'idle', checkpoint_id: null, lease_expires_at: null}} : a)},
    opts: D(['phase.prepare', 'phase.resume']),
    want: {
      'phase.prepare': 'fail: after prepare, status is idle under null, not prepared under conformance-TAG-1',
      'phase.resume': 'skip: needs a prepared checkpoint, and prepare of conformance-TAG-1 did not leave the participant prepared (see phase.prepare)',
    },
  },
  {
    name: 'status unreadable right after prepare',
    fault: (() => {
      let prepared = false
      return {
        before: (r) => {
          if (authorized(r) && r.op === 'prepare') prepared = true
          else if (authorized(r) && r.op === 'status' && prepared) return ((prepared = false), {status: 500, json: 'boom'})
          return undefined
        },
      }
    })(),
    opts: D(['phase.prepare']),
    want: {'phase.prepare': 'fail: after prepare, status is unreadable, not prepared under conformance-TAG-1'},
  },
  {
    name: 'lease null while prepared',
    fault: statusOnly((j) => (j.phase === 'prepared' ? {...j, lease_expires_at: null} : j)),
    opts: D(['phase.prepare']),
    want: {'phase.prepare': 'fail: lease_expires_at null is before deadline_ts T'},
  },
  {
    name: 'lease exactly at the deadline',
    fault: (() => {
      let dl = 0
      return {
        after: (r, a) => {
          if (r.op === 'prepare' && dl === 0) dl = r.json.deadline_ts
          return r.op === 'status' && a.json.phase === 'prepared' ? {...a, json: {...a.json, lease_expires_at: dl}} : a
        },
      }
    })(),
    opts: D(['phase.prepare']),
    want: {'phase.prepare': 'pass: prepared under conformance-TAG-1, lease 0 s past the deadline'},
  },
  {
    name: 'second prepare replied preparing',
    fault: nth('prepare', 2, () => ({status: 200, json: {phase: 'preparing', report: READY}})),
    opts: D(['phase.prepare-replay']),
    want: {'phase.prepare-replay': 'fail: second prepare of conformance-TAG-1: 200 {"phase":"preparing","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}}'},
  },
  {
    name: 'status after the second prepare says idle',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'prepare' ? (n++, a) : r.op === 'status' && n === 2 ? {...a, json: {...a.json, phase: 'idle', checkpoint_id: null}} : a)}
    })(),
    opts: D(['phase.prepare-replay']),
    want: {'phase.prepare-replay': 'fail: after the second prepare, status is idle under null'},
  },
  {
    name: 'slow renews: a call waits until its deadline plus the grace, one with a past deadline only the grace',
    fault: {after: async (r, a) => (r.op === 'renew' ? new Promise((res) => setTimeout(() => res(a), 1500)) : a)},
    opts: {...D(['lease.renew']), grace: 0.5},
    want: {'lease.renew': 'fail: renew with an earlier deadline: no reply within 0.5 seconds'},
  },
  {name: 'renew refused', fault: nth('renew', 1, () => err(409, 'invalid_phase')), opts: D(['lease.renew']), want: {'lease.renew': 'fail: renew: HTTP 409 invalid_phase fault: invalid_phase'}},
  {
    name: 'renew replies a lease before its deadline',
    fault: {after: (r, a) => (r.op === 'renew' && a.status === 200 ? {...a, json: {lease_expires_at: r.json.deadline_ts - 100}} : a)},
    opts: D(['lease.renew']),
    want: {'lease.renew': 'fail: renew to deadline_ts T replied lease_expires_at T, before the deadline'},
  },
  {
    name: 'second renew refused',
    fault: nth('renew', 2, () => err(409, 'invalid_phase')),
    opts: D(['lease.renew']),
    want: {'lease.renew': 'fail: renew with an earlier deadline: HTTP 409 invalid_phase fault: invalid_phase'},
  },
  {
    name: 'second renew moves the lease back',
    fault: {after: (r, a) => (r.op === 'renew' && a.status === 200 ? {...a, json: {lease_expires_at: r.json.deadline_ts + 600}} : a)},
    opts: D(['lease.renew']),
    want: {'lease.renew': 'fail: renew with an earlier deadline moved the lease back from T to T'},
  },
  {
    name: 'renew exactly to the deadline, never moved',
    fault: (() => {
      let first = 0
      return {after: (r, a) => (r.op === 'renew' && a.status === 200 ? {...a, json: {lease_expires_at: (first ||= r.json.deadline_ts)}} : a)}
    })(),
    opts: D(['lease.renew']),
    want: {'lease.renew': 'pass: lease 0 s past the deadline; never moved back'},
  },
]

describe('destructive checks name what was wrong', () => {
  for (const c of DESTRUCTIVE) it.concurrent(c.name, () => runCase(c))
})

/** Answers prepare of an ID other than the open one (while one is open) with `a`. */
const otherPrepare = (a: Answer): Fault => ({
  before: (r, inner) => (authorized(r) && r.op === 'prepare' && inner.controlPlane!.checkpointId !== null && inner.controlPlane!.checkpointId !== cid(r) ? a : undefined),
})
const whileOpen = (op: string, a: Answer): Fault => ({before: (r, inner) => (authorized(r) && r.op === op && inner.controlPlane!.checkpointId !== null ? a : undefined)})

const DESTRUCTIVE_2: Case[] = [
  {
    name: 'another prepare refused with 409 invalid_phase',
    fault: otherPrepare(err(409, 'invalid_phase')),
    opts: D(['fence.conflict']),
    want: {'fence.conflict': 'fail: prepare of conformance-TAG-2 while conformance-TAG-1 is open: HTTP 409 invalid_phase fault: invalid_phase'},
  },
  {
    name: 'another prepare refused with 423 checkpoint_conflict',
    fault: otherPrepare(err(423, 'checkpoint_conflict')),
    opts: D(['fence.conflict']),
    want: {'fence.conflict': 'fail: prepare of conformance-TAG-2 while conformance-TAG-1 is open: HTTP 423 checkpoint_conflict fault: checkpoint_conflict'},
  },
  {
    name: 'retire while open answered',
    fault: whileOpen('retire', {status: 200, json: {retired: ['x']}}),
    opts: D(['outside.retire-open']),
    want: {'outside.retire-open': 'fail: retire while conformance-TAG-1 is prepared: 200 {"retired_count":1}'},
  },
  {
    name: 'forget while open refused with 409 checkpoint_conflict',
    fault: whileOpen('forget', err(409, 'checkpoint_conflict')),
    opts: D(['outside.forget-open']),
    want: {'outside.forget-open': 'fail: forget while conformance-TAG-1 is prepared: HTTP 409 checkpoint_conflict fault: checkpoint_conflict'},
  },
  {
    name: 'commit refused',
    fault: nth('commit', 1, () => err(409, 'checkpoint_error')),
    opts: D(['commit.reply', ...AFTER]),
    want: {
      'commit.reply': 'fail: commit: HTTP 409 checkpoint_error',
      'store.manifest': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'store.records': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'store.lines': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'store.manifest-last': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'commit.replay': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'commit.conflict': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'commit.export-once': 'skip: needs a commit reply with a manifest (see commit.reply)',
    },
  },
  {
    name: 'commit reply names another checkpoint',
    fault: {after: (r, a) => (r.op === 'commit' && a.status === 200 ? {...a, json: {...a.json, manifest: {...a.json.manifest, checkpoint_id: 'other'}}} : a)},
    opts: D(['commit.reply']),
    want: {'commit.reply': 'fail: commit reply manifest names model/p checkpoint other, not model/p checkpoint conformance-TAG-1'},
  },
  {
    name: 'commit reply names another instance',
    fault: {after: (r, a) => (r.op === 'commit' && a.status === 200 ? {...a, json: {...a.json, manifest: {...a.json.manifest, instance: 'q'}}} : a)},
    opts: D(['commit.reply']),
    want: {'commit.reply': 'fail: commit reply manifest names model/q checkpoint conformance-TAG-1, not model/p checkpoint conformance-TAG-1'},
  },
  {
    name: 'commit reply names another kind',
    fault: {after: (r, a) => (r.op === 'commit' && a.status === 200 ? {...a, json: {...a.json, manifest: {...a.json.manifest, kind: 'agent'}}} : a)},
    opts: D(['commit.reply']),
    want: {'commit.reply': 'fail: commit reply manifest names agent/p checkpoint conformance-TAG-1, not model/p checkpoint conformance-TAG-1'},
  },
  {
    name: 'status after commit still prepared',
    fault: statusOnly((j) => (j.phase === 'committed' ? {...j, phase: 'prepared'} : j)),
    opts: D(['commit.reply']),
    want: {'commit.reply': 'fail: after commit, status is prepared under conformance-TAG-1, not committed under conformance-TAG-1'},
  },
  {
    name: 'commit reply without a manifest',
    fault: {after: (r, a) => (r.op === 'commit' && a.status === 200 ? {...a, json: {phase: 'committed', episode_ids: []}} : a)},
    opts: D(['commit.reply', ...AFTER]),
    want: {
      'commit.reply': 'fail: commit reply manifest: Invalid input: expected object, received undefined',
      'store.manifest': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'store.records': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'store.lines': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'store.manifest-last': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'commit.replay': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'commit.conflict': 'skip: needs a commit reply with a manifest (see commit.reply)',
      'commit.export-once': 'skip: needs a commit reply with a manifest (see commit.reply)',
    },
  },
  {
    name: 'commit reply with episode_ids not a list: the files are still checked',
    fault: {after: (r, a) => (r.op === 'commit' && a.status === 200 ? {...a, json: {...a.json, episode_ids: 'none'}} : a)},
    opts: D(['commit.reply', 'store.manifest', 'store.records']),
    want: {
      'commit.reply': 'fail: commit reply episode_ids: Invalid input: expected array, received string',
      'store.manifest': "pass: 310 bytes, sorted keys, indent 1, no trailing newline; equal to the commit reply's",
      'store.records': 'pass: 0 record(s), 0 bytes; name = content sha256 = records_sha256; record_count matches',
    },
  },
  {
    name: 'manifest.json with a non-ASCII byte',
    fault: manifestIs((m) => encodeManifest({...m, note: 'é'}).replace('\\u00e9', 'é')),
    opts: D(['store.manifest']),
    want: {'store.manifest': 'fail: manifest.json holds non-ASCII bytes (json.dumps writes ASCII escapes)'},
  },
  {name: 'manifest.json not JSON', fault: manifestIs(() => 'not json at all'), opts: D(['store.manifest']), want: {'store.manifest': 'fail: manifest.json is not JSON: not json at all'}},
  {name: 'manifest.json a string', fault: manifestIs(() => '"manifest"'), opts: D(['store.manifest']), want: {'store.manifest': 'fail: manifest.json is not a JSON object'}},
  {
    name: 'manifest.json indented by 2 with a trailing newline',
    fault: manifestIs((m) => JSON.stringify(m, null, 2) + '\n'),
    opts: D(['store.manifest']),
    want: {'store.manifest': 'fail: manifest.json is not json.dumps(sort_keys=True, indent=1) output, at character 3: got " \\"checkpoint_id\\": \\"confo", expected "\\"checkpoint_id\\": \\"confor"'},
  },
  {name: 'manifest.json a list', fault: manifestIs(() => '[]'), opts: D(['store.manifest']), want: {'store.manifest': 'fail: manifest.json is not a JSON object'}},
  {name: 'manifest.json null', fault: manifestIs(() => 'null'), opts: D(['store.manifest']), want: {'store.manifest': 'fail: manifest.json is not a JSON object'}},
  {
    name: 'manifest.json with schema_version 2',
    fault: manifestIs((m) => encodeManifest({...m, schema_version: 2})),
    opts: D(['store.manifest']),
    want: {'store.manifest': 'fail: schema_version 2, not 1'},
  },
  {
    name: 'manifest.json of another kind',
    fault: manifestIs((m) => encodeManifest({...m, kind: 'agent'})),
    opts: D(['store.manifest']),
    want: {'store.manifest': 'fail: names agent/p checkpoint conformance-TAG-1, not model/p checkpoint conformance-TAG-1'},
  },
  {
    name: 'manifest.json of another instance',
    fault: manifestIs((m) => encodeManifest({...m, instance: 'q'})),
    opts: D(['store.manifest']),
    want: {'store.manifest': 'fail: names model/q checkpoint conformance-TAG-1, not model/p checkpoint conformance-TAG-1'},
  },
  {
    name: 'manifest.json of another checkpoint',
    fault: manifestIs((m) => encodeManifest({...m, checkpoint_id: 'other'})),
    opts: D(['store.manifest']),
    want: {'store.manifest': 'fail: names model/p checkpoint other, not model/p checkpoint conformance-TAG-1'},
  },
  {
    name: 'manifest.json with a field the reply lacks',
    fault: manifestIs((m) => encodeManifest({...m, extra: 1})),
    opts: D(['store.manifest']),
    want: {'store.manifest': 'fail: manifest.json differs from the manifest in the commit reply'},
  },
  {
    name: 'manifest.json missing',
    fault: onFirstCommit(async (_r, _a, pdir) => unlink(path.join(pdir, 'manifest.json'))),
    opts: D(['store.manifest', 'store.manifest-last']),
    want: {
      'store.manifest': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'store.manifest-last':
        'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
    },
  },
]

describe('commit and store checks name what was wrong', () => {
  for (const c of DESTRUCTIVE_2) it.concurrent(c.name, () => runCase(c))
})

const STORE: Case[] = [
  {
    name: 'records_file not named for a digest',
    fault: onFirstCommit(async (_r, a) => ({...a, json: {...a.json, manifest: {...a.json.manifest, records_file: 'records.jsonl'}}})),
    opts: D(['store.records']),
    want: {'store.records': 'fail: records_file "records.jsonl" is not records-<sha256 hex>.jsonl'},
  },
  {
    name: 'the records file named by the manifest is missing',
    fault: onFirstCommit(async (_r, a, pdir) => unlink(path.join(pdir, a.json.manifest.records_file))),
    opts: D(['store.records', 'store.lines']),
    want: {
      'store.records': 'fail: records-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.jsonl, named by the manifest, is missing',
      'store.lines': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
    },
  },
  {
    name: 'the participant directory removed after the commit',
    fault: onFirstCommit(async (_r, _a, pdir) => rm(pdir, {recursive: true, force: true})),
    opts: D(['store.manifest', 'store.records', 'store.lines', 'store.manifest-last', 'commit.export-once']),
    want: {
      'store.manifest': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'store.records': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'store.lines': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'store.manifest-last':
        'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'commit.export-once': 'skip: cannot list SCRATCH/conformance-TAG-1/gym/model/p',
    },
  },
  {
    name: 'a record appended after the digest was taken',
    fault: onFirstCommit(async (_r, a, pdir) => writeFile(path.join(pdir, a.json.manifest.records_file), LINE('zz'))),
    opts: D(['store.records']),
    want: {'store.records': 'fail: SCRATCH/conformance-TAG-1/gym/model/p/records-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.jsonl does not match its manifest digest'},
  },
  {
    name: 'a commit answered 500 with a commit reply: nothing on disk is judged',
    fault: {after: (r, a) => (r.op === 'commit' && a.status === 200 ? {...a, status: 500} : a)},
    opts: D(['commit.reply', 'store.manifest']),
    want: {
      'commit.reply': 'fail: commit: HTTP 500 {"phase":"committed","manifest":{"checkpoint_id":"conformance-TAG-1","instance":"p","kind":"model","record_count":0… (356 characters in all)',
      'store.manifest': 'skip: needs a commit reply with a manifest (see commit.reply)',
    },
  },
  {
    name: 'a restart reported, commit.restart-in-scope not selected: no commit names it',
    fault: restarts(['ghost'], null),
    opts: D(['commit.reply', 'commit.replay']),
    sent: (requests) => expect(requests.filter((r) => r.op === 'commit' && JSON.stringify(r.json?.episode_ids).includes('ghost'))).toEqual([]),
    want: {'commit.reply': 'pass: committed 0 record(s) into SCRATCH/conformance-TAG-1', 'commit.replay': 'pass: the same reply'},
  },
  {
    name: 'status after commit committed under another ID',
    fault: statusOnly((j) => (j.phase === 'committed' ? {...j, checkpoint_id: 'other'} : j)),
    opts: D(['commit.reply']),
    want: {'commit.reply': 'fail: after commit, status is committed under other, not committed under conformance-TAG-1'},
  },
  {
    name: 'a records file named for another digest than its content, the manifest naming its content',
    fault: onFirstCommit(async (_r, a, pdir) => {
      for (const f of await readdir(pdir)) await unlink(path.join(pdir, f))
      const text = LINE('zz')
      const manifest = {...a.json.manifest, records_file: `records-${sha('other')}.jsonl`, records_sha256: sha(text), record_count: 1}
      await writeFile(path.join(pdir, manifest.records_file), text)
      await writeFile(path.join(pdir, 'manifest.json'), encodeManifest(manifest))
      return {status: 200, json: {...a.json, manifest, episode_ids: ['zz']}}
    }),
    opts: D(['store.records']),
    want: {
      'store.records':
        "fail: SCRATCH/conformance-TAG-1/gym/model/p/records-d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa.jsonl is named for sha256 d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa, but its content and its manifest's records_sha256 are d82d49a8bc66429db195dd277bb8fdb3938b8205bc1650ec09baeb1797821664",
    },
  },
  {
    name: 'two temporary files left beside the records',
    fault: onFirstCommit(async (_r, _a, pdir) => {
      await writeFile(path.join(pdir, '.records.jsonl.b'), '')
      await writeFile(path.join(pdir, '.records.jsonl.a'), '')
    }),
    opts: D(['store.records']),
    want: {'store.records': 'fail: other files left in SCRATCH/conformance-TAG-1/gym/model/p: .records.jsonl.a, .records.jsonl.b (temporary files are removed; one records file per commit)'},
  },
  {
    name: 'a records file that starts with an empty line',
    fault: recordsAre('\n' + LINE('a'), ['a'], 2),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1 is not JSON: unexpected end of input at character 0'},
  },
  {
    name: 'a record without its newline',
    fault: recordsAre(LINE('zz').trimEnd(), ['zz'], 1),
    opts: D(['store.records', 'store.lines']),
    want: {
      'store.records': 'fail: records-18b039c862c20499a44af77ca6747c9dbcd2197e16abc2db0480485dda26921b.jsonl does not end with a newline: every record line ends with \\n',
      'store.lines': 'pass: 1 line(s) re-encode byte for byte',
    },
  },
  {
    name: 'reply episode_ids not the records keys',
    fault: recordsAre(LINE('zz'), ['yy']),
    opts: D(['store.records']),
    want: {'store.records': 'fail: the commit reply\'s episode_ids ["yy"] are not the sorted capture keys of the records ["zz"]'},
  },
  {
    name: 'reply episode_ids unsorted',
    fault: recordsAre(LINE('b') + LINE('a'), ['b', 'a']),
    opts: D(['store.records']),
    want: {'store.records': 'fail: the commit reply\'s episode_ids ["b","a"] are not the sorted capture keys of the records ["a","b"]'},
  },
  {
    name: 'reply episode_ids sorted, records in another order',
    fault: recordsAre(LINE('b') + LINE('a'), ['a', 'b']),
    opts: D(['store.records', 'store.lines']),
    want: {'store.records': 'pass: 2 record(s), 100 bytes; name = content sha256 = records_sha256; record_count matches', 'store.lines': 'pass: 2 line(s) re-encode byte for byte'},
  },
  {
    name: 'a temporary file left beside the records',
    fault: onFirstCommit(async (_r, _a, pdir) => writeFile(path.join(pdir, '.records.jsonl.tmp'), '')),
    opts: D(['store.records']),
    want: {'store.records': 'fail: other files left in SCRATCH/conformance-TAG-1/gym/model/p: .records.jsonl.tmp (temporary files are removed; one records file per commit)'},
  },
  {
    name: 'a line with a non-ASCII byte',
    fault: recordsAre(LINE('a') + '{"episode_id": {"rollout_id": "b", "attempt": 0}, "x": "\xe9"}\n', ['a', 'b']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 2 holds non-ASCII bytes (json.dumps escapes them as \\uXXXX)'},
  },
  {
    name: 'a line that is not JSON',
    fault: recordsAre(LINE('a') + '{"episode_id": \n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 2 is not JSON: unexpected end of input at character 15'},
  },
  {name: 'a line that is a list', fault: recordsAre('[1, 2]\n', []), opts: D(['store.lines']), want: {'store.lines': 'fail: line 1 is not a JSON object'}},
  {
    name: 'episode_id not the first key',
    fault: recordsAre('{"x": 1, "episode_id": {"rollout_id": "a", "attempt": 0}}\n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1: the first key is "x", not "episode_id"'},
  },
  {
    name: 'episode_id keys in the other order',
    fault: recordsAre('{"episode_id": {"attempt": 0, "rollout_id": "a"}}\n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1: episode_id is not {"rollout_id": <rollout ID>, "attempt": <int ≥ 0>}'},
  },
  {
    name: 'episode_id with a negative attempt',
    fault: recordsAre('{"episode_id": {"rollout_id": "a", "attempt": -1}}\n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1: episode_id is not {"rollout_id": <rollout ID>, "attempt": <int ≥ 0>}'},
  },
  {
    name: 'episode_id a string',
    fault: recordsAre('{"episode_id": "a"}\n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1: episode_id is not {"rollout_id": <rollout ID>, "attempt": <int ≥ 0>}'},
  },
  {
    name: 'two good lines',
    fault: recordsAre(LINE('a') + LINE('b'), ['a', 'b']),
    opts: D(['store.lines', 'store.records']),
    want: {'store.records': 'pass: 2 record(s), 100 bytes; name = content sha256 = records_sha256; record_count matches', 'store.lines': 'pass: 2 line(s) re-encode byte for byte'},
  },
  {
    name: 'a line longer than a read chunk',
    fault: recordsAre(LINE('a') + `{"episode_id": {"rollout_id": "b", "attempt": 0}, "x": "${'y'.repeat(1_500_000)}"}\n` + LINE('c'), ['a', 'b', 'c']),
    opts: D(['store.lines']),
    want: {'store.lines': 'pass: 3 line(s) re-encode byte for byte'},
  },
  {
    name: 'the second line not json.dumps output',
    fault: recordsAre(LINE('a') + '{"episode_id": {"rollout_id": "b", "attempt": 0},"x": 1}\n', ['a', 'b']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 2 is not json.dumps output, at character 49: got "\\"x\\": 1}", expected " \\"x\\": 1}"'},
  },
  {
    name: 'a commit replayed refused',
    fault: nth('commit', 2, () => err(409, 'invalid_phase')),
    opts: D(['commit.replay']),
    want: {'commit.replay': 'fail: commit again with equal arguments: HTTP 409 invalid_phase'},
  },
  {
    name: 'a commit with another scope answered with the first reply (Gym version A)',
    fault: (() => {
      let first: Answer | null = null
      return {
        before: (r) => (authorized(r) && r.op === 'commit' && first ? first : undefined),
        after: (r, a) => {
          if (r.op === 'commit' && a.status === 200) first ??= a
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.conflict']),
    want: {'commit.replay': 'pass: the same reply', 'commit.conflict': 'skip: the first reply replayed: Gym version A replays a completed commit whatever its arguments (B/C and the seed refuse it)'},
  },
  {
    name: 'a commit with another scope refused with 422 checkpoint_conflict',
    fault: {before: (r, inner) => (authorized(r) && r.op === 'commit' && inner.controlPlane!.phase === 'committed' && r.json.episode_ids.length === 1 ? err(422, 'checkpoint_conflict') : undefined)},
    opts: D(['commit.conflict']),
    want: {'commit.conflict': 'fail: commit of committed conformance-TAG-1 with another scope: HTTP 422 checkpoint_conflict (want 409 checkpoint_conflict)'},
  },
  {
    name: 'a commit with another scope answered 500 with the first reply',
    fault: (() => {
      let first: Answer | null = null
      return {
        before: (r) => (authorized(r) && r.op === 'commit' && first && r.json.episode_ids.length === 1 ? {...first, status: 500} : undefined),
        after: (r, a) => {
          if (r.op === 'commit' && a.status === 200) first ??= a
          return a
        },
      }
    })(),
    opts: D(['commit.conflict']),
    want: {
      'commit.conflict':
        'fail: commit of committed conformance-TAG-1 with another scope: HTTP 500 {"phase":"committed","manifest":{"checkpoint_id":"conformance-TAG-1","instance":"p","kind":"model","record_count":0… (356 characters in all) (want 409 checkpoint_conflict)',
    },
  },
  {
    name: 'a participant that stays open whatever is resumed: the cleanup gives up after 4 resumes',
    fault: (() => {
      let open: string | null = null
      return {
        after: (r, a) => {
          if (r.op === 'prepare' && a.json?.phase === 'prepared') open ??= cid(r)
          return r.op === 'status' && open ? {...a, json: {...a.json, phase: 'prepared', checkpoint_id: open, lease_expires_at: 1}} : a
        },
      }
    })(),
    opts: D(['phase.prepare']),
    sent: (requests) => {
      const a = cid(requests.find((r) => r.op === 'prepare')!)
      // phase.resume's, then the cleanup's four.
      expect(requests.filter((r) => r.op === 'resume' && cid(r) === a)).toHaveLength(5)
    },
    want: {'phase.prepare': 'fail: lease_expires_at 1 is before deadline_ts T'},
  },
  {
    name: 'a commit replayed with another reply',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'commit' && a.status === 200 && ++n === 2 ? {...a, json: {...a.json, episode_ids: ['x']}} : a)}
    })(),
    opts: D(['commit.replay']),
    want: {
      'commit.replay':
        'fail: a different reply: {"phase":"committed","manifest":{"checkpoint_id":"conformance-TAG-1","instance":"p","kind":"model","record_count":0,"records_file":"records-e3b0c44298fc1c1… (359 characters in all)',
    },
  },
  {
    name: 'a commit replayed with a text body (it failed as an unexpected error before)',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'commit' && a.status === 200 && ++n === 2 ? {...a, json: 'committed, again'} : a)}
    })(),
    opts: D(['commit.replay']),
    want: {'commit.replay': 'fail: a different reply: committed, again'},
  },
  {
    name: 'a commit replayed with its keys in another order',
    fault: (() => {
      let n = 0
      const reverse = (o: Record<string, unknown>) => Object.fromEntries(Object.entries(o).reverse())
      return {after: (r, a) => (r.op === 'commit' && a.status === 200 && ++n === 2 ? {...a, json: reverse({...a.json, manifest: reverse(a.json.manifest)})} : a)}
    })(),
    opts: D(['commit.replay']),
    want: {'commit.replay': 'pass: the same reply'},
  },
  {
    name: 'a commit with another scope answered with a different reply',
    fault: {
      before: (r, inner) =>
        authorized(r) && r.op === 'commit' && inner.controlPlane!.phase === 'committed' && r.json.episode_ids.length === 1 ? {status: 200, json: {phase: 'committed'}} : undefined,
    },
    opts: D(['commit.conflict']),
    want: {'commit.conflict': 'fail: commit of committed conformance-TAG-1 with another scope: HTTP 200 {"phase":"committed"} (want 409 checkpoint_conflict)'},
  },
  {
    name: 'a replayed commit rewrites the records file',
    fault: (() => {
      let n = 0
      return {
        after: async (r, a, inner) => {
          if (r.op === 'commit' && a.status === 200 && ++n === 2) {
            const pdir = participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p')
            const f = path.join(pdir, a.json.manifest.records_file)
            await unlink(f)
            await writeFile(f, '')
          }
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.export-once']),
    want: {
      'commit.replay': 'pass: the same reply',
      'commit.export-once': 'fail: after the replayed and the conflicting commit, rewritten: records-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.jsonl',
    },
  },
  {
    name: 'a replayed commit removes a file',
    fault: (() => {
      let n = 0
      return {
        after: async (r, a, inner) => {
          if (r.op === 'commit' && a.status === 200 && ++n === 2) await writeFile(path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), 'extra'), 'x')
          if (r.op === 'commit' && a.status === 200 && n === 1) await writeFile(path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), 'old'), 'x')
          if (r.op === 'commit' && a.status === 200 && n === 2) await unlink(path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), 'old'))
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.export-once']),
    want: {'commit.replay': 'pass: the same reply', 'commit.export-once': 'fail: after the replayed and the conflicting commit, new: extra; gone: old'},
  },
  {
    name: 'a replayed commit removes a file and adds none',
    fault: (() => {
      let n = 0
      return {
        after: async (r, a, inner) => {
          if (r.op !== 'commit' || a.status !== 200) return a
          const old = path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), 'old')
          if (++n === 1) await writeFile(old, 'x')
          else if (n === 2) await unlink(old)
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.export-once']),
    want: {'commit.replay': 'pass: the same reply', 'commit.export-once': 'fail: after the replayed and the conflicting commit, gone: old'},
  },
  {
    name: 'the participant directory removed by the conflicting commit: an unexpected error fails that check only',
    fault: {
      after: async (r, a) => {
        if (r.op !== 'commit' || r.json.episode_ids.length !== 1) return a
        await rm(participantDir(r.json.checkpoint_dir, 'model', 'p'), {recursive: true, force: true})
        return {status: 0, json: null}
      },
    },
    opts: D(['commit.conflict', 'commit.export-once', 'phase.resume']),
    want: {
      'commit.conflict': 'fail: commit of committed conformance-TAG-1 with another scope: no reply (connection closed before a reply) (want 409 checkpoint_conflict)',
      'commit.export-once': "fail: unexpected error: ENOENT: no such file or directory, scandir 'SCRATCH/conformance-TAG-1/gym/model/p'",
      'phase.resume': 'pass: idle, idempotent false; checkpoint_id and lease null',
    },
  },
]

describe('store and replay checks name the file and the difference', () => {
  for (const c of STORE) it.concurrent(c.name, () => runCase(c))
})

/** Resume of the open ID, answered by the participant and then by `change`. */
const resumeOfOpen = (change: (a: Answer) => Answer): Fault => {
  let open: string | null = null
  return {
    before: (r, inner) => {
      if (authorized(r) && r.op === 'resume') open = inner.controlPlane!.checkpointId === cid(r) ? cid(r) : null
      return undefined
    },
    after: (r, a) => (r.op === 'resume' && open !== null && cid(r) === open ? change(a) : a),
  }
}

const RESUME: Case[] = [
  {
    name: "resume of the open ID replies without idempotent: read as sent (the client's default false passed it before)",
    fault: resumeOfOpen((a) => ({...a, json: {phase: 'idle'}})),
    opts: D(['phase.resume']),
    want: {'phase.resume': 'fail: resume replied HTTP 200 {"phase":"idle"}, want {"phase": "idle", "idempotent": false}'},
  },
  {
    name: 'a second resume replies without idempotent',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'resume' && a.status === 200 && ++n === 2 ? {...a, json: {phase: 'idle'}} : a)}
    })(),
    opts: D(['phase.resume', 'phase.resume-again']),
    want: {
      'phase.resume': 'pass: idle, idempotent false; checkpoint_id and lease null',
      'phase.resume-again': 'fail: second resume: HTTP 200 {"phase":"idle"}, want {"phase": "idle", "idempotent": true}',
    },
  },
  {
    name: 'resume of a never-seen ID replies without idempotent',
    fault: {after: (r, a, inner) => (r.op === 'resume' && a.status === 200 && inner.controlPlane!.phase === 'idle' && a.json.idempotent === true ? {...a, json: {phase: 'idle'}} : a)},
    opts: D(['fence.resume-unknown']),
    want: {'fence.resume-unknown': 'fail: resume of a never-seen ID from idle: HTTP 200 {"phase":"idle"}, want {"phase": "idle", "idempotent": true}'},
  },
  {
    name: 'resume of the open ID refused',
    fault: resumeOfOpen(() => err(409, 'deadline_exceeded')),
    opts: D(['phase.resume']),
    want: {'phase.resume': 'fail: resume: HTTP 409 deadline_exceeded'},
  },
  {
    name: 'resume of the open ID replies phase prepared',
    fault: resumeOfOpen((a) => ({...a, json: {...a.json, phase: 'prepared'}})),
    opts: D(['phase.resume']),
    want: {'phase.resume': 'fail: resume replied HTTP 200 {"phase":"prepared","idempotent":false}, want {"phase": "idle", "idempotent": false}'},
  },
  {
    name: 'status after resume keeps the checkpoint_id',
    fault: (() => {
      let resumed: string | null = null
      return {
        after: (r, a) => {
          if (r.op === 'resume' && a.json?.idempotent === false) resumed = cid(r)
          return r.op === 'status' && resumed !== null && a.json.phase === 'idle' ? {...a, json: {...a.json, checkpoint_id: resumed}} : a
        },
      }
    })(),
    opts: D(['phase.resume']),
    want: {'phase.resume': 'fail: after resume, status is phase idle, checkpoint_id conformance-TAG-1, lease_expires_at null'},
  },
  {
    name: 'status after resume keeps a lease',
    fault: (() => {
      let resumed = false
      return {
        after: (r, a) => {
          if (r.op === 'resume' && a.json?.idempotent === false) resumed = true
          return r.op === 'status' && resumed && a.json.phase === 'idle' ? {...a, json: {...a.json, lease_expires_at: 1}} : a
        },
      }
    })(),
    opts: D(['phase.resume']),
    want: {'phase.resume': 'fail: after resume, status is phase idle, checkpoint_id null, lease_expires_at 1'},
  },
  {
    name: 'status after resume says committed',
    fault: (() => {
      let resumed = false
      return {
        after: (r, a) => {
          if (r.op === 'resume' && a.json?.idempotent === false) resumed = true
          return r.op === 'status' && resumed && a.json.phase === 'idle' ? {...a, json: {...a.json, phase: 'committed'}} : a
        },
      }
    })(),
    opts: D(['phase.resume']),
    want: {'phase.resume': 'fail: after resume, status is phase committed, checkpoint_id null, lease_expires_at null'},
  },
  {
    name: 'status unreadable after resume',
    fault: (() => {
      let resumed = false
      return {
        before: (r) => (authorized(r) && r.op === 'status' && resumed ? ((resumed = false), {status: 500, json: 'x'}) : undefined),
        after: (r, a) => {
          if (r.op === 'resume' && a.json?.idempotent === false) resumed = true
          return a
        },
      }
    })(),
    opts: D(['phase.resume']),
    want: {'phase.resume': 'fail: after resume, status is unreadable'},
  },
  {
    name: 'a second resume replies idempotent false',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'resume' && a.status === 200 && ++n === 2 ? {...a, json: {...a.json, idempotent: false}} : a)}
    })(),
    opts: D(['phase.resume', 'phase.resume-again']),
    want: {
      'phase.resume': 'pass: idle, idempotent false; checkpoint_id and lease null',
      'phase.resume-again': 'fail: second resume: HTTP 200 {"phase":"idle","idempotent":false}, want {"phase": "idle", "idempotent": true}',
    },
  },
  {
    name: 'a second resume replies phase prepared',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'resume' && a.status === 200 && ++n === 2 ? {...a, json: {...a.json, phase: 'prepared'}} : a)}
    })(),
    opts: D(['phase.resume', 'phase.resume-again']),
    want: {
      'phase.resume': 'pass: idle, idempotent false; checkpoint_id and lease null',
      'phase.resume-again': 'fail: second resume: HTTP 200 {"phase":"prepared","idempotent":true}, want {"phase": "idle", "idempotent": true}',
    },
  },
  {
    name: 'prepare of a resumed ID refused with 409 checkpoint_conflict',
    fault: nth('prepare', 2, () => err(409, 'checkpoint_conflict')),
    opts: D(['fence.stale-prepare']),
    want: {'fence.stale-prepare': 'fail: prepare of resumed conformance-TAG-1: HTTP 409 checkpoint_conflict fault: checkpoint_conflict'},
  },
  {
    name: 'resume of a never-seen ID replies idempotent false',
    fault: {after: (r, a, inner) => (r.op === 'resume' && a.status === 200 && inner.controlPlane!.phase === 'idle' && a.json.idempotent === true ? {...a, json: {...a.json, idempotent: false}} : a)},
    opts: D(['fence.resume-unknown']),
    want: {'fence.resume-unknown': 'fail: resume of a never-seen ID from idle: HTTP 200 {"phase":"idle","idempotent":false}, want {"phase": "idle", "idempotent": true}'},
  },
  {
    name: 'resume of a never-seen ID replies phase committed',
    fault: {after: (r, a) => (r.op === 'resume' && a.status === 200 && a.json.idempotent === true ? {...a, json: {...a.json, phase: 'committed'}} : a)},
    opts: D(['fence.resume-unknown']),
    want: {'fence.resume-unknown': 'fail: resume of a never-seen ID from idle: HTTP 200 {"phase":"committed","idempotent":true}, want {"phase": "idle", "idempotent": true}'},
  },
  {
    name: 'a never-seen ID resumed and then prepared: 409 invalid_phase',
    fault: nth('prepare', 2, () => err(409, 'invalid_phase')),
    opts: D(['fence.resume-unknown']),
    want: {'fence.resume-unknown': 'fail: prepare after that resume: HTTP 409 invalid_phase fault: invalid_phase: the resume did not fence the ID'},
  },
  {
    name: 'fence.window: the first prepare refused',
    fault: nth('prepare', 2, () => err(409, 'checkpoint_error')),
    opts: D(['fence.window']),
    want: {'fence.window': 'skip: could not prepare conformance-TAG-2: HTTP 409 checkpoint_error fault: checkpoint_error'},
  },
  {
    name: 'fence.window: the first prepare replies preparing',
    fault: nth('prepare', 2, () => ({status: 200, json: {phase: 'preparing', report: READY}})),
    opts: D(['fence.window']),
    want: {'fence.window': 'skip: could not prepare conformance-TAG-2: 200 {"phase":"preparing","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{},"restarts":[]}}'},
  },
  {
    name: 'fence.window: not fenced right after the resume',
    fault: nth('prepare', 3, () => ({status: 200, json: PREPARED})),
    opts: D(['fence.window']),
    want: {'fence.window': 'skip: conformance-TAG-2 was not fenced even right after its resume (see fence.stale-prepare)'},
  },
  {
    name: 'fence.window: not fenced right after the resume, 409 invalid_phase',
    fault: nth('prepare', 3, () => err(409, 'invalid_phase')),
    opts: D(['fence.window']),
    want: {'fence.window': 'skip: conformance-TAG-2 was not fenced even right after its resume (see fence.stale-prepare)'},
  },
  {
    name: 'fence.window: a resume of a newer ID refused',
    fault: nth('resume', 20, () => err(409, 'checkpoint_error')),
    opts: D(['fence.window']),
    want: {'fence.window': 'skip: resume of a never-seen ID failed: HTTP 409 checkpoint_error fault: checkpoint_error'},
  },
  {
    name: 'fence.window: 63 resumed IDs kept',
    fault: {},
    kept: 63,
    opts: D(['fence.window']),
    want: {
      'fence.window':
        'fail: after 63 newer resumed IDs, prepare of conformance-TAG-2: 200 {"phase":"prepared","report":{"ready":true,"blockers":[],"blocker_count":0,"counts":{"sessions":0,"inflight":0},"restart… (127 characters in all): fewer than 64 resumed IDs are kept',
    },
  },
  {name: 'fence.window: 64 resumed IDs kept', fault: {}, kept: 64, opts: D(['fence.window']), want: {'fence.window': 'pass: still 409 stale_checkpoint after 63 newer resumed IDs'}},
]

describe('resume and fence checks name what was wrong', () => {
  for (const c of RESUME) it.concurrent(c.name, () => runCase(c))
})

const RESTARTS: Case[] = [
  {
    name: 'a restart reported in the prepare reply only, refused as the rule says',
    fault: restarts(['no/key', 5, 'ghost'], err(409, 'restart_in_scope')),
    opts: D(['commit.restart-in-scope', 'commit.reply']),
    want: {'commit.restart-in-scope': 'pass: 409 restart_in_scope for reported restart ghost', 'commit.reply': 'pass: committed 0 record(s) into SCRATCH/conformance-TAG-1'},
  },
  {
    name: 'a restart reported in status only, refused as the rule says',
    fault: restarts(['ghost-a2'], err(409, 'restart_in_scope'), true),
    opts: {...D(['commit.restart-in-scope']), force: true},
    want: {'commit.restart-in-scope': 'pass: 409 restart_in_scope for reported restart ghost-a2'},
  },
  {
    name: 'a restart in scope refused with another code',
    fault: restarts(['ghost'], err(409, 'invalid_phase')),
    opts: D(['commit.restart-in-scope']),
    want: {'commit.restart-in-scope': 'fail: commit naming reported restart ghost: HTTP 409 invalid_phase'},
  },
  {
    name: 'a restart in scope refused with 422 restart_in_scope',
    fault: restarts(['ghost'], err(422, 'restart_in_scope')),
    opts: D(['commit.restart-in-scope']),
    want: {'commit.restart-in-scope': 'fail: commit naming reported restart ghost: HTTP 422 restart_in_scope'},
  },
  {
    name: 'only restarts that are no capture keys',
    fault: restarts(['no/key', 7], null),
    opts: D(['commit.restart-in-scope']),
    want: {'commit.restart-in-scope': 'skip: this participant reports no restart (report.restarts is empty); it can be checked only while it runs a restart-only episode, with --force'},
  },
  {
    name: 'a restart in scope committed: the later checks read that commit',
    fault: restarts(['ghost'], null),
    opts: D(['commit.restart-in-scope', 'commit.reply', 'commit.replay', 'commit.conflict', 'store.records']),
    want: {
      'commit.restart-in-scope':
        'fail: commit naming reported restart ghost: HTTP 200 {"phase":"committed","manifest":{"checkpoint_id":"conformance-TAG-1","instance":"p","kind":"model","record_count":0… (356 characters in all)',
      'commit.reply': 'pass: committed 0 record(s) into SCRATCH/conformance-TAG-1',
      'store.records': 'pass: 0 record(s), 0 bytes; name = content sha256 = records_sha256; record_count matches',
      'commit.replay': 'pass: the same reply',
      'commit.conflict': 'pass: 409 checkpoint_conflict',
    },
  },
]

describe('commit.restart-in-scope', () => {
  for (const c of RESTARTS) it.concurrent(c.name, () => runCase(c))
})

// ---------------------------------------------------------------- the run

describe('the run around the checks', () => {
  it('servers discovery could judge become results; one without the routes is skipped; none at all is an error', async () => {
    await withCleanup(async (own) => {
      const judge = await faulty(
        own,
        statusOnly((j) => ({...j, kind: 'judge'})),
      )
      const unsafe = await faulty(
        own,
        statusOnly((j) => ({...j, instance: '../p'})),
      )
      const broken = await faulty(own, {before: (r) => (r.op === 'status' && authorized(r) ? {status: 500, json: 'boom'} : undefined)})
      const none = await startFleet({members: [{name: 'nothing', kind: 'none'}]})
      const report = await check(own, [
        {name: 'z-judge', url: judge.url},
        {name: 'a-unsafe', url: unsafe.url},
        {name: 'm-broken', url: broken.url},
        {name: 'nothing', url: none.servers[0]!.url},
      ])
      expect(report.participants).toEqual([])
      expect(report.results.map((r) => [r.id, r.server, r.result, r.message])).toEqual([
        ['status.reply', 'm-broken', 'fail', 'HTTP 500 boom'],
        ['status.kind', 'z-judge', 'fail', "unknown participant kind 'judge'"],
        ['status.instance', 'a-unsafe', 'fail', "instance '../p' is not a safe path component (^[A-Za-z0-9][A-Za-z0-9._-]*$, at most 128 characters)"],
        ...CHECKS.filter((d) => d.destructive).map((d) => [d.id, null, 'skip', 'changes participant state: run with --destructive on a staging fleet']),
      ])
      expect(report).toMatchObject({passed: false, destructive: false, interrupted: false, counts: {pass: 0, fail: 3, skip: 21}})

      // Destructive over no participant at all: nothing to prepare, no directory made.
      const dir = await scratchDir(own)
      const d = await check(own, [{name: 'z-judge', url: judge.url}], {destructive: true, dir})
      expect(d.destructive).toBe(false)
      expect(d.results.map((r) => r.id)).toEqual(['status.kind'])
      expect(await readdir(dir)).toEqual([])

      const e = await rejection(check(own, [{name: 'nothing', url: none.servers[0]!.url}]), ControllerError)
      expect(e.code).toBe('discovery')
      expect(e.message).toBe('no checkpoint participant among the servers: every one answered 404 on GET …/checkpoint/status')
    })
  })

  it('a server that refuses the token or does not answer stops the run before anything is sent', async () => {
    await withCleanup(async (own) => {
      const ok = await faulty(own, {})
      const refusing = await faulty(own, {auth: () => 'Bearer nope'})
      const e = await rejection(
        check(own, [
          {name: 'ok', url: ok.url},
          {name: 'refusing', url: refusing.url},
        ]),
        CoordinationError,
      )
      expect(e.message).toBe(
        'checkpoint discover failed on 1 participant(s): refusing: HTTP 401 unauthorized missing or invalid checkpoint control bearer token. conformance needs an answer to GET status from every server it checks',
      )
      const down = await faulty(own, {before: (r) => (r.op === 'status' ? {status: 0, json: null} : undefined)})
      const e2 = await rejection(
        check(own, [
          {name: 'ok', url: ok.url},
          {name: 'down', url: down.url},
        ]),
        CoordinationError,
      )
      expect(e2.message).toMatch(/^checkpoint discover failed on 1 participant\(s\): down: connection closed before a reply after 1 tries\. conformance needs/)
      expect(ok.requests.filter((r) => r.method === 'POST')).toEqual([])
    })
  })

  it('two participants reporting one directory: status.instance fails on the second, naming it', async () => {
    await withCleanup(async (own) => {
      const a = await faulty(own, {})
      const b = await faulty(own, {})
      const report = await check(
        own,
        [
          {name: 'a', url: a.url},
          {name: 'b', url: b.url},
        ],
        {only: ['status.instance', 'status.reply']},
      )
      // The status itself is fine: only status.instance fails.
      expect(report.results.map((r) => [r.id, r.server, r.result, r.message])).toEqual([
        ['status.reply', 'a', 'pass', 'model/p idle'],
        ['status.reply', 'b', 'pass', 'model/p idle'],
        ['status.instance', 'a', 'pass', 'p'],
        ['status.instance', 'b', 'fail', 'another participant also reports model/p: both would write gym/model/p'],
      ])
    })
  })

  it('results are in check order, then server order; the run-level skips come first', async () => {
    await withCleanup(async (own) => {
      const fleet = await startFleet({
        members: [
          {name: 'z', kind: 'model'},
          {name: 'b', kind: 'agent'},
          {name: 'a', kind: 'environment'},
        ],
      })
      const report = await check(
        own,
        fleet.servers.map((s) => ({name: s.name, url: s.url})),
        {only: ['status.kind', 'retire.forget', 'auth.missing-bearer'], concurrency: 1},
      )
      expect(report.participants.map((p) => p.server)).toEqual(['a', 'z', 'b'])
      expect(report.results.map((r) => `${r.id} ${r.server}`)).toEqual([
        'auth.missing-bearer a',
        'auth.missing-bearer z',
        'auth.missing-bearer b',
        'status.kind a',
        'status.kind z',
        'status.kind b',
        'retire.forget null',
      ])
      expect(report.counts).toEqual({pass: 6, fail: 0, skip: 1})
      expect(report.passed).toBe(true)
      const json = conformanceJson(report)
      expect(json).toEqual({
        passed: true,
        destructive: false,
        interrupted: false,
        checkpoint_dir: null,
        participants: [
          {server: 'a', kind: 'environment', instance: 'a'},
          {server: 'z', kind: 'model', instance: 'z'},
          {server: 'b', kind: 'agent', instance: 'b'},
        ],
        counts: {pass: 6, fail: 0, skip: 1},
        checks: report.results.map((r) => ({id: r.id, section: r.section, rule: r.rule, server: r.server, result: r.result, message: r.message})),
      })
      expect(json.checks[0]).toEqual({id: 'auth.missing-bearer', section: '§1', rule: CHECKS[0]!.rule, server: 'a', result: 'pass', message: '401 unauthorized'})
    })
  })

  it('--destructive on a fleet with live work names each busy server; a retire mark alone is not live work', async () => {
    await withCleanup(async (own) => {
      const busy = await faulty(
        own,
        statusOnly((j) => ({...j, report: {...j.report, ready: false, blockers: ['r1'], blocker_count: 1}})),
      )
      const marked = await faulty(own, {}, {instance: 'q'})
      await marked.inner.controlPlane!.retire({checkpoint_id: 'retire', deadline_ts: Date.now() / 1000 + 10, episode_ids: [{rollout_id: 'old', attempt: 0}]})
      const e = await rejection(
        check(
          own,
          [
            {name: 'busy', url: busy.url},
            {name: 'marked', url: marked.url},
          ],
          {destructive: true},
        ),
        ControllerError,
      )
      expect(e.code).toBe('fleet_state')
      expect(e.message).toBe(
        'conformance --destructive prepares, commits and resumes every participant, and 1 hold(s) live work: busy reports 1 blocker(s) (work in flight). Run it on a staging fleet, or add --force; nothing was sent',
      )
      expect(marked.requests.filter((r) => r.method === 'POST')).toEqual([])

      // Several busy servers, one with several reasons: each named with all of its reasons.
      const prepared = await faulty(
        own,
        statusOnly((j) => ({...j, report: {...j.report, ready: false, blockers: ['r2'], blocker_count: 1}})),
        {instance: 'r'},
      )
      await prepared.inner.controlPlane!.prepare({checkpoint_id: 'theirs', deadline_ts: Date.now() / 1000 + 10})
      const e2 = await rejection(
        check(
          own,
          [
            {name: 'busy', url: busy.url},
            {name: 'prepared', url: prepared.url},
          ],
          {destructive: true},
        ),
        ControllerError,
      )
      expect(e2.message).toBe(
        "conformance --destructive prepares, commits and resumes every participant, and 2 hold(s) live work: busy reports 1 blocker(s) (work in flight); prepared is in phase prepared of 'theirs', reports 1 blocker(s) (work in flight). Run it on a staging fleet, or add --force; nothing was sent",
      )
      expect(e2.details).toEqual({
        busy: [
          {server: 'busy', reasons: ['reports 1 blocker(s) (work in flight)']},
          {server: 'prepared', reasons: ["is in phase prepared of 'theirs'", 'reports 1 blocker(s) (work in flight)']},
        ],
      })
      await prepared.inner.controlPlane!.resume({checkpoint_id: 'theirs', deadline_ts: Date.now() / 1000 + 10})

      const report = await check(own, [{name: 'marked', url: marked.url}], {destructive: true, only: ['retire.forget']})
      expect(msgs(report)).toEqual({'retire.forget': 'pass: retired_rollouts 1 → 2 → 1'})
      expect(marked.inner.controlPlane!.status().retired_rollouts).toBe(1)
    })
  })

  it('the temporary checkpoint directory: kept with --keep-dir, and an unusable --dir is an input error', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      const dir = await scratchDir(own)
      const kept = await check(own, [{name: 'p', url: p.url}], {destructive: true, keepDir: true, dir, only: ['commit.reply']})
      expect(kept.checkpointDir).toMatch(new RegExp(`^${dir}/gymckpt-conformance-[A-Za-z0-9]{6}$`))
      expect(await readdir(kept.checkpointDir!)).toHaveLength(1)
      expect(conformanceJson(kept).checkpoint_dir).toBe(kept.checkpointDir)

      const file = path.join(dir, 'a-file')
      await writeFile(file, '')
      const e = await rejection(check(own, [{name: 'p', url: p.url}], {destructive: true, dir: file}), ControllerError)
      expect(e.code).toBe('input')
      expect(e.message).toBe(`cannot create a temporary checkpoint directory under ${file}: a part of the path is not a directory (ENOTDIR)`)
    })
  })

  it('a checkpoint directory that cannot be made fails the run with the file system error, after the cleanup', async () => {
    await withCleanup(async (own) => {
      const dir = await scratchDir(own)
      // A file where the checkpoint's directory goes, put there while its prepare is answered.
      const p = await faulty(own, {
        before: async (r) => {
          if (authorized(r) && r.op === 'prepare') {
            const [scratch] = (await readdir(dir)).filter((n) => n.startsWith('gymckpt-conformance-'))
            await writeFile(path.join(dir, scratch!, cid(r)), '')
          }
          return undefined
        },
      })
      const e = await rejection(check(own, [{name: 'p', url: p.url}], {destructive: true, dir, only: ['phase.prepare', 'commit.reply']}))
      expect(e.message).toMatch(/^ENOTDIR: not a directory, mkdir '/)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
      expect(await readdir(dir)).toEqual([])
    })
  })

  it('an interrupt stops the run, which says so and resumes what it opened', async () => {
    await withCleanup(async (own) => {
      const ac = new AbortController()
      const p = await faulty(own, {
        after: (r, a) => {
          if (r.op === 'renew') ac.abort()
          return a
        },
      })
      const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, signal: ac.signal})
      expect(report.interrupted).toBe(true)
      expect(report.passed).toBe(false)
      expect(report.results.filter((r) => r.server).map((r) => r.id)).toEqual([...CHECKS.filter((d) => !d.destructive).map((d) => d.id), 'retire.forget', 'phase.prepare', 'phase.prepare-replay'])
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})

      const before = new AbortController()
      before.abort()
      const q = await faulty(own, {})
      const none = await check(own, [{name: 'q', url: q.url}], {signal: before.signal})
      expect(none).toMatchObject({interrupted: true, passed: false, counts: {pass: 0, fail: 0, skip: 21}})
      expect(none.results.filter((r) => r.server !== null)).toEqual([])
      expect(q.requests.filter((r) => r.method === 'POST')).toEqual([])
    })
  })

  for (const [what, held] of [
    ['a raw probe', (r: Req) => r.method === 'GET' && r.auth === undefined],
    ['a call', (r: Req) => authorized(r) && r.op === 'retire' && r.json?.episode_ids?.length > 0],
    ['a status read', (r: Req, renewed: boolean) => authorized(r) && r.op === 'status' && renewed],
  ] as const) {
    it(`an interrupt while ${what} waits for its reply ends the run at once, and the cleanup still resumes`, async () => {
      await withCleanup(async (own) => {
        const ac = new AbortController()
        let renewed = false
        const hold = new Set<Req>()
        const p = await faulty(own, {
          before: (r) => {
            if (authorized(r) && r.op === 'renew') renewed = true
            if (!ac.signal.aborted && held(r, renewed)) {
              hold.add(r)
              ac.abort()
            }
            return undefined
          },
          // The reply is held back well past the run's end unless the interrupt cuts the wait.
          after: async (r, a) => (hold.has(r) ? new Promise((res) => setTimeout(() => res(a), 4000)) : a),
        })
        const started = Date.now()
        const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, timeoutS: 10, signal: ac.signal})
        expect(Date.now() - started).toBeLessThan(3000)
        expect(report.interrupted).toBe(true)
        expect(report.results.filter((r) => r.result === 'fail')).toEqual([])
        expect(hold.size).toBe(1)
        expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null, retired_rollouts: 0})
      })
    })
  }

  it('interrupted while prepared, status unreadable: the cleanup resumes every ID it sent', async () => {
    await withCleanup(async (own) => {
      const ac = new AbortController()
      const p = await faulty(own, {
        before: (r) => (ac.signal.aborted && authorized(r) && r.op === 'status' ? {status: 503, json: 'down'} : undefined),
        after: (r, a) => {
          if (r.op === 'renew') ac.abort()
          return a
        },
      })
      const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, signal: ac.signal})
      expect(report.interrupted).toBe(true)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
      // Every ID it sent in a prepare or commit, and nothing else: the probes' IDs and the open one.
      const cut = p.requests.findIndex((r) => r.op === 'renew')
      // (Some deadline probes are no JSON: their ID is read from the text.)
      const idOf = (r: Req) => (r.json ? String(r.json.checkpoint_id) : /"checkpoint_id": "([^"]+)"/.exec(r.body)![1]!)
      const opened = new Set(
        p.requests
          .slice(0, cut)
          .filter((r) => authorized(r) && (r.op === 'prepare' || r.op === 'commit'))
          .map(idOf),
      )
      const resumed = p.requests
        .slice(cut)
        .filter((r) => authorized(r) && r.op === 'resume')
        .map((r) => String(cid(r)))
      expect(new Set(resumed)).toEqual(opened)
      expect(opened.size).toBeGreaterThan(10)
    })
  })

  it('the cleanup gives its resume until the run bound, not just the reply grace', async () => {
    await withCleanup(async (own) => {
      const ac = new AbortController()
      const p = await faulty(own, {
        before: async (r) => {
          // The cleanup's resume of the open checkpoint is slow: 1.5 s, past the 0.5 s grace.
          if (ac.signal.aborted && authorized(r) && r.op === 'resume') await new Promise((res) => setTimeout(res, 1500))
          return undefined
        },
        after: (r, a) => {
          if (r.op === 'renew') ac.abort()
          return a
        },
      })
      const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, signal: ac.signal, grace: 0.5})
      expect(report.interrupted).toBe(true)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
      // One resume, answered in time: not given up after the grace and sent again.
      expect(p.requests.slice(p.requests.findIndex((r) => r.op === 'renew')).filter((r) => r.op === 'resume')).toHaveLength(1)
    })
  })

  it('interrupted while fence.window holds its own prepared ID, status unreadable: the cleanup resumes it too', async () => {
    await withCleanup(async (own) => {
      const ac = new AbortController()
      let prepared = 0
      const p = await faulty(own, {
        before: (r) => (ac.signal.aborted && authorized(r) && r.op === 'status' ? {status: 503, json: 'down'} : undefined),
        after: (r, a) => {
          if (r.op === 'prepare' && a.json?.phase === 'prepared' && ++prepared === 2) ac.abort()
          return a
        },
      })
      const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, signal: ac.signal, only: ['fence.window']})
      expect(report.interrupted).toBe(true)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
    })
  })

  it('a participant prepared by someone else: status.phase names its checkpoint, and the run leaves it open', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      await p.inner.controlPlane!.prepare({checkpoint_id: 'theirs', deadline_ts: Date.now() / 1000 + 10})
      const report = await check(own, [{name: 'p', url: p.url}], {only: ['status.phase', 'refuse']})
      expect(msgs(report)['status.phase']).toBe('pass: prepared under theirs')
      expect(report.results.every((r) => r.result === 'pass')).toBe(true)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'prepared', checkpoint_id: 'theirs'})
      await p.inner.controlPlane!.resume({checkpoint_id: 'theirs', deadline_ts: Date.now() / 1000 + 10})
    })
  })

  it('a conforming fleet: every check passes with a message saying what it saw', async () => {
    await withCleanup(async (own) => {
      const fleet = await startFleet({
        members: [
          {name: 'env', kind: 'environment'},
          {name: 'policy', kind: 'model'},
        ],
      })
      const report = await check(
        own,
        fleet.servers.map((s) => ({name: s.name, url: s.url})),
        {destructive: true},
      )
      const by = new Map<string, string[]>()
      for (const r of report.results) by.set(r.id, [...(by.get(r.id) ?? []), `${r.server} ${r.result}: ${norm(r.message)}`])
      const same = (m: string) => [`env ${m}`, `policy ${m}`]
      expect(Object.fromEntries(by)).toEqual({
        'auth.missing-bearer': same('pass: 401 unauthorized'),
        'auth.wrong-bearer': same('pass: 401 unauthorized'),
        'auth.exact-bearer': same('pass: 401 for "bearer <token>" and "Bearer  <token>"'),
        'auth.post-bearer': same('pass: 401 unauthorized'),
        'status.reply': ['env pass: environment/env idle', 'policy pass: model/policy idle'],
        'status.kind': ['env pass: environment', 'policy pass: model'],
        'status.instance': ['env pass: env', 'policy pass: policy'],
        'status.phase': same('pass: idle'),
        'report.schema': same('pass: status report'),
        'report.blockers': same('pass: 0 listed, blocker_count 0'),
        'report.restarts': same('pass: 0 restart(s)'),
        'refuse.unknown-field': same('pass: 4 bodies refused with 422'),
        'refuse.checkpoint-id': same('pass: 14 bodies refused with 422'),
        'refuse.deadline': same('pass: 7 bodies refused with 422'),
        'refuse.episode-id': same('pass: 6 bodies refused with 422'),
        'refuse.empty-lists': same('pass: 2 bodies refused with 422'),
        'retire.forget': same('pass: retired_rollouts 0 → 1 → 0'),
        'phase.prepare': same('pass: prepared under conformance-TAG-26, lease 600 s past the deadline'),
        'phase.prepare-replay': same('pass: 200 prepared, still prepared'),
        'lease.renew': same('pass: lease 600 s past the deadline; never moved back'),
        'fence.conflict': same('pass: 409 checkpoint_conflict'),
        'outside.retire-open': same('pass: 409 invalid_phase'),
        'outside.forget-open': same('pass: 409 invalid_phase'),
        'commit.restart-in-scope': same('skip: this participant reports no restart (report.restarts is empty); it can be checked only while it runs a restart-only episode, with --force'),
        'commit.reply': same('pass: committed 0 record(s) into SCRATCH/conformance-TAG-26'),
        'store.manifest': [
          "env pass: 319 bytes, sorted keys, indent 1, no trailing newline; equal to the commit reply's",
          "policy pass: 316 bytes, sorted keys, indent 1, no trailing newline; equal to the commit reply's",
        ],
        'store.records': same('pass: 0 record(s), 0 bytes; name = content sha256 = records_sha256; record_count matches'),
        'store.lines': same('skip: no record was exported (nothing live on this participant), so the line format was not exercised'),
        'store.manifest-last': same('pass: the records file appeared before manifest.json, and was last written before it'),
        'commit.replay': same('pass: the same reply'),
        'commit.conflict': same('pass: 409 checkpoint_conflict'),
        'commit.export-once': same('pass: 2 file(s) unchanged'),
        'phase.resume': same('pass: idle, idempotent false; checkpoint_id and lease null'),
        'phase.resume-again': same('pass: idle, idempotent true'),
        'fence.stale-prepare': same('pass: 409 stale_checkpoint'),
        'fence.resume-unknown': same('pass: idempotent resume fenced it: prepare → 409 stale_checkpoint'),
        'fence.window': same('pass: still 409 stale_checkpoint after 63 newer resumed IDs'),
      })
      expect(report).toMatchObject({passed: true, destructive: true, interrupted: false, checkpointDir: null, counts: {pass: 70, fail: 0, skip: 4}})
    })
  })

  it('the safe checks send exactly their probes, and a refused probe is not followed by a resume', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      await check(own, [{name: 'p', url: p.url}])
      const count = (pick: (r: Req) => boolean) => p.requests.filter(pick).length
      const ops = ['status', 'prepare', 'resume', 'commit', 'retire', 'forget', 'renew']
      expect(Object.fromEntries(ops.map((op) => [op, count((r) => r.op === op && authorized(r))]))).toEqual({status: 3, prepare: 15, resume: 8, commit: 8, retire: 1, forget: 1, renew: 0})
      expect(p.requests.filter((r) => !authorized(r)).map((r) => `${r.method} ${r.op} ${r.auth === undefined ? 'none' : r.auth.replace(/[0-9a-f]{32}$/, 'X').replace(TOKEN, 'TOKEN')}`)).toEqual([
        'GET status none',
        'GET status Bearer X',
        'GET status bearer TOKEN',
        'GET status Bearer  TOKEN',
        'POST resume Bearer X',
      ])
      // Every body is sent as JSON, as the controller's own client sends it.
      expect(new Set(p.requests.filter((r) => r.method === 'POST').map((r) => r.ctype))).toEqual(new Set(['application/json']))
      // Probes of a checkpoint directory name one that is not there.
      const dirs = p.requests.filter((r) => r.op === 'commit').map((r) => r.json?.checkpoint_dir)
      expect(new Set(dirs).size).toBe(1)
      expect(dirs[0]).toMatch(/^\/.*gymckpt-conformance-nowhere-[0-9a-f]{8}$/)
    })
  })

  it('participants are checked one at a time with concurrency 1, side by side by default', async () => {
    await withCleanup(async (own) => {
      const log: string[] = []
      const logged = (name: string): Fault => ({
        before: (r) => {
          if (r.method === 'POST') log.push(name)
          return undefined
        },
      })
      const a = await faulty(own, logged('a'), {instance: 'a'})
      const b = await faulty(own, logged('b'), {instance: 'b'})
      const servers = [
        {name: 'a', url: a.url},
        {name: 'b', url: b.url},
      ]
      await check(own, servers, {only: ['refuse'], concurrency: 1})
      expect(log.join('').replace(/(.)\1+/g, '$1')).toBe('ab')
      log.length = 0
      await check(own, servers, {only: ['refuse']})
      expect(log.join('').replace(/(.)\1+/g, '$1').length).toBeGreaterThan(2)
    })
  })

  it('no directory watcher outlives the run', async () => {
    await withCleanup(async (own) => {
      const watchers = () => process.getActiveResourcesInfo().filter((x) => x === 'FSEventWrap').length
      const before = watchers()
      const p = await faulty(own, {})
      await check(own, [{name: 'p', url: p.url}], {destructive: true, only: ['store.manifest-last']})
      expect(watchers()).toBe(before)
    })
  })

  it('store.manifest-last: directory events that miss one of the files say nothing; the times decide', async () => {
    const dir = await tempDir()
    await writeFile(path.join(dir, 'records-x.jsonl'), '')
    await writeFile(path.join(dir, 'manifest.json'), '{}')
    await utimes(path.join(dir, 'records-x.jsonl'), 1_700_000_000, 1_700_000_000)
    await utimes(path.join(dir, 'manifest.json'), 1_700_000_001, 1_700_000_001)
    const byTime = {result: 'pass', message: 'the records file was last written before manifest.json (by modification time)'}
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['records-x.jsonl'])).toEqual(byTime)
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['manifest.json'])).toEqual(byTime)
    expect(await checkManifestLast(dir, 'records-x.jsonl', [])).toEqual(byTime)
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['manifest.json', 'records-x.jsonl'])).toEqual({result: 'fail', message: 'manifest.json appeared in the directory before records-x.jsonl'})
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['records-x.jsonl', 'manifest.json'])).toEqual({
      result: 'pass',
      message: 'the records file appeared before manifest.json, and was last written before it',
    })
    // The same modification time is no sign of the wrong order, and says nothing of the slack.
    await utimes(path.join(dir, 'manifest.json'), 1_700_000_000, 1_700_000_000)
    expect(await checkManifestLast(dir, 'records-x.jsonl', null)).toEqual(byTime)
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['manifest.json', 'records-x.jsonl', 'manifest.json'])).toEqual({
      result: 'pass',
      message: 'the records file appeared before manifest.json, and was last written before it',
    })
  })

  it('only the probes of the selected checks are sent', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      const report = await check(own, [{name: 'p', url: p.url}], {only: ['auth.missing-bearer', 'status.kind']})
      expect(report.results.map((r) => `${r.id} ${r.result}`)).toEqual(['auth.missing-bearer pass', 'status.kind pass'])
      // Discovery's status, the probe without a token, the session's status and the cleanup's.
      expect(p.requests.map((r) => `${r.method} ${r.op} ${r.auth === VALID ? 'token' : (r.auth ?? 'none')}`)).toEqual(['GET status token', 'GET status none', 'GET status token', 'GET status token'])
    })
  })

  it('a server URL with a trailing slash is probed at the same routes', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      const report = await check(own, [{name: 'p', url: `${p.url}/`}], {only: ['auth', 'status.reply']})
      expect(report.results.every((r) => r.result === 'pass')).toBe(true)
      expect(report.results).toHaveLength(5)
    })
  })

  it('--only: an empty list is every check; a name must be a whole check ID or group', () => {
    expect(selectChecks([])).toEqual([...CHECKS])
    expect(selectChecks()).toEqual([...CHECKS])
    expect(thrown(() => selectChecks(['fenc']), ControllerError).message).toBe(
      '--only fenc: no such check; give a check ID (see --list or the README) or a group: auth, status, report, refuse, retire, phase, lease, fence, outside, commit, store',
    )
    expect(thrown(() => selectChecks(['auth.missing-bearer', 'nope']), ControllerError).code).toBe('input')
    expect(selectChecks(['store', 'auth.wrong-bearer']).map((d) => d.id)).toEqual(['auth.wrong-bearer', 'store.manifest', 'store.records', 'store.lines', 'store.manifest-last'])
  })
})
