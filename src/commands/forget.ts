import {Flags} from '@oclif/core'

import {checkpointId} from '../cli/flags.js'
import {BaseCommand, fleetFlags, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {parseRolloutFlags, readRolloutIds} from '../cli/inputs.js'
import {ControllerError} from '../coordination/errors.js'
import {forget} from '../coordination/operations.js'

export default class Forget extends BaseCommand<typeof Forget> {
  static override summary = 'Drop the retire marks of rollouts that are done for good.'
  static override description = `Call it once nothing of any attempt of a rollout can still run and it will not be dispatched
again, for every rollout retired or restored. Same order and phase rules as retire.\n\n${fleetExitCodes('participant')}`
  static override examples = ['<%= config.bin %> forget --fleet fleet.yaml --rollout r7 --rollout r9', '<%= config.bin %> forget --head http://head:11000 --rollouts done.txt']
  static override flags = {
    ...fleetFlags,
    rollout: Flags.string({summary: 'A rollout ID (no attempt suffix); repeatable.', multiple: true}),
    rollouts: Flags.string({summary: "File of rollout IDs, one per line ('-' for stdin)."}),
    id: checkpointId({summary: 'Checkpoint ID sent with the call.', default: 'forget'}),
    timeout: timeoutFlag,
  }

  async run() {
    // Every input is checked before the fleet is contacted: exit 2 means nothing was sent.
    const id = this.flags.id
    const ids = [...parseRolloutFlags(this.flags.rollout ?? []), ...(this.flags.rollouts ? await readRolloutIds(this.flags.rollouts) : [])]
    if (ids.length === 0) throw new ControllerError('input', 'nothing to forget: pass --rollout or --rollouts')
    const {coordinator} = await this.connect()
    const n = await forget(coordinator, id, ids, Date.now() / 1000 + this.flags.timeout)
    if (!this.jsonEnabled()) this.log(`forgot ${n} rollout(s) on ${coordinator.participants.length} participant(s)`)
    return {forgotten: n, participants: coordinator.participants.length}
  }
}
