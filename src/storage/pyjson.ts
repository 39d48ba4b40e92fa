/**
 * Python-compatible JSON: what `json.dumps` writes with its default options, and a lenient reader
 * for it. Gym's records keep dict key order, NaN/Infinity and integers of any size exactly, so a
 * restored episode sees its state byte for byte; this codec round-trips all of them.
 */

/** A Python float whose value is integral (written `2.0`, not `2`). */
export class PyFloat {
  constructor(readonly value: number) {}
}

export type PyValue = null | boolean | number | bigint | string | PyFloat | PyValue[] | Map<string, PyValue> | {[key: string]: PyValue}

export class PyJsonError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'PyJsonError'
  }
}

/** Python's repr() of a float: shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16. */
export function pyFloatRepr(x: number): string {
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0'
  const ax = Math.abs(x)
  // Both languages print the shortest round-trip digits, and JavaScript uses fixed notation from
  // 1e-6 to below 1e21: all of Python's fixed range. Python marks an integral float with `.0`.
  if (ax >= 1e-4 && ax < 1e16) return Number.isInteger(x) ? `${x}.0` : String(x)
  // Outside it both write the shortest digits as d.ddd and an exponent; Python's has a sign and
  // at least two digits (`1e-05`, `1.5e+16`), JavaScript's at least one (`1e-5`). NaN, Infinity
  // and -Infinity have no exponent, and toExponential spells them as json.dumps does.
  const s = x.toExponential()
  const e = s.indexOf('e')
  return s.length - e === 3 ? `${s.slice(0, e + 2)}0${s.slice(e + 2)}` : s
}

/** `json.dumps(value)` with Python's defaults: `, ` and `: ` separators, ASCII output, NaN tokens. */
export function pyDumps(value: PyValue | undefined): string {
  return pyDumpsBuffer(value).toString('latin1')
}

/**
 * The same bytes as pyDumps, encoded straight into a Buffer. The output is ASCII (ensure_ascii),
 * so every piece is copied byte for byte; no string rope is built and flattened, which would cost
 * as much as the encoding itself on records of hundreds of KB.
 */
export function pyDumpsBuffer(value: PyValue | undefined): Buffer {
  return Buffer.from(pyDumpsView(value))
}

/**
 * pyDumpsBuffer without the copy: a view of a scratch buffer that the next call overwrites. For a
 * consumer that copies or writes the bytes before it encodes the next value (the records writer).
 */
export function pyDumpsView(value: PyValue | undefined): Buffer {
  const w = new ByteWriter()
  try {
    write(value, 0, w)
  } catch (err) {
    if (err instanceof RangeError) throw new PyJsonError('value nests too deeply to encode')
    throw err
  }
  return w.view()
}

const SHORT_ESCAPE: (number | undefined)[] = []
for (const [c, e] of [
  ['"', '"'],
  ['\\', '\\'],
  ['\n', 'n'],
  ['\r', 'r'],
  ['\t', 't'],
  ['\b', 'b'],
  ['\f', 'f'],
] as const)
  SHORT_ESCAPE[c.charCodeAt(0)] = e.charCodeAt(0)
const HEX_DIGIT = Buffer.from('0123456789abcdef')
/** What json.dumps escapes (ensure_ascii): everything outside ' '..'~', and `"` and `\\`. */
const NEEDS_ESCAPE = /[^\x20\x21\x23-\x5b\x5d-\x7e]/g

class ByteWriter {
  private static scratch = Buffer.allocUnsafe(1 << 16)
  private buf = ByteWriter.scratch
  private n = 0

