/**
 * A byte-level check that a line is one JSON value as Python's json.loads reads it (NaN,
 * Infinity and -Infinity included) and valid UTF-8, without building it. Verify and restore use it
 * for every record they do not decode, so they never allocate those records' strings; it streams,
 * so a record far larger than a read buffer is checked without ever being held whole.
 */

import {MAX_NESTING} from './pyjson.js'

const enum S {
  Value,
  After,
  ObjFirst,
  ObjKey,
  Colon,
  ArrFirst,
}

/** Why a scan failed. */
export const enum ScanError {
  None = 0,
  Json = 1,
  Utf8 = 2,
  /** Nested deeper than MAX_NESTING (as the exact reader refuses it). */
  Depth = 3,
}

const WS = new Uint8Array(256)
for (const c of [0x20, 0x09, 0x0a, 0x0d]) WS[c] = 1
const DIGIT = new Uint8Array(256)
for (let c = 0x30; c <= 0x39; c++) DIGIT[c] = 1
const ESC = new Uint8Array(256)
for (const c of '"\\/bfnrt') ESC[c.charCodeAt(0)] = 1
const HEX = new Uint8Array(256)
for (const c of '0123456789abcdefABCDEF') HEX[c.charCodeAt(0)] = 1
/** Bytes that end a run of plain string content: controls, quote, backslash, non-ASCII. */
const STOP = new Uint8Array(256)
for (let c = 0; c < 0x20; c++) STOP[c] = 1
for (let c = 0x80; c < 0x100; c++) STOP[c] = 1
STOP[0x22] = 1
STOP[0x5c] = 1

export {MAX_NESTING}

const EPISODE_ID = Buffer.from('episode_id')

/**
 * Checks one JSON value fed in pieces: `feed` each piece of the line in order, then read
 * `error` and `complete`. A piece may end anywhere, inside a string, a number or a UTF-8 sequence:
 * feed returns how far it consumed, and the bytes from there on (a few: a partial token) must be
 * fed again at the front of the next piece. Also counts the line's top-level keys that are
 * `episode_id` (Python keeps the last of repeated keys, so a caller reading the first key off the
 * line start must decode a line that repeats it).
 */
export class JsonScanner {
  error: ScanError = ScanError.None
  /** Top-level keys that are `episode_id`, however spelled (escapes are decoded to compare). */
  episodeKeys = 0
  private stack = new Uint8Array(64)
  private depth = 0
  private s: S = S.Value
  private inString = false
  private isKey = false
  private keyStart = -1
  private keyEscaped = false
  private done = false

  reset(): this {
    this.error = ScanError.None
    this.episodeKeys = 0
    this.depth = 0
    this.s = S.Value
    this.inString = false
    this.isKey = false
    this.keyStart = -1
    this.done = false
    return this
  }

  /** True once a whole value has been read and nothing but whitespace followed it. */
  get complete(): boolean {
    return this.error === ScanError.None && this.done && !this.inString
  }

