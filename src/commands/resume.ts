import {checkpointId} from '../cli/flags.js'
import {FleetCommand, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {note, warn} from '../cli/output.js'
import {resumeFleet} from '../coordination/controller.js'
import {failureMessage} from '../coordination/errors.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Resume extends FleetCommand<typeof Resume> {
  static override summary = 'Reopen every participant (resources, agent, model, environment), going on past failures.'
  static override description = `Resuming an ID fences it for good on every participant: a late prepare of it is refused.
Without --id, resumes the checkpoint or restore the participants report as active. Participants
that are down are reported (exit 3) after every reachable one was resumed; they reopen by
themselves when their lease expires.\n\n${fleetExitCodes('participant')}`
  static override examples = ['<%= config.bin %> resume --fleet fleet.yaml --id ckpt-20261202T120000-1a2b3c4d', '<%= config.bin %> resume --head http://head:11000']
  static override flags = {id: checkpointId({summary: 'Checkpoint or restore ID to resume.'}), timeout: timeoutFlag}

  async run(): Promise<CommandJson<'resume'>> {
    // A member that is down must not keep the others closed: resume whoever answers.
    const {coordinator, discovery} = await this.connect({tolerant: true})
    const out = await resumeFleet(coordinator, discovery, {id: this.flags.id, deadlineTs: Date.now() / 1000 + this.flags.timeout})
    const id = out.checkpointId
    if (!this.jsonEnabled()) {
      if (!id) note('no participant has an active checkpoint; nothing to resume')
      else this.log(`resumed '${id}' on ${out.replies.size} participant(s) (${out.reopened} reopened, ${out.replies.size - out.reopened} had nothing open under it)`)
      if (id && this.flags.id && out.reopened === 0 && !out.error) {
        warn(`no participant had '${id}' open; it is now fenced everywhere (a late prepare of it is refused)${out.active.length ? `; open: ${out.active.join(', ')}` : ''}`)
      }
    }
    if (out.error) throw out.error
    const participants = [...out.replies].map(([server, r]) => ({server, phase: r.phase, idempotent: r.idempotent}))
    return {checkpoint_id: id, participants, unreachable: out.unreachable.map((f) => ({server: f.server, message: failureMessage(f)}))}
  }
}
