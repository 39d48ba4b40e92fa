import {Flags} from '@oclif/core'

import {checkpointId, rolloutFlags} from '../cli/flags.js'
import {FleetCommand, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {rolloutInputs} from '../cli/inputs.js'
import {ControllerError} from '../coordination/errors.js'
import {forget, retirePreview} from '../coordination/operations.js'
import {note, warn} from '../cli/output.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Forget extends FleetCommand<typeof Forget> {
  static override summary = 'Drop the retire marks of rollouts that are done for good.'
  static override description = `Call it once nothing of any attempt of a rollout can still run and it will not be dispatched
again, for every rollout retired or restored. Same order and phase rules as retire.\n\n${fleetExitCodes('participant')}`
  static override examples = ['<%= config.bin %> forget --fleet fleet.yaml --rollout r7 --rollout r9', '<%= config.bin %> forget --head http://head:11000 --rollouts-file done.txt']
  static override flags = {
    ...rolloutFlags('Rollout ID'),
    id: checkpointId({summary: 'Checkpoint ID sent with the call.', default: 'forget'}),
    timeout: timeoutFlag,
    'dry-run': Flags.boolean({summary: 'Show the stages, servers and calls it would send, and who would refuse; send nothing but status probes.'}),
  }

  async run(): Promise<CommandJson<'forget'>> {
    // Every input is checked before the fleet is contacted: exit 2 means nothing was sent.
    const id = this.flags.id
    const ids = await rolloutInputs(this.flags)
    if (ids.length === 0) throw new ControllerError('input', 'nothing to forget: pass --rollout or --rollouts-file')
    const {coordinator, discovery} = await this.connect()
    if (this.flags['dry-run']) {
      const preview = retirePreview(discovery.participants, ids.length, id)
      if (!this.jsonEnabled()) {
        for (const st of preview.stages) this.log(`${st.stage}: ${st.servers.join(', ')}`)
        note(`would forget ${ids.length} rollout(s) in ${preview.calls_per_server} call(s) per server; sent nothing`)
        for (const r of preview.would_refuse) warn(`${r.server} would refuse it: phase ${r.phase}${r.checkpoint_id ? ` of '${r.checkpoint_id}'` : ''} (resume first)`)
      }
      return {dry_run: true, rollout_count: ids.length, participant_count: discovery.participants.length, ...preview}
    }
    const n = await forget(coordinator, id, ids, Date.now() / 1000 + this.flags.timeout)
    if (!this.jsonEnabled()) this.log(`forgot ${n} rollout(s) on ${coordinator.participants.length} participant(s)`)
    return {dry_run: false, rollout_count: n, participant_count: coordinator.participants.length}
  }
}
