// What `gymckpt verify` does and shows, below the command: the oclif command and the fast path in
// bin/run.js (which answers a fully specified verify without loading oclif) both call it.
import {ControllerError} from '../coordination/errors.js'
import {verifyCheckpoint} from '../storage/verify.js'
import {color} from './color.js'
import type {CommandJson} from './json-schemas.js'
import {problemNote, table} from './output.js'

/**
 * Verifies the checkpoint at `location` (a root, LATEST followed, or a checkpoint directory) and
 * returns verify's --json fields; without `json`, the table and the verdict go to `log` (stdout)
 * and the problems to stderr. An invalid checkpoint throws, with the document as its details.
 */
export async function verifyReport(location: string, id: string | undefined, opts: {json: boolean; log: (line: string) => void}): Promise<CommandJson<'verify'>> {
  const report = await verifyCheckpoint(location, {id})
  const json = {
    valid: report.ok,
    checkpoint_id: report.checkpointId,
    checkpoint_dir: report.checkpointDir,
    manifest: report.manifest,
    continued_count: report.continued.length,
    restarted_count: report.restarted.length,
    uncovered: report.uncovered,
    participants: report.participants.map((p) => ({
      kind: p.kind,
      instance: p.instance,
      ok: p.ok,
      records: p.records,
      in_scope: p.inScope,
      outside_scope: p.outsideScope,
      scope_without_record: p.scopeWithoutRecord,
      bytes: p.bytes,
      records_sha256: p.recordsSha256,
    })),
    problems: report.problems,
  }
  if (!opts.json) {
    opts.log(table(json.participants, ['kind', 'instance', 'ok', 'records', 'in_scope', 'outside_scope', 'scope_without_record', 'bytes']))
    for (const p of report.problems) problemNote(p)
    const installs = report.participants.reduce((n, p) => n + p.inScope, 0)
    opts.log(
      `${report.ok ? color.green('valid') : color.red('INVALID')}: ${report.checkpointId} (${report.continued.length} continued, ${report.restarted.length} restarted; ` +
        `a restore installs the ${installs} record(s) in scope and skips the ${report.participants.reduce((n, p) => n + p.outsideScope, 0)} outside it)`,
    )
  }
  if (!report.ok) {
    const errs = report.problems.filter((p) => p.severity === 'error')
    throw new ControllerError('invalid_checkpoint', `checkpoint ${report.checkpointDir} is invalid: ${errs.length} error(s); first: ${errs[0]?.where}: ${errs[0]?.message}`, json)
  }
  return json
}
