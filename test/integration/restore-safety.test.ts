import {describe, expect, it} from 'vitest'

import {Fleet} from '../../src/control-plane/fleet.js'
import {SimDownstream, SimEnvironment} from '../../src/control-plane/sim.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {prepare, resume} from '../../src/coordination/operations.js'
import {assertRestorable, planRestore, restoreBlockers, restoreCheckpoint} from '../../src/coordination/restore.js'
import {FULL, checkpointedFleet, control, coordinatorFor, soon, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const env = (f: Fleet) => f.server('env').participant as SimEnvironment
const sent = (f: Fleet, route: string) => f.servers.flatMap((s) => s.journal.filter((j) => j.route === route).map(() => s.name))

/** A checkpoint of `live` episodes mid-flight (plus one restart), then every server crashed. */
async function checkpointed(live: string[], restart?: string): Promise<string> {
  const fleet = await startFleet({members: FULL})
  const c = await coordinatorFor(fleet)
  for (const r of live) void fleet.run({rolloutId: r, steps: 200, stepMs: 5})
  if (restart) void fleet.run({rolloutId: restart, steps: 200, stepMs: 5, restart: true})
  const n = live.length + (restart ? 1 : 0)
  await waitFor(() => env(fleet).episodes.size === n && [...env(fleet).episodes.values()].every((e) => e.boundary !== null))
  const root = await tempDir()
  const episodes = [...live, ...(restart ? [restart] : [])].map((r) => ({rolloutId: r, attempt: 0}))
  await checkpoint(c, {root, timeoutS: 10, episodes})
  await fleet.crash()
  return root
}

describe('restore preflight: a restore never touches a fleet that holds work', () => {
  it('refuses a fleet with live episodes (fleet_state, each busy server and its counts), sends nothing, and the episodes live on', async () => {
    const root = await checkpointed(['a', 'b'])
    const busy = await startFleet({members: FULL})
    const c = await coordinatorFor(busy)
    const runs = ['x', 'y', 'z'].map((r) => busy.run({rolloutId: r, steps: 40, stepMs: 5}))
    // Each episode's first step reaches the policy model, which then holds its session: wait for
    // both, or a loaded machine asks before the model holds anything.
    await waitFor(() => env(busy).episodes.size === 3 && (busy.server('policy').participant as SimDownstream).sessions.size === 3)
    const err = await restoreCheckpoint(c, {location: root, timeoutS: 10}).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(ControllerError)
    expect((err as ControllerError).code).toBe('fleet_state')
    expect((err as Error).message).toMatch(/nothing was sent/)
    expect((err as Error).message).toMatch(/env holds 3 episodes/)
    expect((err as Error).message).toMatch(/policy holds 3 sessions/)
    expect(sent(busy, 'restore')).toEqual([])
    expect(sent(busy, 'retire')).toEqual([])
    // Nothing was retired: every live episode finishes with its result.
    const replies = await Promise.all(runs)
    expect(replies.map((r) => r.status)).toEqual([200, 200, 200])
    for (const s of c.participants) expect((await control(s.url, 'status')).json.retired_rollouts).toBe(0)
  })

  it('refuses to restore a second time into a fleet that was already restored; the restored sessions stay', async () => {
    const root = await checkpointed(['a', 'b', 'c'])
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    await restoreCheckpoint(c, {location: root, timeoutS: 10})
    const policy = fresh.server('policy').participant as SimDownstream
    expect(policy.sessions.size).toBe(3)
    const calls = () => fresh.servers.map((s) => s.journal.filter((j) => j.route !== 'status').length)
    const journalBefore = calls()
    const err = await restoreCheckpoint(c, {location: root, timeoutS: 10}).catch((e: unknown) => e)
    expect((err as ControllerError).code).toBe('fleet_state')
    expect((err as Error).message).toMatch(/env holds 3 restored episode\(s\) no replacement has claimed \(restored_pending\)/)
    expect(calls()).toEqual(journalBefore)
    expect(policy.sessions.size).toBe(3)
    expect(env(fresh).restoredPending.size).toBe(3)
    // The restored episodes still continue from their boundaries.
    const cont = await fresh.run({rolloutId: 'a', attempt: 1, steps: 200, stepMs: 0})
    expect(cont.status).toBe(200)
    expect((cont.body as {resumed_from_step: number}).resumed_from_step).toBeGreaterThan(0)
  })

  it('a fleet with an open checkpoint is a fleet-state refusal, not an invalid checkpoint', async () => {
    const root = await checkpointed(['a'])
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    expect((await prepare(c, 'ckpt-open', soon())).prepared).toBe(true)
    const plan = await planRestore(c, {location: root})
    expect(plan.verify?.ok).toBe(true)
    expect(plan.busy.map((b) => b.server)).toEqual(['env', 'policy', 'agent', 'res'])
    expect(plan.busy[0]!.reasons).toEqual(["is in phase prepared of 'ckpt-open'"])
    const err = (() => {
      try {
        assertRestorable(plan)
      } catch (e) {
        return e
      }
    })()
    expect((err as ControllerError).code).toBe('fleet_state')
    await resume(c, 'ckpt-open', soon())
  })

  it('names retired marks, restarts, blockers and restored state as reasons; a fresh status has none', () => {
    const base = {
      kind: 'environment',
      instance: 'e',
      phase: 'idle',
      checkpoint_id: null,
      lease_expires_at: null,
      retired_rollouts: 0,
      report: {ready: true, blockers: [], blocker_count: 0, counts: {episodes: 0, workers: 4, cut: 7}, restarts: []},
    }
    expect(restoreBlockers(base)).toEqual([])
    expect(restoreBlockers({...base, retired_rollouts: 2})).toEqual([expect.stringMatching(/^holds 2 retired-rollout mark\(s\)/)])
    expect(restoreBlockers({...base, restored_generation_cuts: ['r-a1']})).toEqual(['holds 1 restored episode(s) no replacement has claimed (restored_generation_cuts)'])
    expect(restoreBlockers({...base, report: {...base.report, restarts: ['q'], blockers: ['r'], blocker_count: 5, counts: {held: 1}}})).toEqual([
      'holds 1 held',
      'runs 1 restart(s)',
      'reports 5 blocker(s) (work in flight)',
    ])
  })
})

describe('restore plan and order', () => {
  it('the dry-run plan names what the restore installs per participant, and sends only status probes', async () => {
    const root = await checkpointed(['a', 'b'], 'q')
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    const plan = await planRestore(c, {location: root})
    expect(plan.busy).toEqual([])
    expect(plan.continued).toEqual([
      {rolloutId: 'a', attempt: 0},
      {rolloutId: 'b', attempt: 0},
    ])
    expect(plan.replacements).toEqual([
      {rolloutId: 'a', attempt: 1},
      {rolloutId: 'b', attempt: 1},
    ])
    expect(plan.restarted).toEqual([{rolloutId: 'q', attempt: 0}])
    expect(plan.participants.map((p) => [p.server, p.install])).toEqual([
      ['env', 2],
      ['policy', 2],
      ['agent', 2],
      ['res', 2],
    ])
    expect(fresh.servers.flatMap((s) => s.journal.map((j) => j.route)).filter((r) => r !== 'status')).toEqual([])
    // The real restore installs exactly that.
    const r = await restoreCheckpoint(c, {location: root, timeoutS: 10})
    expect(Object.fromEntries(Object.entries(r.restoredByServer).map(([s, k]) => [s, k.length]))).toEqual({env: 2, policy: 2, agent: 2, res: 2})
  })

  it('retires the crashed attempts of restarts after the restore, before the fleet is resumed: the restore reaches servers with no marks', async () => {
    const root = await checkpointed(['a'], 'q')
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    await restoreCheckpoint(c, {location: root, timeoutS: 10})
    for (const s of fresh.servers.filter((x) => x.name !== 'judge')) {
      expect(
        s.journal.map((j) => j.route).filter((r) => r !== 'status'),
        s.name,
      ).toEqual(['restore', 'retire', 'resume'])
    }
    // A harness of q's crashed attempt is refused; its rerun at attempt 1 is admitted.
    expect((await fresh.run({rolloutId: 'q', attempt: 0})).status).toBe(409)
    expect((await fresh.run({rolloutId: 'q', attempt: 1, steps: 2, stepMs: 1})).status).toBe(200)
  })

  it('a participant that restored but whose reply was lost retires what it installed; one that refused before installing keeps its live work', async () => {
    const root = await checkpointed(['a', 'b'])
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    // The agent installs, then the connection drops before its reply; the resources server refuses
    // before installing (busy), so nothing is retired there.
    fresh.server('agent').faults.add('restore', {type: 'drop-after'})
    fresh.server('res').faults.add('restore', {type: 'status', status: 409, body: JSON.stringify({error: {code: 'invalid_phase', detail: 'busy'}})})
    const err = await restoreCheckpoint(c, {location: root, timeoutS: 10}).catch((e: unknown) => e)
    expect((err as ControllerError).code).toBe('participant')
    const agent = fresh.server('agent').participant as SimDownstream
    expect(agent.sessions.size).toBe(0)
    const marks: Record<string, number> = {}
    for (const s of c.participants) marks[s.server] = (await control(s.url, 'status')).json.retired_rollouts
    expect(marks).toEqual({env: 2, policy: 2, agent: 2, res: 0})
    for (const s of c.participants) expect((await control(s.url, 'status')).json.phase).toBe('idle')
  })

  it('an interrupted restore cleans up, resumes, and reports interrupted', async () => {
    const root = await checkpointed(['a'])
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    const ctl = new AbortController()
    fresh.server('res').faults.add('restore', {type: 'hang'})
    const p = restoreCheckpoint({...c, signal: ctl.signal}, {location: root, timeoutS: 10}).catch((e: unknown) => e)
    // The hung server journals nothing; the other three have restored.
    await waitFor(() => sent(fresh, 'restore').length === 3)
    ctl.abort(new Error('SIGINT'))
    const err = await p
    expect((err as ControllerError).code).toBe('interrupted')
    for (const s of c.participants.filter((x) => x.server !== 'res')) expect((await control(s.url, 'status')).json.phase).toBe('idle')
  })
})

describe('a fleet that lacks a participant the checkpoint holds state of', () => {
  it('is refused before anything is sent (exit fleet_state), the dry run too, naming it; state only out of the scope lets it go ahead', async () => {
    const {root} = await checkpointedFleet(['a', 'b'])
    // The resources server came back with checkpointing off: it answers 404 and is skipped.
    const fresh = await startFleet({members: FULL.map((m) => (m.name === 'res' ? {...m, kind: 'none' as const} : m))})
    const c = await coordinatorFor(fresh)
    expect(c.participants.map((p) => p.server)).toEqual(['env', 'policy', 'agent'])
    const plan = await planRestore(c, {location: root})
    expect(plan.missing).toEqual([{kind: 'resources', instance: 'res', records: 2, install: 2}])
    expect(() => assertRestorable(plan, {dryRun: true})).toThrow(
      /^dry run: restore refused, nothing was sent: the checkpoint holds state of 1 participant\(s\) no server of this fleet restores: resources\/res \(2 record\(s\) in the scope\)\. Their episodes would continue without it\./,
    )
    const err = (await restoreCheckpoint(c, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('fleet_state')
    expect(err.details).toEqual({missing: [{kind: 'resources', instance: 'res', records: 2, install: 2}]})
    const skipped = (await restoreCheckpoint(c, {location: root, skipVerify: true}).catch((e: unknown) => e)) as ControllerError
    expect(skipped.message).toContain('resources/res (records not read: --skip-verify)')
    expect(fresh.servers.flatMap((s) => s.journal.map((j) => j.route)).filter((r) => r !== 'status')).toEqual([])
    // Nothing of it in the scope (both rollouts skipped): the restore goes ahead without it.
    const none = await planRestore(c, {location: root, skipRollouts: new Set(['a', 'b'])})
    expect(none.missing).toEqual([{kind: 'resources', instance: 'res', records: 2, install: 0}])
    expect(() => assertRestorable(none)).not.toThrow()
  })
})
