import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {episodeFromPrefix, isJsonValue} from '../../src/storage/jsonscan.js'
import {PyValue, pyDumps, pyLoads} from '../../src/storage/pyjson.js'

const accepts = (t: string) => {
  try {
    pyLoads(t)
    return true
  } catch {
    return false
  }
}

describe('isJsonValue', () => {
  it.each(['{}', '[]', '0', '-0.5e-3', '"a\\u00e9\\n"', 'NaN', '-Infinity', ' {"a": [1, 2, {"b": null}], "c": true} ', '{"x": Infinity}'])('accepts %s', (t) => {
    expect(isJsonValue(Buffer.from(t))).toBe(true)
  })

  it.each(['', '{', '[1,]', '{"a" 1}', '{"a": }', '01', '1.', '1e', '"\\x"', '"a\nb"', '{} {}', 'nan', '-NaN', '"\\u12"', '{1: 2}', '[', '"abc'])('refuses %j', (t) => {
    expect(isJsonValue(Buffer.from(t))).toBe(false)
  })

  it('agrees with the exact reader on valid JSON and on every single-character corruption of it', () => {
    const leaf = fc.oneof(fc.string(), fc.integer(), fc.double(), fc.boolean(), fc.constant(null))
    const value = fc.letrec((tie) => ({v: fc.oneof({depthSize: 'small'}, leaf, fc.array(tie('v'), {maxLength: 4}), fc.dictionary(fc.string(), tie('v'), {maxKeys: 4}))})).v
    fc.assert(
      fc.property(value, fc.nat(), fc.constantFrom('', ',', '"', '\\', '}', ']', '[', '{', ':', 'x', '\n', '0', '-', 'e', '.'), fc.boolean(), (v, pos, ch, del) => {
        const text = pyDumps(v as PyValue)
        expect(isJsonValue(Buffer.from(text))).toBe(true)
        const p = pos % (text.length + 1)
        const bad = del ? text.slice(0, p) + text.slice(p + 1) : text.slice(0, p) + ch + text.slice(p)
        expect(isJsonValue(Buffer.from(bad)), bad).toBe(accepts(bad))
      }),
      {numRuns: 2000},
    )
  })
})

describe('episodeFromPrefix', () => {
  it('reads the episode of a record written with episode_id first', () => {
    expect(episodeFromPrefix(Buffer.from('{"episode_id": {"rollout_id": "r-1.x", "attempt": 12}, "s": 1}'))).toEqual({rolloutId: 'r-1.x', attempt: 12})
  })

  it('declines anything else, so the caller decodes the line', () => {
    for (const t of [
      '{"s": 1, "episode_id": {"rollout_id": "r", "attempt": 0}}',
      '{"episode_id": {"attempt": 0, "rollout_id": "r"}}',
      '{"episode_id": {"rollout_id": "r", "attempt": 0}, "episode_id": {"rollout_id": "q", "attempt": 0}}',
      '{"episode_id": {"rollout_id": "\\u0072", "attempt": 0}}',
    ]) {
      expect(episodeFromPrefix(Buffer.from(t)), t).toBeNull()
    }
  })
})
