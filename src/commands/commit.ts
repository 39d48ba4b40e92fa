import {Flags} from '@oclif/core'

import {BaseCommand, EXIT_CODES_HELP, fleetFlags, timeoutFlag} from '../cli/base.js'
import {readEpisodes} from '../cli/inputs.js'
import {commitJson, keys, note, warn} from '../cli/output.js'
import {commitAndPublish} from '../coordination/controller.js'
import {ControllerError} from '../coordination/errors.js'
import {restartsOf} from '../coordination/operations.js'

export default class Commit extends BaseCommand<typeof Commit> {
  static override summary = 'Commit a prepared checkpoint into ROOT/ID and publish it.'
  static override description = `Stateless: reads the checkpoint ID and every restart from the prepared participants' status,
computes the scope as continued(episodes) (the episodes minus the restarts), commits everywhere at
once, then writes ROOT/ID/gymckpt.json and replaces ROOT/LATEST: only after every commit
succeeded. Without --episodes no scope is sent and each participant exports every live episode
(Gym's policy model refuses that; send the scope when you have it).

Episodes: one per line as r, r-a2, r@2 or {"rollout_id":"r","attempt":2}; or a JSON array.\n\n${EXIT_CODES_HELP}`
  static override examples = [
    '<%= config.bin %> commit --fleet fleet.yaml --root /shared/ckpt --episodes inflight.txt',
    'trainer-inflight | <%= config.bin %> commit --head http://head:11000 --root /shared/ckpt --episodes - --json',
  ]
  static override flags = {
    ...fleetFlags,
    root: Flags.string({summary: 'Checkpoint root; the checkpoint goes to ROOT/ID.', required: true}),
    id: Flags.string({summary: 'Checkpoint ID (default: the one every participant is prepared under).'}),
    episodes: Flags.string({summary: "File of the episodes the controller continues ('-' for stdin)."}),
    'no-publish': Flags.boolean({summary: 'Commit only; write neither gymckpt.json nor LATEST.'}),
    timeout: timeoutFlag,
  }

  async run() {
    const episodes = this.flags.episodes ? await readEpisodes(this.flags.episodes) : null
    const {coordinator, discovery} = await this.connect()
    const ids = [...new Set(discovery.participants.map((p) => p.status.checkpoint_id).filter((x): x is string => x !== null))]
    if (!this.flags.id && ids.length === 0) throw new ControllerError('participant', 'no participant has an open checkpoint: run gymckpt prepare first')
    if (!this.flags.id && ids.length > 1) throw new ControllerError('participant', `participants hold different checkpoints (${ids.join(', ')}): pass --id, or resume them and prepare again`)
    const id = this.flags.id ?? ids[0]!
    const notPrepared = discovery.participants.filter((p) => p.status.checkpoint_id !== id || (p.status.phase !== 'prepared' && p.status.phase !== 'committed'))
    if (notPrepared.length) {
      throw new ControllerError('participant', `not prepared under '${id}': ${notPrepared.map((p) => `${p.server} (${p.status.phase} ${p.status.checkpoint_id ?? ''})`.trim()).join(', ')}; run gymckpt prepare first`)
    }
    const restarts = restartsOf(discovery.participants.map((p) => p.status.report.restarts))
    if (!episodes) warn('no --episodes: committing without a scope; every participant exports all of its live episodes')
    const out = await commitAndPublish(coordinator, {checkpointId: id, root: this.flags.root, episodes, restarts, deadlineTs: Date.now() / 1000 + this.flags.timeout, publish: !this.flags['no-publish']})
    if (!this.jsonEnabled()) {
      this.log(out.checkpointDir)
      note(`committed '${id}' on ${out.replies.size} participant(s); continued: ${keys(out.continued)}; restarted: ${keys(out.restarted)}`)
      note(out.published ? `published: LATEST -> ${id}` : 'not published (--no-publish)')
      note(`next: gymckpt resume --id ${id}`)
    }
    return commitJson(out)
  }
}
