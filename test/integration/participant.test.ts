import {readdir} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {TOKEN, control, soon, startFleet, startServer, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const MEMBERS = [
  {name: 'env', kind: 'environment' as const},
  {name: 'policy', kind: 'model' as const},
]

describe('participant double: transport and validation', () => {
  it('requires exactly "Bearer <token>" and answers 401 in the error envelope', async () => {
    const s = await startServer('policy', 'model')
    for (const token of [null, 'wrong', TOKEN.slice(0, -1)]) {
      const r = await control(s.url, 'status', undefined, token)
      expect(r.status).toBe(401)
      expect(r.json).toEqual({error: {code: 'unauthorized', detail: 'missing or invalid checkpoint control bearer token'}})
    }
    expect((await control(s.url, 'status')).json).toMatchObject({kind: 'model', instance: 'policy', phase: 'idle', checkpoint_id: null, retired_rollouts: 0, report: {ready: true}})
  })

  it('validates the body before the bearer: an invalid body is a framework 422 even without a token', async () => {
    const s = await startServer('policy', 'model')
    const bad = [
      {checkpoint_id: '../x', deadline_ts: soon()},
      {checkpoint_id: 'c', deadline_ts: 'soon'},
      {checkpoint_id: 7, deadline_ts: soon()},
      {checkpoint_id: 'c', deadline_ts: soon(), extra: 1},
      {checkpoint_id: 'x'.repeat(129), deadline_ts: soon()},
    ]
    for (const body of bad) {
      const r = await control(s.url, 'prepare', body, null)
      expect(r.status, JSON.stringify(body)).toBe(422)
      expect(Array.isArray(r.json.detail)).toBe(true)
      expect(r.json.error).toBeUndefined()
    }
    expect((await control(s.url, 'prepare', '{not json', null)).status).toBe(422)
    expect((await control(s.url, 'retire', {checkpoint_id: 'r', deadline_ts: soon(), episode_ids: []})).status).toBe(422)
    expect((await control(s.url, 'retire', {checkpoint_id: 'r', deadline_ts: soon(), episode_ids: [{rollout_id: 'x-a1', attempt: 0}]})).status).toBe(422)
    expect((await control(s.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()}, 'nope')).status).toBe(401)
  })

  it('a server without checkpoint routes answers 404', async () => {
    const s = await startServer('judge', 'none')
    expect((await control(s.url, 'status')).status).toBe(404)
  })
})

