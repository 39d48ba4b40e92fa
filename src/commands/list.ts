import {Args} from '@oclif/core'

import {BaseCommand} from '../cli/base.js'
import {rootFlag} from '../cli/flags.js'
import {exitCodesHelp} from '../cli/exit-codes.js'
import {listJson} from '../cli/catalog-json.js'
import {note, table, warn} from '../cli/output.js'
import {formatAge, formatBytes, listCheckpoints} from '../storage/catalog.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class List extends BaseCommand<typeof List> {
  static override summary = 'List the checkpoints in a checkpoint root, newest first.'
  static override description = `One line per checkpoint directory: its ID, when it was created (from gymckpt.json or Gym's collection.json), its age, its size (the sum of its files' sizes), its participants, the continued and restarted episodes of its commit, and its state: published (it has a controller manifest), partial (none: a commit that never finished, or one still running; its time is the directory's), or unreadable (a manifest that cannot be read). LATEST's checkpoint is marked *. Reads manifests and file sizes only, never a records file, and touches no server.\n\n${exitCodesHelp('input', 'invalid_checkpoint')}`
  static override examples = ['<%= config.bin %> list /shared/ckpt', '<%= config.bin %> list /shared/ckpt --json']
  static override args = {root: Args.string({description: 'Checkpoint root, the directory holding LATEST (default: --root, GYMCKPT_ROOT, or the config context).'})}
  static override flags = {root: rootFlag('Checkpoint root, instead of the positional')}

  async run(): Promise<CommandJson<'list'>> {
    const catalog = await listCheckpoints(await this.rootDir(this.args.root, this.flags.root))
    const {warnings, ...json} = listJson(catalog)
    for (const w of warnings) warn(w)
    if (!this.jsonEnabled()) {
      const rows = json.checkpoints.map((c) => ({
        ...c,
        id: c.checkpoint_id,
        participants: c.participant_count,
        latest: c.latest ? '*' : '',
        created: c.created.replace(/\.\d+Z$/, 'Z'),
        age: formatAge(c.age_seconds),
        size: formatBytes(c.size_bytes),
        continued: c.continued_count,
        restarted: c.restarted_count,
      }))
      this.log(table(rows, ['latest', 'id', 'state', 'created', 'age', 'size', 'participants', 'continued', 'restarted']))
      for (const c of json.checkpoints) if (c.error) note(`${c.checkpoint_id}: ${c.error}`)
    }
    return json
  }
}
