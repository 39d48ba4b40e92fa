// The Python JSON codec (src/storage/pyjson.ts) over all of Unicode, every escape, numbers and
// nesting (issue 12). Property tests draw every UTF-16 unit, lone surrogates included.
import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {isJsonValue} from '../../src/storage/jsonscan.js'
import {PyFloat, PyJsonError, PyValue, isPyDict, pyDumps, pyDumpsBuffer, pyDumpsView, pyFloatRepr, pyGet, pyLoads} from '../../src/storage/pyjson.js'

/** Python's json.dumps of a str (ensure_ascii): the oracle, written as CPython's py_encode_basestring_ascii. */
function pythonString(s: string): string {
  let out = '"'
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    const ch = s[i]!
    if (ch === '"') out += '\\"'
    else if (ch === '\\') out += '\\\\'
    else if (ch === '\n') out += '\\n'
    else if (ch === '\r') out += '\\r'
    else if (ch === '\t') out += '\\t'
    else if (ch === '\b') out += '\\b'
    else if (ch === '\f') out += '\\f'
    else if (c >= 0x20 && c <= 0x7e) out += ch
    else out += '\\u' + c.toString(16).padStart(4, '0')
  }
  return out + '"'
}

/**
 * Any UTF-16 unit (lone surrogates too), astral characters, controls, the characters JSON escapes,
 * and runs of plain characters long enough (16+) for the encoder to copy them in one piece.
 */
const unit = fc.oneof(
  fc.string({unit: fc.constantFrom(...'az AZ09.,~!{}'.split('')), minLength: 14, maxLength: 40}),
  fc.integer({min: 0, max: 0xffff}).map((c) => String.fromCharCode(c)),
  fc.integer({min: 0x10000, max: 0x10ffff}).map((c) => String.fromCodePoint(c)),
  fc.integer({min: 0, max: 0x1f}).map((c) => String.fromCharCode(c)),
  fc.integer({min: 0xd800, max: 0xdfff}).map((c) => String.fromCharCode(c)),
  fc.constantFrom('"', '\\', '/', '\u007f', '\u0080', '\u2028', '\ufeff', '\uffff', 'a', ' ', '~'),
)
const anyString = fc.array(unit, {maxLength: 40}).map((a) => a.join(''))

describe('strings over all of Unicode', () => {
  it('are written as Python writes them: ASCII only, each UTF-16 unit escaped alone', () => {
    fc.assert(
      fc.property(anyString, (s) => {
        const out = pyDumps(s)
        expect(out).toBe(pythonString(s))
        expect(/^[\x20-\x7e]*$/.test(out)).toBe(true)
      }),
      {numRuns: 2000},
    )
  })

  it('read back to the same string, and JSON.parse agrees', () => {
    fc.assert(
      fc.property(anyString, (s) => {
        expect(pyLoads(pyDumps(s))).toBe(s)
        expect(JSON.parse(pyDumps(s))).toBe(s)
        expect(isJsonValue(Buffer.from(pyDumps(s), 'latin1'))).toBe(true)
      }),
      {numRuns: 2000},
    )
  })

  it('written raw (UTF-8 writers), everything but controls, quote and backslash reads as itself', () => {
    const raw = fc.array(unit, {maxLength: 40}).map((a) => a.join('').replace(/[\x00-\x1f"\\]/g, ''))
    fc.assert(
      fc.property(raw, (s) => {
        expect(pyLoads(`"${s}"`)).toBe(s)
        expect(pyLoads(JSON.stringify(s))).toBe(s)
      }),
      {numRuns: 1000},
    )
  })

  it('as dict keys and values, inside arrays, in any order', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(anyString, anyString), {maxLength: 6}), (pairs) => {
        const m = new Map<string, PyValue>(pairs.map(([k, v]) => [k, [v, 1]]))
        const text = pyDumps(m)
        expect(text).toBe(`{${[...m].map(([k, v]) => `${pythonString(k)}: [${pythonString((v as string[])[0]!)}, 1]`).join(', ')}}`)
        const back = pyLoads(text) as Map<string, PyValue>
        expect([...back.keys()]).toEqual([...m.keys()])
        expect(pyDumps(back)).toBe(text)
      }),
      {numRuns: 500},
    )
  })

  it('a raw control character in a string is refused, at its position', () => {
    for (let c = 0; c < 0x20; c++) {
      const text = `["ok", "ab${String.fromCharCode(c)}"]`
      expect(() => pyLoads(text), `0x${c.toString(16)}`).toThrow(new PyJsonError('invalid control character in string at character 10'))
    }
    // DEL and everything above are not controls to JSON.
    expect(pyLoads('"\u007f\u0080\u009f"')).toBe('\u007f\u0080\u009f')
  })

  it('grows the output buffer for long strings of escapes', () => {
    const s = '\u0001'.repeat(40_000) + 'é'.repeat(30_000)
    const out = pyDumps(s)
    expect(out.length).toBe(2 + 70_000 * 6)
    expect(pyLoads(out)).toBe(s)
  })
})

