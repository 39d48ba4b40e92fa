import {z} from 'zod'

import {SAFE_ID_PATTERN, fromCaptureKey, quoteInput} from './episode.js'
import {EpisodeIdWire} from './episode-schema.js'

export const CHECKPOINT_ROUTE_PREFIX = '/ng-control/v1/checkpoint'
export const OPERATIONS = ['prepare', 'renew', 'retire', 'forget', 'commit', 'restore', 'resume'] as const
export type Operation = (typeof OPERATIONS)[number]

export const KINDS = ['environment', 'model', 'agent', 'resources'] as const
export const Kind = z.enum(KINDS)
export type Kind = z.infer<typeof Kind>
export const PHASES = ['idle', 'preparing', 'prepared', 'committed', 'restored'] as const
export const Phase = z.enum(PHASES)
export type Phase = z.infer<typeof Phase>

/** Gym reports at most this many blockers; blocker_count carries the full number. */
export const MAX_REPORTED_BLOCKERS = 100

export const CheckpointId = z.string().min(1).max(128).regex(SAFE_ID_PATTERN, 'checkpoint ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ (at most 128 characters)')
export const DeadlineTs = z.number().refine(Number.isFinite, 'deadline_ts must be a finite epoch time in seconds')

// ---- requests: strict, exactly Gym's fields (Gym forbids unknown keys) ----

export const PrepareRequest = z.strictObject({checkpoint_id: CheckpointId, deadline_ts: DeadlineTs})
export const RenewRequest = PrepareRequest
export const ResumeRequest = PrepareRequest
export const RetireRequest = z.strictObject({
  checkpoint_id: CheckpointId,
  deadline_ts: DeadlineTs,
  episode_ids: z.array(EpisodeIdWire).min(1),
})
export const ForgetRequest = z.strictObject({
  checkpoint_id: CheckpointId,
  deadline_ts: DeadlineTs,
  rollout_ids: z.array(z.string().min(1).regex(SAFE_ID_PATTERN)).min(1),
})
export const CommitRequest = z.strictObject({
  checkpoint_id: CheckpointId,
  deadline_ts: DeadlineTs,
  checkpoint_dir: z.string().min(1),
  episode_ids: z.array(EpisodeIdWire).nullish(),
  stop: z.boolean().optional(),
})
export const RestoreRequest = z.strictObject({
  checkpoint_id: CheckpointId,
  deadline_ts: DeadlineTs,
  checkpoint_dir: z.string().min(1),
  episode_ids: z.array(EpisodeIdWire),
})
export type PrepareRequest = z.infer<typeof PrepareRequest>
export type RetireRequest = z.infer<typeof RetireRequest>
export type ForgetRequest = z.infer<typeof ForgetRequest>
export type CommitRequest = z.infer<typeof CommitRequest>
export type RestoreRequest = z.infer<typeof RestoreRequest>

export const REQUEST_SCHEMAS = {
  prepare: PrepareRequest,
  renew: RenewRequest,
  resume: ResumeRequest,
  retire: RetireRequest,
  forget: ForgetRequest,
  commit: CommitRequest,
  restore: RestoreRequest,
} as const satisfies Record<Operation, z.ZodType>

// ---- replies: tolerant (unknown fields kept, both retire/forget shapes accepted) ----

export const PrepareReport = z.looseObject({
  ready: z.boolean(),
  blockers: z.array(z.string()).default([]),
  blocker_count: z.number().int().min(0).optional(),
  counts: z.record(z.string(), z.number()).default({}),
  restarts: z.array(z.string()).default([]),
})
export type PrepareReport = z.infer<typeof PrepareReport>

export const StatusReply = z.looseObject({
  kind: z.string(),
  instance: z.string(),
  phase: z.string(),
  checkpoint_id: z.string().nullable().default(null),
  lease_expires_at: z.number().nullable().default(null),
  retired_rollouts: z.number().int().default(0),
  report: PrepareReport,
})
export type StatusReply = z.infer<typeof StatusReply>

/** Status extras listing restored state no replacement has claimed yet. */
export const RESTORED_LISTS = ['restored_pending', 'restored_generation_cuts'] as const

