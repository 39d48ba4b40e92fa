/**
 * A byte-level check that a line is one JSON value as Python's json.loads reads it (NaN,
 * Infinity and -Infinity included), without building it. Verify uses it so that it never
 * allocates a record's strings; restore still decodes the records it keeps.
 */

const WS = new Uint8Array(256)
for (const c of [0x20, 0x09, 0x0a, 0x0d]) WS[c] = 1
const ESC = new Uint8Array(256)
for (const c of '"\\/bfnrt') ESC[c.charCodeAt(0)] = 1
const HEX = new Uint8Array(256)
for (const c of '0123456789abcdefABCDEF') HEX[c.charCodeAt(0)] = 1
/** Bytes that end a run of plain string content: quote, backslash, control characters. */
const STOP = new Uint8Array(256)
for (let c = 0; c < 0x20; c++) STOP[c] = 1
STOP[0x22] = 1
STOP[0x5c] = 1

const enum S {
  Value,
  After,
  ObjFirst,
  ObjKey,
  ArrFirst,
}

export const MAX_SCAN_DEPTH = 100_000

/** True when `b[start, end)` holds exactly one valid JSON value (surrounding whitespace allowed). */
export function isJsonValue(b: Uint8Array, start = 0, end = b.length): boolean {
  const stack = new Uint8Array(64)
  let stackBuf = stack
  let depth = 0
  let i = start
  let s = S.Value
  for (;;) {
    while (i < end && WS[b[i]!]) i++
    if (s === S.After) {
      if (depth === 0) return i === end
      if (i >= end) return false
      const c = b[i++]
      const inObj = stackBuf[depth - 1] === 1
      if (c === 0x2c) s = inObj ? S.ObjKey : S.Value
      else if (c === (inObj ? 0x7d : 0x5d)) depth--
      else return false
      continue
    }
    if (i >= end) return false
    let c = b[i]!
    if (s === S.ObjFirst || s === S.ObjKey) {
      if (s === S.ObjFirst && c === 0x7d) {
        i++
        depth--
        s = S.After
        continue
      }
      if (c !== 0x22) return false
      i = scanString(b, i + 1, end)
      if (i < 0) return false
      while (i < end && WS[b[i]!]) i++
      if (b[i] !== 0x3a) return false
      i++
      s = S.Value
      continue
    }
    if (s === S.ArrFirst && c === 0x5d) {
      i++
      depth--
      s = S.After
      continue
    }
    // A value.
    if (c === 0x7b || c === 0x5b) {
      if (depth === stackBuf.length) {
        if (depth >= MAX_SCAN_DEPTH) return false
        const grown = new Uint8Array(depth * 2)
        grown.set(stackBuf)
        stackBuf = grown
      }
      stackBuf[depth++] = c === 0x7b ? 1 : 0
      i++
      s = c === 0x7b ? S.ObjFirst : S.ArrFirst
      continue
    }
    if (c === 0x22) i = scanString(b, i + 1, end)
    else if (c === 0x74) i = word(b, i, end, 'true')
    else if (c === 0x66) i = word(b, i, end, 'false')
    else if (c === 0x6e) i = word(b, i, end, 'null')
    else if (c === 0x4e) i = word(b, i, end, 'NaN')
    else if (c === 0x49) i = word(b, i, end, 'Infinity')
    else if (c === 0x2d && b[i + 1] === 0x49) i = word(b, i + 1, end, 'Infinity')
    else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?
      if (c === 0x2d) c = b[++i]!
      if (c === 0x30) i++
      else if (c >= 0x31 && c <= 0x39) while (i < end && b[i]! >= 0x30 && b[i]! <= 0x39) i++
      else return false
      if (b[i] === 0x2e) {
        const d = ++i
        while (i < end && b[i]! >= 0x30 && b[i]! <= 0x39) i++
        if (i === d) return false
      }
      if (b[i] === 0x65 || b[i] === 0x45) {
        i++
        if (b[i] === 0x2b || b[i] === 0x2d) i++
        const d = i
        while (i < end && b[i]! >= 0x30 && b[i]! <= 0x39) i++
        if (i === d) return false
      }
    } else return false
    if (i < 0) return false
    s = S.After
  }
}

/** Scans string content after its opening quote; returns the index past the closing quote, or -1. */
function scanString(b: Uint8Array, i: number, end: number): number {
  for (;;) {
    while (i < end && !STOP[b[i]!]) i++
    if (i >= end) return -1
    const c = b[i]!
    if (c === 0x22) return i + 1
    if (c !== 0x5c) return -1
    const e = b[i + 1]
    if (e === undefined || i + 1 >= end) return -1
    if (e === 0x75) {
      if (i + 6 > end || !HEX[b[i + 2]!] || !HEX[b[i + 3]!] || !HEX[b[i + 4]!] || !HEX[b[i + 5]!]) return -1
      i += 6
    } else if (ESC[e]) i += 2
    else return -1
  }
}

function word(b: Uint8Array, i: number, end: number, w: string): number {
  if (i + w.length > end) return -1
  for (let k = 0; k < w.length; k++) if (b[i + k] !== w.charCodeAt(k)) return -1
  return i + w.length
}

const EPISODE_PREFIX = /^\{"episode_id": \{"rollout_id": "([A-Za-z0-9][A-Za-z0-9._-]*)", "attempt": (0|[1-9][0-9]{0,14})\}[,}]/
const EPISODE_KEY = Buffer.from('"episode_id"')

/**
 * The episode of a record written the way Python (and gymckpt) write them: `episode_id` first.
 * Null when the line does not start that way or names `episode_id` twice (Python keeps the
 * last one): the caller then decodes the line.
 */
export function episodeFromPrefix(line: Buffer): {rolloutId: string; attempt: number} | null {
  const head = line.toString('latin1', 0, Math.min(line.length, 256))
  const m = EPISODE_PREFIX.exec(head)
  if (!m) return null
  if (line.indexOf(EPISODE_KEY, m[0].length) >= 0) return null
  return {rolloutId: m[1]!, attempt: Number(m[2])}
}
