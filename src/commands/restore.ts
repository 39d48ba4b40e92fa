import {Args, Flags} from '@oclif/core'

import {BaseCommand, EXIT_CODES_HELP, fleetFlags, timeoutFlag} from '../cli/base.js'
import {episodesJson, keys, note} from '../cli/output.js'
import {restoreCheckpoint} from '../coordination/controller.js'
import {ControllerError} from '../coordination/errors.js'
import {nextAttempt, fromWire} from '../protocol/episode.js'
import {CheckpointStateError} from '../storage/errors.js'
import {readCheckpointSummary} from '../storage/root.js'
import {verifyCheckpoint} from '../storage/verify.js'

export default class Restore extends BaseCommand<typeof Restore> {
  static override summary = 'Restore a published checkpoint into fresh processes, all or nothing.'
  static override description = `Verifies the checkpoint offline first (nothing is sent if it is invalid), then restores every
participant at once under a new restore ID. If any participant fails, the replacement attempts are
retired everywhere, every participant is resumed, and the restore's own error is reported (exit 4).
On success the fleet is resumed (unless --keep-closed) and the crashed attempts of restarts are
retired. Dispatch each continued episode next at attempt + 1; start restarts over at attempt + 1.
--dry-run checks the checkpoint against the live fleet and sends nothing.\n\n${EXIT_CODES_HELP}`
  static override examples = ['<%= config.bin %> restore /shared/ckpt --fleet fleet.yaml', '<%= config.bin %> restore /shared/ckpt --head http://head:11000 --dry-run --json']
  static override args = {location: Args.string({description: 'Checkpoint root (LATEST is followed) or checkpoint directory.', required: true})}
  static override flags = {
    ...fleetFlags,
    id: Flags.string({summary: 'Checkpoint ID under the root (default: LATEST).'}),
    'dry-run': Flags.boolean({summary: 'Verify against the live fleet; send nothing.'}),
    'keep-closed': Flags.boolean({summary: 'Leave the restored fleet closed; resume it yourself with the restore ID.'}),
    'skip-verify': Flags.boolean({summary: 'Skip the offline verification before the restore.'}),
    timeout: timeoutFlag,
  }

  async run() {
    const {coordinator, discovery} = await this.connect()
    if (this.flags['dry-run']) return this.dryRun(discovery.participants)
    const r = await restoreCheckpoint(coordinator, {
      location: this.args.location,
      checkpointId: this.flags.id,
      timeoutS: this.flags.timeout,
      skipVerify: this.flags['skip-verify'],
      keepClosed: this.flags['keep-closed'],
      log: note,
    })
    if (!this.jsonEnabled()) {
      this.log(r.restoreId)
      note(`restored '${r.checkpointId}' on ${coordinator.participants.length} participant(s)${r.resumed ? ' and resumed' : `; resume with --id ${r.restoreId}`}`)
      note(`dispatch next (attempt + 1): ${keys(r.replacements)}`)
      note(`start over from input (attempt + 1, old attempt retired): ${keys(r.restarted.map(nextAttempt))}`)
    }
    return {
      restore_id: r.restoreId,
      checkpoint_id: r.checkpointId,
      checkpoint_dir: r.checkpointDir,
      resumed: r.resumed,
      replacements: episodesJson(r.replacements),
      restarted: episodesJson(r.restarted),
      restored: r.restoredByServer,
    }
  }

  private async dryRun(participants: {server: string; kind: string; instance: string; status: {phase: string; checkpoint_id: string | null}}[]) {
    let report
    try {
      report = await verifyCheckpoint(this.args.location, {id: this.flags.id, expect: participants.map((p) => ({kind: p.kind, instance: p.instance, server: p.server}))})
    } catch (err) {
      if (err instanceof CheckpointStateError) throw new ControllerError('invalid_checkpoint', err.message)
      throw err
    }
    const busy = participants.filter((p) => p.status.phase !== 'idle' || p.status.checkpoint_id !== null)
    for (const p of busy) report.problems.push({severity: 'error', where: p.server, message: `is in phase ${p.status.phase}${p.status.checkpoint_id ? ` of '${p.status.checkpoint_id}'` : ''}; restore needs idle, fresh processes`})
    const errors = report.problems.filter((p) => p.severity === 'error')
    const summary = errors.length ? null : await readCheckpointSummary(report.checkpointDir)
    const replacements = summary ? summary.continued.map((e) => nextAttempt(fromWire(e))) : []
    const json = {dry_run: true, valid: errors.length === 0, checkpoint_id: report.checkpointId, checkpoint_dir: report.checkpointDir, replacements: episodesJson(replacements), problems: report.problems}
    if (!this.jsonEnabled()) {
      for (const p of report.problems) note(`${p.severity}: ${p.where}: ${p.message}`)
      this.log(errors.length ? `restore of ${report.checkpointId} would fail (${errors.length} error(s))` : `restore of ${report.checkpointId} would continue ${replacements.length} episode(s) on ${participants.length} participant(s)`)
    }
    if (errors.length) throw new ControllerError('invalid_checkpoint', `dry run: restore of ${report.checkpointDir} would fail: ${errors.map((e) => `${e.where}: ${e.message}`).join('; ')}`, json)
    return json
  }
}
