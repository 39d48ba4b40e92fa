import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {Fleet} from '../../src/control-plane/fleet.js'
import {SimDownstream, SimEnvironment} from '../../src/control-plane/sim.js'
import {readParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import {verifyCheckpoint} from '../../src/storage/verify.js'
import {FULL, control, soon, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

// Gym's export rule (reference §4.6): environment, agent and resources export every live episode
// they hold, whatever the commit scope; the policy model only the scope; restored state no
// replacement claimed is cut to the scope on every kind.

const NAMES = ['env', 'policy', 'agent', 'res'] as const
const wire = (keys: [string, number][]) => keys.map(([r, a]) => ({rollout_id: r, attempt: a}))

/** Runs long episodes until the environment holds all of them. */
async function live(fleet: Fleet, ...rollouts: string[]): Promise<void> {
  for (const r of rollouts) void fleet.run({rolloutId: r, steps: 400, stepMs: 5})
  const env = fleet.server('env').participant as SimEnvironment
  await waitFor(() => rollouts.every((r) => env.episodes.get(r)?.boundary), 5000, 'episodes at a boundary')
}

/** prepare (in Gym's order) and commit by raw control calls; returns each server's commit reply. */
async function commitAll(fleet: Fleet, id: string, dir: string, scope: [string, number][] | null): Promise<Record<string, any>> {
  for (const n of NAMES) expect((await control(fleet.server(n).url, 'prepare', {checkpoint_id: id, deadline_ts: soon()})).json.phase, n).toBe('prepared')
  const replies: Record<string, any> = {}
  const body = {checkpoint_id: id, deadline_ts: soon(), checkpoint_dir: dir, ...(scope ? {episode_ids: wire(scope)} : {})}
  for (const n of NAMES) {
    const r = await control(fleet.server(n).url, 'commit', body)
    expect(r.status, `${n}: ${r.text}`).toBe(200)
    replies[n] = r.json
  }
  return replies
}

async function resumeAll(fleet: Fleet, id: string): Promise<void> {
  for (const n of [...NAMES].reverse()) expect((await control(fleet.server(n).url, 'resume', {checkpoint_id: id, deadline_ts: soon()})).status).toBe(200)
}

const exported = (replies: Record<string, any>) => Object.fromEntries(NAMES.map((n) => [n, replies[n].episode_ids]))

describe('export rule of the participant double', () => {
  it('environment, agent and resources export a live episode the scope leaves out; the model does not', async () => {
    const fleet = await startFleet({members: FULL})
    await live(fleet, 'a', 'b')
    const dir = await tempDir()
    const replies = await commitAll(fleet, 'c1', dir, [['a', 0]])
    expect(exported(replies)).toEqual({env: ['a', 'b'], policy: ['a'], agent: ['a', 'b'], res: ['a', 'b']})
    // The records on disk are what the replies say.
    const onDisk = await readParticipantState(path.join(dir, 'gym', 'agent', 'agent'))
    expect(onDisk.keys).toEqual(['a', 'b'])
    expect(onDisk.manifest.record_count).toBe(2)
    await resumeAll(fleet, 'c1')
  })

  it('without a scope, the policy model refuses (409 checkpoint_error) and stays prepared; every other kind exports everything live', async () => {
    const fleet = await startFleet({members: FULL})
    await live(fleet, 'a', 'b')
    for (const n of NAMES) expect((await control(fleet.server(n).url, 'prepare', {checkpoint_id: 'c1', deadline_ts: soon()})).json.phase, n).toBe('prepared')
    const body = {checkpoint_id: 'c1', deadline_ts: soon(), checkpoint_dir: await tempDir()}
    const got: Record<string, unknown> = {}
    for (const n of NAMES) {
      const r = await control(fleet.server(n).url, 'commit', body)
      got[n] = r.status === 200 ? r.json.episode_ids : [r.status, r.json.error.code, r.json.error.detail]
    }
    expect(got).toEqual({env: ['a', 'b'], policy: [409, 'checkpoint_error', 'model commit needs the episode_ids the controller continues'], agent: ['a', 'b'], res: ['a', 'b']})
    expect((await control(fleet.server('policy').url, 'status')).json.phase).toBe('prepared')
    await resumeAll(fleet, 'c1')
  })

  it('a checkpoint holding records outside its scope verifies, with the counts, and restores only the scope', async () => {
    const fleet = await startFleet({members: FULL})
    await live(fleet, 'a', 'b', 'c')
    const root = await tempDir()
    const id = 'ckpt-1'
    const dir = path.join(root, id)
    const scope: [string, number][] = [
      ['a', 0],
      ['z', 0],
    ]
    const replies = await commitAll(fleet, id, dir, scope)
    await resumeAll(fleet, id)
    await writeControllerManifest(dir, {
      format_version: FORMAT_VERSION,
      checkpoint_id: id,
      created_at: Date.now() / 1000,
      continued: wire(scope),
      restarted: [],
      participants: NAMES.map((n) => ({server: n, kind: replies[n].manifest.kind, instance: n, manifest: replies[n].manifest, episode_ids: replies[n].episode_ids})),
    })
    await publishLatest(root, id)

    const v = await verifyCheckpoint(root)
    expect(v.problems.filter((p) => p.severity === 'error')).toEqual([])
    expect(v.ok).toBe(true)
    const counts = Object.fromEntries(v.participants.map((p) => [p.instance, [p.records, p.inScope, p.outsideScope, p.scopeWithoutRecord]]))
    // z is in the scope but held nowhere (it finished, say): one scope episode without a record each.
    expect(counts).toEqual({env: [3, 1, 2, 1], policy: [1, 1, 0, 1], agent: [3, 1, 2, 1], res: [3, 1, 2, 1]})
    expect(v.uncovered).toEqual(['z'])
    // The report says a restore skips the records outside the scope.
    const notes = v.problems.filter((p) => p.severity === 'info')
    expect(notes.map((p) => path.basename(p.where))).toEqual(['agent', 'env', 'res'])
    expect(notes[0]!.message).toBe('2 record(s) outside the commit scope: b, c; a restore skips them and installs only the 1 in scope')

    await fleet.crash()
    const fresh = await startFleet({members: FULL})
    for (const n of NAMES) {
      const r = await control(fresh.server(n).url, 'restore', {checkpoint_id: 'restore-1', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: wire(scope)})
      expect(r.json, n).toEqual({phase: 'restored', source_checkpoint_id: id, restored: ['a-a1']})
    }
    expect((fresh.server('env').participant as SimEnvironment).restoredKeys()).toEqual(['a-a1'])
    expect((fresh.server('agent').participant as SimDownstream).restoredKeys()).toEqual(['a-a1'])
  })

  it('restored state no replacement claimed is cut to the scope on every kind, and the rest is deleted', async () => {
    const fleet = await startFleet({members: FULL})
    await live(fleet, 'a', 'b')
    const dir = await tempDir()
    await commitAll(fleet, 'c1', dir, [
      ['a', 0],
      ['b', 0],
    ])
    await fleet.crash()

    const fresh = await startFleet({members: FULL})
    for (const n of NAMES) {
      const r = await control(fresh.server(n).url, 'restore', {
        checkpoint_id: 'rs',
        deadline_ts: soon(),
        checkpoint_dir: dir,
        episode_ids: wire([
          ['a', 0],
          ['b', 0],
        ]),
      })
      expect(r.json.restored, n).toEqual(['a-a1', 'b-a1'])
    }
    await resumeAll(fresh, 'rs')
    // A new live episode c, outside the next scope; neither replacement has been dispatched.
    await live(fresh, 'c')
    const replies = await commitAll(fresh, 'c2', await tempDir(), [['a', 1]])
    // a-a1 is restored and in scope; b-a1 restored and outside it; c is live and outside it.
    expect(exported(replies)).toEqual({env: ['a-a1', 'c'], policy: ['a-a1'], agent: ['a-a1', 'c'], res: ['a-a1', 'c']})
    for (const n of NAMES) expect(fresh.server(n).participant!.restoredKeys(), n).toEqual(['a-a1'])
    await resumeAll(fresh, 'c2')
    // b's state is gone but b@1 is not refused: it starts over from its input.
    const b = await fresh.run({rolloutId: 'b', attempt: 1, steps: 3, stepMs: 0})
    expect(b.status).toBe(200)
    expect((b.body as {resumed_from_step: number}).resumed_from_step).toBe(0)
  })
})
