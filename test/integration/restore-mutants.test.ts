// The restore preflight and restore (src/coordination/restore.ts): every reason a fleet is not
// fresh, every refusal, and the failures after the preflight (issue 12).
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {commit, prepare, resume, retire} from '../../src/coordination/operations.js'
import {RestorePlan, assertRestorable, planRestore, restoreBlockers, restoreCheckpoint} from '../../src/coordination/restore.js'
import {EpisodeIdWire, episode, fromWire} from '../../src/protocol/episode.js'
import {StatusReply} from '../../src/protocol/wire.js'
import {readRestoreLog} from '../../src/storage/restore-log.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import {FULL, coordinatorFor, soon, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const fresh = (over: Partial<StatusReply> = {}, report: Partial<StatusReply['report']> = {}): StatusReply =>
  ({
    kind: 'model',
    instance: 'm',
    phase: 'idle',
    checkpoint_id: null,
    lease_expires_at: null,
    retired_rollouts: 0,
    report: {ready: true, blockers: [], counts: {}, restarts: [], ...report},
    ...over,
  }) as StatusReply

describe('restoreBlockers', () => {
  it('a fresh participant has none', () => {
    expect(restoreBlockers(fresh())).toEqual([])
    expect(restoreBlockers(fresh({}, {counts: {episodes: 0, sessions: 0, inflight: 0, held: 0, other: 5}}))).toEqual([])
    expect(restoreBlockers(fresh({restored_pending: [], restored_generation_cuts: []} as never))).toEqual([])
  })

  it('names every reason, in order', () => {
    const st = fresh({phase: 'prepared', checkpoint_id: 'ck', retired_rollouts: 3, restored_pending: ['a-a1', 'b-a1'], restored_generation_cuts: ['c-a1']} as never, {
      counts: {episodes: 2, sessions: 1, inflight: 4, held: 5},
      restarts: ['r1'],
      blockers: ['x'],
      blocker_count: 7,
    })
    expect(restoreBlockers(st)).toEqual([
      "is in phase prepared of 'ck'",
      'holds 2 episodes, 1 sessions, 4 inflight, 5 held',
      'holds 2 restored episode(s) no replacement has claimed (restored_pending)',
      'holds 1 restored episode(s) no replacement has claimed (restored_generation_cuts)',
      'runs 1 restart(s)',
      'reports 7 blocker(s) (work in flight)',
      'holds 3 retired-rollout mark(s) from an earlier retire or failed restore, which would refuse replacements of those rollouts',
    ])
  })

  it('each reason alone', () => {
    expect(restoreBlockers(fresh({phase: 'restored'}))).toEqual(['is in phase restored'])
    expect(restoreBlockers(fresh({checkpoint_id: 'x'}))).toEqual(["is in phase idle of 'x'"])
    expect(restoreBlockers(fresh({}, {counts: {held: 1}}))).toEqual(['holds 1 held'])
    expect(restoreBlockers(fresh({}, {blockers: ['a', 'b']}))).toEqual(['reports 2 blocker(s) (work in flight)'])
    expect(restoreBlockers(fresh({}, {blockers: ['a'], blocker_count: 0}))).toEqual([])
    expect(restoreBlockers(fresh({retired_rollouts: 1}))).toEqual([expect.stringMatching(/^holds 1 retired-rollout mark/)])
    expect(restoreBlockers(fresh({restored_pending: 'x'} as never))).toEqual([])
  })
})

const plan = (over: Partial<RestorePlan> = {}): RestorePlan => ({
  checkpointId: 'ck',
  checkpointDir: '/ck/ck',
  continued: [],
  replacements: [],
  restarted: [],
  participants: [],
  busy: [],
  unreachable: [],
  missing: [],
  verify: null,
  manifest: 'gymckpt.json',
  controllerState: undefined,
  ...over,
})

