import {Flags} from '@oclif/core'

import {BaseCommand, EXIT_CODES_HELP, fleetFlags, timeoutFlag} from '../cli/base.js'
import {note} from '../cli/output.js'
import {ControllerError} from '../coordination/errors.js'
import {resume} from '../coordination/operations.js'

export default class Resume extends BaseCommand<typeof Resume> {
  static override summary = 'Reopen every participant (resources, agent, model, environment), going on past failures.'
  static override description = `Resuming an ID fences it for good on every participant: a late prepare of it is refused.
Without --id, resumes the checkpoint or restore the participants report as active.\n\n${EXIT_CODES_HELP}`
  static override examples = ['<%= config.bin %> resume --fleet fleet.yaml --id ckpt-20261202T120000-1a2b3c4d', '<%= config.bin %> resume --head http://head:11000']
  static override flags = {...fleetFlags, id: Flags.string({summary: 'Checkpoint or restore ID to resume.'}), timeout: timeoutFlag}

  async run() {
    const {coordinator, discovery} = await this.connect()
    let id = this.flags.id
    if (!id) {
      const active = [...new Set(discovery.participants.map((p) => p.status.checkpoint_id).filter((x): x is string => x !== null))]
      if (active.length === 0) {
        if (!this.jsonEnabled()) note('no participant has an active checkpoint; nothing to resume')
        return {checkpoint_id: null, resumed: {}}
      }
      if (active.length > 1) throw new ControllerError('input', `participants report several active checkpoints (${active.join(', ')}); pass --id`)
      id = active[0]!
    }
    const replies = await resume(coordinator, id, Date.now() / 1000 + this.flags.timeout)
    const resumed = Object.fromEntries([...replies].map(([s, r]) => [s, {phase: r.phase, idempotent: r.idempotent}]))
    if (!this.jsonEnabled()) this.log(`resumed '${id}' on ${replies.size} participant(s)`)
    return {checkpoint_id: id, resumed}
  }
}
