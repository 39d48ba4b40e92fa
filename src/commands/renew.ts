import {checkpointId} from '../cli/flags.js'
import {FleetCommand, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {renew} from '../coordination/operations.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Renew extends FleetCommand<typeof Renew> {
  static override summary = "Extend every participant's lease on an open checkpoint."
  static override description = `Leases end at deadline + grace; renew when publishing takes longer than expected. A lease
never moves earlier.\n\n${fleetExitCodes('participant')}`
  static override examples = ['<%= config.bin %> renew --fleet fleet.yaml --id ckpt-20261202T120000-1a2b3c4d --timeout 900']
  static override flags = {id: checkpointId({summary: 'The open checkpoint.', required: true}), timeout: timeoutFlag}

  async run(): Promise<CommandJson<'renew'>> {
    const {coordinator} = await this.connect()
    const replies = await renew(coordinator, this.flags.id, Date.now() / 1000 + this.flags.timeout)
    const participants = [...replies].map(([server, r]) => ({server, lease_expires_at: r.lease_expires_at}))
    if (!this.jsonEnabled()) for (const p of participants) this.log(`${p.server}\t${new Date(p.lease_expires_at * 1000).toISOString()}`)
    return {checkpoint_id: this.flags.id, participants}
  }
}
