// Mutation-testing follow-up for src/coordination/conformance.ts, the resume, fence and restart-in-
// scope checks; see conformance-mutants.test.ts for how the cases work. Split from it so that the
// file whose test killed the last mutant runs first for the next one (vitest runs the files that
// failed last time first), not after 200 other cases.
import {describe, expect, it} from 'vitest'

import {READY, authorized, err} from '../helpers/conformance-proxy.js'
import {type Case, runCase, PREPARED, cid, nth, restarts, D, resumeOfOpen} from '../helpers/conformance-cases.js'

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
    name: 'a second resume answered 500 with the body of a good reply: only a 200 is read as one',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'resume' && a.status === 200 && ++n === 2 ? {status: 500, json: {phase: 'idle', idempotent: true}} : a)}
    })(),
    opts: D(['phase.resume', 'phase.resume-again']),
    want: {
      'phase.resume': 'pass: idle, idempotent false; checkpoint_id and lease null',
      'phase.resume-again': 'fail: second resume: HTTP 500 {"phase":"idle","idempotent":true}, want {"phase": "idle", "idempotent": true}',
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
  {
    name: 'fence.window: 64 resumed IDs kept; each newer ID is resumed once, eight at a time',
    fault: {},
    kept: 64,
    opts: D(['fence.window']),
    want: {'fence.window': 'pass: still 409 stale_checkpoint after 63 newer resumed IDs'},
    sent: (requests) => {
      const resumed = requests.filter((r) => authorized(r) && r.op === 'resume').map(cid)
      // The check's own two IDs and the 63 newer ones, none twice.
      expect(resumed.length).toBe(65)
      expect(new Set(resumed).size).toBe(65)
    },
  },
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
