import {readFile, readdir} from 'node:fs/promises'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

import {describe, expect, it} from 'vitest'

import {EXIT} from '../../src/cli/exit-codes.js'
import {Fleet} from '../../src/control-plane/fleet.js'
import {SimDownstream} from '../../src/control-plane/sim.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {restore} from '../../src/coordination/operations.js'
import {assertRestorable, planRestore, restoreCheckpoint} from '../../src/coordination/restore.js'
import {newRestoreId} from '../../src/coordination/runs.js'
import {verifyCheckpoint} from '../../src/storage/verify.js'
import {FAILURE_TABLE_END, FAILURE_TABLE_START, FaultRowId, failureTable, row, rowsTestedIn} from '../fault-matrix.rows.js'
import {Scope, allIn, assertNothingLost, controlCalls, liveEpisodes, mountTmpfs, phases, publishSome, sentIds, tree} from '../helpers/fault-matrix.js'
import {control, waitFor} from '../helpers/fleet.js'

/** The fault matrix rows run in-process: the controller against real participant servers on 127.0.0.1. */

const covered = new Set<FaultRowId>()
const EPISODES = ['a', 'b']
const episodesOf = (ids: string[]) => ids.map((r) => ({rolloutId: r, attempt: 0}))

/** The error's code maps to one of the row's exit codes. */
function expectCode(id: FaultRowId, err: unknown): ControllerError {
  covered.add(id)
  expect(err).toBeInstanceOf(ControllerError)
  const e = err as ControllerError
  const exit = row(id).exit
  expect(exit === 'killed' ? [] : exit, `${id}: ${e.code}: ${e.message}`).toContain(EXIT[e.code])
  return e
}

async function publishedFleet(scope: Scope, steps?: number): Promise<{fleet: Fleet; root: string; history: string[]}> {
  const fleet = await scope.fleet()
  await liveEpisodes(fleet, EPISODES, steps)
  const root = await scope.dir()
  return {fleet, root, history: await publishSome(await scope.coordinator(fleet), root, EPISODES)}
}

/** Episodes restored from crashedFleet() are run to their end: few steps (12 s at 200 ms a step). */
const SHORT = 60

/** A published root whose fleet then crashed: what a restore starts from. */
async function crashedFleet(scope: Scope): Promise<{root: string; history: string[]}> {
  const {fleet, root, history} = await publishedFleet(scope, SHORT)
  await fleet.crash()
  return {root, history}
}

