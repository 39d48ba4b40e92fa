// The refusal of a commit scope that leaves out restored episodes (controller.ts
// checkRestoredInScope, reference 5.3.1 and 5.3.4), on its own: the order of what it lists, the cut
// after ten, the hint for an episode named at its earlier attempt, and keys that are no episode.
// From the survivors of the first Stryker run over the whole of controller.ts (2026-12-05).
import {describe, expect, it} from 'vitest'

import {checkRestoredInScope} from '../../src/coordination/controller.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {EpisodeId, episode} from '../../src/protocol/episode.js'
import type {StatusReply} from '../../src/protocol/wire.js'

/** A participant's status that reports these restored episodes as not started yet. */
const pending = (keys: string[]) => ({phase: 'idle', checkpoint_id: null, restored_pending: keys}) as unknown as StatusReply

function refusal(statuses: [string, StatusReply][], episodes: EpisodeId[]): ControllerError {
  try {
    checkRestoredInScope(statuses, episodes)
  } catch (err) {
    expect(err).toBeInstanceOf(ControllerError)
    return err as ControllerError
  }
  throw new Error('the scope was not refused')
}

const keys = (n: number) => Array.from({length: n}, (_, i) => `r${String(i).padStart(2, '0')}-a1`)

describe('checkRestoredInScope', () => {
  it('lists the missing episodes sorted, each with every participant holding it', () => {
    const err = refusal(
      [
        ['env', pending(['z-a1', 'a-a1'])],
        ['res', pending(['a-a1'])],
      ],
      [],
    )
    expect(err.code).toBe('input')
    expect(err.message).toMatch(
      /^the scope leaves out 2 restored episode\(s\) whose replacement has not started: 'a-a1' \(env, res\), 'z-a1' \(env\); every participant's commit would delete their restored state\. Name each/,
    )
    expect(err.details).toEqual({restored: ['a-a1', 'z-a1']})
  })

  it('names ten at most: ten are listed whole, an eleventh only counted', () => {
    const ten = refusal([['env', pending(keys(10).reverse())]], [])
    expect(ten.message).toContain(
      `${keys(10)
        .map((k) => `'${k}' (env)`)
        .join(', ')}; every`,
    )
    const eleven = refusal([['env', pending(keys(11))]], [])
    expect(eleven.message).toMatch(/^the scope leaves out 11 restored/)
    expect(eleven.message).toContain(
      `${keys(10)
        .map((k) => `'${k}' (env)`)
        .join(', ')}, …; every`,
    )
    expect(eleven.message).not.toContain('r10-a1')
    expect(eleven.details).toEqual({restored: keys(11)})
  })

  it('an episode named at the attempt it was checkpointed under gets a hint; one named at a later attempt does not', () => {
    const err = refusal([['env', pending(['a-a1', 'b-a1'])]], [episode('a', 0), episode('b', 2)])
    expect(err.message).toContain(`their restored state. 'a' is named, but its restored state is under the replacement attempt 'a-a1'. Name each`)
    expect(err.message).not.toMatch(/'b(-a2)?' is named/)
  })

  it('five hints at most, separated by semicolons', () => {
    const ids = ['a', 'b', 'c', 'd', 'e', 'f']
    const err = refusal(
      [['env', pending(ids.map((r) => `${r}-a1`))]],
      ids.map((r) => episode(r, 0)),
    )
    const hints = ids.slice(0, 5).map((r) => `'${r}' is named, but its restored state is under the replacement attempt '${r}-a1'`)
    expect(err.message).toContain(`their restored state. ${hints.join('; ')}. Name each`)
    expect(err.message).not.toContain(`'f' is named`)
  })

  it('a reported key that names no episode is listed, with no hint and no other error', () => {
    const err = refusal([['env', pending(['../x', 'a-a1'])]], [episode('a', 0)])
    expect(err.details).toEqual({restored: ['../x', 'a-a1']})
    expect(err.message).toMatch(/^the scope leaves out 2 restored episode\(s\) whose replacement has not started: '\.\.\/x' \(env\), 'a-a1' \(env\); /)
    expect(err.message).toContain(`'a' is named, but its restored state is under the replacement attempt 'a-a1'`)
  })

  it('every pending episode named at its replacement attempt: no refusal', () => {
    expect(() => checkRestoredInScope([['env', pending(['a-a1'])]], [episode('a', 1)])).not.toThrow()
  })
})
