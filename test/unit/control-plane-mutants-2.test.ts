// More rules of the participant double's phase machine (src/control-plane/control-plane.ts), from
// the survivors of the unit-only run of 2026-12-04 (issue 12): the words of each refusal, and the
// blocker count a participant reports.
import path from 'node:path'

import {afterEach, describe, expect, it} from 'vitest'

import {ControlError, ControlPlane} from '../../src/control-plane/control-plane.js'
import {SimDownstream} from '../../src/control-plane/sim.js'
import {writeParticipantState} from '../../src/storage/participant-store.js'
import {tempDir} from '../helpers/tmp.js'

const planes: ControlPlane[] = []
afterEach(() => {
  for (const cp of planes.splice(0)) cp.close()
})

const soon = (s = 10) => Date.now() / 1000 + s

function make() {
  const p = new SimDownstream('model', 'm')
  const cp = new ControlPlane(p)
  p.attach(cp)
  planes.push(cp)
  return {p, cp}
}

/** `[name, status, code, message]` of the ControlError a call rejects with. */
async function refusal(p: Promise<unknown>): Promise<[string, number, string, string]> {
  const e = await p.then(
    () => null,
    (err: unknown) => err,
  )
  if (!(e instanceof ControlError)) throw new Error(`expected a ControlError, got ${String(e)}`)
  return [e.name, e.status, e.code, e.message]
}

describe('the words of each refusal', () => {
  it('admission: a resumed ID, another open checkpoint, a wrong phase', async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await refusal(cp.prepare({checkpoint_id: 'b', deadline_ts: soon()}))).toEqual(['ControlError', 409, 'checkpoint_conflict', "checkpoint 'a' is active in phase prepared"])
    expect(await refusal(cp.retire({checkpoint_id: 'a', deadline_ts: soon(), episode_ids: []}))).toEqual(['ControlError', 409, 'invalid_phase', 'not valid in phase prepared; resume first'])
    await cp.resume({checkpoint_id: 'a', deadline_ts: soon()})
    expect(await refusal(cp.renew({checkpoint_id: 'a', deadline_ts: soon()}))).toEqual(['ControlError', 409, 'stale_checkpoint', "checkpoint 'a' was already resumed"])
    expect(await refusal(cp.renew({checkpoint_id: 'c', deadline_ts: soon()}))).toEqual(['ControlError', 409, 'invalid_phase', 'not valid in phase idle'])
  })

  it('retire under another ID while restored names the restore', async () => {
    const {cp} = make()
    const dir = await tempDir()
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'm', checkpointId: 'src'}, [])
    await cp.restore({checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: []})
    expect(await refusal(cp.retire({checkpoint_id: 'x', deadline_ts: soon(), episode_ids: []}))).toEqual(['ControlError', 409, 'checkpoint_conflict', "checkpoint 'rs' is active in phase restored"])
    // A restore of the same ID with another scope: it already completed.
    expect(await refusal(cp.restore({checkpoint_id: 'rs', deadline_ts: soon(), checkpoint_dir: dir, episode_ids: [{rollout_id: 'q', attempt: 0}]}))).toEqual([
      'ControlError',
      409,
      'checkpoint_conflict',
      "checkpoint 'rs' already completed restore with another directory or scope",
    ])
  })

  it('commit: another directory while writing, and a deadline passed during the write', async () => {
    const {cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    const dir = await tempDir()
    const first = cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: dir})
    expect(await refusal(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: path.join(dir, 'b')}))).toEqual([
      'ControlError',
      409,
      'checkpoint_conflict',
      "checkpoint 'a' is already being written to another directory or scope",
    ])
    await first
    const {cp: cp2} = make()
    await cp2.prepare({checkpoint_id: 'b', deadline_ts: soon()})
    expect(await refusal(cp2.commit({checkpoint_id: 'b', deadline_ts: Date.now() / 1000 - 1, checkpoint_dir: await tempDir()}))).toEqual([
      'ControlError',
      409,
      'deadline_exceeded',
      "checkpoint 'b' deadline passed during I/O",
    ])
  })

  it('restore: a deadline passed while reading names the directory', async () => {
    const {cp} = make()
    const dir = await tempDir()
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'm', checkpointId: 'src'}, [])
    expect(await refusal(cp.restore({checkpoint_id: 'rs', deadline_ts: Date.now() / 1000 - 1, checkpoint_dir: dir, episode_ids: []}))).toEqual([
      'ControlError',
      409,
      'deadline_exceeded',
      `checkpoint 'rs' deadline passed while reading ${path.join(dir, 'gym', 'model', 'm')}`,
    ])
  })
})

describe('blockers', () => {
  it("the participant's own blocker count is kept when it reports one", () => {
    const {p, cp} = make()
    p.report = () => ({ready: false, blockers: ['x'], blocker_count: 7, counts: {}, restarts: []})
    expect(cp.report()).toMatchObject({blockers: ['x'], blocker_count: 7})
  })

  it('a commit refused for blockers names at most 100 of them', async () => {
    const {p, cp} = make()
    await cp.prepare({checkpoint_id: 'a', deadline_ts: soon()})
    p.stuckBlockers = Array.from({length: 130}, (_, i) => `b${String(i).padStart(3, '0')}`)
    const [, , code, message] = await refusal(cp.commit({checkpoint_id: 'a', deadline_ts: soon(), checkpoint_dir: await tempDir()}))
    expect(code).toBe('export_failed')
    expect(message).toBe(`participant is no longer ready to commit: blockers=${JSON.stringify(p.stuckBlockers.slice(0, 100))}; resume, then prepare again under a new checkpoint ID`)
  })
})