  /**
   * Scans `b[i, end)`. `last` says the value ends at `end` (the line's end). Returns the index up
   * to which the bytes are consumed: `end`, or the start of a token cut by `end` (only when not
   * `last`). On a failure `error` is set and the return value is meaningless.
   */
  feed(b: Uint8Array, i: number, end: number, last: boolean): number {
    let s = this.s
    let depth = this.depth
    let stack = this.stack
    let c: number
    const dv = new DataView(b.buffer, b.byteOffset, b.byteLength)
    for (;;) {
      if (this.inString) {
        // Plain content runs to the next quote, backslash, control or non-ASCII byte.
        for (;;) {
          i = skipPlain(b, dv, i, end)
          if (i >= end) return this.cutInString(end, depth, last)
          c = b[i]!
          if (c === 0x22) break
          if (c === 0x5c) {
            if (i + 1 >= end) return this.cutInString(i, depth, last)
            const e = b[i + 1]!
            if (e === 0x75) {
              if (i + 6 > end) return this.cutInString(i, depth, last)
              if (!HEX[b[i + 2]!] || !HEX[b[i + 3]!] || !HEX[b[i + 4]!] || !HEX[b[i + 5]!]) return this.fail()
              i += 6
            } else if (ESC[e]) i += 2
            else return this.fail()
            this.keyEscaped = true
            continue
          }
          if (c < 0x80) return this.fail()
          // A UTF-8 sequence: its length and the range its second byte must fall in.
          const n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2
          if (i + n > end) {
            if (last) return this.fail(ScanError.Utf8)
            return this.cutInString(i, depth, last)
          }
          const c1 = b[i + 1]!
          let ok: boolean
          if (c < 0xc2 || c > 0xf4) ok = false
          else if (n === 2) ok = c1 >= 0x80 && c1 <= 0xbf
          else if (n === 3) ok = (c === 0xe0 ? c1 >= 0xa0 : c === 0xed ? c1 >= 0x80 && c1 <= 0x9f : c1 >= 0x80) && c1 <= (c === 0xed ? 0x9f : 0xbf) && (b[i + 2]! & 0xc0) === 0x80
          else ok = (c === 0xf0 ? c1 >= 0x90 : c1 >= 0x80) && c1 <= (c === 0xf4 ? 0x8f : 0xbf) && (b[i + 2]! & 0xc0) === 0x80 && (b[i + 3]! & 0xc0) === 0x80
          if (!ok) return this.fail(ScanError.Utf8)
          i += n
        }
        // The closing quote.
        if (this.isKey) {
          if (depth === 1 && isEpisodeKey(b, this.keyStart, i, this.keyEscaped)) this.episodeKeys++
          this.isKey = false
          s = S.Colon
        } else s = S.After
        this.inString = false
        i++
      }
      while (i < end && WS[b[i]!] === 1) i++
      if (i >= end) {
        this.s = s
        this.depth = depth
        if (last && !(s === S.After && depth === 0)) return this.fail()
        this.done = s === S.After && depth === 0
        return end
      }
      c = b[i]!
      if (s === S.After) {
        if (depth === 0) return this.fail()
        const inObj = stack[depth - 1] === 1
        if (c === 0x2c) s = inObj ? S.ObjKey : S.Value
        else if (c === (inObj ? 0x7d : 0x5d)) depth--
        else return this.fail()
        i++
        continue
      }
      if (s === S.Colon) {
        if (c !== 0x3a) return this.fail()
        i++
        s = S.Value
        continue
      }
      if (s === S.ObjFirst || s === S.ObjKey) {
        if (s === S.ObjFirst && c === 0x7d) {
          i++
          depth--
          s = S.After
          continue
        }
        if (c !== 0x22) return this.fail()
        i++
        this.inString = true
        this.isKey = true
        this.keyStart = i
        this.keyEscaped = false
        this.s = s
        this.depth = depth
        continue
      }
      if (s === S.ArrFirst && c === 0x5d) {
        i++
        depth--
        s = S.After
        continue
      }
      // A value. Numbers first: most of a record's tokens are.
      if (DIGIT[c] === 1 || c === 0x2d) {
        let start = i
        if (c === 0x2d && i + 1 < end && b[i + 1] === 0x49) {
          const j = this.word(b, i + 1, end, WORD_INFINITY)
          if (j === -1) return this.fail()
          if (j === -2) return last ? this.fail() : this.cutToken(start, s, depth)
          i = j
          s = S.After
          continue
        }
        i = scanNumber(b, dv, i, end)
        if (i === -1) return this.fail()
        if (i >= end) {
          // A number cut by the end of a piece may go on in the next one.
          if (!last) return this.cutToken(start, s, depth)
          if (!numberEnds(b, start, end)) return this.fail()
        } else if (depth > 0 && stack[depth - 1] === 0) {
          // More numbers in this array (token ids, logprobs): read them without the state machine.
          let other = false
          while (b[i] === 0x2c) {
            let j = i + 1
            while (j < end && WS[b[j]!] === 1) j++
            if (j >= end) break
            c = b[j]!
            if (DIGIT[c] !== 1 && (c !== 0x2d || j + 1 >= end || b[j + 1] === 0x49)) {
              // Some other value after the comma.
              i = j
              other = true
              break
            }
            start = j
            i = scanNumber(b, dv, j, end)
            if (i === -1) return this.fail()
            if (i >= end) {
              if (!last) return this.cutToken(start, S.Value, depth)
              if (!numberEnds(b, start, end)) return this.fail()
              break
            }
          }
          if (other) {
            s = S.Value
            continue
          }
        }
        s = S.After
        continue
      }
      if (c === 0x22) {
        i++
        this.inString = true
        this.s = s = S.After
        this.depth = depth
        continue
      }
      if (c === 0x7b || c === 0x5b) {
        if (depth === stack.length) {
          if (depth >= MAX_NESTING) return this.fail(ScanError.Depth)
          const grown = new Uint8Array(Math.min(depth * 2, MAX_NESTING))
          grown.set(stack)
          this.stack = stack = grown
        }
        stack[depth++] = c === 0x7b ? 1 : 0
        i++
        s = c === 0x7b ? S.ObjFirst : S.ArrFirst
        continue
      }
      if (c >= 0x80) return this.fail(ScanError.Json)
      const w = c === 0x74 ? WORD_TRUE : c === 0x66 ? WORD_FALSE : c === 0x6e ? WORD_NULL : c === 0x4e ? WORD_NAN : c === 0x49 ? WORD_INFINITY : null
      if (w === null) return this.fail()
      const j = this.word(b, i, end, w)
      if (j === -1) return this.fail()
      if (j === -2) return last ? this.fail() : this.cutToken(i, s, depth)
      i = j
      s = S.After
    }
  }

