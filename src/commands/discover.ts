import {FleetCommand, fleetExitCodes} from '../cli/base.js'
import {note, table} from '../cli/output.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Discover extends FleetCommand<typeof Discover> {
  static override summary = 'List the checkpoint participants of a Gym fleet.'
  static override description = `Probes every server's checkpoint status route. A 404 means "not a participant" (skipped);
a server that is down, silent, refuses the token or reports an unknown kind fails discovery, and so
does a fleet without a policy model.\n\n${fleetExitCodes()}`
  static override examples = ['<%= config.bin %> discover --head http://head:11000', '<%= config.bin %> discover --server env=http://127.0.0.1:9001 --server policy=http://127.0.0.1:9002 --json']
  static override flags = {}

  async run(): Promise<CommandJson<'discover'>> {
    const {discovery} = await this.connect()
    const participants = discovery.participants.map((p) => ({server: p.server, kind: p.kind, instance: p.instance, url: p.url, phase: p.status.phase}))
    if (!this.jsonEnabled()) {
      this.log(table(participants, ['server', 'kind', 'instance', 'phase', 'url']))
      if (discovery.skipped.length) note(`not participants (404): ${discovery.skipped.map((s) => s.name).join(', ')}`)
    }
    return {participants, skipped: discovery.skipped.map((s) => ({server: s.name, url: s.url}))}
  }
}
