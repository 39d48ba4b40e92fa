// The wire contract of src/protocol/wire.ts and src/protocol/errors.ts held against the reference
// (reference/gym-checkpoint-protocol.md, sections 2 and 4): routes, error codes and their HTTP
// statuses, what requests refuse, what replies tolerate and default (issue 12).
import {describe, expect, it} from 'vitest'

import {ERROR_CODES, ErrorEnvelope, HTTP_STATUS_OF, ValidationErrorBody, errorEnvelope, parseErrorBody} from '../../src/protocol/errors.js'
import {
  CHECKPOINT_ROUTE_PREFIX,
  CheckpointId,
  CommitReply,
  CommitRequest,
  DeadlineTs,
  ForgetReply,
  ForgetRequest,
  KINDS,
  Kind,
  MAX_REPORTED_BLOCKERS,
  OPERATIONS,
  PHASES,
  ParticipantManifest,
  Phase,
  PrepareReply,
  PrepareReport,
  PrepareRequest,
  REPLY_SCHEMAS,
  REQUEST_SCHEMAS,
  RenewReply,
  RenewRequest,
  RestoreReply,
  RestoreRequest,
  ResumeReply,
  ResumeRequest,
  RetireReply,
  RetireRequest,
  StatusReply,
  pendingRestored,
} from '../../src/protocol/wire.js'

const issue = (r: {success: boolean; error?: {issues: {message: string}[]}}) => (r.success ? null : r.error!.issues[0]!.message)

describe('error codes (reference section 4)', () => {
  it('every code with its HTTP status, as the reference tables them', () => {
    expect(HTTP_STATUS_OF).toEqual({
      unauthorized: 401,
      stale_checkpoint: 409,
      checkpoint_conflict: 409,
      invalid_phase: 409,
      deadline_exceeded: 409,
      restart_in_scope: 409,
      export_failed: 409,
      invalid_checkpoint_state: 422,
      checkpoint_error: 409,
      retire_incomplete: 409,
      checkpoint_coordinator_unavailable: 503,
      stale_attempt: 409,
      admission_closed: 409,
      rollout_id_required: 400,
      invalid_rollout_id: 400,
    })
    expect([...ERROR_CODES].sort()).toEqual(Object.keys(HTTP_STATUS_OF).sort())
    expect(ERROR_CODES.length).toBe(15)
  })

  it('parseErrorBody reads the envelope, the framework 422 and any other text', () => {
    expect(parseErrorBody('{"error": {"code": "stale_checkpoint", "detail": "was resumed"}}')).toEqual({code: 'stale_checkpoint', detail: 'was resumed'})
    expect(parseErrorBody('{"error": {"code": "x"}}')).toEqual({code: 'x', detail: ''})
    expect(parseErrorBody(JSON.stringify({detail: [{type: 'missing', loc: ['body', 'deadline_ts'], msg: 'Field required'}, {loc: ['body', 'episode_ids', 0], msg: 'bad'}, {msg: 'no loc'}]}))).toEqual({
      code: 'validation_error',
      detail: 'body.deadline_ts: Field required; body.episode_ids.0: bad; : no loc',
    })
    expect(parseErrorBody('<html>' + 'x'.repeat(300))).toEqual({code: null, detail: ('<html>' + 'x'.repeat(300)).slice(0, 200)})
    const other = JSON.stringify({message: 'y'.repeat(250)})
    expect(parseErrorBody(other)).toEqual({code: null, detail: other.slice(0, 200)})
    expect(parseErrorBody('{"detail": "a string, not a list"}')).toEqual({code: null, detail: '{"detail": "a string, not a list"}'})
    expect(parseErrorBody('')).toEqual({code: null, detail: ''})
  })

  it('errorEnvelope builds what ErrorEnvelope reads; a framework 422 keeps its extra fields', () => {
    expect(errorEnvelope('invalid_phase', 'not valid in phase idle')).toEqual({error: {code: 'invalid_phase', detail: 'not valid in phase idle'}})
    expect(ErrorEnvelope.parse(errorEnvelope('unauthorized', 'no'))).toEqual({error: {code: 'unauthorized', detail: 'no'}})
    expect(ValidationErrorBody.parse({detail: [{loc: [], msg: 'm', input: 3}]})).toEqual({detail: [{loc: [], msg: 'm', input: 3}]})
  })
})

describe('routes and enumerations', () => {
  it('the route prefix, operations, kinds, phases and the blocker cap', () => {
    expect(CHECKPOINT_ROUTE_PREFIX).toBe('/ng-control/v1/checkpoint')
    expect(OPERATIONS).toEqual(['prepare', 'renew', 'retire', 'forget', 'commit', 'restore', 'resume'])
    expect(KINDS).toEqual(['environment', 'model', 'agent', 'resources'])
    expect(Kind.options).toEqual([...KINDS])
    expect(PHASES).toEqual(['idle', 'preparing', 'prepared', 'committed', 'restored'])
    expect(Phase.options).toEqual([...PHASES])
    expect(MAX_REPORTED_BLOCKERS).toBe(100)
  })
})