describe('participant double: phases, fencing, idempotency', () => {
  it('prepare → commit → resume, then the ID is fenced for good', async () => {
    const s = await startServer('policy', 'model')
    const dir = await tempDir()
    expect((await control(s.url, 'prepare', {checkpoint_id: 'c1', deadline_ts: soon()})).json.phase).toBe('prepared')
    // A second ID while one is open.
    expect((await control(s.url, 'prepare', {checkpoint_id: 'c2', deadline_ts: soon()})).json.error.code).toBe('checkpoint_conflict')
    // A retry of a completed prepare gets the remembered reply.
    expect((await control(s.url, 'prepare', {checkpoint_id: 'c1', deadline_ts: soon()})).json.phase).toBe('prepared')
    expect((await control(s.url, 'retire', {checkpoint_id: 'c1', deadline_ts: soon(), episode_ids: [{rollout_id: 'r'}]})).json.error.code).toBe('invalid_phase')
    const commit = await control(s.url, 'commit', {checkpoint_id: 'c1', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: []})
    expect(commit.status).toBe(200)
    expect(commit.json).toMatchObject({phase: 'committed', episode_ids: [], manifest: {kind: 'model', instance: 'policy', checkpoint_id: 'c1', record_count: 0}})
    expect((await control(s.url, 'status')).json.phase).toBe('committed')
    expect((await control(s.url, 'resume', {checkpoint_id: 'c1', deadline_ts: soon()})).json).toEqual({phase: 'idle', idempotent: false})
    expect((await control(s.url, 'resume', {checkpoint_id: 'c1', deadline_ts: soon()})).json).toEqual({phase: 'idle', idempotent: true})
    const late = await control(s.url, 'prepare', {checkpoint_id: 'c1', deadline_ts: soon()})
    expect(late.status).toBe(409)
    expect(late.json.error.code).toBe('stale_checkpoint')
  })

  it('resuming an ID never prepared here fences it (a late prepare of an aborted checkpoint is refused)', async () => {
    const s = await startServer('policy', 'model')
    expect((await control(s.url, 'resume', {checkpoint_id: 'never', deadline_ts: soon()})).json).toEqual({phase: 'idle', idempotent: true})
    expect((await control(s.url, 'prepare', {checkpoint_id: 'never', deadline_ts: soon()})).json.error.code).toBe('stale_checkpoint')
  })

  it('a retried commit returns the same reply; same scope in another order is the same; another scope conflicts', async () => {
    const fleet = await startFleet({members: MEMBERS})
    const env = fleet.server('env')
    void fleet.run({rolloutId: 'a', steps: 50, stepMs: 5})
    void fleet.run({rolloutId: 'b', steps: 50, stepMs: 5})
    await waitFor(() => (env.participant as SimEnvironment).episodes.size === 2)
    const dir = await tempDir()
    expect((await control(env.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})).json.phase).toBe('prepared')
    const scope = [
      {rollout_id: 'a', attempt: 0},
      {rollout_id: 'b', attempt: 0},
    ]
    const first = await control(env.url, 'commit', {checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: scope})
    expect(first.json.episode_ids).toEqual(['a', 'b'])
    const again = await control(env.url, 'commit', {checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [...scope].reverse()})
    expect(again.json).toEqual(first.json)
    const other = await control(env.url, 'commit', {checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: scope.slice(0, 1)})
    expect(other.json.error.code).toBe('checkpoint_conflict')
    const otherDir = await control(env.url, 'commit', {checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: dir + '-2', episode_ids: scope})
    expect(otherDir.json.error.code).toBe('checkpoint_conflict')
    await control(env.url, 'resume', {checkpoint_id: 'c', deadline_ts: soon()})
  })

  it('a commit whose scope names a restart is refused with restart_in_scope', async () => {
    const fleet = await startFleet({members: [...MEMBERS, {name: 'res', kind: 'resources'}]})
    const env = fleet.server('env')
    void fleet.run({rolloutId: 's', steps: 200, stepMs: 5, restart: true})
    await waitFor(async () => (await control(env.url, 'status')).json.report.restarts.includes('s'), 5000, 'restart reported')
    const dir = await tempDir()
    const prep = await control(env.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})
    expect(prep.json.report.restarts).toEqual(['s'])
    const r = await control(env.url, 'commit', {checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [{rollout_id: 's', attempt: 0}]})
    expect(r.status).toBe(409)
    expect(r.json.error).toEqual({code: 'restart_in_scope', detail: `the commit scope names episodes that restart: ["s"]`})
    await control(env.url, 'resume', {checkpoint_id: 'c', deadline_ts: soon()})
  })

  it('prepare that misses its deadline replies preparing with capped blockers and keeps admission closed', async () => {
    const s = await startServer('policy', 'model')
    const stuck = Array.from({length: 150}, (_, i) => `stuck-${String(i).padStart(3, '0')}`)
    s.participant!.stuckBlockers = stuck
    const r = await control(s.url, 'prepare', {checkpoint_id: 'c', deadline_ts: Date.now() / 1000 + 0.2})
    expect(r.status).toBe(200)
    expect(r.json.phase).toBe('preparing')
    expect(r.json.report.blockers).toHaveLength(100)
    expect(r.json.report.blocker_count).toBe(150)
    expect(s.participant!.admissionClosed).toBe(true)
    await control(s.url, 'resume', {checkpoint_id: 'c', deadline_ts: soon()})
    expect(s.participant!.admissionClosed).toBe(false)
  })

  it('readiness that regresses after prepare ends the checkpoint for good with 409 export_failed', async () => {
    const s = await startServer('policy', 'model')
    const dir = await tempDir()
    await control(s.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})
    s.participant!.stuckBlockers = ['late']
    const body = {checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: []}
    expect((await control(s.url, 'commit', body)).json.error.code).toBe('export_failed')
    s.participant!.stuckBlockers = []
    expect((await control(s.url, 'commit', body)).json.error.code).toBe('export_failed')
    expect(await readdir(dir)).toEqual([])
  })

  it('an expired lease resumes the participant by itself and fences the ID', async () => {
    const s = await startServer('policy', 'model', {grace: 0.1})
    await control(s.url, 'prepare', {checkpoint_id: 'c', deadline_ts: Date.now() / 1000 + 0.1})
    await waitFor(async () => (await control(s.url, 'status')).json.phase === 'idle', 3000, 'lease expiry')
    expect(s.participant!.admissionClosed).toBe(false)
    expect((await control(s.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})).json.error.code).toBe('stale_checkpoint')
  })

  it('renew extends the lease and never moves it earlier', async () => {
    const s = await startServer('policy', 'model')
    await control(s.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon(100)})
    const a = (await control(s.url, 'renew', {checkpoint_id: 'c', deadline_ts: soon(10)})).json.lease_expires_at
    const b = (await control(s.url, 'renew', {checkpoint_id: 'c', deadline_ts: soon(1000)})).json.lease_expires_at
    expect(b).toBeGreaterThan(a)
    expect((await control(s.url, 'renew', {checkpoint_id: 'other', deadline_ts: soon()})).json.error.code).toBe('checkpoint_conflict')
    await control(s.url, 'resume', {checkpoint_id: 'c', deadline_ts: soon()})
    expect((await control(s.url, 'renew', {checkpoint_id: 'x', deadline_ts: soon()})).json.error.code).toBe('invalid_phase')
  })
})

