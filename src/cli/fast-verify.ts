// `gymckpt verify ROOT [--id ID] [--root ROOT] [--json] [--[no-]color]`, fully specified, answered
// without oclif: bin/run.js calls it before loading oclif (a third of verify's start-up). Anything
// else (help, another flag, a root from GYMCKPT_ROOT or the config file, an invalid --id, oclif's
// env switches) is left to oclif, which gives the same answers, errors and exit codes.
// bin/run.js loads it bundled (dist/fast/, scripts/build.mjs): deciding loads verify's code too,
// a few ms that a line left to oclif (verify --help) pays on top of oclif's own start.

import {successDocument, toStdout, writeDirect, writeJson} from './output.js'
import {verifyReport} from './verify-report.js'

/** The checkpoint ID pattern and length Gym allows; anything else gets oclif's flag error. */
const CHECKPOINT_ID = /^[A-Za-z0-9][A-Za-z0-9._-]*$/

interface FastArgs {
  location: string
  id: string | undefined
  json: boolean
}

/** The arguments after `verify`, or null when oclif must parse them. */
export function fastVerifyArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): FastArgs | null {
  if (env.GYMCKPT_CONTENT_TYPE !== undefined) return null
  let location: string | undefined
  let root: string | undefined
  let id: string | undefined
  let json = false
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!
    const eq = a.indexOf('=')
    const [name, inline] = a.startsWith('--') && eq > 0 ? [a.slice(0, eq), a.slice(eq + 1)] : [a, undefined]
    if (name === '--json' && inline === undefined) json = true
    else if ((name === '--color' || name === '--no-color') && inline === undefined) continue
    else if (name === '--id' || name === '--root') {
      const v = inline ?? argv[++i]
      if (v === undefined || (inline === undefined && v.startsWith('-')) || (name === '--id' ? id : root) !== undefined) return null
      if (name === '--id') id = v
      else root = v
    } else if (!a.startsWith('-') && location === undefined) location = a
    else return null
  }
  if (id !== undefined && !(CHECKPOINT_ID.test(id) && id.length <= 128)) return null
  if (location !== undefined && root !== undefined && location !== root) return null
  const where = location ?? root
  return where === undefined || where === '' ? null : {location: where, id, json}
}

/** Runs verify and returns its exit code, or null when oclif must handle the command line. */
export async function fastVerify(argv: string[]): Promise<number | null> {
  const args = fastVerifyArgs(argv)
  if (!args) return null
  writeDirect()
  try {
    const doc = await verifyReport(args.location, args.id, {json: args.json, log: (line) => toStdout(`${line}\n`)})
    if (args.json) writeJson(successDocument(doc))
    return 0
  } catch (err) {
    // The failure path's modules load only on failure (a few ms of a valid checkpoint's start-up).
    const [{reportFailure}, {renderNext}] = await Promise.all([import('./failure.js'), import('./next.js')])
    return reportFailure(err as Error, {json: args.json, nextLine: (s) => renderNext('gymckpt', s, {})})
  }
}
