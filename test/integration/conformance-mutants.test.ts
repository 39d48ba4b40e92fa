// Mutation-testing follow-up for src/coordination/conformance.ts (test/EQUIVALENT_MUTANTS.md lists
// what no test can tell apart). conformance.test.ts shows that each check fails on a participant
// breaking its rule; here the verdicts are read with their messages, which must name what was
// wrong, and the paths around them (no reply, odd bodies, skips, cleanup) are driven too. Every
// participant is the real in-process double on 127.0.0.1 behind a small proxy that changes one
// behaviour.

import {describe, it} from 'vitest'

import {TOKEN} from '../helpers/fleet.js'
import {Req, VALID, err} from '../helpers/conformance-proxy.js'
import {type Case, runCase, statusOnly, laterStatus, acceptOnly, PREPARED, cid, ep0, EXTRA} from '../helpers/conformance-cases.js'

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