/**
 * The restored episodes a participant holds whose replacement has not started, as it reports them:
 * `restored_pending`, capture keys of the replacement attempts (reference 5.1: environment servers,
 * and multi-worker coordinators' unclaimed claim keys). The model's `restored_generation_cuts` is
 * left out: the reference does not say a cut goes once its replacement starts or ends, so a scope
 * that rightly leaves out a finished episode could be refused.
 */
export function pendingRestored(st: StatusReply): string[] {
  const v = (st as Record<string, unknown>).restored_pending
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : []
}

export const PrepareReply = z.looseObject({phase: z.string(), report: PrepareReport})
export type PrepareReply = z.infer<typeof PrepareReply>

export const ParticipantManifest = z.looseObject({
  schema_version: z.number(),
  kind: z.string(),
  instance: z.string(),
  checkpoint_id: z.string(),
  records_file: z.string(),
  records_sha256: z.string(),
  record_count: z.number().int(),
})
export type ParticipantManifest = z.infer<typeof ParticipantManifest>

export const CommitReply = z.looseObject({
  phase: z.string(),
  manifest: ParticipantManifest,
  episode_ids: z.array(z.string()).default([]),
  /**
   * The policy model's token-store keys that the checkpointed episodes still reference: the
   * training framework must keep them, or a restore of the model's generation cuts fails
   * (reference 4.6). Other kinds send none.
   */
  staging_keys: z.array(z.string()).nullish(),
})
export type CommitReply = z.infer<typeof CommitReply>

/** A capture key as a participant names one: it must decode (a key that does not is a bad reply, not a crash later). */
const ReplyCaptureKey = z.string().superRefine((k, ctx) => {
  try {
    fromCaptureKey(k)
  } catch (err) {
    ctx.addIssue({code: 'custom', message: `${quoteInput(k)} is no capture key: ${(err as Error).message}`})
  }
})

/** Only a restore that installed replies `restored` (reference 4.7); any other phase did not. */
export const RestoreReply = z.looseObject({
  phase: z.literal('restored'),
  source_checkpoint_id: z.string(),
  restored: z.array(ReplyCaptureKey).default([]),
})
export type RestoreReply = z.infer<typeof RestoreReply>

/** A resume reopens: the reply is phase idle in every version (reference 4.8); any other phase is a participant still closed. */
export const ResumeReply = z.looseObject({phase: z.literal('idle'), idempotent: z.boolean().default(false)})
export type ResumeReply = z.infer<typeof ResumeReply>

export const RenewReply = z.looseObject({lease_expires_at: z.number()})
export type RenewReply = z.infer<typeof RenewReply>

/** The seed's newer participants send counts; the stored Gym versions send the lists. */
export const RetireReply = z
  .looseObject({retired_count: z.number().int().min(0).optional(), retired: z.array(z.string()).optional()})
  .refine((r) => r.retired_count !== undefined || r.retired !== undefined, 'retire reply has neither retired_count nor retired')
  .transform((r) => ({retired_count: r.retired_count ?? r.retired!.length}))
export const ForgetReply = z
  .looseObject({forgotten_count: z.number().int().min(0).optional(), forgotten: z.array(z.string()).optional()})
  .refine((r) => r.forgotten_count !== undefined || r.forgotten !== undefined, 'forget reply has neither forgotten_count nor forgotten')
  .transform((r) => ({forgotten_count: r.forgotten_count ?? r.forgotten!.length}))

export const REPLY_SCHEMAS = {
  prepare: PrepareReply,
  renew: RenewReply,
  resume: ResumeReply,
  retire: RetireReply,
  forget: ForgetReply,
  commit: CommitReply,
  restore: RestoreReply,
} as const satisfies Record<Operation, z.ZodType>
export type ReplyOf<O extends Operation> = z.output<(typeof REPLY_SCHEMAS)[O]>
/** A reply as a participant sends it (what the schemas accept): the type the double's replies are written to. */
export type WireReply<O extends Operation> = z.input<(typeof REPLY_SCHEMAS)[O]>
export type StatusReplyWire = z.input<typeof StatusReply>
