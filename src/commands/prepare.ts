import {Flags} from '@oclif/core'

import {checkpointId, rootFlag} from '../cli/flags.js'
import {FleetCommand, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {episodesJson, keys, note} from '../cli/output.js'
import {checkRoot, prepareOrAbort} from '../coordination/controller.js'
import {nextStep} from '../coordination/errors.js'
import {newCheckpointId} from '../coordination/runs.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Prepare extends FleetCommand<typeof Prepare> {
  static override summary = 'Freeze every participant at a safe boundary (environment, model, agent, resources).'
  static override description = `Stops at the first stage that is not ready by the deadline. Then, unless --keep-closed, every
participant is resumed again and the blockers are reported (exit 5). On success the fleet stays
closed until 'commit' and 'resume'; leases end deadline + grace (Gym: 600 s) after the deadline.\n\n${fleetExitCodes('participant', 'not_prepared', 'fleet_state')}`
  static override examples = [
    'ID=$(<%= config.bin %> prepare --fleet fleet.yaml --json | jq -r .checkpoint_id)',
    '<%= config.bin %> prepare --head http://head:11000 --id ckpt-nightly-7 --timeout 120',
  ]
  static override flags = {
    id: checkpointId({summary: 'Checkpoint ID (default: a new ckpt-<time>-<hex>). Never reuse a resumed ID.'}),
    timeout: timeoutFlag,
    'keep-closed': Flags.boolean({summary: 'When prepare misses its deadline, leave the fleet closed for inspection.'}),
    root: rootFlag('Checkpoint root the commit will write to; checked, and used to print the exact commit command'),
  }

  async run(): Promise<CommandJson<'prepare'>> {
    const root = this.flags.root ?? (await this.settings()).root?.value
    if (root) await checkRoot(root)
    const {coordinator} = await this.connect()
    const id = this.flags.id ?? newCheckpointId()
    const deadlineTs = Date.now() / 1000 + this.flags.timeout
    const prep = await prepareOrAbort(coordinator, id, deadlineTs, {keepClosed: this.flags['keep-closed'], log: note})
    const restarts = prep.restarts()
    // commit publishes and does not resume: the resume is its own step, as in Gym's coordination.
    const next = [
      this.nextLine(nextStep('commit', ['--id', id, ...(this.flags.root ? ['--root', this.flags.root] : root ? [] : ['--root', 'ROOT']), '--episodes-file', '-'])),
      this.nextLine(nextStep('resume', ['--id', id])),
    ]
    if (!this.jsonEnabled()) {
      this.log(id)
      note(`prepared ${prep.replies.size} participant(s); restarts: ${keys(restarts)}`)
      note(`the fleet is closed until it is resumed (leases end ${this.flags.timeout} s + the participants' grace from now)`)
      for (const n of next) note(`next: ${n}`)
      note(
        `(add --episodes-file FILE to the commit: the episodes you continue; Gym's policy model refuses a commit without them${root ? '' : '; pass --root to prepare to print the exact commit line'})`,
      )
    }
    return {checkpoint_id: id, prepared: true, deadline_ts: deadlineTs, restarted: episodesJson(restarts), next}
  }
}
