// The one mapping from an error to what the operator sees: exit code, the --json failure document
// or the human lines on stderr. Used by the command base (oclif) and by the fast path of verify
// (bin/run.js), so both fail with the same bytes.

import {ControllerError, CoordinationError, NextStep} from '../coordination/errors.js'
import {CheckpointStateError} from '../storage/errors.js'
import {errColor} from './color.js'
import {EXIT} from './exit-codes.js'
import {JSON_SCHEMA_VERSION} from './json-version.js'
import {timingsJson, timingsTable, toStderr, warnings, writeJson} from './output.js'

/**
 * Reports `err` (its --json document on stdout, or `error:` and `next:` lines on stderr) and
 * returns the exit code. `context` is what the command had learned when it failed (a dry run's
 * plan, the statuses it read), put into the details next to the error's own.
 */
export function reportFailure(err: Error & {oclif?: {exit?: number}}, opts: {json: boolean; context?: Record<string, unknown>; nextLine: (s: NextStep) => string}): number {
  let code: number
  let name: string
  let details: unknown
  if (err instanceof ControllerError) {
    code = EXIT[err.code]
    name = err.code
    details = err instanceof CoordinationError ? {operation: err.operation, failures: err.failures} : err.details
  } else if (err instanceof CheckpointStateError) {
    code = EXIT.invalid_checkpoint
    name = 'invalid_checkpoint'
  } else if (err.oclif?.exit !== undefined) {
    // oclif's own errors: flag parsing and validation (exit 2).
    code = EXIT.input
    name = 'input'
  } else {
    code = EXIT.internal
    name = 'internal'
  }
  if (opts.context && Object.keys(opts.context).length) details = {...(details as object | undefined), ...opts.context}
  // A failed operation that timed its calls shows them, as a successful one does.
  const timings = err instanceof ControllerError ? err.timings : null
  if (timings) details = {...(details as object | undefined), timings: timingsJson(timings)}
  err.message = oneLine(err.message)
  const next = err instanceof ControllerError ? err.next.map(opts.nextLine) : []
  if (opts.json) {
    writeJson({
      ok: false,
      schema_version: JSON_SCHEMA_VERSION,
      warnings,
      error: {code: name, exit_code: code, message: err.message, ...(details === undefined ? {} : {details}), ...(next.length ? {next} : {})},
    })
  } else {
    if (timings) toStderr(`${timingsTable(timings)}\n`)
    toStderr(`${errColor.red('error:')} ${err.message}\n`)
    for (const n of next) toStderr(`next: ${n}\n`)
    if (code === EXIT.internal && err.stack) toStderr(`${err.stack}\n`)
  }
  return code
}

/** oclif's flag errors span lines ('Parsing --id', a tab, the cause, a help hint): one line, flag first. */
export function oneLine(message: string): string {
  const lines = message
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !/^See more help with/.test(l))
  const head = /^Parsing (--[\w-]+)$/.exec(lines[0] ?? '')
  if (!head) return lines.join(' ')
  const rest = lines.slice(1).join(' ')
  return rest.startsWith(head[1]!) ? rest : `${head[1]}: ${rest}`
}