describe('every escape', () => {
  it('each short escape and \\u in either case decodes to its character', () => {
    const cases: [string, string][] = [
      ['\\"', '"'],
      ['\\\\', '\\'],
      ['\\/', '/'],
      ['\\b', '\b'],
      ['\\f', '\f'],
      ['\\n', '\n'],
      ['\\r', '\r'],
      ['\\t', '\t'],
      ['\\u00e9', 'é'],
      ['\\u00E9', 'é'],
      ['\\uABCD', '\uabcd'],
      ['\\u0000', '\0'],
      ['\\ud83d\\ude00', '😀'],
      ['\\ud800', '\ud800'],
      ['\\udc00x', '\udc00x'],
    ]
    for (const [esc, ch] of cases) {
      expect(pyLoads(`"a${esc}b"`), esc).toBe(`a${ch}b`)
      expect(pyLoads(`{"${esc}": "${esc}"}`), esc).toEqual(new Map([[ch, ch]]))
    }
    // All together, back to back, and the writer's choice for each.
    expect(pyLoads('"\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041"')).toBe('"\\/\b\f\n\r\tA')
    expect(pyDumps('"\\/\b\f\n\r\t')).toBe('"\\"\\\\/\\b\\f\\n\\r\\t"')
  })

  it('an invalid escape or \\u without four hex digits is refused, at the escape', () => {
    const bad: [string, string][] = [
      ['"ab\\x41"', 'invalid escape at character 4'],
      ['"ab\\a"', 'invalid escape at character 4'],
      ['"ab\\U0041"', 'invalid escape at character 4'],
      ['"ab\\u00g1"', 'invalid \\u escape at character 5'],
      ['"ab\\u12"', 'invalid \\u escape at character 5'],
      ['"ab\\u-123"', 'invalid \\u escape at character 5'],
      ['"ab\\u 123"', 'invalid \\u escape at character 5'],
      ['"ab\\u', 'unterminated string at character 1'],
      ['"ab\\"', 'unterminated string at character 1'],
    ]
    for (const [text, msg] of bad) expect(() => pyLoads(text), text).toThrow(new PyJsonError(msg))
  })

  it('after an escape, the rest of the string is still checked for controls and quotes', () => {
    expect(() => pyLoads('"\\n\u0001"')).toThrow(new PyJsonError('invalid control character in string at character 3'))
    expect(pyLoads('["\\n", "b"]')).toEqual(['\n', 'b'])
    expect(pyLoads('"a\\\\"')).toBe('a\\')
  })
})