  /** -1: not the word; -2: cut by `end`; else the index past it. */
  private word(b: Uint8Array, i: number, end: number, w: Uint8Array): number {
    const n = w.length
    for (let k = 0; k < n; k++) {
      if (i + k >= end) return -2
      if (b[i + k] !== w[k]) return -1
    }
    return i + n
  }

  private fail(e: ScanError = ScanError.Json): number {
    this.error = e
    return -1
  }

  /** A token starting at `at` was cut: resume there with the state before it. */
  private cutToken(at: number, s: S, depth: number): number {
    this.s = s
    this.depth = depth
    return at
  }

  /**
   * The end of a piece inside a string (or inside an escape or a UTF-8 sequence starting at `at`):
   * the next piece goes on from `at`. A top-level key is cut whole instead, to be read again in
   * one piece, so that it can always be compared with episode_id.
   */
  private cutInString(at: number, depth: number, last: boolean): number {
    if (last) return this.fail()
    if (this.isKey && depth === 1) {
      this.inString = false
      this.isKey = false
      return this.cutToken(this.keyStart - 1, S.ObjKey, depth)
    }
    return at
  }
}

/** Whether the top-level key b[start, end) (between its quotes) is episode_id. */
function isEpisodeKey(b: Uint8Array, start: number, end: number, escaped: boolean): boolean {
  if (!escaped) return end - start === 10 && EPISODE_ID.compare(b, start, end) === 0
  // Spelled with escapes: decoded (it is whole and valid here), then compared.
  return JSON.parse(Buffer.from(b.buffer, b.byteOffset + start - 1, end - start + 2).toString('utf8')) === 'episode_id'
}

// Four bytes at a time (SWAR): the lowest byte flagged in each mask is exact (a borrow or carry
// only corrupts the bytes above a flagged one), and the little-endian read puts the first byte lowest.

