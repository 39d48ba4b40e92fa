// The Python JSON codec (src/storage/pyjson.ts), fourth round. The reader's string path no longer
// falls back on a second decoder: a token that string() refuses goes to stringError, which only
// names the error. So string() must read every valid string itself, wherever its backslashes and
// quotes fall; these tests walk those places. Also the float spelling outside the fixed range, and
// the encoder's scratch buffer, kept between calls up to its bound.
import {describe, expect, it} from 'vitest'

import {PyJsonError, PyValue, pyDumps, pyDumpsView, pyFloatRepr, pyLoads} from '../../src/storage/pyjson.js'

/** Strings around the reader's short-slice length (13), each with its escapes at a telling place. */
function tellingStrings(): string[] {
  const out: string[] = []
  for (const len of [0, 1, 2, 11, 12, 13, 14, 40]) {
    const plain = 'abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ'.slice(0, len)
    out.push(plain)
    if (len === 0) continue
    for (const esc of ['\\', '"', '\n', '\u00e9', '\u0001', '\\"', '"\\', '\\\\']) {
      out.push(esc + plain.slice(1)) // at the start
      out.push(plain.slice(0, len >> 1) + esc + plain.slice(len >> 1)) // in the middle
      out.push(plain + esc) // last, right before the closing quote
    }
  }
  return out
}

describe('every valid string is read by string() itself, wherever its escapes fall', () => {
  const strings = tellingStrings()

  it('each on its own, in Python spelling and in JSON.stringify spelling', () => {
    for (const s of strings) {
      expect(pyLoads(pyDumps(s)), JSON.stringify(s)).toBe(s)
      expect(pyLoads(JSON.stringify(s)), JSON.stringify(s)).toBe(s)
    }
  })

  it('several in one list and one dict: a backslash in one token, then none in the next, or the other way', () => {
    // The reader remembers where the next backslash is from one string to the next; a token after
    // one with escapes, or before one, must be read with its own quote and nothing else.
    for (let i = 0; i < strings.length; i++) {
      const group: string[] = [strings[i]!, strings[(i * 7 + 3) % strings.length]!, strings[(i * 13 + 5) % strings.length]!]
      const list: PyValue = group
      expect(pyLoads(pyDumps(list)), JSON.stringify(group)).toEqual(group)
      const dict = new Map<string, PyValue>(group.map((s, k) => [`${s}${k}`, s]))
      expect(pyLoads(pyDumps(dict)), JSON.stringify(group)).toEqual(dict)
    }
  })

  it('a string with a backslash and a second string without one, the quote of the second before the next backslash', () => {
    const v = ['a\\b', 'cdefghijklmnopq', 'r', 'stu\\"v', 'wxyz0123456789"']
    expect(pyLoads(pyDumps(v))).toEqual(v)
    expect(pyLoads('["\\\\", "", "x", "\\u0041", "yy"]')).toEqual(['\\', '', 'x', 'A', 'yy'])
  })

  it('the error in a string that cannot be read is named where it is, not past its end', () => {
    // An escape that is not one, at the end of a string whose closing quote comes right after it.
    expect(() => pyLoads('["abc\\x", 1]')).toThrow(new PyJsonError('invalid escape at character 6'))
    expect(() => pyLoads('["abcdefghijklmnop\\x", 1]')).toThrow(new PyJsonError('invalid escape at character 19'))
    // A raw control after an escape, in a long string.
    expect(() => pyLoads('"\\n abcdefghijklmnop\u0002q"')).toThrow(new PyJsonError('invalid control character in string at character 20'))
    // A backslash as the last character of the text.
    expect(() => pyLoads('"ab"cd\\')).toThrow(new PyJsonError('extra data at character 4'))
    expect(() => pyLoads('"ab\\')).toThrow(new PyJsonError('unterminated string at character 1'))
  })
})

describe('pyFloatRepr outside the fixed range: the exponent with a sign and at least two digits', () => {
  it.each([
    [1e-5, '1e-05'],
    [-1e-5, '-1e-05'],
    [1.5e16, '1.5e+16'],
    [5e-324, '5e-324'],
    [1.7976931348623157e308, '1.7976931348623157e+308'],
    [-2.5e-7, '-2.5e-07'],
    [1e21, '1e+21'],
    [1e-100, '1e-100'],
    [9.999999999999999e-5, '9.999999999999999e-05'],
    [-0, '-0.0'],
    [0.0001, '0.0001'],
    [-9999999999999998, '-9999999999999998.0'],
    [NaN, 'NaN'],
    [Infinity, 'Infinity'],
    [-Infinity, '-Infinity'],
  ])('%s is written %s', (x, repr) => {
    expect(pyFloatRepr(x)).toBe(repr)
  })
})

describe('pyDumpsView: the scratch buffer that the next call overwrites', () => {
  // Buffers are compared by identity as booleans: a failed toBe would print both whole.
  // A list of many short strings grows the buffer by doubling from its 64 KiB start, so its size is
  // always a power of two: 1 MiB of output leaves 1 or 2 MiB, 12 MiB leaves exactly 16 MiB.
  const listOf = (bytes: number): string[] => new Array<string>(Math.ceil(bytes / 12)).fill('abcdefgh')

  it('is kept after it grew, so the next value is written into it without a new allocation', () => {
    const big = pyDumpsView(listOf(1 << 20))
    expect(big.buffer.byteLength).toBeGreaterThan(1 << 16)
    const next = pyDumpsView(['x'])
    expect(next.buffer === big.buffer, 'the same buffer').toBe(true)
    expect(next.toString('latin1')).toBe('["x"]')
  })

  it('is kept at exactly 16 MiB, and a larger one is let go after the call', () => {
    const at = pyDumpsView(listOf(12 << 20))
    expect(at.buffer.byteLength).toBe(1 << 24)
    const after = pyDumpsView([1])
    expect(after.buffer === at.buffer, 'the same buffer').toBe(true)

    const past = pyDumpsView(listOf(24 << 20))
    expect(past.buffer.byteLength).toBe(1 << 25)
    const later = pyDumpsView([2])
    expect(later.buffer === past.buffer, 'the 32 MiB buffer').toBe(false)
    expect(later.buffer === at.buffer, 'the 16 MiB buffer').toBe(true)
    expect(later.toString('latin1')).toBe('[2]')
  })
})

describe('PyJsonError', () => {
  it('is named so in a stack or a log line', () => {
    expect(new PyJsonError('x').name).toBe('PyJsonError')
    expect(String(new PyJsonError('bad'))).toBe('PyJsonError: bad')
  })
})
