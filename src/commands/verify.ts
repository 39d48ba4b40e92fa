import {Args} from '@oclif/core'
import {checkpointId, rootFlag} from '../cli/flags.js'
import {BaseCommand} from '../cli/base.js'
import {exitCodesHelp} from '../cli/exit-codes.js'
import {verifyReport} from '../cli/verify-report.js'
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
    return verifyReport(await this.rootDir(this.args.location, this.flags.root), this.flags.id, {json: this.jsonEnabled(), log: (line) => this.log(line)})
  }
}
