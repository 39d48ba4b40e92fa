// The participant double's replay-safe step calls (src/control-plane/sim.ts): a replay step the
// checkpoint caught half done runs again after a restore and leaves each session as one run did.
import {afterEach, describe, expect, it} from 'vitest'

import {ControlPlane} from '../../src/control-plane/control-plane.js'
import {SimDownstream, sha} from '../../src/control-plane/sim.js'
import {captureKey} from '../../src/protocol/episode.js'
import {StoredRecord} from '../../src/storage/participant-store.js'

const planes: ControlPlane[] = []
afterEach(() => {
  for (const cp of planes.splice(0)) cp.close()
})

function make(): SimDownstream {
  const p = new SimDownstream('agent', 'a')
  const cp = new ControlPlane(p, {})
  p.attach(cp)
  planes.push(cp)
  return p
}

/** Exports `from`'s sessions and installs them into a fresh double, as a checkpoint and restore would. */
async function restored(from: SimDownstream): Promise<SimDownstream> {
  const to = make()
  const records: StoredRecord[] = from.exportRecords(null).map((r) => ({key: captureKey(r.episode), record: r.record}))
  for (const r of records) to.validateRecord(r.key, r.record)
  await to.install(records)
  return to
}

describe('replay-safe step calls of the double', () => {
  it('a replay step run again after a restore gives the chain one run gave; the calls are not counted twice', async () => {
    const live = make()
    await live.step('e', {step: 1, acc: 'a0', seed: true})
    const one = await live.step('e', {step: 2, acc: 'a1', replay: true})
    expect(one.digest).toBe(sha(sha(sha('agent', 'a', 'e'), 1, 'a0'), 2, 'a1'))
    const state = live.exportRecords(null)[0]!.record as Map<string, Map<string, unknown>>
    expect([...state.get('state')!.keys()]).toEqual(['chain', 'calls', 'replay_step', 'replay_before'])
    expect(state.get('state')!.get('replay_step')).toBe(2)

    const back = await restored(live)
    const again = await back.step('e-a1', {step: 2, acc: 'a1', replay: true})
    expect(again.digest).toBe(one.digest)
    expect(back.sessions.get('e-a1')!.calls).toBe(2)
    // The next step is an ordinary one.
    expect((await back.step('e-a1', {step: 3, acc: 'a2', replay: true})).digest).toBe(sha(one.digest, 3, 'a2'))
  })

  it('only a replay step is replay-safe: a wait step sent again is applied again', async () => {
    const live = make()
    await live.step('e', {step: 1, acc: 'a0', seed: true})
    const one = await live.step('e', {step: 2, acc: 'a1'})
    expect([...(live.exportRecords(null)[0]!.record as Map<string, Map<string, unknown>>).get('state')!.keys()]).toEqual(['chain', 'calls'])
    const back = await restored(live)
    expect((await back.step('e-a1', {step: 2, acc: 'a1'})).digest).toBe(sha(one.digest, 2, 'a1'))
  })

  it('a live session never takes a step twice as one, even in replay mode', async () => {
    const live = make()
    await live.step('e', {step: 1, acc: 'a0', seed: true, replay: true})
    const one = await live.step('e', {step: 2, acc: 'a1', replay: true})
    expect((await live.step('e', {step: 2, acc: 'a1', replay: true})).digest).toBe(sha(one.digest, 2, 'a1'))
  })

  it('refuses replay_step without replay_before, or of the wrong type', () => {
    const p = make()
    const rec = (extra: [string, unknown][]) => new Map<string, unknown>([['state', new Map<string, unknown>([['chain', 'c'], ['calls', 1], ...extra])]])
    const msg = 'replay_step and replay_before must come together, a number and a string'
    expect(() => p.validateRecord('e', rec([['replay_step', 1]]) as never)).toThrow(msg)
    expect(() => p.validateRecord('e', rec([['replay_before', 'b']]) as never)).toThrow(msg)
    expect(() =>
      p.validateRecord(
        'e',
        rec([
          ['replay_step', '1'],
          ['replay_before', 'b'],
        ]) as never,
      ),
    ).toThrow(msg)
    expect(() =>
      p.validateRecord(
        'e',
        rec([
          ['replay_step', 1],
          ['replay_before', 2],
        ]) as never,
      ),
    ).toThrow(msg)
    expect(() =>
      p.validateRecord(
        'e',
        rec([
          ['replay_step', 1],
          ['replay_before', 'b'],
        ]) as never,
      ),
    ).not.toThrow()
  })
})