describe('participant double: retire and forget', () => {
  it('retire marks, stops and frees; a late request is refused with stale_attempt until forget', async () => {
    const fleet = await startFleet({members: MEMBERS})
    const env = fleet.server('env')
    const policy = fleet.server('policy')
    const running = fleet.run({rolloutId: 'r', steps: 1000, stepMs: 5})
    await waitFor(() => (env.participant as SimEnvironment).episodes.size === 1)
    const r = await control(env.url, 'retire', {checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [{rollout_id: 'r', attempt: 0}]})
    expect(r.json).toEqual({retired_count: 1})
    // The retire replied only after the episode stopped.
    expect((env.participant as SimEnvironment).episodes.size).toBe(0)
    expect((await running).status).toBe(409)
    await control(policy.url, 'retire', {checkpoint_id: 'retire', deadline_ts: soon(), episode_ids: [{rollout_id: 'r', attempt: 0}]})
    expect((await control(env.url, 'status')).json.retired_rollouts).toBe(1)
    const stale = await fleet.run({rolloutId: 'r', attempt: 0})
    expect(stale.status).toBe(409)
    expect((stale.body as {error: {code: string}}).error.code).toBe('stale_attempt')
    // A later attempt runs.
    expect((await fleet.run({rolloutId: 'r', attempt: 1, steps: 2, stepMs: 1})).status).toBe(200)
    for (const s of [env, policy]) expect((await control(s.url, 'forget', {checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r', 'r']})).json).toEqual({forgotten_count: 2})
    expect((await control(env.url, 'status')).json.retired_rollouts).toBe(0)
    expect((await fleet.run({rolloutId: 'r', attempt: 0, steps: 2, stepMs: 1})).status).toBe(200)
  })

  it('a retire past its deadline keeps its mark', async () => {
    const s = await startServer('env', 'environment')
    const r = await control(s.url, 'retire', {checkpoint_id: 'retire', deadline_ts: Date.now() / 1000 - 1, episode_ids: [{rollout_id: 'q', attempt: 2}]})
    expect(r.json.error.code).toBe('deadline_exceeded')
    expect((await control(s.url, 'status')).json.retired_rollouts).toBe(1)
  })

  it('forget is refused while a checkpoint is open', async () => {
    const s = await startServer('policy', 'model')
    await control(s.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})
    expect((await control(s.url, 'forget', {checkpoint_id: 'forget', deadline_ts: soon(), rollout_ids: ['r']})).json.error).toEqual({
      code: 'invalid_phase',
      detail: 'not valid in phase prepared; resume first',
    })
    await control(s.url, 'resume', {checkpoint_id: 'c', deadline_ts: soon()})
  })
})

describe('participant double: restore', () => {
  it('restore installs under the next attempt, keeps admission closed until resume, and refuses a busy process', async () => {
    const fleet = await startFleet({members: MEMBERS})
    const env = fleet.server('env')
    void fleet.run({rolloutId: 'a', steps: 1000, stepMs: 5})
    await waitFor(() => (env.participant as SimEnvironment).episodes.size === 1)
    const root = await tempDir()
    await control(env.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})
    await control(env.url, 'commit', {checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: root, episode_ids: [{rollout_id: 'a', attempt: 0}]})
    await control(env.url, 'resume', {checkpoint_id: 'c', deadline_ts: soon()})
    const busy = await control(env.url, 'restore', {checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: root, episode_ids: [{rollout_id: 'a', attempt: 0}]})
    expect(busy.json.error.code).toBe('checkpoint_error')

    const fresh = await startServer('env', 'environment')
    const body = {checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: root, episode_ids: [{rollout_id: 'a', attempt: 0}]}
    const r = await control(fresh.url, 'restore', body)
    expect(r.json).toEqual({phase: 'restored', source_checkpoint_id: 'c', restored: ['a-a1']})
    expect((await control(fresh.url, 'restore', body)).json).toEqual(r.json)
    expect((await control(fresh.url, 'restore', {...body, episode_ids: []})).json.error.code).toBe('checkpoint_conflict')
    expect(fresh.participant!.admissionClosed).toBe(true)
    expect((await control(fresh.url, 'status')).json).toMatchObject({phase: 'restored', checkpoint_id: 'rs', restored_pending: ['a-a1'], retired_rollouts: 0})
    await control(fresh.url, 'resume', {checkpoint_id: 'rs', deadline_ts: soon()})
    expect(fresh.participant!.admissionClosed).toBe(false)
  })

  it('a missing or corrupt participant directory is 422 invalid_checkpoint_state and leaves the participant idle and open', async () => {
    const root = await tempDir()
    const s = await startServer('policy', 'model')
    const r = await control(s.url, 'restore', {checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: root, episode_ids: []})
    expect(r.status).toBe(422)
    expect(r.json.error.code).toBe('invalid_checkpoint_state')
    expect(r.json.error.detail).toContain(path.join(root, 'gym', 'model', 'policy', 'manifest.json'))
    expect((await control(s.url, 'status')).json.phase).toBe('idle')
    expect(s.participant!.admissionClosed).toBe(false)
  })
})

describe('participant double: episodes during a checkpoint', () => {
  it('refuses a new /run with admission_closed while a checkpoint is open', async () => {
    const fleet = await startFleet({members: MEMBERS})
    const env = fleet.server('env')
    await control(env.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})
    const r = await fleet.run({rolloutId: 'new'})
    expect(r.status).toBe(409)
    expect((r.body as {error: {code: string}}).error.code).toBe('admission_closed')
    await control(env.url, 'resume', {checkpoint_id: 'c', deadline_ts: soon()})
    expect((await fleet.run({rolloutId: 'new', steps: 2, stepMs: 1})).status).toBe(200)
  })

  it('a replay step in flight does not block prepare; the boundary before it is exported', async () => {
    const fleet = await startFleet({members: MEMBERS})
    const env = fleet.server('env')
    const sim = env.participant as SimEnvironment
    const run = fleet.run({rolloutId: 'rp', steps: 3, stepMs: 400, stepMode: 'replay'})
    await waitFor(() => sim.episodes.get('rp')?.state === 'replaying')
    const t0 = Date.now()
    const prep = await control(env.url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})
    expect(prep.json.phase).toBe('prepared')
    expect(Date.now() - t0).toBeLessThan(300)
    const dir = await tempDir()
    const commit = await control(env.url, 'commit', {checkpoint_id: 'c', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [{rollout_id: 'rp', attempt: 0}]})
    expect(commit.json.episode_ids).toEqual(['rp'])
    const {readParticipantState} = await import('../../src/storage/participant-store.js')
    const state = await readParticipantState(path.join(dir, 'gym', 'environment', 'env'), {keep: new Set(['rp'])})
    // No boundary yet: after a crash it starts over from its input.
    expect((state.kept[0]!.record as Map<string, unknown>).get('boundary')).toBeNull()
    await control(env.url, 'resume', {checkpoint_id: 'c', deadline_ts: soon()})
    expect((await run).status).toBe(200)
  })
})
