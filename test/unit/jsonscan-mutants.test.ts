// The byte-level JSON scanner and the episode prefix reader (src/storage/jsonscan.ts): the cases
// its survivors of a mutation run showed untested (issue 12).
import {isUtf8} from 'node:buffer'

import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {JsonScanner, PREFIX_BYTES, ScanError, episodeFromPrefix, isJsonValue} from '../../src/storage/jsonscan.js'
import {PyValue, pyDumps} from '../../src/storage/pyjson.js'

const ok = (t: string) => isJsonValue(Buffer.from(t, 'utf8'))

/** The error a whole-line scan of `b` ends with. */
const errorOf = (b: Buffer) => {
  const sc = new JsonScanner()
  sc.feed(b, 0, b.length, true)
  return sc.error
}

describe('isJsonValue reuses one scanner', () => {
  it('a scan that failed inside a string, a key or an object leaves nothing behind for the next one', () => {
    // Each first text fails at a point where the scanner is inside a string (value or key), nested.
    for (const broken of ['"\\x', '{"a\\x', '{"k": [1, {"b', '[[[[["\\u12', '{"a": 1, "b\\q"']) {
      expect(ok(broken), broken).toBe(false)
      for (const good of ['1', '"abc"', '{"a": 1}', '[]', 'true']) expect(ok(good), `${good} after ${broken}`).toBe(true)
    }
  })
})

describe('episodeFromPrefix', () => {
  const line = (id: string, attempt: string, rest = '}') => Buffer.from(`{"episode_id": {"rollout_id": "${id}", "attempt": ${attempt}}${rest}`)

  it('reads the rollout ID characters Gym allows, the attempt as a number, with or without more keys', () => {
    expect(episodeFromPrefix(line('aZ09._-x', '7'))).toEqual({rolloutId: 'aZ09._-x', attempt: 7})
    expect(episodeFromPrefix(line('Q', '0', ', "x": 1}'))).toEqual({rolloutId: 'Q', attempt: 0})
    expect(episodeFromPrefix(line('r', '123456789012345'))).toEqual({rolloutId: 'r', attempt: 123456789012345})
  })

  it('declines what the strict prefix does not match: the caller decodes those lines exactly', () => {
    for (const [id, attempt, rest] of [
      ['.r', '0', '}'],
      ['-r', '0', '}'],
      ['_r', '0', '}'],
      ['', '0', '}'],
      ['r/x', '0', '}'],
      ['r', '01', '}'],
      ['r', '-1', '}'],
      ['r', '1234567890123456', '}'],
      ['r', '1.0', '}'],
      ['r', '0', ' }'],
      ['r', '0', ']'],
    ] as const) {
      expect(episodeFromPrefix(line(id, attempt, rest)), `${id} ${attempt} ${rest}`).toBeNull()
    }
    expect(episodeFromPrefix(Buffer.from(' ' + line('r', '0').toString()))).toBeNull()
  })

  it('looks only at the first PREFIX_BYTES bytes of the line', () => {
    expect(PREFIX_BYTES).toBe(256)
    // The prefix up to and including the `}` or `,` after the attempt is 48 bytes plus the ID.
    const fits = line('r'.repeat(PREFIX_BYTES - 48), '0', ', "s": "' + 'x'.repeat(1000) + '"}')
    expect(episodeFromPrefix(fits)?.rolloutId).toBe('r'.repeat(PREFIX_BYTES - 48))
    const past = line('r'.repeat(PREFIX_BYTES - 47), '0', ', "s": "' + 'x'.repeat(1000) + '"}')
    expect(episodeFromPrefix(past)).toBeNull()
    // A short line is read whole.
    expect(episodeFromPrefix(line('r', '0'))).toEqual({rolloutId: 'r', attempt: 0})
  })

  it('a line naming episode_id again is declined whole, and read off its prefix when streamed (whole = false)', () => {
    const dup = line('a', '1', ', "x": 2, "episode_id": {"rollout_id": "b", "attempt": 0}}')
    expect(episodeFromPrefix(dup)).toBeNull()
    expect(episodeFromPrefix(dup, true)).toBeNull()
    expect(episodeFromPrefix(dup, false)).toEqual({rolloutId: 'a', attempt: 1})
    // The word not between quotes of its own is not a repeat.
    expect(episodeFromPrefix(line('a', '1', ', "x": "an episode_id"}'))).toEqual({rolloutId: 'a', attempt: 1})
  })
})