describe("requests: strict, exactly Gym's fields", () => {
  it('a checkpoint ID is 1 to 128 safe characters, starting with a letter or digit', () => {
    expect(CheckpointId.safeParse('a').success).toBe(true)
    expect(CheckpointId.safeParse('A9._-x').success).toBe(true)
    expect(CheckpointId.safeParse('x'.repeat(128)).success).toBe(true)
    expect(CheckpointId.safeParse('x'.repeat(129)).success).toBe(false)
    expect(CheckpointId.safeParse('').success).toBe(false)
    expect(issue(CheckpointId.safeParse('.x'))).toBe('checkpoint ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ (at most 128 characters)')
    expect(issue(CheckpointId.safeParse('a/b'))).toBe('checkpoint ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ (at most 128 characters)')
  })

  it('deadline_ts is a finite number of seconds', () => {
    expect(DeadlineTs.safeParse(1.5).success).toBe(true)
    expect(DeadlineTs.safeParse(0).success).toBe(true)
    // zod 4's number() already refuses these, before the refine (kept for an older zod) runs.
    for (const v of [Infinity, -Infinity, NaN]) expect(DeadlineTs.safeParse(v).success, String(v)).toBe(false)
    expect(DeadlineTs.safeParse('1').success).toBe(false)
  })

  it('prepare, renew and resume take the ID and the deadline, nothing else', () => {
    for (const s of [PrepareRequest, RenewRequest, ResumeRequest]) {
      expect(s.parse({checkpoint_id: 'c', deadline_ts: 1})).toEqual({checkpoint_id: 'c', deadline_ts: 1})
      expect(s.safeParse({checkpoint_id: 'c', deadline_ts: 1, stop: false}).success).toBe(false)
      expect(s.safeParse({checkpoint_id: 'c'}).success).toBe(false)
      expect(s.safeParse({checkpoint_id: '../c', deadline_ts: 1}).success).toBe(false)
    }
  })

  it('retire needs at least one episode; forget at least one safe rollout ID', () => {
    const base = {checkpoint_id: 'c', deadline_ts: 1}
    expect(RetireRequest.parse({...base, episode_ids: [{rollout_id: 'r', attempt: 2}]}).episode_ids).toEqual([{rollout_id: 'r', attempt: 2}])
    expect(RetireRequest.safeParse({...base, episode_ids: []}).success).toBe(false)
    expect(RetireRequest.safeParse({...base, episode_ids: [{rollout_id: 'r', attempt: 0}], x: 1}).success).toBe(false)
    expect(ForgetRequest.parse({...base, rollout_ids: ['r', 's.1']}).rollout_ids).toEqual(['r', 's.1'])
    expect(ForgetRequest.safeParse({...base, rollout_ids: []}).success).toBe(false)
    expect(ForgetRequest.safeParse({...base, rollout_ids: ['']}).success).toBe(false)
    expect(ForgetRequest.safeParse({...base, rollout_ids: ['../r']}).success).toBe(false)
    expect(ForgetRequest.safeParse({...base, rollout_ids: ['r'], episode_ids: []}).success).toBe(false)
  })

  it('commit: a directory, an optional scope (null or absent omits it), stop only as a boolean', () => {
    const base = {checkpoint_id: 'c', deadline_ts: 1, checkpoint_dir: '/d'}
    expect(CommitRequest.parse(base)).toEqual(base)
    expect(CommitRequest.parse({...base, episode_ids: null}).episode_ids).toBeNull()
    expect(CommitRequest.parse({...base, episode_ids: []}).episode_ids).toEqual([])
    expect(CommitRequest.parse({...base, stop: true}).stop).toBe(true)
    expect(CommitRequest.safeParse({...base, stop: 'yes'}).success).toBe(false)
    expect(CommitRequest.safeParse({...base, checkpoint_dir: ''}).success).toBe(false)
    expect(CommitRequest.safeParse({...base, extra: 1}).success).toBe(false)
  })

  it('restore: a directory and a scope, both required', () => {
    const base = {checkpoint_id: 'c', deadline_ts: 1, checkpoint_dir: '/d'}
    expect(RestoreRequest.parse({...base, episode_ids: []})).toEqual({...base, episode_ids: []})
    expect(RestoreRequest.safeParse(base).success).toBe(false)
    expect(RestoreRequest.safeParse({...base, episode_ids: null}).success).toBe(false)
    expect(RestoreRequest.safeParse({...base, checkpoint_dir: '', episode_ids: []}).success).toBe(false)
    expect(RestoreRequest.safeParse({...base, episode_ids: [], stop: false}).success).toBe(false)
  })

  it('each operation has its own request schema', () => {
    expect(REQUEST_SCHEMAS).toEqual({prepare: PrepareRequest, renew: RenewRequest, resume: ResumeRequest, retire: RetireRequest, forget: ForgetRequest, commit: CommitRequest, restore: RestoreRequest})
    expect(Object.keys(REQUEST_SCHEMAS).sort()).toEqual([...OPERATIONS].sort())
  })
})

