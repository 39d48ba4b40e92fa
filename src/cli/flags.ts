import {Flags} from '@oclif/core'

import {ControllerError} from '../coordination/errors.js'
import {parseCheckpointIdFlag} from './inputs.js'

/** setTimeout fires at once (with a warning) past 2^31-1 ms: every duration stays well below it. */
export const MAX_TIMER_MS = 2 ** 31 - 1
/** The largest bound a seconds flag may have: room for the 5 s reply grace and more under MAX_TIMER_MS. */
export const MAX_SECONDS = 2_000_000

function duration(s: number): string {
  if (s % 86_400 === 0) return `${s / 86_400} day${s === 86_400 ? '' : 's'}`
  if (s % 3600 === 0) return `${s / 3600} hour${s === 3600 ? '' : 's'}`
  if (s % 60 === 0) return `${s / 60} minute${s === 60 ? '' : 's'}`
  return `${s} s`
}

/**
 * A whole number of seconds between `min` (default 1) and `max`, with the bounds stated in its
 * summary; out of range, oclif refuses it with exit 2 before the command runs.
 */
export function seconds(opts: {summary: string; default: number; max: number; min?: number; helpGroup?: string}) {
  const min = opts.min ?? 1
  if (!(Number.isInteger(min) && Number.isInteger(opts.max) && min >= 0 && min <= opts.default && opts.default <= opts.max && opts.max <= MAX_SECONDS)) {
    throw new Error(`seconds flag: bounds ${min}..${opts.max} with default ${opts.default} must be integers within 0..${MAX_SECONDS}`)
  }
  return Flags.integer({
    summary: `${opts.summary.replace(/\.$/, '')}; ${min} to ${opts.max} (${duration(opts.max)}).`,
    default: opts.default,
    min,
    max: opts.max,
    helpGroup: opts.helpGroup,
  })
}

/**
 * A flag parser for Flags.custom, so a value is parsed and checked where its flag is declared: a
 * value `parse` refuses (it throws, saying why) exits 2 with that reason before the command runs.
 */
export function checked<T>(parse: (value: string) => T): (value: string) => Promise<T> {
  return async (v) => {
    try {
      return parse(v)
    } catch (err) {
      throw err instanceof ControllerError ? err : new ControllerError('input', (err as Error).message)
    }
  }
}

/**
 * A checkpoint ID flag, checked as Gym checks it when the flags are parsed: a bad one exits 2
 * before the command runs, so nothing is sent.
 */
export const checkpointId = Flags.custom<string>({parse: checked(parseCheckpointIdFlag)})

/** `90`, `90s`, `5m`, `1h` as seconds; `0` or `off` as null (never). */
export function parseDuration(v: string, flag: string, max: number): number | null {
  const t = v.trim().toLowerCase()
  if (t === 'off' || t === '0') return null
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(t)
  if (!m) throw new Error(`${flag} ${JSON.stringify(v.slice(0, 50))}: expected a duration such as 90, 90s, 5m, 1h, or off`)
  const s = Number(m[1]) * ({ms: 0.001, s: 1, m: 60, h: 3600} as Record<string, number>)[m[2] ?? 's']!
  if (s < 1 || s > max) throw new Error(`${flag} ${v}: a duration from 1 s to ${max} s`)
  return s
}

/** The checkpoint root, as a flag (commands that take it positionally accept this too). */
export const rootFlag = (summary = 'Checkpoint root; a checkpoint goes to ROOT/ID') => Flags.string({summary: `${summary} (or GYMCKPT_ROOT, or root in the config context).`})

/**
 * Episodes as values (`--episode`, repeatable) and from a file (`--episodes-file`, '-' for stdin):
 * one scheme for every command that takes episodes. `--episodes` stays as a hidden alias of the
 * file flag, so scripts written before the rename keep working.
 */
export const episodeFlags = (what: string) => ({
  episode: Flags.string({summary: `${what}: r, r-a2 (capture key), r@2 or {"rollout_id":"r","attempt":2}; repeatable.`, multiple: true}),
  'episodes-file': Flags.string({summary: `File of ${what.toLowerCase()}, one per line or one JSON array ('-' for stdin).`, aliases: ['episodes']}),
})

/** The episode flags as given, for a printed next step that repeats the command. */
export function episodeArgs(f: {episode?: string[]; 'episodes-file'?: string}): string[] {
  return [...(f.episode ?? []).flatMap((e) => ['--episode', e]), ...(f['episodes-file'] !== undefined ? ['--episodes-file', f['episodes-file']] : [])]
}

/** Lets an operator's scope leave out restored episodes no replacement has claimed (commit, checkpoint). */
export const dropRestoredFlag = Flags.boolean({
  summary: 'Let the scope leave out restored episodes whose replacement has not started: every participant deletes their restored state.',
  description:
    'Without it, a scope that leaves out an episode a participant reports as restored with its replacement not started (restored_pending) is refused before anything is sent (exit 2): name each by its replacement attempt (the checkpointed attempt + 1) to carry it into this checkpoint.',
})

/** How to give the commit scope on the command line (the error when a fleet with a policy model gets none). */
export const SCOPE_HINT = 'pass them with --episode or --episodes-file (an empty file, e.g. /dev/null, when none continue)'

/** Rollout IDs as values (`--rollout`, repeatable) and from a file (`--rollouts-file`; `--rollouts` is a hidden alias). */
export const rolloutFlags = (what: string) => ({
  rollout: Flags.string({summary: `${what} (no attempt suffix); repeatable.`, multiple: true}),
  'rollouts-file': Flags.string({summary: `File of ${what.toLowerCase()}s, one per line ('-' for stdin).`, aliases: ['rollouts']}),
})
