import {NextStep} from '../coordination/errors.js'
import {DEFAULT_TOKEN_ENV} from './inputs.js'

/** The fleet flags a command was given, as arguments a printed next step repeats. */
export interface FleetFlagValues {
  head?: string
  server?: string[]
  fleet?: string
  'token-env'?: string
  'token-file'?: string
}

/** Quotes an argument for a POSIX shell only when it needs it. */
export function shellQuote(s: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`
}

export function fleetArgs(f: FleetFlagValues): string[] {
  const out: string[] = []
  if (f.head) out.push('--head', f.head)
  if (f.fleet) out.push('--fleet', f.fleet)
  for (const s of f.server ?? []) out.push('--server', s)
  if (f['token-file']) out.push('--token-file', f['token-file'])
  else if (f['token-env'] && f['token-env'] !== DEFAULT_TOKEN_ENV) out.push('--token-env', f['token-env'])
  return out
}

/** One pasteable command line: `gymckpt resume --id X --fleet fleet.yaml`. */
export function renderNext(bin: string, step: NextStep, fleet: FleetFlagValues): string {
  return [bin, ...step.command.split(' '), ...step.args, ...(step.fleet ? fleetArgs(fleet) : [])].map(shellQuote).join(' ')
}