  private reserve(k: number): void {
    if (this.n + k <= this.buf.length) return
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.n + k))
    this.buf.copy(next, 0, 0, this.n)
    this.buf = next
  }

  /** An ASCII string: a keyword, a separator, or the digits of a number (short, so byte by byte). */
  ascii(s: string): void {
    const len = s.length
    this.reserve(len)
    const b = this.buf
    let n = this.n
    for (let i = 0; i < len; i++) b[n++] = s.charCodeAt(i)
    this.n = n
  }

  byte(c: number): void {
    this.reserve(1)
    this.buf[this.n++] = c
  }

  /**
   * A number as json.dumps writes it. An int32 (token ids, counters; not -0, which is the float
   * -0.0) is written digit by digit, with no intermediate string.
   */
  number(v: number): void {
    if (!Object.is(v | 0, v)) return this.ascii(pyNumber(v))
    this.reserve(11)
    const b = this.buf
    let n = this.n
    if (v < 0) {
      b[n++] = 0x2d
      // -2^31 becomes the double 2^31, which `(x / 10) | 0` still divides exactly.
      v = -v
    }
    let digits = 1
    for (let x = v; x >= 10; x = (x / 10) | 0) digits++
    n += digits
    for (let k = n - 1; v >= 10; k--) {
      const q = (v / 10) | 0
      b[k] = 0x30 + v - q * 10
      v = q
    }
    b[n - digits] = 0x30 + v
    this.n = n
  }

  /**
   * A string as Python's json.dumps writes it: `"` `\\` and \b \f \n \r \t as short escapes,
   * everything else outside ' '..'~' (DEL, non-ASCII, each UTF-16 unit of an astral character)
   * as a lowercase \uXXXX.
   */
  string(s: string): void {
    const len = s.length
    this.reserve(len * 6 + 2)
    const b = this.buf
    let n = this.n
    b[n++] = 0x22
    let i = 0
    NEEDS_ESCAPE.lastIndex = 0
    for (;;) {
      // The next character to escape (the regex runs natively; test() allocates no match).
      const j = NEEDS_ESCAPE.test(s) ? NEEDS_ESCAPE.lastIndex - 1 : len
      // The plain run before it: a short one byte by byte, a long one in one native copy.
      if (j - i < 16) for (let k = i; k < j; k++) b[n++] = s.charCodeAt(k)
      else n += b.write(i === 0 && j === len ? s : s.slice(i, j), n, 'latin1')
      if (j === len) break
      const c = s.charCodeAt(j)
      b[n++] = 0x5c
      const short = SHORT_ESCAPE[c]
      if (short !== undefined) b[n++] = short
      else {
        b[n++] = 0x75
        b[n++] = HEX_DIGIT[(c >> 12) & 15]!
        b[n++] = HEX_DIGIT[(c >> 8) & 15]!
        b[n++] = HEX_DIGIT[(c >> 4) & 15]!
        b[n++] = HEX_DIGIT[c & 15]!
      }
      i = j + 1
    }
    b[n++] = 0x22
    this.n = n
  }

  view(): Buffer {
    // Keep a grown buffer for the next value, up to a bound.
    if (this.buf.length <= 1 << 24) ByteWriter.scratch = this.buf
    return this.buf.subarray(0, this.n)
  }
}

/**
 * The most containers (lists and dicts) a value may nest, one limit for everything that reads or
 * writes records: this codec both ways, and the streaming scanner (jsonscan.ts), so that verify
 * never passes a record that a restore refuses. Python's json refuses to go deeper than its
 * recursion limit (993 levels measured with python3.11's default of 1,000; 1,500 for 3.12's C
 * limit), so no Gym server writes a deeper record; and this recursive codec reaches 2,000 on any
 * thread's stack (about 3,600 measured on a main thread).
 */
export const MAX_NESTING = 2_000
const LBRACKET = 0x5b
const RBRACKET = 0x5d
const LBRACE = 0x7b
const RBRACE = 0x7d

function pyNumber(v: number): string {
  if (Number.isInteger(v) && !Object.is(v, -0)) return Number.isSafeInteger(v) ? String(v) : BigInt(v).toString()
  return pyFloatRepr(v)
}

