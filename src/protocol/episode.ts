export type {EpisodeIdWire} from './episode-schema.js'
import type {EpisodeIdWire} from './episode-schema.js'

/** Pattern Gym applies to checkpoint IDs, rollout IDs, kinds and instance names. */
export const SAFE_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]*$/
/** The reserved attempt suffix: an ID ending in it would make capture keys ambiguous. */
export const RESERVED_SUFFIX = /-a([1-9][0-9]*)$/

export const ROLLOUT_ID_PATTERN_MESSAGE = 'rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$'
export const ROLLOUT_ID_SUFFIX_MESSAGE = 'rollout ID must not end with the reserved attempt suffix -a<N>'
/** zod's own words for `.min(1)` on a string: the first issue RolloutIdSchema reports for ''. */
const ROLLOUT_ID_EMPTY_MESSAGE = 'Too small: expected string to have >=1 characters'

/** The message of the first issue RolloutIdSchema (episode-schema.ts) reports for `id`, or null when it accepts it. */
export function rolloutIdIssue(id: string): string | null {
  if (id.length < 1) return ROLLOUT_ID_EMPTY_MESSAGE
  if (!SAFE_ID_PATTERN.test(id)) return ROLLOUT_ID_PATTERN_MESSAGE
  if (RESERVED_SUFFIX.test(id)) return ROLLOUT_ID_SUFFIX_MESSAGE
  return null
}

/**
 * What EpisodeIdWire.safeParse(v) gives, without zod: its output, or null when it refuses `v`. An
 * object with only rollout_id (a valid rollout ID) and attempt (absent or undefined: 0; else a safe
 * integer >= 0). The keys are walked as zod walks them (for…in), so inherited ones count too.
 */
export function wireEpisode(v: unknown): EpisodeIdWire | null {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return null
  for (const k in v) if (k !== 'rollout_id' && k !== 'attempt') return null
  const o = v as Record<string, unknown>
  const id = o.rollout_id
  if (typeof id !== 'string' || rolloutIdIssue(id) !== null) return null
  const a = o.attempt
  if (a === undefined) return {rollout_id: id, attempt: 0}
  if (typeof a !== 'number' || !Number.isSafeInteger(a) || a < 0) return null
  return {rollout_id: id, attempt: a}
}

export interface EpisodeId {
  readonly rolloutId: string
  readonly attempt: number
}

export class InvalidEpisodeError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'InvalidEpisodeError'
  }
}

export function episode(rolloutId: string, attempt = 0): EpisodeId {
  // The scope math parses every reported restart (10,000 at a time): the common case first.
  if (SAFE_ID_PATTERN.test(rolloutId) && !RESERVED_SUFFIX.test(rolloutId) && Number.isSafeInteger(attempt) && attempt >= 0) return {rolloutId, attempt}
  const issue = rolloutIdIssue(rolloutId)
  if (issue !== null) throw new InvalidEpisodeError(`invalid rollout ID '${rolloutId}': ${issue}`)
  if (!Number.isSafeInteger(attempt) || attempt < 0) throw new InvalidEpisodeError(`invalid attempt ${attempt} for rollout '${rolloutId}'`)
  return {rolloutId, attempt}
}

/** `r` for the first attempt, `r-aN` after N restores or retries. */
export function captureKey(e: EpisodeId): string {
  return e.attempt === 0 ? e.rolloutId : `${e.rolloutId}-a${e.attempt}`
}

/** Inverse of captureKey; throws InvalidEpisodeError for a key that names no valid episode. */
export function fromCaptureKey(key: string): EpisodeId {
  const m = RESERVED_SUFFIX.exec(key)
  if (m) return episode(key.slice(0, m.index), Number(m[1]))
  return episode(key, 0)
}

export function nextAttempt(e: EpisodeId): EpisodeId {
  return {rolloutId: e.rolloutId, attempt: e.attempt + 1}
}

export function toWire(e: EpisodeId): EpisodeIdWire {
  return {rollout_id: e.rolloutId, attempt: e.attempt}
}

export function fromWire(w: EpisodeIdWire): EpisodeId {
  return {rolloutId: w.rollout_id, attempt: w.attempt}
}

export function sameEpisode(a: EpisodeId, b: EpisodeId): boolean {
  return a.rolloutId === b.rolloutId && a.attempt === b.attempt
}

/** Sorted, de-duplicated capture keys: the form in which Gym compares scopes. */
export function sortedKeys(episodes: Iterable<EpisodeId>): string[] {
  return [...new Set([...episodes].map(captureKey))].sort()
}

/** The largest attempt an operator may name (int32): anything larger is a typo, not a real retry count. */
export const MAX_ATTEMPT = 2 ** 31 - 1
/** Quoted input is cut to this many characters: a 24 MB line is never echoed whole. */
export const QUOTE_MAX = 200

// C0/C1 controls, line/paragraph separators, bidi overrides and BOM: shown escaped so a quoted
// input cannot move the cursor, recolour or reorder the operator's terminal.
const UNSAFE_CHAR = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]/

/**
 * Input as an error message shows it: control characters escaped, cut to about `max` characters
 * (never inside a surrogate pair) with the full length named. quoteInput adds the quotes.
 */
export function clipInput(s: string, max = QUOTE_MAX): string {
  const [body, rest] = clip(s, max)
  return body + rest
}

/** Input quoted for an error message: `'…'`, clipped and escaped as clipInput does. */
export function quoteInput(s: string, max = QUOTE_MAX): string {
  const [body, rest] = clip(s, max)
  return `'${body}'${rest}`
}

const NAMED_ESCAPES: Record<string, string> = {'\n': '\\n', '\r': '\\r', '\t': '\\t'}