describe('fault matrix (in-process)', () => {
  it('wrong-token: a wrong token fails discovery as unauthorized; nothing else is sent', {timeout: 60_000}, async ({onTestFinished}) => {
    const scope = new Scope(onTestFinished)
    const {fleet, root, history} = await publishedFleet(scope)
    const before = controlCalls(fleet)
    const err = await scope.coordinator(fleet, 'not-the-token').catch((e: unknown) => e)
    const e = expectCode('wrong-token', err)
    expect(e.code).toBe('unauthorized')
    expect(e.message).not.toContain('not-the-token')
    expect(controlCalls(fleet)).toEqual(before)
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    expect(await assertNothingLost(root, history)).toBe(history.at(-1))
  })

  it('two-checkpoints: two checkpoints at once on one fleet and root; one publishes, nothing is lost', {timeout: 60_000}, async ({onTestFinished}) => {
    const scope = new Scope(onTestFinished)
    const {fleet, root, history} = await publishedFleet(scope)
    const [c1, c2] = [await scope.coordinator(fleet), await scope.coordinator(fleet)]
    const ids = ['ckpt-race-one', 'ckpt-race-two']
    const results = await Promise.allSettled([
      checkpoint(c1, {root, checkpointId: ids[0], timeoutS: 10, episodes: episodesOf(EPISODES)}),
      checkpoint(c2, {root, checkpointId: ids[1], timeoutS: 10, episodes: episodesOf(EPISODES)}),
    ])
    const won = results.flatMap((r, i) => (r.status === 'fulfilled' ? [ids[i]!] : []))
    const lost = results.flatMap((r) => (r.status === 'rejected' ? [r.reason as unknown] : []))
    expect(won).toHaveLength(1)
    expect(lost).toHaveLength(1)
    expectCode('two-checkpoints', lost[0])
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    expect(await assertNothingLost(root, [...history, won[0]!])).toBe(won[0])
    // The loser published nothing: its directory, if any, has no controller manifest.
    const loser = ids.find((i) => i !== won[0])!
    expect(await readdir(path.join(root, loser)).catch(() => [] as string[])).not.toContain('gymckpt.json')
  })

  it('checkpoint-during-restore: refused before anything is sent; the restore finishes', {timeout: 60_000}, async ({onTestFinished}) => {
    const scope = new Scope(onTestFinished)
    const {root, history} = await crashedFleet(scope)
    const fleet = await scope.fleet()
    fleet.server('policy').faults.add('restore', {type: 'delay', ms: 1000})
    const c = await scope.coordinator(fleet)
    const restoring = restoreCheckpoint(c, {location: root, timeoutS: 10})
    await waitFor(() => ['env', 'agent', 'res'].every((n) => fleet.server(n).controlPlane!.phase === 'restored'), 10_000, 'restore in progress')
    const before = controlCalls(fleet)
    const err = await checkpoint(await scope.coordinator(fleet), {root, timeoutS: 10, episodes: episodesOf(EPISODES)}).catch((e: unknown) => e)
    const e = expectCode('checkpoint-during-restore', err)
    expect(e.message).toMatch(/another checkpoint is open: 'restore-[0-9a-f]{12}' on env \(restored\)/)
    expect(controlCalls(fleet)).toEqual(before)
    const restored = await restoring
    expect(restored.resumed).toBe(true)
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    expect(await assertNothingLost(root, history)).toBe(history.at(-1))
    // The restored episodes continue from their boundaries.
    const cont = await fleet.run({rolloutId: 'a', attempt: 1, steps: SHORT, stepMs: 0})
    expect(cont.status).toBe(200)
  })

  it('two-restores: two restores at once into one fresh fleet; at most one succeeds and it keeps what it restored', {timeout: 60_000}, async ({onTestFinished}) => {
    const scope = new Scope(onTestFinished)
    const {root, history} = await crashedFleet(scope)
    const fleet = await scope.fleet()
    const [c1, c2] = [await scope.coordinator(fleet), await scope.coordinator(fleet)]
    const results = await Promise.allSettled([restoreCheckpoint(c1, {location: root, timeoutS: 10}), restoreCheckpoint(c2, {location: root, timeoutS: 10})])
    const won = results.filter((r) => r.status === 'fulfilled')
    const lost = results.flatMap((r) => (r.status === 'rejected' ? [r.reason as unknown] : []))
    expect(won.length).toBeLessThanOrEqual(1)
    expect(lost.length).toBeGreaterThanOrEqual(1)
    for (const e of lost) expectCode('two-restores', e)
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    expect(await assertNothingLost(root, history)).toBe(history.at(-1))
    const retired = await Promise.all(['env', 'policy', 'agent', 'res'].map(async (n) => (await control(fleet.server(n).url, 'status')).json.retired_rollouts as number))
    if (won.length === 1) {
      // The loser retired nothing of the winner's: every restored episode continues from its boundary.
      expect(retired).toEqual([0, 0, 0, 0])
      const conts = await Promise.all(EPISODES.map((r) => fleet.run({rolloutId: r, attempt: 1, steps: SHORT, stepMs: 0})))
      expect(conts.map((x) => [x.status, (x.body as {resumed_from_step?: number}).resumed_from_step! > 0])).toEqual(EPISODES.map(() => [200, true]))
    } else {
      // Neither: each retired only what it installed itself, on the participants it restored.
      expect(retired.every((n) => n === 0 || n === EPISODES.length)).toBe(true)
    }
  })

  it('disk-full: the commit fails, the fleet is resumed, LATEST keeps its value, no manifest in the new directory', {timeout: 60_000}, async ({onTestFinished}) => {
    const scope = new Scope(onTestFinished)
    const fleet = await scope.fleet()
    const c = await scope.coordinator(fleet)
    await liveEpisodes(fleet, EPISODES)
    const root = path.join(await scope.dir(), 'small')
    const unmount = await mountTmpfs(root, 'size=256k')
    try {
      const history = await publishSome(c, root, EPISODES)
      // One episode whose agent session state is larger than the whole file system.
      const agent = fleet.server('agent').participant as SimDownstream
      agent.sessions.get('a')!.payload = 'x'.repeat(400_000)
      const err = await checkpoint(c, {root, checkpointId: 'ckpt-disk-full', timeoutS: 10, episodes: episodesOf(EPISODES)}).catch((e: unknown) => e)
      const e = expectCode('disk-full', err)
      expect(e.message).toMatch(/agent: HTTP 422 invalid_checkpoint_state .*ENOSPC/)
      expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
      expect(sentIds(fleet.server('agent'), 'resume')).toContain('ckpt-disk-full')
      expect(await assertNothingLost(root, history)).toBe(history.at(-1))
      const files = await tree(path.join(root, 'ckpt-disk-full'))
      // No controller manifest, and no participant manifest where the write failed.
      expect(files).toContain('gym/agent/agent')
      expect(files.filter((f) => f === 'gymckpt.json' || f === 'gym/agent/agent/manifest.json')).toEqual([])
      expect((await verifyCheckpoint(path.join(root, 'ckpt-disk-full'))).ok).toBe(false)
      expect(files.filter((f) => /(^|\/)\.[^/]+\.[0-9a-f]{8}$/.test(f))).toEqual([]) // no temp file left
    } finally {
      unmount()
    }
  })

  // A restore whose preflight passed before another restore finished: every participant refuses it.
  it('two-restores-late: a restore whose preflight passed before another restore finished retires nothing of it', {timeout: 60_000}, async ({onTestFinished}) => {
    const scope = new Scope(onTestFinished)
    const {root, history} = await crashedFleet(scope)
    const fleet = await scope.fleet()
    const [c1, c2] = [await scope.coordinator(fleet), await scope.coordinator(fleet)]
    const late = await planRestore(c2, {location: root})
    assertRestorable(late) // its preflight passes: the fleet is still fresh
    const first = await restoreCheckpoint(c1, {location: root, timeoutS: 10})
    expect(first.resumed).toBe(true)
    // Then it goes ahead, as restoreCheckpoint does after its preflight.
    const err = await restore(c2, newRestoreId(), late.checkpointDir, late.continued, Date.now() / 1000 + 10).catch((e: unknown) => e)
    expectCode('two-restores-late', err)
    expect(await phases(fleet)).toEqual(allIn(fleet, 'idle'))
    const retired = await Promise.all(['env', 'policy', 'agent', 'res'].map(async (n) => (await control(fleet.server(n).url, 'status')).json.retired_rollouts as number))
    expect(retired).toEqual([0, 0, 0, 0])
    const conts = await Promise.all(EPISODES.map((r) => fleet.run({rolloutId: r, attempt: 1, steps: SHORT, stepMs: 0})))
    expect(conts.map((x) => [x.status, (x.body as {resumed_from_step?: number}).resumed_from_step! > 0])).toEqual(EPISODES.map(() => [200, true]))
    expect(await assertNothingLost(root, history)).toBe(history.at(-1))
  })

  it('every in-process row of test/fault-matrix.rows.ts has run above', () => {
    expect([...covered].sort()).toEqual(rowsTestedIn('integration'))
  })
})

describe('the README failure table', () => {
  it('is exactly failureTable() between the failure-table markers', async () => {
    const readme = await readFile(path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../README.md'), 'utf8')
    const start = readme.indexOf(FAILURE_TABLE_START)
    const end = readme.indexOf(FAILURE_TABLE_END)
    const table = failureTable()
    expect(start, `README.md has no ${FAILURE_TABLE_START} … ${FAILURE_TABLE_END} section; paste between them:\n${table}`).toBeGreaterThanOrEqual(0)
    expect(end, `README.md has no ${FAILURE_TABLE_END} marker`).toBeGreaterThan(start)
    expect(readme.slice(start + FAILURE_TABLE_START.length, end).trim()).toBe(table)
  })
})
