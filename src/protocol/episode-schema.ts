import {z} from 'zod'

import {RESERVED_SUFFIX, ROLLOUT_ID_PATTERN_MESSAGE, ROLLOUT_ID_SUFFIX_MESSAGE, SAFE_ID_PATTERN} from './episode.js'

// The zod schemas of EpisodeId on the wire, apart from episode.ts so that reading a checkpoint
// (verify, restore's decode) does not load zod: episode.ts's wireEpisode and rolloutIdIssue give
// the same answers without it, and test/unit/manifest-fast-check.test.ts holds them to these.

export const RolloutIdSchema = z
  .string()
  .min(1)
  .regex(SAFE_ID_PATTERN, ROLLOUT_ID_PATTERN_MESSAGE)
  .refine((id) => !RESERVED_SUFFIX.test(id), {message: ROLLOUT_ID_SUFFIX_MESSAGE})

/** EpisodeId exactly as it travels on the wire. */
export const EpisodeIdWire = z.strictObject({
  rollout_id: RolloutIdSchema,
  attempt: z.number().int().min(0).default(0),
})
export type EpisodeIdWire = z.output<typeof EpisodeIdWire>
