// EpisodeId, capture keys and operator input (src/protocol/episode.ts): every rule with its
// message (issue 12).
import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {EpisodeIdWire, RolloutIdSchema} from '../../src/protocol/episode-schema.js'
import {
  InvalidEpisodeError,
  MAX_ATTEMPT,
  RESERVED_SUFFIX,
  SAFE_ID_PATTERN,
  captureKey,
  clipInput,
  episode,
  fromCaptureKey,
  fromWire,
  nextAttempt,
  parseEpisodeToken,
  parseEpisodeValue,
  quoteInput,
  rolloutIdProblem,
  sameEpisode,
  sortedKeys,
  toWire,
} from '../../src/protocol/episode.js'

const invalid = (f: () => unknown): string => {
  try {
    f()
  } catch (e) {
    expect(e).toBeInstanceOf(InvalidEpisodeError)
    expect((e as Error).name).toBe('InvalidEpisodeError')
    return (e as Error).message
  }
  throw new Error('expected an InvalidEpisodeError')
}

describe('IDs and the reserved suffix', () => {
  it('the safe ID pattern is anchored at both ends', () => {
    for (const ok of ['a', 'A9', '0', 'a.b_c-d', 'r-a0', 'r-a01', 'r-a', 'job-2']) expect(SAFE_ID_PATTERN.test(ok), ok).toBe(true)
    for (const bad of ['', '.a', '-a', '_a', 'a/b', 'a b', '../x', 'x\n', '\nx', 'a:b', 'é']) expect(SAFE_ID_PATTERN.test(bad), bad).toBe(false)
  })

  it('the reserved suffix is -a<N>, N without a leading zero, at the very end', () => {
    expect(RESERVED_SUFFIX.exec('r-a12')?.[1]).toBe('12')
    expect(RESERVED_SUFFIX.exec('r-a12')?.index).toBe(1)
    for (const no of ['r-a0', 'r-a01', 'r-a', 'r-a1x', 'r-b1', 'ra1']) expect(RESERVED_SUFFIX.test(no), no).toBe(false)
  })

  it('RolloutIdSchema and rolloutIdProblem agree, each with its reason', () => {
    expect(rolloutIdProblem('')).toBe('the rollout ID is empty')
    expect(rolloutIdProblem('a b')).toBe('a rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$')
    expect(rolloutIdProblem('r-a3')).toBe('a rollout ID must not end with the reserved attempt suffix -a<N>')
    expect(rolloutIdProblem('r-a0')).toBeNull()
    expect(RolloutIdSchema.safeParse('').error!.issues[0]!.code).toBe('too_small')
    expect(RolloutIdSchema.safeParse('a b').error!.issues[0]!.message).toBe('rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$')
    expect(RolloutIdSchema.safeParse('r-a3').error!.issues[0]!.message).toBe('rollout ID must not end with the reserved attempt suffix -a<N>')
    fc.assert(
      fc.property(fc.stringMatching(/^[A-Za-z0-9._-]{0,12}$/), (id) => {
        expect(RolloutIdSchema.safeParse(id).success).toBe(rolloutIdProblem(id) === null)
      }),
    )
  })

  it('EpisodeIdWire: attempt defaults to 0, no other keys, integers >= 0 only', () => {
    expect(EpisodeIdWire.parse({rollout_id: 'r'})).toEqual({rollout_id: 'r', attempt: 0})
    for (const bad of [{rollout_id: 'r', attempt: -1}, {rollout_id: 'r', attempt: 1.5}, {rollout_id: 'r', attempt: '1'}, {rollout_id: 'r', x: 1}, {rollout_id: 'r-a1'}, {attempt: 0}]) {
      expect(EpisodeIdWire.safeParse(bad).success, JSON.stringify(bad)).toBe(false)
    }
  })
})

