import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {MAX_NESTING, PyFloat, PyValue, pyDumps, pyFloatRepr, pyLoads} from '../../src/storage/pyjson.js'

// repr() of each float as printed by CPython 3.11.
const PY_REPR: [number, string][] = [
  [0.1, '0.1'],
  [1.0, '1.0'],
  [-0, '-0.0'],
  [1e16, '1e+16'],
  [1.5e-7, '1.5e-07'],
  [1e-5, '1e-05'],
  [0.0001, '0.0001'],
  [123456789.125, '123456789.125'],
  [1e22, '1e+22'],
  [2.5e-300, '2.5e-300'],
  [5e-324, '5e-324'],
  [1.7976931348623157e308, '1.7976931348623157e+308'],
  [-3.25, '-3.25'],
  [100.0, '100.0'],
  [1e15, '1000000000000000.0'],
  [123e-20, '1.23e-18'],
  [0.30000000000000004, '0.30000000000000004'],
  [9007199254740992, '9007199254740992.0'],
]

// json.dumps({"b": 1, "1": 2, "a": [1.0, nan, inf, -inf, 2**70, -2**64, "é\u2028😀\x7f\x00\"\\/\n\t"], "x": {"": None, "y": True}}) in CPython 3.11.
const PY_DUMPED =
  '{"b": 1, "1": 2, "a": [1.0, NaN, Infinity, -Infinity, 1180591620717411303424, -18446744073709551616, "\\u00e9\\u2028\\ud83d\\ude00\\u007f\\u0000\\"\\\\/\\n\\t"], "x": {"": null, "y": true}}'

describe('pyFloatRepr', () => {
  it.each(PY_REPR)('%s prints as CPython repr %s', (x, repr) => {
    expect(pyFloatRepr(x)).toBe(repr)
  })

  it('prints NaN and infinities as Python tokens', () => {
    expect([NaN, Infinity, -Infinity].map(pyFloatRepr)).toEqual(['NaN', 'Infinity', '-Infinity'])
  })

  it('reads back to the same double for any finite float', () => {
    fc.assert(fc.property(fc.double({noNaN: true, noDefaultInfinity: true}), (x) => Object.is(Number(pyFloatRepr(x)), x) || (x === 0 && Number(pyFloatRepr(x)) === 0)))
  })
})

describe('pyDumps / pyLoads', () => {
  it('reads a CPython-written line and writes it back byte for byte (key order, NaN, big ints, escapes)', () => {
    const v = pyLoads(PY_DUMPED)
    expect(v).toBeInstanceOf(Map)
    expect([...(v as Map<string, PyValue>).keys()]).toEqual(['b', '1', 'a', 'x'])
    const a = (v as Map<string, PyValue>).get('a') as PyValue[]
    expect(a[0]).toBeInstanceOf(PyFloat)
    expect(Number.isNaN(a[1] as number)).toBe(true)
    expect(a[4]).toBe(2n ** 70n)
    expect(a[6]).toBe('é\u2028😀\x7f\x00"\\/\n\t')
    expect(pyDumps(v)).toBe(PY_DUMPED)
  })

  it('uses Python separators and keeps insertion order of plain objects', () => {
    expect(pyDumps({z: [1, 2.5], a: {}, b: []})).toBe('{"z": [1, 2.5], "a": {}, "b": []}')
  })

  it('refuses values that are not JSON and names them', () => {
    expect(() => pyDumps({when: new Date(0)} as never)).toThrow(/Date is not JSON-representable/)
    expect(() => pyDumps([undefined] as never)).toThrow(/undefined/)
  })

  it('rejects malformed input with the position', () => {
    for (const bad of ['{"a": }', '[1,]', '{"a" 1}', '"abc', 'nul', '{"a": 1} x', '"\\x"', '"a\nb"']) {
      expect(() => pyLoads(bad), bad).toThrow(/at character \d+/)
    }
  })

  it('round-trips arbitrary JSON values through dumps and loads', () => {
    const leaf = fc.oneof(fc.string(), fc.integer(), fc.double({noNaN: false}), fc.boolean(), fc.constant(null), fc.bigInt({min: -(2n ** 80n), max: 2n ** 80n}))
    const value = fc.letrec((tie) => ({
      v: fc.oneof({depthSize: 'small'}, leaf, fc.array(tie('v'), {maxLength: 4}), fc.dictionary(fc.string(), tie('v'), {maxKeys: 4})),
    })).v
    fc.assert(
      fc.property(value, (v) => {
        const once = pyDumps(v as PyValue)
        expect(pyDumps(pyLoads(once))).toBe(once)
      }),
      {numRuns: 300},
    )
  })

  it('reads and writes MAX_NESTING levels, deeper than CPython writes, and refuses one more both ways', () => {
    const arrays = (n: number) => '['.repeat(n) + ']'.repeat(n)
    const dicts = (n: number) => '{"k": '.repeat(n - 1) + '{"v": NaN}' + '}'.repeat(n - 1)
    expect(MAX_NESTING).toBeGreaterThanOrEqual(1_500)
    for (const make of [arrays, dicts]) {
      expect(pyDumps(pyLoads(make(MAX_NESTING)))).toBe(make(MAX_NESTING))
      expect(() => pyLoads(make(MAX_NESTING + 1))).toThrow(`nesting deeper than ${MAX_NESTING}`)
    }
    // Scalars at the deepest level do not count as a level.
    expect(pyLoads(`${'['.repeat(MAX_NESTING)}1${']'.repeat(MAX_NESTING)}`)).toBeDefined()
    let v: PyValue = []
    for (let i = 1; i < MAX_NESTING; i++) v = [v]
    expect(pyDumps(v)).toBe(arrays(MAX_NESTING))
    expect(() => pyDumps([v])).toThrow(`value nests deeper than ${MAX_NESTING} levels`)
    expect(() => pyDumps(new Map([['k', v]]))).toThrow(/nests deeper/)
    expect(() => pyLoads(arrays(200_000))).toThrow(/nest/)
  })
})
