import {Args, Flags} from '@oclif/core'

import {BaseCommand} from '../cli/base.js'
import {rootFlag} from '../cli/flags.js'
import {exitCodesHelp} from '../cli/exit-codes.js'
import {note, table} from '../cli/output.js'
import {applyPrune, planPrune} from '../storage/prune.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Prune extends BaseCommand<typeof Prune> {
  static override summary = 'Remove old checkpoints from a checkpoint root (a dry run unless --yes).'
  static override description = `Keeps the --keep newest published checkpoints and always the one LATEST names. Removes older
published checkpoints, checkpoint directories that were never published and are older than
LATEST (a newer one may be a commit in progress), and stale temp files. Leaves anything that is
not a checkpoint directory, and every symbolic link, alone. Touches no server. Without --yes (or
with --dry-run) it removes nothing and shows what it would remove.\n\n${exitCodesHelp('input', 'invalid_checkpoint')}`
  static override examples = ['<%= config.bin %> prune /shared/ckpt --dry-run', '<%= config.bin %> prune /shared/ckpt --keep 3 --yes --json']
  static override args = {root: Args.string({description: 'Checkpoint root, the directory holding LATEST (default: --root, GYMCKPT_ROOT, or the config context).'})}
  static override flags = {
    root: rootFlag('Checkpoint root, instead of the positional'),
    keep: Flags.integer({summary: 'Published checkpoints to keep, newest first.', default: 2, min: 1}),
    yes: Flags.boolean({summary: 'Remove; without it, only show what would be removed.', exclusive: ['dry-run']}),
    'dry-run': Flags.boolean({summary: 'Only show what would be removed (the default; for scripts that say so).', exclusive: ['yes']}),
  }

  async run(): Promise<CommandJson<'prune'>> {
    const plan = await planPrune(await this.rootDir(this.args.root, this.flags.root), this.flags.keep)
    if (this.flags.yes) await applyPrune(plan)
    if (!this.jsonEnabled()) {
      const rows = [...plan.remove.map((e) => ({...e, action: this.flags.yes ? 'removed' : 'would remove'})), ...plan.keep.map((e) => ({...e, action: 'keep'}))]
      this.log(table(rows, ['action', 'name', 'reason']))
      if (!this.flags.yes && plan.remove.length) note('dry run: pass --yes to remove')
    }
    return {root: plan.root, latest: plan.latest, dry_run: !this.flags.yes, remove: plan.remove, keep: plan.keep}
  }
}