describe('capture keys', () => {
  it('round-trip for every valid rollout and attempt', () => {
    const id = fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._-]{0,10}$/).filter((s) => !RESERVED_SUFFIX.test(s))
    fc.assert(
      fc.property(id, fc.nat(MAX_ATTEMPT), (r, a) => {
        const k = captureKey({rolloutId: r, attempt: a})
        expect(k).toBe(a === 0 ? r : `${r}-a${a}`)
        expect(fromCaptureKey(k)).toEqual({rolloutId: r, attempt: a})
      }),
    )
  })

  it('a key naming no valid episode is refused with the reason', () => {
    expect(invalid(() => fromCaptureKey(''))).toBe("invalid rollout ID '': Too small: expected string to have >=1 characters")
    expect(invalid(() => fromCaptureKey('-a1'))).toMatch(/^invalid rollout ID '': /)
    expect(invalid(() => fromCaptureKey('a/b'))).toBe("invalid rollout ID 'a/b': rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$")
    // r-a1-a2 is attempt 2 of r-a1, whose own ID ends in the reserved suffix.
    expect(invalid(() => fromCaptureKey('r-a1-a2'))).toBe("invalid rollout ID 'r-a1': rollout ID must not end with the reserved attempt suffix -a<N>")
  })

  it('episode() checks the attempt too', () => {
    expect(episode('r')).toEqual({rolloutId: 'r', attempt: 0})
    expect(episode('r', 5)).toEqual({rolloutId: 'r', attempt: 5})
    expect(invalid(() => episode('r', -1))).toBe("invalid attempt -1 for rollout 'r'")
    expect(invalid(() => episode('r', 1.5))).toBe("invalid attempt 1.5 for rollout 'r'")
    expect(invalid(() => episode('r', 2 ** 53))).toBe(`invalid attempt ${2 ** 53} for rollout 'r'`)
    expect(episode('r', 2 ** 53 - 1).attempt).toBe(2 ** 53 - 1)
  })

  it('next attempt, wire form, equality and sorted keys', () => {
    const e = {rolloutId: 'r', attempt: 2}
    expect(nextAttempt(e)).toEqual({rolloutId: 'r', attempt: 3})
    expect(e.attempt).toBe(2)
    expect(toWire(e)).toEqual({rollout_id: 'r', attempt: 2})
    expect(fromWire({rollout_id: 'r', attempt: 2})).toEqual(e)
    expect(sameEpisode(e, {rolloutId: 'r', attempt: 2})).toBe(true)
    expect(sameEpisode(e, {rolloutId: 'r', attempt: 1})).toBe(false)
    expect(sameEpisode(e, {rolloutId: 's', attempt: 2})).toBe(false)
    expect(
      sortedKeys([
        {rolloutId: 'b', attempt: 0},
        {rolloutId: 'a', attempt: 1},
        {rolloutId: 'b', attempt: 0},
        {rolloutId: 'a', attempt: 0},
      ]),
    ).toEqual(['a', 'a-a1', 'b'])
  })
})

describe('quoting input', () => {
  it('escapes controls, separators, bidi overrides and the BOM; keeps other characters', () => {
    expect(quoteInput('a\nb\rc\td')).toBe("'a\\nb\\rc\\td'")
    expect(clipInput('\u0000\u001f\u007f\u0080\u009f')).toBe('\\x00\\x1f\\x7f\\x80\\x9f')
    expect(clipInput('\u2028\u2029\u202a\u202e\u2066\u2069\ufeff')).toBe('\\u2028\\u2029\\u202a\\u202e\\u2066\\u2069\\ufeff')
    expect(clipInput('\u00a0é\u2027\u202f\u2065\u206a\ufefe😀 ~')).toBe('\u00a0é\u2027\u202f\u2065\u206a\ufefe😀 ~')
  })

  it('cuts long input at the limit, never inside a surrogate pair, and names the full length', () => {
    expect(quoteInput('x'.repeat(200))).toBe(`'${'x'.repeat(200)}'`)
    expect(quoteInput('x'.repeat(201))).toBe(`'${'x'.repeat(200)}…' (201 characters in all)`)
    expect(clipInput('abcdef', 3)).toBe('abc… (6 characters in all)')
    expect(clipInput('abc', 3)).toBe('abc')
    expect(clipInput('ab😀c', 3)).toBe('ab😀… (5 characters in all)')
    // An escape counts with its full length.
    expect(clipInput('\n\n\n', 4)).toBe('\\n\\n… (3 characters in all)')
    expect(clipInput('')).toBe('')
  })
})