describe('numbers', () => {
  it('integers keep their size; floats keep integral-ness; -0 is the integer 0', () => {
    expect(pyLoads('123456789012345')).toBe(123456789012345)
    expect(pyLoads('-123456789012345')).toBe(-123456789012345)
    expect(pyLoads('1234567890123456')).toBe(1234567890123456)
    expect(pyLoads('9007199254740991')).toBe(9007199254740991)
    expect(pyLoads('9007199254740992')).toBe(9007199254740992n)
    expect(pyLoads('-9007199254740993')).toBe(-9007199254740993n)
    expect(Object.is(pyLoads('-0'), 0)).toBe(true)
    expect(Object.is(pyLoads('0'), 0)).toBe(true)
    expect(pyLoads('[0, -0, 7]')).toEqual([0, 0, 7])
    const f = pyLoads('-0.0') as PyFloat
    expect(f).toBeInstanceOf(PyFloat)
    expect(Object.is(f.value, -0)).toBe(true)
    expect(pyLoads('2.0')).toEqual(new PyFloat(2))
    expect(pyLoads('2e0')).toEqual(new PyFloat(2))
    expect(pyLoads('2.5')).toBe(2.5)
    expect(pyLoads('-1.5E+2')).toEqual(new PyFloat(-150))
    expect(pyLoads('1e-2')).toBe(0.01)
    expect(pyLoads('1e400')).toBe(Infinity)
    for (const [text, v] of [
      ['1,', 1],
      ['12]', 12],
      ['3}', 3],
    ] as const)
      expect(pyLoads(`[${text.slice(0, -1)}]`)).toEqual([v])
  })

  it('numbers JSON does not allow are refused', () => {
    for (const bad of ['01', '-', '-a', '1.', '.5', '1e', '1e+', '+1', '00', '-01', '1.e5', '0x10']) {
      expect(() => pyLoads(bad), bad).toThrow(PyJsonError)
    }
  })

  it('are written as Python writes them', () => {
    expect(pyDumps([0, -0, 1, -1, 2 ** 53, 1e21, 2.5, new PyFloat(3), new PyFloat(-0), 12345678901234567890123n, -5n, NaN, Infinity, -Infinity])).toBe(
      '[0, -0.0, 1, -1, 9007199254740992, 1000000000000000000000, 2.5, 3.0, -0.0, 12345678901234567890123, -5, NaN, Infinity, -Infinity]',
    )
    expect(pyDumps(true)).toBe('true')
    expect(pyDumps(false)).toBe('false')
    expect(pyDumps(null)).toBe('null')
  })

  it('pyFloatRepr matches CPython repr on either side of every notation switch', () => {
    // repr() in CPython 3.11.
    const table: [number, string][] = [
      [0.0001, '0.0001'],
      [0.00009999, '9.999e-05'],
      [9.9999e-5, '9.9999e-05'],
      [1e-5, '1e-05'],
      [1e16, '1e+16'],
      [9999999999999998, '9999999999999998.0'],
      // eslint-disable-next-line no-loss-of-precision -- the literal rounds on purpose: Python prints the double it becomes
      [12345678901234567, '1.2345678901234568e+16'],
      [1.5e300, '1.5e+300'],
      [-2.5e-10, '-2.5e-10'],
      [123456789012345.6, '123456789012345.6'],
      [2 ** 60, '1.152921504606847e+18'],
      [1 / 3, '0.3333333333333333'],
      [0.5, '0.5'],
      [-0.0001, '-0.0001'],
      [-1e16, '-1e+16'],
      [1e100, '1e+100'],
      [1.234e-100, '1.234e-100'],
      [0, '0.0'],
    ]
    for (const [x, repr] of table) expect(pyFloatRepr(x), String(x)).toBe(repr)
  })
})

describe('nesting', () => {
  const arrays = (n: number) => '['.repeat(n) + ']'.repeat(n)
  const dicts = (n: number) => '{"a": '.repeat(n) + '1' + '}'.repeat(n)

  it('reads and writes nesting as deep as CPython writes (its recursion limit, 1,000 levels of lists and dicts)', () => {
    expect(pyDumps(pyLoads(arrays(1000)))).toBe(arrays(1000))
    expect(pyDumps(pyLoads(dicts(1000)))).toBe(dicts(1000))
    let v: PyValue = 1
    for (let i = 0; i < 1000; i++) v = {a: v}
    expect(pyDumps(v)).toBe(dicts(1000))
  })

  it('past what the codec can hold, both directions refuse with a PyJsonError, never a RangeError', () => {
    for (const text of [arrays(20_000), dicts(20_000), arrays(10_001), '['.repeat(50_000)]) {
      const err = (() => {
        try {
          pyLoads(text)
          return null
        } catch (e) {
          return e
        }
      })()
      expect(err).toBeInstanceOf(PyJsonError)
      expect((err as Error).message).toMatch(/nest/)
    }
    let v: PyValue = []
    for (let i = 0; i < 20_000; i++) v = [v]
    expect(() => pyDumps(v)).toThrow(PyJsonError)
    expect(() => pyDumps(v)).toThrow(/nest/)
    let m: PyValue = 1
    for (let i = 0; i < 20_000; i++) m = new Map([['k', m]])
    expect(() => pyDumpsView(m)).toThrow(PyJsonError)
  })
})

