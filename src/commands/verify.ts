import {Args} from '@oclif/core'
import color from 'ansis'

import {checkpointId, rootFlag} from '../cli/flags.js'
import {BaseCommand} from '../cli/base.js'
import {exitCodesHelp} from '../cli/exit-codes.js'
import {note, table} from '../cli/output.js'
import {ControllerError} from '../coordination/errors.js'
import {verifyCheckpoint} from '../storage/verify.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Verify extends BaseCommand<typeof Verify> {
  static override summary = 'Check a checkpoint offline, as a restore would, without touching any server.'
  static override description = `Accepts a checkpoint root (follows LATEST) or a checkpoint directory, made by gymckpt
(gymckpt.json) or by Gym's own rollout collection (collection.json). Checks every participant
manifest, streams every records file through sha256 and counts its records, reads each record's
episode_id, and refuses duplicate records of one episode, symlinks that leave the checkpoint
directory, and records file names that disagree with their digest. Records outside the commit
scope are normal (Gym's environment, agent and resources servers export every live episode) and
are counted per participant: IN_SCOPE records are what a restore installs, OUTSIDE_SCOPE records
are verified and skipped, SCOPE_WITHOUT_RECORD counts scope episodes the participant held nothing
for. Exit 6 on any error.\n\n${exitCodesHelp('input', 'invalid_checkpoint')}`
  static override examples = ['<%= config.bin %> verify /shared/ckpt', '<%= config.bin %> verify /shared/ckpt --id ckpt-20261202T120000-1a2b3c4d --json']
  static override args = {location: Args.string({description: 'Checkpoint root or checkpoint directory (default: --root, GYMCKPT_ROOT, or the config context).'})}
  static override flags = {id: checkpointId({summary: 'Checkpoint ID under the root (default: LATEST).'}), root: rootFlag('Checkpoint root, instead of the positional')}

  async run(): Promise<CommandJson<'verify'>> {
    const report = await verifyCheckpoint(await this.rootDir(this.args.location, this.flags.root), {id: this.flags.id})
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
    if (!this.jsonEnabled()) {
      this.log(table(json.participants, ['kind', 'instance', 'ok', 'records', 'in_scope', 'outside_scope', 'scope_without_record', 'bytes']))
      for (const p of report.problems) note(`${p.severity === 'error' ? color.red('error') : p.severity === 'warning' ? color.yellow('warning') : 'note'}: ${p.where}: ${p.message}`)
      const installs = report.participants.reduce((n, p) => n + p.inScope, 0)
      this.log(
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
}