describe('operator input', () => {
  it('takes every form of one episode', () => {
    const cases: [string, [string, number]][] = [
      ['r', ['r', 0]],
      ['  r  ', ['r', 0]],
      ['r-a2', ['r', 2]],
      ['r@0', ['r', 0]],
      ['r@7', ['r', 7]],
      ['r-a0', ['r-a0', 0]],
      [`r@${MAX_ATTEMPT}`, ['r', MAX_ATTEMPT]],
      [`r-a${MAX_ATTEMPT}`, ['r', MAX_ATTEMPT]],
      ['{"rollout_id": "r", "attempt": 4}', ['r', 4]],
      ['{"rollout_id": "r"}', ['r', 0]],
    ]
    for (const [t, [r, a]] of cases) expect(parseEpisodeToken(t), t).toEqual({rolloutId: r, attempt: a})
  })

  it('refuses every malformed episode with a message that quotes it', () => {
    const cases: [string, string][] = [
      ['', "'': an empty episode"],
      ['   ', "'': an empty episode"],
      ['r@', "'r@': attempt '' is not a non-negative integer"],
      ['r@01', "'r@01': attempt '01' has a leading zero"],
      ['r@-1', "'r@-1': attempt '-1' is not a non-negative integer"],
      ['r@1.0', "'r@1.0': attempt '1.0' is not a non-negative integer"],
      ['r@x', "'r@x': attempt 'x' is not a non-negative integer"],
      [`r@${MAX_ATTEMPT + 1}`, `'r@${MAX_ATTEMPT + 1}': attempt ${MAX_ATTEMPT + 1} is beyond the largest attempt, ${MAX_ATTEMPT}`],
      [`r-a${MAX_ATTEMPT + 1}`, `'r-a${MAX_ATTEMPT + 1}': attempt ${MAX_ATTEMPT + 1} is beyond the largest attempt, ${MAX_ATTEMPT}`],
      ['@3', "'@3': rollout ID '': the rollout ID is empty"],
      // The last @ splits: the attempt is what follows it.
      ['a@b@3', "'a@b@3': rollout ID 'a@b': a rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$"],
      ['a b@3', "'a b@3': rollout ID 'a b': a rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$"],
      ['r-a1@3', "'r-a1@3': rollout ID 'r-a1': a rollout ID must not end with the reserved attempt suffix -a<N>"],
      ['r-a1-a2', "'r-a1-a2': rollout ID 'r-a1': a rollout ID must not end with the reserved attempt suffix -a<N>"],
      ['.r', "'.r': a rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$"],
      ['{"rollout_id": "r",', `'{"rollout_id": "r",': not valid JSON`],
      ['{"rollout_id": "r", "x": 1}', `'{"rollout_id": "r", "x": 1}': not an episode: unknown key 'x' (an episode object has only "rollout_id" and "attempt")`],
      ['{"attempt": 1}', `'{"attempt": 1}': not an episode: "rollout_id" is missing`],
      ['{"rollout_id": 5}', `'{"rollout_id": 5}': not an episode: "rollout_id" must be a string, not a number`],
      ['{"rollout_id": null}', `'{"rollout_id": null}': not an episode: "rollout_id" must be a string, not null`],
      ['{"rollout_id": ["r"]}', `'{"rollout_id": ["r"]}': not an episode: "rollout_id" must be a string, not an array`],
      ['{"rollout_id": {}}', `'{"rollout_id": {}}': not an episode: "rollout_id" must be a string, not an object`],
      ['{"rollout_id": "r-a2"}', `'{"rollout_id": "r-a2"}': not an episode: rollout_id 'r-a2': a rollout ID must not end with the reserved attempt suffix -a<N>`],
      ['{"rollout_id": "r", "attempt": "1"}', `'{"rollout_id": "r", "attempt": "1"}': not an episode: "attempt" must be a non-negative integer, not a string`],
      ['{"rollout_id": "r", "attempt": null}', `'{"rollout_id": "r", "attempt": null}': not an episode: "attempt" must be a non-negative integer, not null`],
      ['{"rollout_id": "r", "attempt": true}', `'{"rollout_id": "r", "attempt": true}': not an episode: "attempt" must be a non-negative integer, not a boolean`],
      ['{"rollout_id": "r", "attempt": -1}', `'{"rollout_id": "r", "attempt": -1}': not an episode: "attempt" must be a non-negative integer, not -1`],
      ['{"rollout_id": "r", "attempt": 1.5}', `'{"rollout_id": "r", "attempt": 1.5}': not an episode: "attempt" must be a non-negative integer, not 1.5`],
      [`{"rollout_id": "r", "attempt": ${MAX_ATTEMPT + 1}}`, `'{"rollout_id": "r", "attempt": ${MAX_ATTEMPT + 1}}': attempt ${MAX_ATTEMPT + 1} is beyond the largest attempt, ${MAX_ATTEMPT}`],
    ]
    for (const [t, msg] of cases) {
      const m = invalid(() => parseEpisodeToken(t))
      if (msg.endsWith('not valid JSON')) expect(m, t).toMatch(new RegExp(`^${msg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} \\(.+\\); an episode object must fit on one line$`))
      else expect(m, t).toBe(msg)
    }
    expect(parseEpisodeToken(`{"rollout_id": "r", "attempt": ${MAX_ATTEMPT}}`)).toEqual({rolloutId: 'r', attempt: MAX_ATTEMPT})
  })

  it('a long malformed episode is quoted clipped', () => {
    const m = invalid(() => parseEpisodeToken('.' + 'x'.repeat(300)))
    expect(m).toBe(`'.${'x'.repeat(199)}…' (301 characters in all): a rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$`)
  })

  it('JSON array items: strings in any token form, objects, and nothing else', () => {
    expect(parseEpisodeValue('r-a2')).toEqual({rolloutId: 'r', attempt: 2})
    expect(parseEpisodeValue('r@1')).toEqual({rolloutId: 'r', attempt: 1})
    expect(parseEpisodeValue({rollout_id: 'r', attempt: 3})).toEqual({rolloutId: 'r', attempt: 3})
    expect(invalid(() => parseEpisodeValue(' {"rollout_id": "r"}'))).toBe(`' {"rollout_id": "r"}': a JSON object inside a string; write the object itself`)
    expect(invalid(() => parseEpisodeValue({rollout_id: 'r', extra: 1}))).toBe(
      `'{"rollout_id":"r","extra":1}': not an episode: unknown key 'extra' (an episode object has only "rollout_id" and "attempt")`,
    )
    const not = (v: unknown, shown: string, type: string) =>
      expect(
        invalid(() => parseEpisodeValue(v)),
        shown,
      ).toBe(`'${shown}': not an episode: expected a string (r, r-a2 or r@2) or an object {"rollout_id", "attempt"}, not ${type}`)
    not(null, 'null', 'null')
    not(5, '5', 'a number')
    not(true, 'true', 'a boolean')
    not(['r'], '["r"]', 'an array')
    not(undefined, 'undefined', 'a undefined')
  })
})
