import {FleetCommand, fleetExitCodes} from '../cli/base.js'
import {statusJson, table} from '../cli/output.js'
import {CoordinationError, failureMessage} from '../coordination/errors.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Status extends FleetCommand<typeof Status> {
  static override summary = "Show every participant's phase, checkpoint, lease and readiness."
  static override description = `One status call per participant, all at once. Servers that fail their probe are listed too,
with their error, and the command then exits 3.\n\n${fleetExitCodes()}`
  static override examples = ['<%= config.bin %> status --fleet fleet.yaml', '<%= config.bin %> status --head http://head:11000 --json | jq .participants']
  static override flags = {}

  async run(): Promise<CommandJson<'status'>> {
    const {discovery} = await this.connect({tolerant: true})
    const participants = statusJson(discovery.participants)
    if (!this.jsonEnabled()) {
      const rows = participants.map((p) => ({
        ...p,
        lease: p.lease_expires_at ? `${Math.round(p.lease_expires_at - Date.now() / 1000)}s` : null,
        blockers: p.blocker_count,
        restarts: p.restarts.length,
        retired: p.retired_rollouts,
      }))
      const failed = discovery.failures.map((f) => ({server: f.server, kind: '?', phase: 'UNREACHABLE', checkpoint_id: failureMessage(f)}))
      this.log(table([...rows, ...failed], ['server', 'kind', 'phase', 'checkpoint_id', 'lease', 'ready', 'blockers', 'restarts', 'retired']))
    }
    if (discovery.failures.length) {
      this.failureContext = {participants}
      throw new CoordinationError('discover', discovery.failures)
    }
    return {participants}
  }
}
