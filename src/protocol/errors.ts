import {z} from 'zod'

/** Every error code a participant's control plane or data plane is known to send. */
export const ERROR_CODES = [
  'unauthorized',
  'stale_checkpoint',
  'checkpoint_conflict',
  'invalid_phase',
  'deadline_exceeded',
  'restart_in_scope',
  'export_failed',
  'invalid_checkpoint_state',
  'checkpoint_error',
  'retire_incomplete',
  'checkpoint_coordinator_unavailable',
  'stale_attempt',
  'admission_closed',
  'rollout_id_required',
  'invalid_rollout_id',
] as const
export type ErrorCode = (typeof ERROR_CODES)[number]

export const HTTP_STATUS_OF: Record<ErrorCode, number> = {
  unauthorized: 401,
  stale_checkpoint: 409,
  checkpoint_conflict: 409,
  invalid_phase: 409,
  deadline_exceeded: 409,
  restart_in_scope: 409,
  export_failed: 409,
  invalid_checkpoint_state: 422,
  checkpoint_error: 409,
  retire_incomplete: 409,
  checkpoint_coordinator_unavailable: 503,
  stale_attempt: 409,
  admission_closed: 409,
  rollout_id_required: 400,
  invalid_rollout_id: 400,
}

export const ErrorEnvelope = z.object({error: z.object({code: z.string(), detail: z.string().default('')})})
export type ErrorEnvelope = z.infer<typeof ErrorEnvelope>
/** The web framework's request-validation 422, which is not in the envelope. */
export const ValidationErrorBody = z.object({
  detail: z.array(z.object({loc: z.array(z.union([z.string(), z.number()])).default([]), msg: z.string()}).loose()),
})

export interface ParsedErrorBody {
  /** The envelope's code, `validation_error` for a framework 422, or null for an unknown body. */
  code: string | null
  detail: string
}

/** Reads any error body a participant may send: the envelope, a framework 422, or non-JSON text. */
export function parseErrorBody(text: string): ParsedErrorBody {
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch {
    return {code: null, detail: text.slice(0, 200)}
  }
  const env = ErrorEnvelope.safeParse(json)
  if (env.success) return {code: env.data.error.code, detail: env.data.error.detail}
  const val = ValidationErrorBody.safeParse(json)
  if (val.success) {
    return {
      code: 'validation_error',
      detail: val.data.detail.map((d) => `${d.loc.join('.')}: ${d.msg}`).join('; '),
    }
  }
  return {code: null, detail: text.slice(0, 200)}
}

export function errorEnvelope(code: ErrorCode, detail: string): ErrorEnvelope {
  return {error: {code, detail}}
}
