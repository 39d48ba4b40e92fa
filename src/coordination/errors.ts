import type {ParticipantTiming} from './controller.js'

/** Stable error codes of the controller; the CLI maps each to an exit code (src/cli/exit-codes.ts). */
export type ControllerErrorCode =
  | 'input' // bad flag value, file, or episode list
  | 'discovery' // a server could not be probed, unknown kind, no model
  | 'unauthorized' // a participant refused the token
  | 'participant' // a participant refused or failed an operation
  | 'not_prepared' // prepare missed its deadline with blockers
  | 'invalid_checkpoint' // checkpoint state on disk is invalid
  | 'fleet_state' // the fleet is not in a state the operation needs (busy, a checkpoint open)
  | 'preempted' // collect stopped on SIGTERM/SIGINT after publishing a checkpoint: run it again with --resume
  | 'interrupted' // SIGINT/SIGTERM; the fleet was resumed

/**
 * A command the operator can run next, as data: the CLI renders it with its binary name and the
 * fleet flags of the command that failed, so the printed line works when pasted.
 */
export interface NextStep {
  command: string
  args: string[]
  /** Takes the same fleet flags (--head/--fleet/--server and the token source). */
  fleet: boolean
}

export const nextStep = (command: string, args: string[] = [], fleet = true): NextStep => ({command, args, fleet})

export class ControllerError extends Error {
  /** What to run next; empty when nothing the operator runs would help. */
  next: NextStep[] = []
  /** Each participant's call times up to the failure, when an operation that times its calls failed. */
  timings: ParticipantTiming[] | null = null

  constructor(
    readonly code: ControllerErrorCode,
    message: string,
    readonly details?: unknown,
  ) {
    super(message)
    this.name = 'ControllerError'
  }

  withNext(...steps: NextStep[]): this {
    this.next = steps
    return this
  }
}

/** One server's failure in a fan-out. */
export interface ParticipantFailure {
  server: string
  /** HTTP status, or null when no reply came (refused, reset, timed out). */
  status: number | null
  /** The participant's error code (`stale_checkpoint`, …), `validation_error`, `timeout`, `connection`, or null. */
  code: string | null
  message: string
}

export function failureMessage(f: ParticipantFailure): string {
  return f.status === null ? f.message : `HTTP ${f.status} ${f.code ?? ''} ${f.message}`.replace(/\s+/g, ' ').trim()
}

/** `server: reason; server: reason`: how an error lists its participants' failures. */
export function failureList(failures: ParticipantFailure[]): string {
  return failures.map((f) => `${f.server}: ${failureMessage(f)}`).join('; ')
}

/** `server (reason), server (reason)`: failures named inside a sentence. */
export function failureNames(failures: ParticipantFailure[]): string {
  return failures.map((f) => `${f.server} (${failureMessage(f)})`).join(', ')
}

/** A fan-out stage in which some participants failed; every failure is kept. */
export class CoordinationError extends ControllerError {
  readonly failures: ParticipantFailure[]
  /** Set when the checkpoint was published before this failure (a resume that failed after it). */
  published: {checkpointId: string; checkpointDir: string} | null = null

  constructor(
    readonly operation: string,
    failures: ParticipantFailure[],
    hint?: string,
  ) {
    const sorted = [...failures].sort((a, b) => a.server.localeCompare(b.server))
    const body = failureList(sorted)
    const unauthorized = failures.length > 0 && failures.every((f) => f.code === 'unauthorized')
    super(
      unauthorized ? 'unauthorized' : operation === 'discover' ? 'discovery' : 'participant',
      `checkpoint ${operation} failed on ${failures.length} participant(s): ${body}${hint ? `. ${hint}` : ''}`,
      sorted,
    )
    this.name = 'CoordinationError'
    this.failures = sorted
  }
}
