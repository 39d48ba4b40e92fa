// The Python JSON codec (src/storage/pyjson.ts), second round (issue 12): the nesting limit at its
// exact boundary in both directions, and how a value that is not JSON is named.
import {describe, expect, it} from 'vitest'

import {MAX_NESTING, PyFloat, PyJsonError, PyValue, pyDumps, pyLoads} from '../../src/storage/pyjson.js'

const arrays = (n: number) => '['.repeat(n) + ']'.repeat(n)
const dicts = (n: number) => '{"a": '.repeat(n - 1) + '{}' + '}'.repeat(n - 1)

/** `inner` inside `n` lists. */
function nest(n: number, inner: PyValue): PyValue {
  let v = inner
  for (let i = 0; i < n; i++) v = [v]
  return v
}

describe('the nesting limit (MAX_NESTING containers), exactly', () => {
  it('reads and writes MAX_NESTING lists or dicts; one more is refused with the limit named, not a stack overflow', () => {
    expect(MAX_NESTING).toBe(2_000)
    for (const make of [arrays, dicts]) {
      const text = make(MAX_NESTING)
      expect(pyDumps(pyLoads(text))).toBe(text)
      // The container that would be the 2,001st starts at character 2,000 (lists) or 12,000 (dicts).
      const at = make === arrays ? MAX_NESTING : MAX_NESTING * 6
      expect(() => pyLoads(make(MAX_NESTING + 1))).toThrow(new PyJsonError(`nesting deeper than ${MAX_NESTING} at character ${at}`))
    }
    expect(pyDumps(nest(MAX_NESTING - 1, []))).toBe(arrays(MAX_NESTING))
    expect(() => pyDumps(nest(MAX_NESTING, []))).toThrow(new PyJsonError(`value nests deeper than ${MAX_NESTING} levels`))
    expect(() => pyDumps(nest(MAX_NESTING, new Map()))).toThrow(new PyJsonError(`value nests deeper than ${MAX_NESTING} levels`))
    expect(() => pyDumps(nest(MAX_NESTING, {}))).toThrow(new PyJsonError(`value nests deeper than ${MAX_NESTING} levels`))
  })

  it('scalars at the deepest level are not containers: a float, a string or null inside MAX_NESTING lists is written, and read back', () => {
    expect(pyDumps(nest(MAX_NESTING, new PyFloat(2)))).toBe('['.repeat(MAX_NESTING) + '2.0' + ']'.repeat(MAX_NESTING))
    expect(pyDumps(nest(MAX_NESTING, 'x'))).toBe('['.repeat(MAX_NESTING) + '"x"' + ']'.repeat(MAX_NESTING))
    expect(pyDumps(nest(MAX_NESTING, null))).toBe('['.repeat(MAX_NESTING) + 'null' + ']'.repeat(MAX_NESTING))
    expect(pyLoads('['.repeat(MAX_NESTING) + '2.0' + ']'.repeat(MAX_NESTING))).toEqual(nest(MAX_NESTING - 1, [new PyFloat(2)]))
  })
})

describe('values that are not JSON', () => {
  it('an object whose prototype chain has no constructor is named as such', () => {
    const orphan = Object.create(Object.create(null) as object) as never
    expect(() => pyDumps(orphan)).toThrow(new PyJsonError('a null-prototype object is not JSON-representable'))
    expect(() => pyDumps([1, {a: orphan}] as never)).toThrow(new PyJsonError('a null-prototype object is not JSON-representable'))
    expect(() => pyDumps(new Date(0) as never)).toThrow(new PyJsonError('a Date is not JSON-representable'))
  })
})