describe('JsonScanner', () => {
  it('reset clears a failure, the count of episode_id keys and the state', () => {
    const sc = new JsonScanner()
    const bad = Buffer.from('{"episode_id": 1, "s": "\\x')
    sc.feed(bad, 0, bad.length, true)
    expect(sc.error).toBe(ScanError.Json)
    expect(sc.episodeKeys).toBe(1)
    sc.reset()
    expect(sc.error).toBe(ScanError.None)
    expect(sc.episodeKeys).toBe(0)
    const good = Buffer.from('{"a": 1}')
    expect(sc.feed(good, 0, good.length, true)).toBe(good.length)
    expect(sc.complete).toBe(true)
    // Reset after a whole value: nothing is read yet, so nothing is complete.
    expect(sc.reset().complete).toBe(false)
  })

  it('a value the line ends before it is whole is an error, not only incomplete', () => {
    for (const t of ['', '  ', '[1', '[1, 2', '{"a": 1', '{"a": [1, 2]', '[[]', '-', '[1, -']) {
      expect(errorOf(Buffer.from(t)), t).toBe(ScanError.Json)
    }
  })

  it('counts only the key episode_id: not another key of ten characters, not another escaped key', () => {
    const keys = (t: string) => {
      const sc = new JsonScanner()
      sc.feed(Buffer.from(t), 0, t.length, true)
      expect(sc.complete, t).toBe(true)
      return sc.episodeKeys
    }
    expect(keys('{"abcdefghij": 1, "episode_ix": 2, "episode_id_": 3, "episode_i": 4}')).toBe(0)
    expect(keys('{"a\\u0062": 1, "episode\\u005fix": 2}')).toBe(0)
    expect(keys('{"e\\u0070isode_id": 1}')).toBe(1)
  })
})

describe('isJsonValue on a window of a larger buffer', () => {
  const leaf = fc.oneof(fc.string({unit: 'binary'}), fc.integer(), fc.double(), fc.boolean(), fc.constant(null), fc.constantFrom('episode_id', 'é😀', '\\', '"'))
  const value = fc.letrec((tie) => ({v: fc.oneof({depthSize: 'small'}, leaf, fc.array(tie('v'), {maxLength: 4}), fc.dictionary(fc.string(), tie('v'), {maxKeys: 3}))})).v
  // What may surround the window: bytes that would complete or change a cut value if read.
  const junk = fc.array(fc.constantFrom(...'"\\]}0123456789.eE+-:, trueInfinityNaN\u00e9'.split('')), {maxLength: 12}).map((a) => Buffer.from(a.join(''), 'utf8'))

  it('reads only b[start, end): the same verdict as the bytes alone, whatever lies around them', () => {
    fc.assert(
      fc.property(value, fc.boolean(), fc.nat(), fc.nat(), junk, junk, (v, raw, cut, cut2, before, after) => {
        const text = Buffer.from(raw ? (JSON.stringify(v as never) ?? 'null') : pyDumps(v as PyValue), 'utf8')
        // The whole value, and a prefix and an infix of it (mostly invalid: cut tokens).
        const a = cut % (text.length + 1)
        const b = a + (cut2 % (text.length - a + 1))
        for (const t of [text, text.subarray(0, a), text.subarray(a, b), text.subarray(0, b)]) {
          const buf = Buffer.concat([before, t, after])
          expect(isJsonValue(buf, before.length, before.length + t.length), `${t.toString('latin1')} in ${buf.toString('latin1')}`).toBe(isJsonValue(Buffer.from(t)))
        }
      }),
      {numRuns: 1500},
    )
  })

  it('cut tokens are not completed by the bytes after the window', () => {
    for (const [t, after] of [
      ['tru', 'e'],
      ['nul', 'l'],
      ['-Infinit', 'y'],
      ['NaN', ''],
      ['"ab', '"'],
      ['"\\u004', '1"'],
      ['"\\', 'n"'],
      ['[1, 2', ']'],
      ['{"a": 1', '}'],
      ['1.', '5'],
      ['1e', '5'],
      ['-', '1'],
      ['[1, ', '2]'],
      ['"\u00e9', '"'],
    ] as const) {
      const buf = Buffer.from(t + after + '   ', 'utf8')
      const end = Buffer.byteLength(t)
      expect(isJsonValue(buf, 0, end), t).toBe(isJsonValue(Buffer.from(t, 'utf8')))
      // And the same bytes after a prefix: start is honoured.
      const pre = Buffer.concat([Buffer.from('[[["x'), buf])
      expect(isJsonValue(pre, 5, 5 + end), t).toBe(isJsonValue(Buffer.from(t, 'utf8')))
    }
  })
})

