/**
 * Python-compatible JSON: what `json.dumps` writes with its default options, and a lenient reader
 * for it. Gym's records keep dict key order, NaN/Infinity and integers of any size exactly, so a
 * restored episode sees its state byte for byte; this codec round-trips all of them.
 */

/** A Python float whose value is integral (written `2.0`, not `2`). */
export class PyFloat {
  constructor(readonly value: number) {}
}

export type PyValue =
  | null
  | boolean
  | number
  | bigint
  | string
  | PyFloat
  | PyValue[]
  | Map<string, PyValue>
  | {[key: string]: PyValue}

export class PyJsonError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'PyJsonError'
  }
}

/** Python's repr() of a float: shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16. */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return 'NaN'
  if (x === Infinity) return 'Infinity'
  if (x === -Infinity) return '-Infinity'
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0'
  const [mant, expText] = x.toExponential().split('e') as [string, string]
  const neg = mant.startsWith('-')
  const digits = mant.replace('-', '').replace('.', '')
  const exp = Number(expText)
  let out: string
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      const intPart = digits.length > exp + 1 ? digits.slice(0, exp + 1) : digits.padEnd(exp + 1, '0')
      const frac = digits.length > exp + 1 ? digits.slice(exp + 1) : '0'
      out = `${intPart}.${frac}`
    } else {
      out = `0.${'0'.repeat(-exp - 1)}${digits}`
    }
  } else {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits
    const e = Math.abs(exp).toString().padStart(2, '0')
    out = `${m}e${exp < 0 ? '-' : '+'}${e}`
  }
  return neg ? `-${out}` : out
}

const PLAIN_STRING = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/
const ESCAPE_CHARS = /[\x00-\x1f"\\\x7f-\uffff]/g
const SHORT_ESCAPES: Record<string, string> = {'"': '\\"', '\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t', '\b': '\\b', '\f': '\\f'}

export function pyString(s: string): string {
  if (PLAIN_STRING.test(s)) return `"${s}"`
  return `"${s.replace(ESCAPE_CHARS, (c) => {
    const short = SHORT_ESCAPES[c]
    if (short) return short
    // Python escapes everything outside ' '..'~', DEL included.
    return `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`
  })}"`
}

/** `json.dumps(value)` with Python's defaults: `, ` and `: ` separators, ASCII output, NaN tokens. */
export function pyDumps(value: PyValue | undefined): string {
  const parts: string[] = []
  write(value, parts, 0)
  return parts.join('')
}

const MAX_DEPTH = 10_000

function write(v: PyValue | undefined, out: string[], depth: number): void {
  if (depth > MAX_DEPTH) throw new PyJsonError(`value nests deeper than ${MAX_DEPTH} levels`)
  if (v === null) out.push('null')
  else if (v === true) out.push('true')
  else if (v === false) out.push('false')
  else if (typeof v === 'string') out.push(pyString(v))
  else if (typeof v === 'number') {
    if (Number.isInteger(v) && !Object.is(v, -0)) out.push(Number.isSafeInteger(v) ? String(v) : BigInt(v).toString())
    else out.push(pyFloatRepr(v))
  } else if (typeof v === 'bigint') out.push(v.toString())
  else if (v instanceof PyFloat) out.push(pyFloatRepr(v.value))
  else if (Array.isArray(v)) {
    out.push('[')
    for (let i = 0; i < v.length; i++) {
      if (i) out.push(', ')
      write(v[i], out, depth + 1)
    }
    out.push(']')
  } else if (v instanceof Map) {
    out.push('{')
    let first = true
    for (const [k, val] of v) {
      if (typeof k !== 'string') throw new PyJsonError(`dict key ${String(k)} is not a string`)
      out.push(first ? '' : ', ', pyString(k), ': ')
      first = false
      write(val, out, depth + 1)
    }
    out.push('}')
  } else if (typeof v === 'object' && v !== undefined && [Object.prototype, null].includes(Object.getPrototypeOf(v))) {
    out.push('{')
    let first = true
    for (const k of Object.keys(v)) {
      out.push(first ? '' : ', ', pyString(k), ': ')
      first = false
      write((v as Record<string, PyValue>)[k], out, depth + 1)
    }
    out.push('}')
  } else {
    throw new PyJsonError(`${describe(v)} is not JSON-representable`)
  }
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
  const v = p.value(0)
  p.ws()
  if (p.i !== text.length) p.fail('extra data')
  return v
}

class Parser {
  i = 0
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

  value(depth: number): PyValue {
    if (depth > MAX_DEPTH) this.fail(`nesting deeper than ${MAX_DEPTH}`)
    const s = this.s
    const c = s[this.i]
    switch (c) {
      case '{':
        return this.object(depth)
      case '[':
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
    const re = /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/y
    re.lastIndex = this.i
    const m = re.exec(this.s)
    if (!m) return this.fail('invalid number')
    this.i = re.lastIndex
    const raw = m[0]
    if (m[2] === undefined && m[3] === undefined) {
      const n = Number(raw)
      return Number.isSafeInteger(n) ? n : BigInt(raw)
    }
    const f = Number(raw)
    return Number.isInteger(f) ? new PyFloat(f) : f
  }

  string(): string {
    const s = this.s
    const start = ++this.i
    const close = s.indexOf('"', start)
    if (close < 0) this.fail('unterminated string')
    const slice = s.slice(start, close)
    if (!slice.includes('\\') && !/[\x00-\x1f]/.test(slice)) {
      this.i = close + 1
      return slice
    }
    let out = ''
    let i = start
    for (;;) {
      const c = s.charCodeAt(i)
      if (Number.isNaN(c)) {
        this.i = i
        this.fail('unterminated string')
      }
      if (c === 0x22) break
      if (c < 0x20) {
        this.i = i
        this.fail('invalid control character in string')
      }
      if (c !== 0x5c) {
        out += s[i]
        i++
        continue
      }
      const e = s[i + 1]
      i += 2
      switch (e) {
        case '"': out += '"'; break
        case '\\': out += '\\'; break
        case '/': out += '/'; break
        case 'b': out += '\b'; break
        case 'f': out += '\f'; break
        case 'n': out += '\n'; break
        case 'r': out += '\r'; break
        case 't': out += '\t'; break
        case 'u': {
          const hex = s.slice(i, i + 4)
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) {
            this.i = i
            this.fail('invalid \\u escape')
          }
          out += String.fromCharCode(parseInt(hex, 16))
          i += 4
          break
        }
        default:
          this.i = i - 1
          this.fail('invalid escape')
      }
    }
    this.i = i + 1
    return out
  }

  array(depth: number): PyValue[] {
    this.i++
    const out: PyValue[] = []
    this.ws()
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
