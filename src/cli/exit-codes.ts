import {ControllerErrorCode} from '../coordination/errors.js'

/** The one exit-code table; `--help` and the README print it from here. */
export const EXIT = {
  ok: 0,
  internal: 1,
  input: 2,
  discovery: 3,
  participant: 4,
  not_prepared: 5,
  invalid_checkpoint: 6,
  unauthorized: 7,
  fleet_state: 8,
  preempted: 75,
  interrupted: 130,
} as const satisfies Record<ControllerErrorCode | 'ok' | 'internal', number>

export const EXIT_DESCRIPTIONS: Record<keyof typeof EXIT, string> = {
  ok: 'success',
  internal: 'unexpected internal error (a bug: please report it)',
  input: 'invalid flag, file, token source or episode list; nothing was sent',
  discovery: 'discovery failed: a server is down or silent, reports an unknown kind, or there is no policy model',
  participant: 'a participant refused or failed the operation (see the per-server errors)',
  not_prepared: 'prepare missed its deadline with blockers (the fleet was resumed unless --keep-closed)',
  invalid_checkpoint: 'the checkpoint on disk is invalid or could not be written',
  unauthorized: 'a participant refused the control token',
  fleet_state: 'the fleet is not in the state the operation needs (e.g. restore into servers holding live work); nothing was sent',
  preempted: 'collect stopped on SIGTERM/SIGINT after publishing a checkpoint; continue with collect --resume (EX_TEMPFAIL)',
  interrupted: 'interrupted by SIGINT/SIGTERM: what the command opened was resumed; the message names anything left as it was (a commit or resume cut short) and the line to run',
}

export type ExitName = keyof typeof EXIT

/** The EXIT CODES section of a command's help: only the codes it can return (0 and 1 always). */
export function exitCodesHelp(...names: ExitName[]): string {
  const shown = new Set<ExitName>(['ok', 'internal', ...names])
  return `EXIT CODES\n${(Object.keys(EXIT) as ExitName[])
    .filter((k) => shown.has(k))
    .map((k) => `  ${String(EXIT[k]).padStart(3)}  ${EXIT_DESCRIPTIONS[k]}`)
    .join('\n')}`
}
