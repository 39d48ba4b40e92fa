import {z} from 'zod'

import {SAFE_ID_PATTERN} from '../protocol/episode.js'
import {EpisodeIdWire} from '../protocol/episode-schema.js'
import {ParticipantManifest} from '../protocol/wire.js'
import {FORMAT_VERSION} from './root.js'

// The authority on what a controller manifest and a Gym collection manifest are. Kept apart from
// root.ts so reading a checkpoint does not load zod: root.ts checks a manifest without zod first
// (controllerManifestFast, gymCollectionManifestFast) and imports this module only when that check
// is not certain; test/unit/manifest-fast-check.test.ts holds those checks to these schemas.

export const ControllerManifest = z.object({
  format_version: z.literal(FORMAT_VERSION),
  checkpoint_id: z.string().regex(SAFE_ID_PATTERN),
  created_at: z.number(),
  continued: z.array(EpisodeIdWire),
  restarted: z.array(EpisodeIdWire),
  participants: z.array(
    z.object({
      server: z.string(),
      kind: z.string(),
      instance: z.string(),
      manifest: ParticipantManifest,
      episode_ids: z.array(z.string()),
      /** The model's commit reply's staging_keys (reference 4.6), when it sent them. */
      staging_keys: z.array(z.string()).optional(),
    }),
  ),
  /** Opaque state the controller keeps with the checkpoint (the demo keeps completed results). */
  controller_state: z.unknown().optional(),
})
export type ControllerManifest = z.infer<typeof ControllerManifest>

export const GymCollectionManifest = z.looseObject({
  checkpoint_id: z.string(),
  run_id: z.string().optional(),
  created_at: z.number(),
  continued: z.array(EpisodeIdWire),
  restarted: z.array(EpisodeIdWire).default([]),
})
export type GymCollectionManifest = z.output<typeof GymCollectionManifest>

export function describeIssue(err: z.ZodError): string {
  const i = err.issues[0]
  return i ? `${i.path.join('.') || '(root)'}: ${i.message}` : 'invalid'
}