function write(v: PyValue | undefined, depth: number, w: ByteWriter): void {
  switch (typeof v) {
    case 'string':
      return w.string(v)
    case 'number':
      return w.number(v)
    case 'boolean':
    case 'bigint':
      return w.ascii(String(v))
    case 'object':
      break
    default:
      throw new PyJsonError(`${describe(v)} is not JSON-representable`)
  }
  if (v === null) return w.ascii('null')
  // `depth` containers hold this one.
  if (depth >= MAX_NESTING && !(v instanceof PyFloat)) throw new PyJsonError(`value nests deeper than ${MAX_NESTING} levels`)
  if (Array.isArray(v)) {
    w.byte(LBRACKET)
    for (let i = 0; i < v.length; i++) {
      if (i) {
        w.byte(0x2c)
        w.byte(0x20)
      }
      const x = v[i]
      // Numbers (token ids, logprobs) without the dispatch and the depth check.
      if (typeof x === 'number') w.number(x)
      else write(x, depth + 1, w)
    }
    return w.byte(RBRACKET)
  }
  if (v instanceof Map) {
    w.byte(LBRACE)
    let first = true
    for (const [k, val] of v) {
      if (typeof k !== 'string') throw new PyJsonError(`dict key ${String(k)} is not a string`)
      if (!first) w.ascii(', ')
      first = false
      w.string(k)
      w.ascii(': ')
      write(val, depth + 1, w)
    }
    return w.byte(RBRACE)
  }
  if (v instanceof PyFloat) return w.ascii(pyFloatRepr(v.value))
  const proto = Object.getPrototypeOf(v)
  if (proto !== Object.prototype && proto !== null) throw new PyJsonError(`${describe(v)} is not JSON-representable`)
  w.byte(LBRACE)
  let first = true
  for (const k of Object.keys(v)) {
    if (!first) w.ascii(', ')
    first = false
    w.string(k)
    w.ascii(': ')
    write((v as Record<string, PyValue>)[k], depth + 1, w)
  }
  w.byte(RBRACE)
}

function describe(v: unknown): string {
  if (v === undefined) return 'undefined'
  if (typeof v === 'object') return `a ${(v as object).constructor?.name ?? 'null-prototype object'}`
  return `a ${typeof v}`
}

/**
 * Reads Python-style JSON: NaN/Infinity/-Infinity, integers beyond 2^53 as bigint, integral
 * floats as PyFloat, objects as Maps (so integer-like keys keep their place).
 */
export function pyLoads(text: string): PyValue {
  const p = new Parser(text)
  p.ws()
  let v: PyValue
  try {
    v = p.value(0)
  } catch (err) {
    if (err instanceof RangeError) throw new PyJsonError('value nests too deeply to decode')
    throw err
  }
  p.ws()
  if (p.i !== text.length) p.fail('extra data')
  return v
}

const CONTROL = /[\x00-\x1f]/
const HEX4 = /^[0-9a-fA-F]{4}$/
/** The letters of the escapes besides `\u`: `\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t`. */
const SHORT_ESCAPES = Array.from('"\\/bfnrt', (c) => c.charCodeAt(0))

/** V8 makes a substring this long or longer a view that keeps its parent string alive. */
const SLICE_MIN = 13

/** A fraction or an exponent: what makes a number a Python float. */
const FLOAT_MARK = /[.eE]/

class Parser {
  i = 0
  /** The next backslash at or after the last string's start (Infinity: none). */
  private bs = -1
  constructor(readonly s: string) {}

  fail(what: string): never {
    throw new PyJsonError(`${what} at character ${this.i}`)
  }

