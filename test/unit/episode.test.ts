import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {InvalidEpisodeError, captureKey, fromCaptureKey, parseEpisodeToken} from '../../src/protocol/episode.js'
import {PrepareResult, continuedOf} from '../../src/coordination/operations.js'

describe('capture keys', () => {
  it.each([
    ['r-a10', 'r', 10],
    ['r-a0', 'r-a0', 0],
    ['r-a01', 'r-a01', 0],
    ['job-2', 'job-2', 0],
    ['r', 'r', 0],
  ])('%s decodes to (%s, %d)', (key, rollout, attempt) => {
    expect(fromCaptureKey(key)).toEqual({rolloutId: rollout, attempt})
  })

  it('refuses keys that name no valid episode', () => {
    for (const bad of ['-a1', '', '.x', 'a/b', 'x-a1-a3']) expect(() => fromCaptureKey(bad), bad).toThrow(InvalidEpisodeError)
  })

  it('every episode built from a valid rollout ID round-trips through its capture key', () => {
    const rollout = fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._-]{0,20}$/).filter((r) => !/-a[1-9][0-9]*$/.test(r))
    fc.assert(
      fc.property(rollout, fc.nat(10_000), (r, a) => {
        expect(fromCaptureKey(captureKey({rolloutId: r, attempt: a}))).toEqual({rolloutId: r, attempt: a})
      }),
    )
  })

  it('parses the three episode-file spellings and names what is wrong', () => {
    expect(parseEpisodeToken('r-a2')).toEqual({rolloutId: 'r', attempt: 2})
    expect(parseEpisodeToken('r@2')).toEqual({rolloutId: 'r', attempt: 2})
    expect(parseEpisodeToken('{"rollout_id": "r", "attempt": 2}')).toEqual({rolloutId: 'r', attempt: 2})
    expect(() => parseEpisodeToken('r@x')).toThrow(/attempt 'x'/)
    expect(() => parseEpisodeToken('{"rollout_id": "r-a1"}')).toThrow(/reserved attempt suffix/)
    expect(() => parseEpisodeToken('{"rollout_id": "r", "extra": 1}')).toThrow(/not an episode/)
  })
})

describe('continued()', () => {
  it('leaves out every reported restart, keeps the controller order (Gym test vector)', () => {
    const result = new PrepareResult('c', true, new Map([['env', {phase: 'prepared', report: {ready: true, blockers: [], counts: {}, restarts: ['s-a1', 't']}}]]), [])
    const eps = [
      {rolloutId: 'r', attempt: 0},
      {rolloutId: 's', attempt: 1},
      {rolloutId: 't', attempt: 0},
    ]
    expect(result.continued(eps)).toEqual([{rolloutId: 'r', attempt: 0}])
    expect(continuedOf(eps, [{rolloutId: 's', attempt: 0}])).toEqual(eps)
  })

  it('reports blockers only for participants that are not prepared', () => {
    const r = new PrepareResult(
      'c',
      false,
      new Map([
        ['env', {phase: 'prepared', report: {ready: true, blockers: [], counts: {}, restarts: []}}],
        ['model', {phase: 'preparing', report: {ready: false, blockers: ['r7'], blocker_count: 120, counts: {}, restarts: []}}],
      ]),
      ['agent'],
    )
    expect(r.blockers()).toEqual({model: {blockers: ['r7'], blockerCount: 120}})
  })
})
