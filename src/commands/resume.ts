import {checkpointId} from '../cli/flags.js'
import {BaseCommand, fleetFlags, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {note, warn} from '../cli/output.js'
import {openCheckpoints} from '../coordination/controller.js'
import {ControllerError, CoordinationError, failureMessage, nextStep} from '../coordination/errors.js'
import {resumeAll} from '../coordination/operations.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Resume extends BaseCommand<typeof Resume> {
  static override summary = 'Reopen every participant (resources, agent, model, environment), going on past failures.'
  static override description = `Resuming an ID fences it for good on every participant: a late prepare of it is refused.
Without --id, resumes the checkpoint or restore the participants report as active. Participants
that are down are reported (exit 3) after every reachable one was resumed; they reopen by
themselves when their lease expires.\n\n${fleetExitCodes('participant')}`
  static override examples = ['<%= config.bin %> resume --fleet fleet.yaml --id ckpt-20261202T120000-1a2b3c4d', '<%= config.bin %> resume --head http://head:11000']
  static override flags = {...fleetFlags, id: checkpointId({summary: 'Checkpoint or restore ID to resume.'}), timeout: timeoutFlag}

  async run(): Promise<CommandJson<'resume'>> {
    // A member that is down must not keep the others closed: resume whoever answers.
    const {coordinator, discovery} = await this.connect(undefined, {tolerant: true})
    const statuses = new Map(discovery.participants.map((p) => [p.server, p.status]))
    const active = [...openCheckpoints(statuses).keys()]
    let id = this.flags.id
    if (!id) {
      if (active.length > 1)
        throw new ControllerError('input', `participants report several active checkpoints (${active.join(', ')}); pass --id`).withNext(...active.map((k) => nextStep('resume', ['--id', k])))
      id = active[0]
    }
    const down = discovery.failures.filter((f) => f.code !== 'no_model')
    const result = id ? await resumeAll(coordinator, id, Date.now() / 1000 + this.flags.timeout) : {replies: new Map(), failures: []}
    const participants = [...result.replies].map(([server, r]) => ({server, phase: r.phase, idempotent: r.idempotent}))
    const reopened = [...result.replies.values()].filter((r) => !r.idempotent).length
    if (!this.jsonEnabled()) {
      if (!id) note('no participant has an active checkpoint; nothing to resume')
      else this.log(`resumed '${id}' on ${result.replies.size} participant(s) (${reopened} reopened, ${result.replies.size - reopened} had nothing open under it)`)
      if (id && this.flags.id && reopened === 0 && result.failures.length === 0 && down.length === 0) {
        warn(`no participant had '${id}' open; it is now fenced everywhere (a late prepare of it is refused)${active.length ? `; open: ${active.join(', ')}` : ''}`)
      }
    }
    if (id && result.failures.length) {
      const others = active.filter((k) => k !== id)
      const conflict = result.failures.some((f) => f.code === 'checkpoint_conflict')
      throw new CoordinationError(
        'resume',
        result.failures,
        conflict && others.length
          ? `those participants hold another checkpoint (${others.join(', ')}); resume that one if no controller is still working on it`
          : `the other participants were resumed; resume '${id}' again`,
      ).withNext(...(conflict && others.length ? others.map((k) => nextStep('resume', ['--id', k])) : [nextStep('resume', ['--id', id])]))
    }
    if (down.length) {
      const lease = Math.max(0, ...discovery.participants.filter((p) => p.status.checkpoint_id === id).map((p) => p.status.lease_expires_at ?? 0))
      throw new CoordinationError(
        'discover',
        down,
        `every reachable participant was resumed${id ? ` under '${id}'` : ''}; the ones down reopen by themselves when their lease expires${lease ? ` (the others' lease ran to ${new Date(lease * 1000).toISOString()})` : ''}, or resume again once they are back`,
      ).withNext(...(id ? [nextStep('resume', ['--id', id])] : []))
    }
    return {checkpoint_id: id ?? null, participants, unreachable: down.map((f) => ({server: f.server, message: failureMessage(f)}))}
  }
}