function clip(s: string, max: number): [body: string, rest: string] {
  let out = ''
  let i = 0
  while (i < s.length && out.length < max) {
    const cp = s.codePointAt(i)!
    const ch = String.fromCodePoint(cp)
    if (UNSAFE_CHAR.test(ch)) out += NAMED_ESCAPES[ch] ?? (cp <= 0xff ? `\\x${cp.toString(16).padStart(2, '0')}` : `\\u${cp.toString(16).padStart(4, '0')}`)
    else out += ch
    i += ch.length
  }
  return i < s.length ? [`${out}…`, ` (${s.length} characters in all)`] : [out, '']
}

/** Why `id` is not a rollout ID an operator may name (Gym's pattern, no -a<N> suffix), or null. */
export function rolloutIdProblem(id: string): string | null {
  if (id === '') return 'the rollout ID is empty'
  if (!SAFE_ID_PATTERN.test(id)) return 'a rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$'
  if (RESERVED_SUFFIX.test(id)) return 'a rollout ID must not end with the reserved attempt suffix -a<N>'
  return null
}

function typeName(v: unknown): string {
  if (v === null) return 'null'
  if (Array.isArray(v)) return 'an array'
  return typeof v === 'object' ? 'an object' : `a ${typeof v}`
}

function checkedAttempt(n: number, shown: string): number {
  if (n > MAX_ATTEMPT) throw new InvalidEpisodeError(`${shown}: attempt ${n} is beyond the largest attempt, ${MAX_ATTEMPT}`)
  return n
}

function checkedRollout(id: string, shown: string, named: boolean): string {
  const problem = rolloutIdProblem(id)
  if (problem) throw new InvalidEpisodeError(named ? `${shown}: rollout ID ${quoteInput(id)}: ${problem}` : `${shown}: ${problem}`)
  return id
}

const EPISODE_KEYS = new Set(['rollout_id', 'attempt'])

/** An episode object as an operator writes it; `shown` is how the error messages quote it. */
function parseEpisodeObject(raw: object, shown: string): EpisodeId {
  const not = (why: string) => new InvalidEpisodeError(`${shown}: not an episode: ${why}`)
  const obj = raw as Record<string, unknown>
  const unknown = Object.keys(obj).filter((k) => !EPISODE_KEYS.has(k))
  if (unknown.length) throw not(`unknown key ${quoteInput(unknown[0]!)} (an episode object has only "rollout_id" and "attempt")`)
  if (!('rollout_id' in obj)) throw not('"rollout_id" is missing')
  const id = obj.rollout_id
  if (typeof id !== 'string') throw not(`"rollout_id" must be a string, not ${typeName(id)}`)
  const problem = rolloutIdProblem(id)
  if (problem) throw not(`rollout_id ${quoteInput(id)}: ${problem}`)
  const a = obj.attempt === undefined ? 0 : obj.attempt
  if (typeof a !== 'number') throw not(`"attempt" must be a non-negative integer, not ${typeName(a)}`)
  if (!Number.isInteger(a) || a < 0) throw not(`"attempt" must be a non-negative integer, not ${a}`)
  return {rolloutId: id, attempt: checkedAttempt(a, shown)}
}

/**
 * Parses one episode as an operator names it: a line of an episodes file or an `--episode` value.
 * A capture key (`r`, `r-a2`), `rollout@attempt`, or a JSON object `{"rollout_id": …, "attempt": …}`
 * on one line. Messages start with the quoted (and clipped) input.
 */
export function parseEpisodeToken(token: string): EpisodeId {
  const t = token.trim()
  const shown = quoteInput(t)
  if (t === '') throw new InvalidEpisodeError(`${shown}: an empty episode`)
  if (t.startsWith('{')) {
    let raw: unknown
    try {
      raw = JSON.parse(t)
    } catch (err) {
      throw new InvalidEpisodeError(`${shown}: not valid JSON (${clipInput((err as Error).message)}); an episode object must fit on one line`)
    }
    return parseEpisodeObject(raw as object, shown)
  }
  const at = t.lastIndexOf('@')
  if (at >= 0) {
    const attempt = t.slice(at + 1)
    if (!/^(0|[1-9][0-9]*)$/.test(attempt)) {
      const why = /^[0-9]+$/.test(attempt) ? 'has a leading zero' : 'is not a non-negative integer'
      throw new InvalidEpisodeError(`${shown}: attempt ${quoteInput(attempt)} ${why}`)
    }
    return {rolloutId: checkedRollout(t.slice(0, at), shown, true), attempt: checkedAttempt(Number(attempt), shown)}
  }
  const m = RESERVED_SUFFIX.exec(t)
  if (m) return {rolloutId: checkedRollout(t.slice(0, m.index), shown, true), attempt: checkedAttempt(Number(m[1]), shown)}
  return {rolloutId: checkedRollout(t, shown, false), attempt: 0}
}

/**
 * Parses one item of a JSON array of episodes: a string in any form parseEpisodeToken takes
 * except an embedded JSON object, or an episode object. Everything else is refused.
 */
export function parseEpisodeValue(v: unknown): EpisodeId {
  if (typeof v === 'string') {
    if (v.trim().startsWith('{')) throw new InvalidEpisodeError(`${quoteInput(v)}: a JSON object inside a string; write the object itself`)
    return parseEpisodeToken(v)
  }
  if (v !== null && typeof v === 'object' && !Array.isArray(v)) return parseEpisodeObject(v, quoteInput(JSON.stringify(v)))
  throw new InvalidEpisodeError(`${quoteInput(String(JSON.stringify(v)))}: not an episode: expected a string (r, r-a2 or r@2) or an object {"rollout_id", "attempt"}, not ${typeName(v)}`)
}
