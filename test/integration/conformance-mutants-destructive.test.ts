// Mutation-testing follow-up for src/coordination/conformance.ts, the destructive checks (prepare,
// commit, conflict, export-once); see conformance-mutants.test.ts for how the cases work. Split
// from it so that the file whose test killed the last mutant runs first for the next one (vitest
// runs the files that failed last time first), not after 200 other cases.
import {unlink} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {encodeManifest} from '../../src/storage/participant-store.js'
import {READY, authorized, err} from '../helpers/conformance-proxy.js'
import {type Case, runCase, statusOnly, EXTRA, onFirstCommit, manifestIs, nth, D, AFTER, otherPrepare, whileOpen} from '../helpers/conformance-cases.js'

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
    name: 'retire refused from idle: it marked nothing, so the cleanup forgets nothing',
    fault: nth('retire', 1, () => err(409, 'invalid_phase')),
    opts: D(['retire.forget']),
    sent: (requests) => expect(requests.filter((r) => r.op === 'forget')).toEqual([]),
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