describe('what the scanner says went wrong', () => {
  it('a value that stops inside a string is a JSON error; an unfinished UTF-8 sequence at the end is a UTF-8 error', () => {
    expect(errorOf(Buffer.from('"abc'))).toBe(ScanError.Json)
    expect(errorOf(Buffer.from('"é', 'utf8'))).toBe(ScanError.Json)
    expect(errorOf(Buffer.from('["😀', 'utf8'))).toBe(ScanError.Json)
    expect(errorOf(Buffer.from('"a\\'))).toBe(ScanError.Json)
    expect(errorOf(Buffer.from('"a\\u12'))).toBe(ScanError.Json)
    expect(errorOf(Buffer.from([0x22, 0x61, 0xe2, 0x82]))).toBe(ScanError.Utf8)
    expect(errorOf(Buffer.from([0x22, 0xf0, 0x9f, 0x98]))).toBe(ScanError.Utf8)
    expect(errorOf(Buffer.from([0x22, 0xc3]))).toBe(ScanError.Utf8)
    // A non-ASCII byte outside a string is not JSON, whatever it is.
    for (const c of [0x80, 0xc3, 0xff]) expect(errorOf(Buffer.from([0x5b, c, 0x5d])), c.toString(16)).toBe(ScanError.Json)
  })

  it('each hex digit of a \\u escape is checked', () => {
    for (const esc of ['g000', '0g00', '00g0', '000g', 'G000', '000G', '00 0', '000"']) expect(ok(`"\\u${esc}"`), esc).toBe(false)
    for (const esc of ['0000', 'abcd', 'ABCD', '9fAf']) expect(ok(`"\\u${esc}"`), esc).toBe(true)
  })
})