describe('assertRestorable', () => {
  it('goes ahead for a reachable, fresh fleet and a published checkpoint', () => {
    expect(() => assertRestorable(plan())).not.toThrow()
  })

  it('refuses, in order: an unreachable participant, a busy one, a checkpoint that fails verification, one never published', () => {
    const down = {server: 'm', status: null, code: 'connection', message: 'refused'}
    const busy = {server: 'e', reasons: ['holds 1 episodes', 'runs 1 restart(s)']}
    const badVerify = {
      ok: false,
      problems: [
        {severity: 'warning', where: 'w', message: 'just a warning'},
        {severity: 'error', where: 'gym/x', message: 'broken'},
      ],
    } as never
    const e1 = (() => {
      try {
        assertRestorable(plan({unreachable: [down], busy: [busy], verify: badVerify, manifest: null}))
      } catch (e) {
        return e as CoordinationError
      }
    })()!
    expect(e1).toBeInstanceOf(CoordinationError)
    expect(e1.code).toBe('discovery')
    expect(e1.message).toMatch(/every participant must answer before a restore; nothing was sent$/)
    expect(() => assertRestorable(plan({busy: [busy, {server: 'a', reasons: ['x']}], verify: badVerify}))).toThrow(
      'restore refused, nothing was sent: restore needs freshly started servers, and 2 participant(s) are not: e holds 1 episodes, runs 1 restart(s); a x. A restore there would be refused, and cleaning up after it would retire their work. Point the command at the fresh fleet, or restart these servers first.',
    )
    expect(() => assertRestorable(plan({verify: badVerify, manifest: null}))).toThrow('checkpoint /ck/ck failed verification, nothing was sent: gym/x: broken')
    expect(() => assertRestorable(plan({verify: {ok: true, problems: []} as never, manifest: null}))).toThrow('/ck/ck has no controller manifest: it was never published; nothing was sent')
    const err = (() => {
      try {
        assertRestorable(plan({busy: [busy]}))
      } catch (e) {
        return e as ControllerError
      }
    })()!
    expect([err.code, err.details]).toEqual(['fleet_state', {busy: [busy]}])
  })
})

async function checkpointed() {
  const fleet = await startFleet({members: FULL})
  const c = await coordinatorFor(fleet)
  const root = await tempDir()
  const run = fleet.run({rolloutId: 'e1', steps: 4, stepMs: 40})
  await new Promise((r) => setTimeout(r, 60))
  await prepare(c, 'ck-1', soon())
  const dir = path.join(root, 'ck-1')
  const replies = await commit(c, 'ck-1', dir, [episode('e1')], soon())
  await writeControllerManifest(dir, {
    format_version: FORMAT_VERSION,
    checkpoint_id: 'ck-1',
    created_at: 1,
    continued: [{rollout_id: 'e1', attempt: 0}],
    restarted: [{rollout_id: 'gone', attempt: 0}],
    participants: c.participants.map((p) => ({server: p.server, kind: p.kind, instance: p.instance, manifest: replies.get(p.server)!.manifest, episode_ids: []})),
    controller_state: {note: 1},
  })
  await publishLatest(root, 'ck-1')
  await resume(c, 'ck-1', soon())
  await run
  const target = await startFleet({members: FULL})
  return {root, dir, target, tc: await coordinatorFor(target)}
}