describe("replies: tolerant, with Gym's defaults", () => {
  it('a prepare report defaults its lists and counts, keeps unknown fields, and counts blockers as a non-negative integer', () => {
    expect(PrepareReport.parse({ready: true})).toEqual({ready: true, blockers: [], counts: {}, restarts: []})
    expect(PrepareReport.parse({ready: false, blockers: ['b'], blocker_count: 3, counts: {episodes: 2}, restarts: ['r#0'], extra: 'kept'})).toEqual({
      ready: false,
      blockers: ['b'],
      blocker_count: 3,
      counts: {episodes: 2},
      restarts: ['r#0'],
      extra: 'kept',
    })
    expect(PrepareReport.safeParse({ready: true, blocker_count: -1}).success).toBe(false)
    expect(PrepareReport.safeParse({ready: true, blocker_count: 1.5}).success).toBe(false)
    expect(PrepareReport.safeParse({ready: true, blocker_count: 0}).success).toBe(true)
    expect(PrepareReport.safeParse({}).success).toBe(false)
    expect(PrepareReply.parse({phase: 'prepared', report: {ready: true}, x: 1})).toEqual({phase: 'prepared', report: {ready: true, blockers: [], counts: {}, restarts: []}, x: 1})
  })

  it('status defaults the checkpoint, the lease and the retired marks; keeps extras', () => {
    expect(StatusReply.parse({kind: 'model', instance: 'm', phase: 'idle', report: {ready: true}, restored_pending: []})).toEqual({
      kind: 'model',
      instance: 'm',
      phase: 'idle',
      checkpoint_id: null,
      lease_expires_at: null,
      retired_rollouts: 0,
      report: {ready: true, blockers: [], counts: {}, restarts: []},
      restored_pending: [],
    })
    expect(StatusReply.safeParse({kind: 'model', instance: 'm', phase: 'idle', report: {ready: true}, retired_rollouts: 0.5}).success).toBe(false)
  })

  it('retire and forget replies: a count or a list, never neither', () => {
    expect(RetireReply.parse({retired_count: 2})).toEqual({retired_count: 2})
    expect(RetireReply.parse({retired: ['a', 'b', 'c']})).toEqual({retired_count: 3})
    expect(RetireReply.parse({retired_count: 1, retired: ['a', 'b']})).toEqual({retired_count: 1})
    expect(issue(RetireReply.safeParse({}))).toBe('retire reply has neither retired_count nor retired')
    expect(RetireReply.safeParse({retired_count: -1}).success).toBe(false)
    expect(ForgetReply.parse({forgotten_count: 0})).toEqual({forgotten_count: 0})
    expect(ForgetReply.parse({forgotten: ['a']})).toEqual({forgotten_count: 1})
    expect(ForgetReply.parse({forgotten_count: 4, forgotten: []})).toEqual({forgotten_count: 4})
    expect(issue(ForgetReply.safeParse({other: 1}))).toBe('forget reply has neither forgotten_count nor forgotten')
    expect(ForgetReply.safeParse({forgotten_count: 1.5}).success).toBe(false)
  })

  it('commit, restore, resume and renew replies and their defaults', () => {
    const manifest = {schema_version: 1, kind: 'model', instance: 'm', checkpoint_id: 'c', records_file: 'records.jsonl', records_sha256: 'x', record_count: 0}
    expect(CommitReply.parse({phase: 'committed', manifest})).toEqual({phase: 'committed', manifest, episode_ids: []})
    expect(ParticipantManifest.safeParse({...manifest, record_count: 1.5}).success).toBe(false)
    expect(ParticipantManifest.parse({...manifest, extra: true})).toEqual({...manifest, extra: true})
    expect(RestoreReply.parse({phase: 'restored', source_checkpoint_id: 'c'})).toEqual({phase: 'restored', source_checkpoint_id: 'c', restored: []})
    expect(ResumeReply.parse({phase: 'idle'})).toEqual({phase: 'idle', idempotent: false})
    expect(ResumeReply.parse({phase: 'idle', idempotent: true})).toEqual({phase: 'idle', idempotent: true})
    expect(RenewReply.safeParse({}).success).toBe(false)
    expect(REPLY_SCHEMAS).toEqual({prepare: PrepareReply, renew: RenewReply, resume: ResumeReply, retire: RetireReply, forget: ForgetReply, commit: CommitReply, restore: RestoreReply})
  })
})

describe('pendingRestored: the restored episodes a status reports as not yet replaced', () => {
  const status = (extra: Record<string, unknown>) => StatusReply.parse({kind: 'environment', instance: 'e0', phase: 'idle', report: {ready: true}, ...extra})

  it('the strings of restored_pending, in order; anything else in the list is left out', () => {
    expect(pendingRestored(status({restored_pending: ['r1:0', 7, null, {k: 'r2:0'}, 'r3:1']}))).toEqual(['r1:0', 'r3:1'])
  })

  it('none when the field is missing or not a list; restored_generation_cuts is not read', () => {
    expect(pendingRestored(status({}))).toEqual([])
    expect(pendingRestored(status({restored_pending: 'r1:0'}))).toEqual([])
    expect(pendingRestored(status({restored_generation_cuts: ['r1:0']}))).toEqual([])
  })
})