describe('UTF-8 inside strings, at every boundary of the encoding', () => {
  /** `"` + bytes + `"`: valid exactly when the bytes are UTF-8 (none of them ASCII here). */
  const inString = (bytes: number[]) => Buffer.from([0x22, ...bytes, 0x22])

  it("agrees with Node's UTF-8 check on the first and last code point of each sequence length and range", () => {
    const valid = [0x80, 0x7ff, 0x800, 0xfff, 0x1000, 0xcfff, 0xd000, 0xd7ff, 0xe000, 0xffff, 0x10000, 0x3ffff, 0x40000, 0xfffff, 0x100000, 0x10ffff]
    for (const cp of valid) {
      const bytes = [...Buffer.from(String.fromCodePoint(cp), 'utf8')]
      expect(isJsonValue(inString(bytes)), cp.toString(16)).toBe(true)
    }
    const invalid = [
      [0xc0, 0x80],
      [0xc1, 0xbf],
      [0xc2, 0x7f],
      [0xc2, 0xc0],
      [0xdf, 0xc0],
      [0xe0, 0x9f, 0xbf],
      [0xe0, 0xa0, 0x7f],
      [0xe0, 0xa0, 0xc0],
      [0xe1, 0x7f, 0x80],
      [0xe1, 0xc0, 0x80],
      [0xe1, 0x80, 0xc0],
      [0xed, 0xa0, 0x80],
      [0xed, 0xbf, 0xbf],
      [0xed, 0x7f, 0x80],
      [0xee, 0xc0, 0x80],
      [0xef, 0xbf, 0x7f],
      [0xf0, 0x8f, 0xbf, 0xbf],
      [0xf0, 0xc0, 0x80, 0x80],
      [0xf0, 0x90, 0x7f, 0x80],
      [0xf0, 0x90, 0x80, 0x7f],
      [0xf0, 0x90, 0x80, 0xc0],
      [0xf1, 0x7f, 0x80, 0x80],
      [0xf1, 0xc0, 0x80, 0x80],
      [0xf3, 0x80, 0xc0, 0x80],
      [0xf4, 0x90, 0x80, 0x80],
      [0xf4, 0x8f, 0xbf, 0xc0],
      [0xf5, 0x80, 0x80, 0x80],
      [0xff, 0x80],
    ]
    for (const bytes of invalid) {
      expect(isUtf8(Buffer.from(bytes)), bytes.join(',')).toBe(false)
      expect(isJsonValue(inString(bytes)), bytes.join(',')).toBe(false)
      expect(errorOf(inString(bytes)), bytes.join(',')).toBe(ScanError.Utf8)
    }
  })

  it("agrees with Node's UTF-8 check on any code point with any one byte changed", () => {
    fc.assert(
      fc.property(fc.integer({min: 0x80, max: 0x10ffff}), fc.nat(), fc.integer({min: 0x80, max: 0xff}), fc.boolean(), (cp, pos, byte, change) => {
        if (cp >= 0xd800 && cp <= 0xdfff) return
        const bytes = [...Buffer.from(String.fromCodePoint(cp), 'utf8')]
        if (change) bytes[pos % bytes.length] = byte
        expect(isJsonValue(inString(bytes)), bytes.join(',')).toBe(isUtf8(Buffer.from(bytes)))
      }),
      {numRuns: 5000},
    )
  })
})

describe('structure', () => {
  it('one value per line: a comma after a top-level value is refused, and so is a bare value where a key goes', () => {
    for (const t of ['1,2', '1, 2', '"a","b"', '[1],[2]', '{"a": 1, 2}', '{"a": [1], 2: 3}', '1]', '{}}', '[]]']) expect(ok(t), t).toBe(false)
    // A container closes only with its own bracket, and a trailing comma is refused in objects too.
    for (const t of ['[1}', '[1 2', '{"a": 1]', '{"a": 1 "b"', '{"a": 1,}', '{"a": 1, }']) expect(ok(t), t).toBe(false)
    for (const t of ['[1,2]', '[1, 2, -3, 4.5e1]', '{"a": 1, "b": 2}', '[1, "a", 2]', '[1, -Infinity, 2]', '[1, {"a": 2}, 3]']) expect(ok(t), t).toBe(true)
  })

  it('a key is followed by its colon, and by nothing else in its place', () => {
    // (A property test over random corruptions found this only after some 1,800 cases: not every run.)
    for (const t of ['{"a",1}', '{"a"=1}', '{"a";1}', '{"a" 1}', '{"a"}', '{"a": 1, "b"x2}', '{"a"::1}']) expect(ok(t), t).toBe(false)
    expect(ok('{"a" : 1, "b":2}')).toBe(true)
  })
})