describe('planRestore and restoreCheckpoint', () => {
  it('the plan counts what each participant installs and skips, and carries the manifest', async () => {
    const {root, dir, tc} = await checkpointed()
    const p = await planRestore(tc, {location: root})
    expect(p).toMatchObject({
      checkpointId: 'ck-1',
      checkpointDir: dir,
      continued: [{rolloutId: 'e1', attempt: 0}],
      replacements: [{rolloutId: 'e1', attempt: 1}],
      restarted: [{rolloutId: 'gone', attempt: 0}],
      busy: [],
      unreachable: [],
      manifest: 'gymckpt.json',
      controllerState: {note: 1},
    })
    expect(p.participants.map((x) => [x.server, x.records, x.install, x.skip])).toEqual([
      ['env', 1, 1, 0],
      ['policy', 1, 1, 0],
      ['agent', 1, 1, 0],
      ['res', 1, 1, 0],
    ])
    const skipped = await planRestore(tc, {location: root, skipRollouts: new Set(['e1'])})
    expect(skipped.continued).toEqual([])
    expect(skipped.participants.map((x) => [x.install, x.skip])).toEqual([
      [0, 1],
      [0, 1],
      [0, 1],
      [0, 1],
    ])
    const noVerify = await planRestore(tc, {location: root, skipVerify: true})
    expect(noVerify.verify).toBeNull()
    expect(noVerify.participants.map((x) => x.records)).toEqual([null, null, null, null])
    await expect(planRestore(tc, {location: path.join(root, 'nope')})).rejects.toMatchObject({code: 'invalid_checkpoint'})
  })

  it('restores, retires the crashed attempts of restarts under the restore ID, resumes, and reports what each installed', async () => {
    const {root, target, tc} = await checkpointed()
    const r = await restoreCheckpoint(tc, {location: root, retireFirst: [episode('later', 2)]})
    expect(r.resumed).toBe(true)
    expect(r.restoredByServer).toEqual({env: ['e1-a1'], policy: ['e1-a1'], agent: ['e1-a1'], res: ['e1-a1']})
    for (const s of target.servers.filter((x) => x.controlPlane)) {
      expect(s.controlPlane!.retired.get('gone'), s.name).toBe(0)
      expect(s.controlPlane!.retired.get('later'), s.name).toBe(2)
      expect(s.controlPlane!.phase, s.name).toBe('idle')
      const routes = s.journal.map((j) => j.route).filter((x) => x !== 'status')
      expect(routes, s.name).toEqual(['restore', 'retire', 'resume'])
      expect(JSON.parse(s.journal.find((j) => j.route === 'retire')!.body).checkpoint_id).toBe(r.restoreId)
    }
  })

  it('keepClosed leaves the restored fleet closed under the restore ID', async () => {
    const {root, target, tc} = await checkpointed()
    const r = await restoreCheckpoint(tc, {location: root, keepClosed: true})
    expect(r.resumed).toBe(false)
    expect(target.server('env').controlPlane!.phase).toBe('restored')
    await resume(tc, r.restoreId, soon())
  })

  it('a retire of the restarts that fails after the restore leaves the fleet closed and names the restore ID to finish with', async () => {
    const {root, target, tc} = await checkpointed()
    target.server('agent').faults.add('retire', {type: 'status', status: 500})
    const err = (await restoreCheckpoint(tc, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.code).toBe('participant')
    expect(err.message).toMatch(
      /^restore 'restore-[0-9a-f]+' of 'ck-1' succeeded everywhere, but retiring the 1 crashed attempt\(s\) that start over failed: agent: HTTP 500 .*The fleet is still closed: retire them again with checkpoint ID 'restore-[0-9a-f]+', then resume with the restore ID\.$/,
    )
    const id = (err.details as {restore_id: string}).restore_id
    expect(err.next).toEqual([
      {command: 'retire', args: ['--id', id, '--episode', expect.any(String)], fleet: true},
      {command: 'resume', args: ['--id', id], fleet: true},
    ])
    expect(err.details).toEqual({restore_id: expect.stringMatching(/^restore-/), retire: [expect.objectContaining({attempt: expect.any(Number)})]})
    for (const s of target.servers.filter((x) => x.controlPlane)) {
      expect(
        s.journal.some((j) => j.route === 'restore'),
        s.name,
      ).toBe(true)
      expect(
        s.journal.some((j) => j.route === 'resume'),
        s.name,
      ).toBe(false)
      expect(s.controlPlane!.phase, s.name).toBe('restored')
    }
    // What the message says to do works.
    await retire(tc, id, (err.details as {retire: EpisodeIdWire[]}).retire.map(fromWire), soon())
    await resume(tc, id, soon())
    for (const s of target.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.phase, s.name).toBe('idle')
  })

  it('after a retire that fails, the line to paste lists at most 20 attempts; more are only in the details', async () => {
    // 1 restart + 19 given = 20: the retire line is offered.
    const a = await checkpointed()
    a.target.server('agent').faults.add('retire', {type: 'status', status: 500})
    const twenty = Array.from({length: 19}, (_, i) => episode(`x${i}`, 1))
    const err = (await restoreCheckpoint(a.tc, {location: a.root, retireFirst: twenty}).catch((e: unknown) => e)) as ControllerError
    expect(err.message).toMatch(/ retiring the 20 crashed attempt\(s\) that start over failed: agent: HTTP 500 /)
    expect(err.next.map((n) => n.command)).toEqual(['retire', 'resume'])
    expect(err.next[0]!.args.filter((x) => x === '--episode')).toHaveLength(20)
    // 21: only the resume line; the attempts are in the details.
    const b = await checkpointed()
    b.target.server('agent').faults.add('retire', {type: 'status', status: 500})
    const more = (await restoreCheckpoint(b.tc, {location: b.root, retireFirst: [...twenty, episode('x19', 1)]}).catch((e: unknown) => e)) as ControllerError
    expect(more.message).toMatch(/ retiring the 21 crashed attempt\(s\) /)
    expect(more.next.map((n) => n.command)).toEqual(['resume'])
    expect((more.details as {retire: unknown[]}).retire).toHaveLength(21)
  })

  it('a participant of the checkpoint is present only with both its kind and its instance', async () => {
    const {root} = await checkpointed()
    // resources/res is gone; the fleet has a resources server of another instance, and a server
    // named res of another kind.
    const fleet = await startFleet({
      members: [
        {name: 'env', kind: 'environment'},
        {name: 'policy', kind: 'model'},
        {name: 'agent', kind: 'agent'},
        {name: 'res2', kind: 'resources'},
      ],
    })
    const plan = await planRestore(await coordinatorFor(fleet), {location: root})
    expect(plan.missing.map((m) => `${m.kind}/${m.instance}`)).toEqual(['resources/res'])
    const other = await startFleet({
      members: [
        {name: 'env', kind: 'environment'},
        {name: 'policy', kind: 'model'},
        {name: 'agent', kind: 'agent'},
        {name: 'res', kind: 'model'},
      ],
    })
    const plan2 = await planRestore(await coordinatorFor(other), {location: root})
    expect(plan2.missing.map((m) => `${m.kind}/${m.instance}`)).toEqual(['resources/res'])
  })

  it('two participants the fleet lacks are both named, and the dry run says it sent nothing to a fleet with one unreachable', async () => {
    const {root} = await checkpointed()
    const fleet = await startFleet({
      members: [
        {name: 'env', kind: 'environment'},
        {name: 'policy', kind: 'model'},
      ],
    })
    const plan = await planRestore(await coordinatorFor(fleet), {location: root})
    expect(plan.missing.map((m) => `${m.kind}/${m.instance}`).sort()).toEqual(['agent/agent', 'resources/res'])
    const lost = plan.missing.filter((m) => m.install !== 0)
    expect(lost).toHaveLength(2)
    expect(() => assertRestorable(plan)).toThrow(/no server of this fleet restores: \w+\/\w+ \(\d+ record\(s\) in the scope\), \w+\/\w+ \(\d+ record\(s\) in the scope\)\. /)
    const skipped = await planRestore(await coordinatorFor(fleet), {location: root, skipVerify: true})
    expect(() => assertRestorable(skipped)).toThrow(
      /no server of this fleet restores: (agent\/agent|resources\/res) \(records not read: --skip-verify\), (agent\/agent|resources\/res) \(records not read: --skip-verify\)\. /,
    )
    const unreachable: RestorePlan = {...plan, unreachable: [{server: 'x', status: null, code: 'connection', message: 'refused'}]}
    expect(() => assertRestorable(unreachable, {dryRun: true})).toThrow('every participant must answer before a restore; the dry run sent nothing')
    expect(() => assertRestorable(unreachable)).toThrow('every participant must answer before a restore; nothing was sent')
  })

  it('a resume that fails after a restore that succeeded names the restore ID to resume with', async () => {
    const {root, target, tc} = await checkpointed()
    target.server('res').faults.add('resume', {type: 'status', status: 500})
    const err = (await restoreCheckpoint(tc, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.code).toBe('participant')
    expect(err.message).toMatch(/^restore 'restore-[0-9a-f]+' of 'ck-1' succeeded everywhere, but resuming it failed: res: HTTP 500 .*Resume it again with its restore ID\.$/)
    expect(err.details).toEqual({restore_id: expect.stringMatching(/^restore-/)})
    expect(err.next).toEqual([{command: 'resume', args: ['--id', (err.details as {restore_id: string}).restore_id], fleet: true}])
  })

  it('a fleet that became busy after the verification is refused before anything is sent', async () => {
    const {root, target, tc} = await checkpointed()
    // The second preflight sees the environment running an episode.
    const run = target.run({rolloutId: 'busy', steps: 50, stepMs: 50})
    await new Promise((r) => setTimeout(r, 100))
    const err = (await restoreCheckpoint(tc, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('fleet_state')
    for (const s of target.servers)
      expect(
        s.journal.some((j) => j.route === 'restore' || j.route === 'retire'),
        s.name,
      ).toBe(false)
    await target.server('env').controlPlane!.retire({checkpoint_id: 'x', deadline_ts: soon(), episode_ids: [{rollout_id: 'busy', attempt: 0}]})
    await run
  })
})

describe('restoreCheckpoint: timings and the restore log', () => {
  it("a row per participant: restore and resume times, the records it installed and its file's bytes", async () => {
    const {root, dir, tc} = await checkpointed()
    const r = await restoreCheckpoint(tc, {location: root})
    expect(r.timings.map((t) => t.server)).toEqual(['env', 'policy', 'agent', 'res'])
    for (const t of r.timings) {
      const v = r.verify!.participants.find((x) => x.kind === t.kind && x.instance === t.instance)!
      expect([typeof t.restoreMs, typeof t.resumeMs, t.prepareMs, t.commitMs], t.server).toEqual(['number', 'number', null, null])
      expect(t.records, t.server).toBe(1)
      expect(t.bytes, t.server).toBe(v.bytes)
      expect(t.bytes, t.server).toBeGreaterThan(0)
    }
    const log = await readRestoreLog(root)
    expect(log.entries).toEqual([{restore_id: r.restoreId, time: expect.any(String), checkpoint_id: 'ck-1', checkpoint_dir: dir, outcome: 'restored', error: null, participants: 4}])
  })

  it('without verification no bytes are known; keepClosed has no resume time', async () => {
    const {root, tc} = await checkpointed()
    const r = await restoreCheckpoint(tc, {location: root, skipVerify: true, keepClosed: true})
    expect(r.timings.map((t) => [t.records, t.bytes, t.resumeMs])).toEqual([
      [1, null, null],
      [1, null, null],
      [1, null, null],
      [1, null, null],
    ])
    await resume(tc, r.restoreId, soon())
  })

  it('a refused restore is logged as refused with its error; a failed one as failed', async () => {
    const {root, dir, target, tc} = await checkpointed()
    target.server('policy').faults.add('restore', {type: 'status', status: 500})
    const failed = (await restoreCheckpoint(tc, {location: root}).catch((e: unknown) => e)) as Error
    const busy = target.run({rolloutId: 'busy', steps: 50, stepMs: 50})
    await new Promise((r) => setTimeout(r, 100))
    const refused = (await restoreCheckpoint(tc, {location: root, skipVerify: true}).catch((e: unknown) => e)) as Error
    const log = await readRestoreLog(root)
    expect(log.entries.map((e) => [e.checkpoint_id, e.checkpoint_dir, e.outcome, e.error])).toEqual([
      ['ck-1', dir, 'failed', failed.message],
      ['ck-1', dir, 'refused', refused.message],
    ])
    await target.server('env').controlPlane!.retire({checkpoint_id: 'x', deadline_ts: soon(), episode_ids: [{rollout_id: 'busy', attempt: 0}]})
    await busy
  })

  it('the resume after the restore and its retire gets at least 30 s more, not what the restore left of its deadline', async () => {
    const {root, target, tc} = await checkpointed()
    target.server('agent').faults.add('retire', {type: 'delay', ms: 700})
    await restoreCheckpoint(tc, {location: root, timeoutS: 1})
    const body = (route: string) => JSON.parse(target.server('env').journal.find((j) => j.route === route)!.body) as {deadline_ts: number}
    const restoreDeadline = body('restore').deadline_ts
    // The retire took most of the 1 s the restore was given; the resume is still given 30 s.
    expect(body('resume').deadline_ts - restoreDeadline).toBeGreaterThan(29)
    expect(body('resume').deadline_ts - restoreDeadline).toBeLessThan(60)
  })

  it('an interrupt during the retire of restarts after the restore lets the retire and the resume finish, then reports the interrupt', async () => {
    const {root, target, tc} = await checkpointed()
    const abort = new AbortController()
    target.server('agent').faults.add('retire', {type: 'delay', ms: 300})
    // Interrupted once the slow retire is on its way to the agent.
    const onCall = (e: {operation: string; server: string; ms: number | null}) => {
      if (e.operation === 'retire' && e.server === 'agent' && e.ms === null) setImmediate(() => abort.abort())
    }
    const p = restoreCheckpoint({...tc, signal: abort.signal, onCall}, {location: root})
    const err = (await p.catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('interrupted')
    expect(err.message).toMatch(/^interrupted during restore '(restore-[0-9a-f]+)' of 'ck-1', which succeeded everywhere; the fleet was resumed$/)
    expect(err.details).toEqual({restore_id: err.message.match(/'(restore-[0-9a-f]+)'/)![1]})
    for (const s of target.servers.filter((x) => x.controlPlane)) {
      const routes = s.journal.map((j) => j.route)
      expect(
        routes.filter((r) => r === 'restore' || r === 'retire' || r === 'resume'),
        s.name,
      ).toEqual(['restore', 'retire', 'resume'])
      expect(s.controlPlane!.phase, s.name).toBe('idle')
    }
    expect((await readRestoreLog(root)).entries.map((e) => [e.outcome, e.error])).toEqual([['restored', err.message]])
  })

  it('the same interrupt with keepClosed says the fleet is kept closed, as asked', async () => {
    const {root, target, tc} = await checkpointed()
    const abort = new AbortController()
    target.server('agent').faults.add('retire', {type: 'delay', ms: 300})
    const onCall = (e: {operation: string; server: string; ms: number | null}) => {
      if (e.operation === 'retire' && e.server === 'agent' && e.ms === null) setImmediate(() => abort.abort())
    }
    const err = (await restoreCheckpoint({...tc, signal: abort.signal, onCall}, {location: root, keepClosed: true}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('interrupted')
    expect(err.message).toMatch(/^interrupted during restore 'restore-[0-9a-f]+' of 'ck-1', which succeeded everywhere; the fleet is kept closed, as asked$/)
    for (const s of target.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.phase, s.name).toBe('restored')
  })
})