describe('structure and errors', () => {
  it('objects: Maps keep their order, plain and null-prototype objects are dicts; nothing else is', () => {
    const nullProto = Object.assign(Object.create(null) as Record<string, PyValue>, {b: 1, a: [true]})
    expect(pyDumps(nullProto)).toBe('{"b": 1, "a": [true]}')
    expect(
      pyDumps(
        new Map<string, PyValue>([
          ['z', 1],
          ['a', new Map()],
        ]),
      ),
    ).toBe('{"z": 1, "a": {}}')
    expect(pyDumps([])).toBe('[]')
    expect(pyDumps({})).toBe('{}')
    expect(pyDumps([1, [2, [3]], {}])).toBe('[1, [2, [3]], {}]')
    class Foo {}
    expect(() => pyDumps(new Foo() as never)).toThrow(new PyJsonError('a Foo is not JSON-representable'))
    expect(() => pyDumps((() => 1) as never)).toThrow(new PyJsonError('a function is not JSON-representable'))
    expect(() => pyDumps(Symbol('s') as never)).toThrow(new PyJsonError('a symbol is not JSON-representable'))
    expect(() => pyDumps(undefined)).toThrow(new PyJsonError('undefined is not JSON-representable'))
    expect(() => pyDumps(new Map([[1, 2]]) as never)).toThrow(new PyJsonError('dict key 1 is not a string'))
    expect(() => pyDumps({a: [undefined]} as never)).toThrow(new PyJsonError('undefined is not JSON-representable'))
  })

  it('whitespace is allowed where JSON allows it, and nothing else after the value', () => {
    expect(pyLoads(' \t\r\n{ "a" : [ 1 , 2 ] , "b" :{ } } \n')).toEqual(
      new Map<string, PyValue>([
        ['a', [1, 2]],
        ['b', new Map()],
      ]),
    )
    expect(pyLoads('[ ]')).toEqual([])
    expect(pyLoads('{ }')).toEqual(new Map())
    const cases: [string, string][] = [
      ['', 'unexpected end of input at character 0'],
      ['  ', 'unexpected end of input at character 2'],
      ['[1] 2', 'extra data at character 4'],
      ['[1 2]', "expected ',' or ']' at character 3"],
      ['{"a": 1 "b": 2}', "expected ',' or '}' at character 8"],
      ['{"a" 1}', "expected ':' at character 5"],
      ['{a: 1}', 'expected a string key at character 1'],
      ['{"a": 1,}', 'expected a string key at character 8'],
      ['[1,]', "unexpected character ']' at character 3"],
      ['tru', 'invalid literal at character 0'],
      ['nul', 'invalid literal at character 0'],
      ['Nan', 'invalid literal at character 0'],
      ['-Inf', 'invalid number at character 0'],
      ['Infinit', 'invalid literal at character 0'],
      ['x', "unexpected character 'x' at character 0"],
      ['[', 'unexpected end of input at character 1'],
      ['{"a":', 'unexpected end of input at character 5'],
      ['"abc', 'unterminated string at character 1'],
    ]
    for (const [text, msg] of cases) expect(() => pyLoads(text), JSON.stringify(text)).toThrow(new PyJsonError(msg))
    expect(pyLoads('[true, false, null, NaN, Infinity, -Infinity]')).toEqual([true, false, null, NaN, Infinity, -Infinity])
  })

  it('pyDumpsBuffer is a copy; pyDumpsView is overwritten by the next value', () => {
    const a = pyDumpsBuffer(['first'])
    const view = pyDumpsView(['xx'])
    expect(view.toString('latin1')).toBe('["xx"]')
    pyDumpsView(['yy'])
    expect(view.toString('latin1')).toBe('["yy"]')
    expect(a.toString('latin1')).toBe('["first"]')
    // A value larger than the scratch buffer gets its own, and later small values still encode right.
    const big = 'z'.repeat(200_000)
    expect(pyDumpsView([big]).length).toBe(200_004)
    expect(pyDumps(['s'])).toBe('["s"]')
  })

  it('pyGet and isPyDict read both dict representations and nothing else', () => {
    const m = new Map<string, PyValue>([['k', 1]])
    expect(pyGet(m, 'k')).toBe(1)
    expect(pyGet({k: 2}, 'k')).toBe(2)
    expect(pyGet([3] as PyValue, '0')).toBeUndefined()
    expect(pyGet(new PyFloat(1), 'value')).toBeUndefined()
    expect(pyGet(null, 'k')).toBeUndefined()
    expect(pyGet(undefined, 'k')).toBeUndefined()
    expect(pyGet('str', 'length')).toBeUndefined()
    expect([m, {}, [], new PyFloat(1), null, 1, 'a', undefined].map((v) => isPyDict(v as PyValue))).toEqual([true, true, false, false, false, false, false, false])
  })
})