describe('words and numbers', () => {
  it('a word must be spelled out whole, and Infinity follows only a minus sign', () => {
    for (const t of ['trUe', 'tru3', 'nall', 'fals3', 'NaM', 'Infinitx', '-Infinitx', '-Inf', '1Infinity', '[2Infinity]', '[1, 2Infinity]']) expect(ok(t), t).toBe(false)
    for (const t of ['true', 'false', 'null', 'NaN', 'Infinity', '-Infinity', '[-Infinity, 1]']) expect(ok(t), t).toBe(true)
  })

  it('exponents: e or E, with an optional sign', () => {
    for (const t of ['1E5', '1e+5', '1E-5', '[1E+2, 3e-1]', '-0.5E5', '{"a": 2E2}']) expect(ok(t), t).toBe(true)
    for (const t of ['1e++5', '1E', '1e-', '[1E, 2]', '1e5.0']) expect(ok(t), t).toBe(false)
  })
})

describe('JsonScanner fed in pieces', () => {
  it('complete is false until a whole value has been read, and after a failure', () => {
    const sc = new JsonScanner()
    expect(sc.complete).toBe(false)
    const a = Buffer.from('{"a": [1,')
    expect(sc.feed(a, 0, a.length, false)).toBe(a.length)
    expect(sc.complete).toBe(false)
    const b = Buffer.from(' 2]} ')
    expect(sc.feed(b, 0, b.length, false)).toBe(b.length)
    expect(sc.complete).toBe(true)
    // A piece that ends after a whole inner value, or holds only whitespace, completes nothing.
    for (const t of ['{"a": [1, 2]', '  ', '[[]']) {
      const p = new JsonScanner()
      expect(p.feed(Buffer.from(t), 0, t.length, false), t).toBe(t.length)
      expect(p.complete, t).toBe(false)
    }
    const c = Buffer.from('x')
    sc.feed(c, 0, c.length, true)
    expect(sc.error).toBe(ScanError.Json)
    expect(sc.complete).toBe(false)
  })

  it('consumes a piece that ends right after a whole escape or UTF-8 sequence, and hands back a cut one', () => {
    for (const [text, consumed] of [
      ['"\\u0041', 7],
      ['"\\n', 3],
      ['"é', 3],
      ['"😀', 5],
      ['"\\u004', 1],
      ['"\\', 1],
      ['["ab', 4],
      ['[-Inf', 1],
      ['[1, -Infin', 4],
      ['[tru', 1],
    ] as const) {
      const b = Buffer.from(text, 'utf8')
      const sc = new JsonScanner()
      expect(sc.feed(b, 0, b.length, false), text).toBe(consumed)
      expect(sc.error, text).toBe(ScanError.None)
    }
    // A cut UTF-8 sequence: handed back from its first byte.
    const e = Buffer.from('"é', 'utf8').subarray(0, 2)
    expect(new JsonScanner().feed(e, 0, e.length, false)).toBe(1)
  })

  it('a top-level key cut by a piece is handed back whole (from its quote); a nested key or a value is not', () => {
    const top = Buffer.from('{"a": 1, "episo')
    expect(new JsonScanner().feed(top, 0, top.length, false)).toBe(top.indexOf('"episo'))
    const nested = Buffer.from('{"a": {"episo')
    expect(new JsonScanner().feed(nested, 0, nested.length, false)).toBe(nested.length)
    const value = Buffer.from('{"a": "episo')
    expect(new JsonScanner().feed(value, 0, value.length, false)).toBe(value.length)
    // Fed again from there, the key counts once.
    const sc = new JsonScanner()
    const k = sc.feed(top, 0, top.length, false)
    const rest = Buffer.concat([top.subarray(k), Buffer.from('de_id": 2}')])
    sc.feed(rest, 0, rest.length, true)
    expect(sc.complete).toBe(true)
    expect(sc.episodeKeys).toBe(1)
  })
})
