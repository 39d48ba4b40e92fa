import {Flags} from '@oclif/core'

import {BaseCommand, EXIT_CODES_HELP, fleetFlags, timeoutFlag} from '../cli/base.js'
import {keys, note} from '../cli/output.js'
import {prepareOrAbort} from '../coordination/controller.js'
import {newCheckpointId} from '../coordination/runs.js'

export default class Prepare extends BaseCommand<typeof Prepare> {
  static override summary = 'Freeze every participant at a safe boundary (environment, model, agent, resources).'
  static override description = `Stops at the first stage that is not ready by the deadline. Then, unless --keep-closed, every
participant is resumed again and the blockers are reported (exit 5). On success the fleet stays
closed until 'commit' and 'resume'; leases end deadline + grace (Gym: 600 s) after the deadline.\n\n${EXIT_CODES_HELP}`
  static override examples = ['ID=$(<%= config.bin %> prepare --fleet fleet.yaml --json | jq -r .checkpoint_id)', '<%= config.bin %> prepare --head http://head:11000 --id ckpt-nightly-7 --timeout 120']
  static override flags = {
    ...fleetFlags,
    id: Flags.string({summary: 'Checkpoint ID (default: a new ckpt-<time>-<hex>). Never reuse a resumed ID.'}),
    timeout: timeoutFlag,
    'keep-closed': Flags.boolean({summary: 'When prepare misses its deadline, leave the fleet closed for inspection.'}),
  }

  async run() {
    const {coordinator} = await this.connect()
    const id = this.flags.id ?? newCheckpointId()
    const deadlineTs = Date.now() / 1000 + this.flags.timeout
    const prep = await prepareOrAbort(coordinator, id, deadlineTs, {keepClosed: this.flags['keep-closed'], log: note})
    const restarts = prep.restarts()
    if (!this.jsonEnabled()) {
      this.log(id)
      note(`prepared ${prep.replies.size} participant(s); restarts: ${keys(restarts)}`)
      note(`next: gymckpt commit --id ${id} --root DIR [--episodes FILE], then gymckpt resume --id ${id}`)
    }
    return {checkpoint_id: id, prepared: true, deadline_ts: deadlineTs, restarts: restarts.map((e) => ({rollout_id: e.rolloutId, attempt: e.attempt}))}
  }
}
