import {Flags} from '@oclif/core'

import {checkpointId, episodeFlags} from '../cli/flags.js'
import {FleetCommand, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {episodeInputs} from '../cli/inputs.js'
import {ControllerError} from '../coordination/errors.js'
import {retire, retirePreview} from '../coordination/operations.js'
import {note, warn} from '../cli/output.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Retire extends FleetCommand<typeof Retire> {
  static override summary = 'Stop and free attempts everywhere, callers first; they stay refused until forget.'
  static override description = `Order: environment, then agent, then model and resources. Refused while a checkpoint is open
(resume first). Each participant marks the attempt (and earlier ones) before it stops anything, so
a late request of a retired attempt gets 409 stale_attempt. Sent in batches of 1024.\n\n${fleetExitCodes('participant')}`
  static override examples = ['<%= config.bin %> retire --fleet fleet.yaml --episode r7 --episode r9-a1', 'cat stragglers.txt | <%= config.bin %> retire --head http://head:11000 --episodes-file -']
  static override flags = {
    ...episodeFlags('Attempts to retire'),
    id: checkpointId({summary: 'Checkpoint ID sent with the call (a restored fleet needs its restore ID).', default: 'retire'}),
    timeout: timeoutFlag,
    'dry-run': Flags.boolean({summary: 'Show the stages, servers and calls it would send, and who would refuse; send nothing but status probes.'}),
  }

  async run(): Promise<CommandJson<'retire'>> {
    // Every input is checked before the fleet is contacted: exit 2 means nothing was sent.
    const id = this.flags.id
    const episodes = (await episodeInputs(this.flags)) ?? []
    if (episodes.length === 0) throw new ControllerError('input', 'nothing to retire: pass --episode or --episodes-file')
    const {coordinator, discovery} = await this.connect()
    if (this.flags['dry-run']) {
      const preview = retirePreview(discovery.participants, episodes.length, id)
      if (!this.jsonEnabled()) {
        for (const st of preview.stages) this.log(`${st.stage}: ${st.servers.join(', ')}`)
        note(`would retire ${episodes.length} attempt(s) in ${preview.calls_per_server} call(s) per server; sent nothing`)
        for (const r of preview.would_refuse) warn(`${r.server} would refuse it: phase ${r.phase}${r.checkpoint_id ? ` of '${r.checkpoint_id}'` : ''} (resume first)`)
      }
      return {dry_run: true, episode_count: episodes.length, participant_count: discovery.participants.length, ...preview}
    }
    const n = await retire(coordinator, id, episodes, Date.now() / 1000 + this.flags.timeout)
    if (!this.jsonEnabled()) this.log(`retired ${n} attempt(s) on ${coordinator.participants.length} participant(s)`)
    return {dry_run: false, episode_count: n, participant_count: coordinator.participants.length}
  }
}
