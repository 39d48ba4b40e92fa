import {Flags} from '@oclif/core'

import {SCOPE_HINT, checkpointId, dropRestoredFlag, episodeArgs, episodeFlags, rootFlag} from '../cli/flags.js'
import {FleetCommand, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {episodeInputs} from '../cli/inputs.js'
import {commitJson, keys, note, timingsTable} from '../cli/output.js'
import {progressMode, withProgress} from '../cli/progress.js'
import {checkRestoredInScope, checkRoot, checkScope, commitAndPublish, preparedForCommit} from '../coordination/controller.js'
import {ControllerError, nextStep} from '../coordination/errors.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Commit extends FleetCommand<typeof Commit> {
  static override summary = 'Commit a prepared checkpoint into ROOT/ID and publish it.'
  static override description = `Stateless: reads the checkpoint ID and every restart from the prepared participants' status,
computes the scope as continued(episodes) (the episodes minus the restarts), commits everywhere at
once, then writes ROOT/ID/gymckpt.json and replaces ROOT/LATEST: only after every commit
succeeded. Without --episode or --episodes-file no scope is sent and each participant exports every live episode
(Gym's policy model refuses that; send the scope when you have it).

Episodes: one per line as r, r-a2, r@2 or {"rollout_id":"r","attempt":2}; or a JSON array.

Progress (each phase's stage, the servers still pending, the time left to the deadline) goes to stderr on a terminal (GYMCKPT_PROGRESS=plain also elsewhere, off never); at the end a table of each participant's call times, records and bytes goes to stderr, and to --json as timings.\n\n${fleetExitCodes('participant', 'invalid_checkpoint', 'fleet_state')}`
  static override examples = [
    '<%= config.bin %> commit --fleet fleet.yaml --root /shared/ckpt --episodes-file inflight.txt',
    'trainer-inflight | <%= config.bin %> commit --head http://head:11000 --root /shared/ckpt --episodes-file - --json',
  ]
  static override flags = {
    root: rootFlag(),
    id: checkpointId({summary: 'Checkpoint ID (default: the one every participant is prepared under).'}),
    ...episodeFlags('Episodes the controller continues (required with a policy model)'),
    'no-publish': Flags.boolean({summary: 'Commit only; write neither gymckpt.json nor LATEST.'}),
    'drop-restored': dropRestoredFlag,
    timeout: timeoutFlag,
  }

  async run(): Promise<CommandJson<'commit'>> {
    const episodes = await episodeInputs(this.flags)
    const root = await checkRoot(await this.rootDir(this.flags.root))
    // Tolerant: a member that died since prepare must not leave the others closed.
    const {coordinator, discovery} = await this.connect({tolerant: true})
    const deadlineTs = Date.now() / 1000 + this.flags.timeout
    const {checkpointId: id, restarts} = await preparedForCommit(coordinator, discovery, {id: this.flags.id, deadlineTs, log: note, again: this.rootArgs(), scopeArgs: episodeArgs(this.flags)})
    try {
      checkScope(coordinator, episodes, SCOPE_HINT)
      if (episodes && !this.flags['drop-restored'])
        checkRestoredInScope(
          discovery.participants.map((p) => [p.server, p.status] as const),
          episodes,
        )
    } catch (err) {
      // The fleet stays prepared: this command with the scope commits it, or resume reopens it.
      if (err instanceof ControllerError) err.withNext(nextStep('commit', ['--id', id, ...this.rootArgs(), '--episodes-file', '-']), nextStep('resume', ['--id', id]))
      throw err
    }
    const out = await withProgress(
      {commit: {title: this.flags['no-publish'] ? 'commit' : 'commit and publish', operations: ['commit']}},
      {mode: progressMode(this.jsonEnabled()), signal: this.signal},
      ({onCall}) =>
        commitAndPublish(
          {...coordinator, onCall},
          {
            checkpointId: id,
            root,
            episodes,
            restarts,
            deadlineTs,
            publish: !this.flags['no-publish'],
            rememberScope: true,
            committedOn: discovery.participants.filter((p) => p.status.phase === 'committed' && p.status.checkpoint_id === id).map((p) => p.server),
          },
        ),
    ).catch((err: unknown) => {
      if (err instanceof ControllerError && err.next.length === 0) err.withNext(nextStep('resume', ['--id', id]))
      throw err
    })
    const next = [this.nextLine(nextStep('resume', ['--id', id]))]
    if (!this.jsonEnabled()) {
      this.log(out.checkpointDir)
      note(timingsTable(out.timings))
      note(`committed '${id}' on ${out.replies.size} participant(s); continued: ${keys(out.continued)}; restarted: ${keys(out.restarted)}`)
      note(out.published ? `published: LATEST -> ${id}` : 'not published (--no-publish)')
      note(`the fleet stays closed until resumed; next: ${next[0]}`)
    }
    return {...commitJson(out), next}
  }

  /** --root as given (a root from GYMCKPT_ROOT or the config is found again by the pasted line). */
  private rootArgs(): string[] {
    return this.flags.root ? ['--root', this.flags.root] : []
  }
}