  ws(): void {
    const s = this.s
    while (this.i < s.length) {
      const c = s.charCodeAt(this.i)
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) this.i++
      else break
    }
  }

  /** The value at this.i, inside `depth` containers. */
  value(depth: number): PyValue {
    const s = this.s
    const c = s[this.i]
    switch (c) {
      case '{':
        if (depth >= MAX_NESTING) this.fail(`nesting deeper than ${MAX_NESTING}`)
        return this.object(depth)
      case '[':
        if (depth >= MAX_NESTING) this.fail(`nesting deeper than ${MAX_NESTING}`)
        return this.array(depth)
      case '"':
        return this.string()
      case 't':
        return this.literal('true', true)
      case 'f':
        return this.literal('false', false)
      case 'n':
        return this.literal('null', null)
      case 'N':
        return this.literal('NaN', NaN)
      case 'I':
        return this.literal('Infinity', Infinity)
      default:
        if (c === '-' && s.startsWith('-Infinity', this.i)) return this.literal('-Infinity', -Infinity)
        if (c === '-' || (c !== undefined && c >= '0' && c <= '9')) return this.number()
        return this.fail(c === undefined ? 'unexpected end of input' : `unexpected character '${c}'`)
    }
  }

  literal<T extends PyValue>(word: string, v: T): T {
    if (!this.s.startsWith(word, this.i)) this.fail('invalid literal')
    this.i += word.length
    return v
  }

  number(): PyValue {
    // Fast path: a short plain integer, the common case (token ids, counters).
    const s = this.s
    let j = this.i
    const neg = s.charCodeAt(j) === 0x2d
    if (neg) j++
    const start = j
    let v = 0
    let c = s.charCodeAt(j)
    while (c >= 0x30 && c <= 0x39 && j - start < 15) {
      v = v * 10 + (c - 0x30)
      c = s.charCodeAt(++j)
    }
    const digits = j - start
    if (digits > 0 && !(c >= 0x30 && c <= 0x39) && c !== 0x2e && c !== 0x65 && c !== 0x45 && !(digits > 1 && s.charCodeAt(start) === 0x30)) {
      this.i = j
      return neg ? -v + 0 : v
    }
    // The grammar by hand (no regex match objects): -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?
    j = neg ? this.i + 1 : this.i
    c = s.charCodeAt(j)
    if (c === 0x30) c = s.charCodeAt(++j)
    else if (c >= 0x31 && c <= 0x39) {
      do c = s.charCodeAt(++j)
      while (c >= 0x30 && c <= 0x39)
    } else return this.fail('invalid number')
    let float = false
    if (c === 0x2e) {
      const d = ++j
      c = s.charCodeAt(j)
      while (c >= 0x30 && c <= 0x39) c = s.charCodeAt(++j)
      if (j === d) return this.fail('invalid number')
      float = true
    }
    if (c === 0x65 || c === 0x45) {
      c = s.charCodeAt(++j)
      if (c === 0x2b || c === 0x2d) c = s.charCodeAt(++j)
      const d = j
      while (c >= 0x30 && c <= 0x39) c = s.charCodeAt(++j)
      if (j === d) return this.fail('invalid number')
      float = true
    }
    const raw = s.slice(this.i, j)
    this.i = j
    if (!float) {
      const n = Number(raw)
      // `-0` is the integer 0 in Python, written back as `0`.
      return Number.isSafeInteger(n) ? n + 0 : BigInt(raw)
    }
    const f = Number(raw)
    return Number.isInteger(f) ? new PyFloat(f) : f
  }

  /**
   * A string token. The closing quote is found with indexOf and the content decoded by JSON.parse
   * (the same escapes and the same refusal of raw controls as Python's reader): a flat string
   * in one native pass, never a rope of runs that the encoder must flatten later, and never a
   * slice that keeps the whole line alive. Anything JSON.parse refuses is read again by
   * stringError for the exact error.
   */
  string(): string {
    const s = this.s
    const open = this.i
    let q = s.indexOf('"', open + 1)
    if (q < 0) return this.stringError()
    if (this.bs < open) {
      const b = s.indexOf('\\', open)
      this.bs = b < 0 ? Infinity : b
    }
    if (this.bs > q) {
      const len = q - open - 1
      if (len < SLICE_MIN) {
        // Short: V8 copies substrings this short, so a slice holds nothing else alive.
        for (let k = open + 1; k < q; k++) if (s.charCodeAt(k) < 0x20) return this.stringError()
        this.i = q + 1
        return s.slice(open + 1, q)
      }
    } else {
      // Escapes: the closing quote is the first one after an even run of backslashes.
      for (;;) {
        let k = q - 1
        while (s.charCodeAt(k) === 0x5c) k--
        if ((q - 1 - k) % 2 === 0) break
        q = s.indexOf('"', q + 1)
        if (q < 0) return this.stringError()
      }
    }
    let v: unknown
    try {
      v = JSON.parse(s.slice(open, q + 1))
    } catch {
      return this.stringError()
    }
    this.i = q + 1
    return v as string
  }

  /**
   * The error in a string token that string() refused: a raw control character, a bad escape, or
   * no closing quote. Every such token has its error before its closing quote (string() reads the
   * rest), so this only looks for the error; it decodes nothing.
   */
  stringError(): never {
    const s = this.s
    let i = ++this.i
    for (;;) {
      // The run up to the next quote or backslash.
      const q = s.indexOf('"', i)
      if (q < 0) this.fail('unterminated string')
      const bs = s.indexOf('\\', i)
      const end = bs >= 0 && bs < q ? bs : q
      const run = s.slice(i, end)
      if (CONTROL.test(run)) {
        this.i = i + run.search(CONTROL)
        this.fail('invalid control character in string')
      }
      // The escape at `end` (the run cannot end at the closing quote: see above).
      const e = s.charCodeAt(end + 1)
      i = end + 2
      if (e === 0x75) {
        if (!HEX4.test(s.slice(i, i + 4))) {
          this.i = i
          this.fail('invalid \\u escape')
        }
        i += 4
      } else if (!SHORT_ESCAPES.includes(e)) {
        this.i = end + 1
        this.fail('invalid escape')
      }
    }
  }

  array(depth: number): PyValue[] {
    const open = this.i++
    this.ws()
    const c = this.s.charCodeAt(this.i)
    if ((c >= 0x30 && c <= 0x39) || (c === 0x2d && this.s.charCodeAt(this.i + 1) !== 0x49)) {
      const fast = this.numbers(open)
      if (fast) return fast
    }
    const out: PyValue[] = []
    if (this.s[this.i] === ']') {
      this.i++
      return out
    }
    for (;;) {
      this.ws()
      out.push(this.value(depth + 1))
      this.ws()
      const c = this.s[this.i++]
      if (c === ']') return out
      if (c !== ',') {
        this.i--
        this.fail("expected ',' or ']'")
      }
    }
  }

  /**
   * An array of numbers (token ids, logprobs: most of a transcript's bytes) decoded by JSON.parse
   * in one native pass, then made exactly what the token-by-token reader returns: integral values
   * are looked up by their spelling (`2.0` and `-0.0` are Python floats, `-0` is the integer 0,
   * integers beyond 2^53 are bigints). Null (read it token by token) for NaN/Infinity and for
   * anything but numbers.
   */
  numbers(open: number): PyValue[] | null {
    const s = this.s
    const close = s.indexOf(']', open)
    if (close < 0) return null
    const text = s.slice(open, close + 1)
    let arr: unknown
    try {
      arr = JSON.parse(text)
    } catch {
      return null
    }
    const a = arr as PyValue[]
    if (!FLOAT_MARK.test(text)) {
      // No fraction or exponent anywhere (token ids): every value is an int as spelt, and only
      // -0 (the int 0) and integers beyond 2^53 (bigints, read off their spelling) need more.
      let e = 0
      for (; e < a.length; e++) {
        const v = a[e]
        if (typeof v !== 'number') return null
        if (!Number.isSafeInteger(v)) break
        if (v === 0) a[e] = 0
      }
      if (e === a.length) {
        this.i = close + 1
        return a
      }
    }
    // Token k starts after the k-th comma: found only up to the integral values, which are few.
    let k = 0
    let at = open + 1
    for (let e = 0; e < a.length; e++) {
      const v = a[e]
      if (typeof v !== 'number') return null
      if (!Number.isInteger(v)) continue
      for (; k < e; k++) at = s.indexOf(',', at) + 1
      while (s.charCodeAt(at) <= 0x20) at++
      let end = at
      let float = false
      for (let c = s.charCodeAt(end); c !== 0x2c && c !== 0x5d && c > 0x20; c = s.charCodeAt(++end)) if (c === 0x2e || c === 0x65 || c === 0x45) float = true
      if (float) a[e] = new PyFloat(v)
      else if (!Number.isSafeInteger(v)) a[e] = BigInt(s.slice(at, end))
      else if (v === 0) a[e] = 0
    }
    this.i = close + 1
    return a
  }

  object(depth: number): Map<string, PyValue> {
    this.i++
    const out = new Map<string, PyValue>()
    this.ws()
    if (this.s[this.i] === '}') {
      this.i++
      return out
    }
    for (;;) {
      this.ws()
      if (this.s[this.i] !== '"') this.fail('expected a string key')
      const k = this.string()
      this.ws()
      if (this.s[this.i++] !== ':') {
        this.i--
        this.fail("expected ':'")
      }
      this.ws()
      out.set(k, this.value(depth + 1))
      this.ws()
      const c = this.s[this.i++]
      if (c === '}') return out
      if (c !== ',') {
        this.i--
        this.fail("expected ',' or '}'")
      }
    }
  }
}

/** Reads a field of a decoded dict, whichever representation it has. */
export function pyGet(obj: PyValue | undefined, key: string): PyValue | undefined {
  if (obj instanceof Map) return obj.get(key)
  if (obj && typeof obj === 'object' && !Array.isArray(obj) && !(obj instanceof PyFloat)) return (obj as Record<string, PyValue>)[key]
  return undefined
}

export function isPyDict(v: PyValue | undefined): v is Map<string, PyValue> | {[key: string]: PyValue} {
  return v instanceof Map || (typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof PyFloat))
}
