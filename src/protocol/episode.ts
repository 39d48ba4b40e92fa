import {z} from 'zod'

/** Pattern Gym applies to checkpoint IDs, rollout IDs, kinds and instance names. */
export const SAFE_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]*$/
/** The reserved attempt suffix: an ID ending in it would make capture keys ambiguous. */
export const RESERVED_SUFFIX = /-a([1-9][0-9]*)$/

export const RolloutIdSchema = z
  .string()
  .min(1)
  .regex(SAFE_ID_PATTERN, 'rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$')
  .refine((id) => !RESERVED_SUFFIX.test(id), {
    message: 'rollout ID must not end with the reserved attempt suffix -a<N>',
  })

/** EpisodeId exactly as it travels on the wire. */
export const EpisodeIdWire = z.strictObject({
  rollout_id: RolloutIdSchema,
  attempt: z.number().int().min(0).default(0),
})
export type EpisodeIdWire = z.output<typeof EpisodeIdWire>

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
  const parsed = RolloutIdSchema.safeParse(rolloutId)
  if (!parsed.success) throw new InvalidEpisodeError(`invalid rollout ID '${rolloutId}': ${parsed.error.issues[0]?.message}`)
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

/**
 * Parses one line of an episodes file: a capture key (`r`, `r-a2`), `rollout@attempt`, or a JSON
 * object `{"rollout_id": …, "attempt": …}`.
 */
export function parseEpisodeToken(token: string): EpisodeId {
  const t = token.trim()
  if (t.startsWith('{')) {
    let raw: unknown
    try {
      raw = JSON.parse(t)
    } catch {
      throw new InvalidEpisodeError(`'${t}' is not valid JSON`)
    }
    const parsed = EpisodeIdWire.safeParse(raw)
    if (!parsed.success) throw new InvalidEpisodeError(`'${t}' is not an episode: ${parsed.error.issues[0]?.message}`)
    return fromWire(parsed.data)
  }
  const at = t.lastIndexOf('@')
  if (at > 0) {
    const attempt = t.slice(at + 1)
    if (!/^(0|[1-9][0-9]*)$/.test(attempt)) throw new InvalidEpisodeError(`'${t}': attempt '${attempt}' is not a non-negative integer`)
    return episode(t.slice(0, at), Number(attempt))
  }
  return fromCaptureKey(t)
}
