// The Python JSON codec (src/storage/pyjson.ts), third round: what the mutation run of lines 53–664
// left alive. A stack that runs out inside the codec, bytes that land right at the end of the
// encoder's buffer, dicts nested as plain objects, and the reader's paths that only an error or a
// rarer spelling reaches.
import {describe, expect, it} from 'vitest'

import {MAX_NESTING, PyFloat, PyJsonError, PyValue, pyDumps, pyDumpsView, pyLoads} from '../../src/storage/pyjson.js'

/** How each call ended: 'ok', or the error's class and message. */
function outcome(f: () => unknown): string {
  try {
    f()
    return 'ok'
  } catch (err) {
    return `${(err as Error).constructor.name}: ${(err as Error).message}`
  }
}

/**
 * Runs `f` with less and less stack left: recurses until the stack is exhausted, then calls `f`
 * every few frames on the way back, from the deepest frame up to the first one where it succeeds.
 */
function withLittleStack(f: () => unknown): string[] {
  const seen: string[] = []
  const dive = (): number => {
    let below: number
    try {
      below = dive()
    } catch (err) {
      if (!(err instanceof RangeError)) throw err
      return 0
    }
    if (below % 5 === 0 && seen.at(-1) !== 'ok') seen.push(outcome(f))
    return below + 1
  }
  dive()
  return seen
}

/** `inner` inside `n` lists. */
function nest(n: number, inner: PyValue): PyValue {
  let v = inner
  for (let i = 0; i < n; i++) v = [v]
  return v
}

/** The size of the encoder's scratch buffer now (it grows and is kept): to put bytes across its end. */
const scratchSize = () => pyDumpsView(null).buffer.byteLength

describe('a stack that runs out inside the codec', () => {
  it('encoding: the RangeError becomes a PyJsonError that says so, wherever the stack ends', () => {
    const deep = nest(MAX_NESTING - 1, [])
    const seen = withLittleStack(() => pyDumps(deep))
    expect(seen).toContain('PyJsonError: value nests too deeply to encode')
    expect(seen.at(-1)).toBe('ok')
    // Near the bottom the call itself may not get in; nothing else ever comes out.
    for (const o of seen) expect(['ok', 'PyJsonError: value nests too deeply to encode', 'RangeError: Maximum call stack size exceeded']).toContain(o)
  })

  it('decoding: the same, as "too deeply to decode"', () => {
    const text = '['.repeat(MAX_NESTING) + ']'.repeat(MAX_NESTING)
    const seen = withLittleStack(() => pyLoads(text))
    expect(seen).toContain('PyJsonError: value nests too deeply to decode')
    expect(seen.at(-1)).toBe('ok')
    for (const o of seen) expect(['ok', 'PyJsonError: value nests too deeply to decode', 'RangeError: Maximum call stack size exceeded']).toContain(o)
  })
})

describe('bytes at the end of the encoder buffer', () => {
  it('brackets, commas and spaces alone (lists of empty lists) past the end of the buffer are all written', () => {
    const n = Math.ceil(scratchSize() / 4) + 3
    const v = Array<PyValue>(n).fill([])
    const out = pyDumps(v)
    expect(out.length).toBe(4 * n)
    expect(out).toBe(`[${Array<string>(n).fill('[]').join(', ')}]`)
  })

  it('an integer whose digits cross the end of the buffer is written whole', () => {
    const size = scratchSize()
    const v: PyValue[] = []
    let len = 1 // '['
    while (len + 4 < size - 5) {
      v.push([])
      len += v.length > 1 ? 4 : 2
    }
    // The first of these starts a few bytes before the end and ends a few after it.
    for (let i = 0; i < 4; i++) v.push(1234567890 + i)
    const out = pyDumps(v)
    const start = out.indexOf('1234567890')
    expect(start).toBeLessThan(size)
    expect(start + 10).toBeGreaterThan(size)
    expect(out).toBe(`[${v.map((x) => (Array.isArray(x) ? '[]' : String(x))).join(', ')}]`)
  })
})

describe('dicts nested as plain objects', () => {
  it('count toward the nesting limit like Maps and lists', () => {
    const dicts = (n: number): PyValue => {
      let v: PyValue = {}
      for (let i = 1; i < n; i++) v = {a: v}
      return v
    }
    expect(pyDumps(dicts(MAX_NESTING))).toBe('{"a": '.repeat(MAX_NESTING - 1) + '{}' + '}'.repeat(MAX_NESTING - 1))
    expect(() => pyDumps(dicts(MAX_NESTING + 1))).toThrow(new PyJsonError(`value nests deeper than ${MAX_NESTING} levels`))
    expect(() => pyDumps({a: {b: nest(MAX_NESTING - 2, [])}})).toThrow(new PyJsonError(`value nests deeper than ${MAX_NESTING} levels`))
    expect(pyDumps({a: nest(MAX_NESTING - 2, [])})).toBe('{"a": ' + '['.repeat(MAX_NESTING - 1) + ']'.repeat(MAX_NESTING - 1) + '}')
    expect(pyDumps({a: new PyFloat(1)})).toBe('{"a": 1.0}')
  })
})

describe('the reader: what only an error shows', () => {
  it('a value that starts with a character no JSON value starts with is named, even one that sorts before the digits', () => {
    for (const [text, at] of [
      ['+1', 0],
      ['.5', 0],
      [' #', 1],
      ['[1, +2, "x"]', 4],
      ['{"a": /}', 6],
    ] as const) {
      expect(() => pyLoads(text), text).toThrow(new PyJsonError(`unexpected character '${text[at]}' at character ${at}`))
    }
  })

  it('a fraction or an exponent without digits is an invalid number, at the number', () => {
    const cases: [string, number][] = [
      ['1.', 0],
      ['1.e5', 0],
      ['-0.]', 0],
      ['[2, 1.x, "s"]', 4],
      ['1e', 0],
      ['1E+', 0],
      ['-2e-', 0],
      ['{"a": 3.5e}', 6],
      ['[2, 1ex, "s"]', 4],
    ]
    for (const [text, at] of cases) expect(() => pyLoads(text), text).toThrow(new PyJsonError(`invalid number at character ${at}`))
  })

  it('a minus sign followed by no digit is an invalid number, whatever character follows it', () => {
    const cases: [string, number][] = [
      ['-.', 0],
      ['-!', 0],
      ['- 1', 0],
      ['[-,]', 1],
      ['[-]', 1],
      ['{"a": -}', 6],
      ['[1, -/, 2]', 4],
    ]
    for (const [text, at] of cases) expect(() => pyLoads(text), text).toThrow(new PyJsonError(`invalid number at character ${at}`))
  })

  it('after each valid escape the reader goes on, and finds the error that follows it where it is', () => {
    for (const esc of ['\\"', '\\\\', '\\/', '\\b', '\\f', '\\n', '\\r', '\\t', '\\u00e9', '\\u00E9', '\\uD83D']) {
      // `"a` + the escape + `b` + a raw control: the control is the error.
      expect(() => pyLoads(`"a${esc}b\u0001"`), esc).toThrow(new PyJsonError(`invalid control character in string at character ${3 + esc.length}`))
      // An invalid escape right after it: the error is there, not at the first one.
      expect(() => pyLoads(`["a${esc}\\x"]`), esc).toThrow(new PyJsonError(`invalid escape at character ${4 + esc.length}`))
      // Or a \u without four hex digits.
      expect(() => pyLoads(`{"k${esc}\\u12g4": 1}`), esc).toThrow(new PyJsonError(`invalid \\u escape at character ${5 + esc.length}`))
    }
  })
})