/** The index of the first quote, backslash, control or non-ASCII byte in b[i, end), or end. */
function skipPlain(b: Uint8Array, dv: DataView, i: number, end: number): number {
  while (i + 4 <= end) {
    // Int32 arithmetic throughout (`| 0`): the JIT then never checks for overflow.
    const w = dv.getInt32(i, true)
    const q = w ^ 0x22222222
    const k = w ^ 0x5c5c5c5c
    const m = ((((q - 0x01010101) | 0) & ~q) | (((k - 0x01010101) | 0) & ~k) | (((w - 0x20202020) | 0) & ~w) | w) & 0x80808080
    if (m !== 0) return i + ((31 - Math.clz32(m & -m)) >> 3)
    i += 4
  }
  while (i < end && STOP[b[i]!] === 0) i++
  return i
}

/**
 * Past a number starting at b[i] (`-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`), or -1. A
 * number reaching `end` may be cut: the caller decides.
 */
function scanNumber(b: Uint8Array, dv: DataView, i: number, end: number): number {
  let c = b[i]!
  if (c === 0x2d) {
    if (++i >= end) return end
    c = b[i]!
  }
  if (c === 0x30) i++
  else if (DIGIT[c] === 1) i = skipDigits(b, dv, i + 1, end)
  else return -1
  if (i < end && b[i] === 0x2e) {
    const d = ++i
    i = skipDigits(b, dv, i, end)
    if (i === d && i < end) return -1
  }
  if (i < end && (b[i] === 0x65 || b[i] === 0x45)) {
    i++
    if (i < end && (b[i] === 0x2b || b[i] === 0x2d)) i++
    const d = i
    i = skipDigits(b, dv, i, end)
    if (i === d && i < end) return -1
  }
  return i
}

/** The index of the first byte that is not a digit in b[i, end), or end. */
function skipDigits(b: Uint8Array, dv: DataView, i: number, end: number): number {
  while (i + 4 <= end) {
    const w = dv.getInt32(i, true)
    const m = ((w + 0x46464646) | 0 | ((w - 0x30303030) | 0)) & 0x80808080
    if (m !== 0) return i + ((31 - Math.clz32(m & -m)) >> 3)
    i += 4
  }
  while (i < end && DIGIT[b[i]!] === 1) i++
  return i
}

const WORD_TRUE = Buffer.from('true')
const WORD_FALSE = Buffer.from('false')
const WORD_NULL = Buffer.from('null')
const WORD_NAN = Buffer.from('NaN')
const WORD_INFINITY = Buffer.from('Infinity')

/** A number that runs to the end of the line: its last part must have its digits. */
function numberEnds(b: Uint8Array, start: number, end: number): boolean {
  const c = b[end - 1]!
  return DIGIT[c] === 1 && !(end - start === 1 && b[start] === 0x2d)
}

const shared = new JsonScanner()

/** True when `b[start, end)` holds exactly one valid JSON value (surrounding whitespace allowed) in valid UTF-8. */
export function isJsonValue(b: Uint8Array, start = 0, end = b.length): boolean {
  const s = shared.reset()
  s.feed(b, start, end, true)
  return s.complete
}

const EPISODE_PREFIX = /^\{"episode_id": \{"rollout_id": "([A-Za-z0-9][A-Za-z0-9._-]*)", "attempt": (0|[1-9][0-9]{0,14})\}[,}]/

/** How many bytes of a line's start episodeFromPrefix needs at most. */
export const PREFIX_BYTES = 256

/**
 * The episode of a record written the way Python (and gymckpt) write them: `episode_id` first.
 * Null when the line does not start that way: the caller then decodes the line. With `whole`
 * (the default), also null when the line names `episode_id` again (Python keeps the last one); a
 * caller that streams the line checks that with JsonScanner.episodeKeys instead.
 */
export function episodeFromPrefix(line: Buffer, whole = true): {rolloutId: string; attempt: number} | null {
  const head = line.toString('latin1', 0, Math.min(line.length, PREFIX_BYTES))
  const m = EPISODE_PREFIX.exec(head)
  if (!m) return null
  if (whole && line.indexOf(EPISODE_KEY, m[0].length) >= 0) return null
  return {rolloutId: m[1]!, attempt: Number(m[2])}
}

const EPISODE_KEY = Buffer.from('"episode_id"')
