// The codec's fast paths (issue 11): arrays of numbers decoded by JSON.parse, strings found with
// indexOf and decoded by JSON.parse, integers written digit by digit, floats straight from
// String(). Each must give exactly what the token-by-token path gives.
import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {PyFloat, PyValue, pyDumps, pyFloatRepr, pyLoads} from '../../src/storage/pyjson.js'

/** Number tokens as Python writes them, and as other writers may. */
const token = fc.oneof(
  fc.integer().map(String),
  fc.double({noNaN: true, noDefaultInfinity: true}).map(pyFloatRepr),
  fc.bigInt({min: -(2n ** 80n), max: 2n ** 80n}).map(String),
  fc.constantFrom('0', '-0', '0.0', '-0.0', '2.0', '-2.0', '1e+16', '1e-05', '1E5', '2e0', '-1.5E+2', '9007199254740993', '-9007199254740992', '1e400', '5e-324', '0.5', '123456789012345678'),
)
const separator = fc.constantFrom(', ', ',', ' ,  ', ',\n\t')

describe('arrays of numbers', () => {
  it('decode to exactly what reading each token alone gives (ints, -0, integral floats, big ints, exponents)', () => {
    fc.assert(
      fc.property(fc.array(token, {minLength: 1, maxLength: 30}), separator, fc.boolean(), (tokens, sep, padded) => {
        const text = padded ? `[ ${tokens.join(sep)} ]` : `[${tokens.join(sep)}]`
        const got = pyLoads(text) as PyValue[]
        expect(got).toEqual(tokens.map((t) => pyLoads(t)))
        // And they write back as Python would write what it read.
        expect(pyDumps(got)).toBe(`[${tokens.map((t) => pyDumps(pyLoads(t))).join(', ')}]`)
      }),
      {numRuns: 2000},
    )
  })

  it('arrays of integers only (token ids): -0 is the integer 0, beyond 2^53 a bigint, as each token alone', () => {
    const int = fc.oneof(fc.integer().map(String), fc.bigInt({min: -(2n ** 70n), max: 2n ** 70n}).map(String), fc.constantFrom('0', '-0', '9007199254740991', '9007199254740992', '-9007199254740993'))
    fc.assert(
      fc.property(fc.array(int, {minLength: 1, maxLength: 30}), separator, (tokens, sep) => {
        const got = pyLoads(`[${tokens.join(sep)}]`) as PyValue[]
        expect(got).toEqual(tokens.map((t) => pyLoads(t)))
        for (const v of got) if (typeof v === 'number') expect(Object.is(v, -0)).toBe(false)
      }),
      {numRuns: 2000},
    )
    expect(pyLoads('[-0, 1, 0]')).toEqual([0, 1, 0])
    expect(Object.is((pyLoads('[-0]') as PyValue[])[0], 0)).toBe(true)
    expect(pyLoads('[1, 9007199254740993, -0]')).toEqual([1, 9007199254740993n, 0])
    expect(pyLoads('[1E2, 7]')).toEqual([new PyFloat(100), 7])
  })

  it('-0.0 is a float and -0 the integer 0, inside float arrays too', () => {
    const v = pyLoads('[0.5, -0.0, -0, 0.0, 3, 2.0]') as PyValue[]
    expect(v[1]).toEqual(new PyFloat(-0))
    expect(Object.is(v[2], 0)).toBe(true)
    expect(v[3]).toEqual(new PyFloat(0))
    expect(v[4]).toBe(3)
    expect(v[5]).toEqual(new PyFloat(2))
    expect(pyDumps(v)).toBe('[0.5, -0.0, 0, 0.0, 3, 2.0]')
  })

  it('arrays that are not all numbers, or hold NaN, nest, or are cut, take the token-by-token path', () => {
    expect(pyLoads('[1, NaN, -Infinity, 2.5]')).toEqual([1, NaN, -Infinity, 2.5])
    expect(pyLoads('[1, [2, 3], 4]')).toEqual([1, [2, 3], 4])
    expect(pyLoads('[1, "a]", {"b": [2]}]')).toEqual([1, 'a]', new Map([['b', [2]]])])
    expect(pyLoads('[-1, 18446744073709551616]')).toEqual([-1, 2n ** 64n])
    expect(() => pyLoads('[1, 2')).toThrow(/at character/)
    expect(() => pyLoads('[1, 2,]')).toThrow(/at character/)
    expect(() => pyLoads('[01]')).toThrow(/at character/)
  })
})

describe('strings', () => {
  const piece = fc.oneof(fc.string({unit: 'binary', maxLength: 30}), fc.constantFrom('\\', '"', '\\"', '\\\\"', 'é', '😀', '\u2028', '\n', '"\\'))
  it('long and short, with escapes, quotes after backslash runs, in keys and values: read back exactly', () => {
    fc.assert(
      fc.property(fc.array(piece, {maxLength: 12}), fc.array(piece, {maxLength: 4}), (parts, keyParts) => {
        const s = parts.join('')
        const k = keyParts.join('')
        const text = pyDumps(new Map<string, PyValue>([[k, [s, s + s, 1]]]))
        const back = pyLoads(text) as Map<string, PyValue>
        expect([...back.keys()]).toEqual([k])
        expect(back.get(k)).toEqual([s, s + s, 1])
        // Raw UTF-8 (JSON.stringify leaves non-ASCII unescaped), as another writer may write it.
        expect(pyLoads(JSON.stringify([s, k]))).toEqual([s, k])
      }),
      {numRuns: 1500},
    )
  })

  it('a raw control character in a long string is refused at its position', () => {
    const text = `["${'a'.repeat(40)}\u0001${'b'.repeat(40)}"]`
    expect(() => pyLoads(text)).toThrow('invalid control character in string at character 42')
    expect(() => pyLoads(`["${'a'.repeat(40)}\\q"]`)).toThrow('invalid escape at character 43')
    expect(() => pyLoads(`["${'a'.repeat(40)}`)).toThrow('unterminated string at character 2')
  })
})

describe('numbers written', () => {
  it('integers digit by digit, exactly as String() and Python write them', () => {
    fc.assert(
      fc.property(fc.integer(), (n) => {
        expect(pyDumps(n)).toBe(String(n))
        expect(pyDumps([n, n])).toBe(`[${n}, ${n}]`)
      }),
      {numRuns: 3000},
    )
    for (const n of [0, 9, 10, 99, 100, 2 ** 31 - 1, -(2 ** 31), 2 ** 31, -(2 ** 31) - 1, -1, -10, 2 ** 53, -(2 ** 53)]) {
      expect(pyDumps(n), String(n)).toBe(BigInt(n).toString())
      expect(pyDumps([n])).toBe(`[${BigInt(n).toString()}]`)
    }
  })

  it('floats inside arrays and alone as Python repr writes them', () => {
    fc.assert(
      fc.property(fc.double(), (x) => {
        const py = Number.isInteger(x) && !Object.is(x, -0) ? (Number.isSafeInteger(x) ? String(x) : BigInt(x).toString()) : pyFloatRepr(x)
        expect(pyDumps(x)).toBe(py)
        expect(pyDumps([x, 0.5])).toBe(`[${py}, 0.5]`)
      }),
      {numRuns: 3000},
    )
  })
})
