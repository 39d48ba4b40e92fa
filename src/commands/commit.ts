import {Flags} from '@oclif/core'

import {checkpointId, episodeFlags, rootFlag} from '../cli/flags.js'
import {BaseCommand, fleetFlags, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {episodeInputs} from '../cli/inputs.js'
import {commitJson, keys, note, timingsTable, warn} from '../cli/output.js'
import {progressMode, withProgress} from '../cli/progress.js'
import {afterClose, checkRoot, closeCheckpoint, commitAndPublish, openCheckpoints} from '../coordination/controller.js'
import {DiscoveredParticipant} from '../coordination/discover.js'
import {ControllerError, CoordinationError, failureMessage, nextStep} from '../coordination/errors.js'
import {restartsOf} from '../coordination/operations.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Commit extends BaseCommand<typeof Commit> {
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
    ...fleetFlags,
    root: rootFlag(),
    id: checkpointId({summary: 'Checkpoint ID (default: the one every participant is prepared under).'}),
    ...episodeFlags('Episodes the controller continues (default: no scope)'),
    'no-publish': Flags.boolean({summary: 'Commit only; write neither gymckpt.json nor LATEST.'}),
    timeout: timeoutFlag,
  }

  async run(): Promise<CommandJson<'commit'>> {
    const episodes = await episodeInputs(this.flags)
    const root = await checkRoot(await this.rootDir(this.flags.root))
    // Tolerant: a member that died since prepare must not leave the others closed.
    const {coordinator, discovery} = await this.connect(undefined, {tolerant: true})
    const id = this.checkpointToCommit(discovery.participants)
    const down = discovery.failures.filter((f) => f.code !== 'no_model')
    const holders = discovery.participants.filter((p) => p.status.checkpoint_id === id)
    const lost = discovery.participants.filter((p) => p.status.checkpoint_id === null)
    if (holders.length && (down.length || lost.length)) {
      // A member is down or restarted empty: this checkpoint can never be committed. Close it on
      // every reachable participant instead of leaving them closed until their leases run out.
      const closed = await closeCheckpoint(coordinator, id, Date.now() / 1000 + this.flags.timeout, note)
      const after = afterClose(id, closed)
      const why = [...down.map((f) => `${f.server} is down (${failureMessage(f)})`), ...lost.map((p) => `${p.server} holds no checkpoint (restarted, or its lease expired)`)].join('; ')
      const state =
        closed.resumed && down.length
          ? `every reachable participant was resumed; ${down.map((f) => f.server).join(', ')} reopen(s) by itself when its lease expires, or resume again once it is back`
          : after.text
      throw new ControllerError(
        down.length ? 'discovery' : 'participant',
        `checkpoint '${id}' cannot be committed: ${why}; nothing was committed; ${state}. Checkpoint again (a new ID) once every server is back.`,
        {
          checkpoint_id: id,
          unreachable: down,
          lost: lost.map((p) => p.server),
        },
      ).withNext(...(down.length ? [nextStep('resume', ['--id', id])] : after.next))
    }
    if (down.length) throw new CoordinationError('discover', down, 'every participant must answer before a commit; nothing was sent').withNext(nextStep('commit', ['--id', id, ...this.rootArgs()]))
    const notPrepared = discovery.participants.filter((p) => p.status.checkpoint_id !== id || (p.status.phase !== 'prepared' && p.status.phase !== 'committed'))
    if (notPrepared.length) {
      throw new ControllerError(
        'fleet_state',
        `not prepared under '${id}': ${notPrepared.map((p) => `${p.server} (${p.status.phase}${p.status.checkpoint_id ? ` of '${p.status.checkpoint_id}'` : ''})`).join(', ')}; nothing was sent`,
      ).withNext(nextStep('resume', ['--id', id]))
    }
    const restarts = restartsOf(discovery.participants.map((p) => p.status.report.restarts))
    if (!episodes) warn('no --episode or --episodes-file: committing without a scope; every participant exports all of its live episodes')
    const out = await withProgress(
      {commit: {title: this.flags['no-publish'] ? 'commit' : 'commit and publish', operations: ['commit']}},
      {mode: progressMode(this.jsonEnabled()), signal: this.signal},
      ({onCall}) => commitAndPublish({...coordinator, onCall}, {checkpointId: id, root, episodes, restarts, deadlineTs: Date.now() / 1000 + this.flags.timeout, publish: !this.flags['no-publish']}),
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

  /** The checkpoint the participants are prepared under (or --id), with the real problem when none is. */
  private checkpointToCommit(ps: DiscoveredParticipant[]): string {
    const open = [...openCheckpoints(new Map(ps.map((p) => [p.server, p.status]))).keys()]
    if (this.flags.id) return this.flags.id
    if (open.length === 0) throw new ControllerError('fleet_state', 'no participant has an open checkpoint; nothing was sent. Prepare one first.').withNext(nextStep('prepare', this.rootArgs()))
    if (open.length > 1)
      throw new ControllerError('fleet_state', `participants hold different checkpoints (${open.join(', ')}); nothing was sent. Pass --id, or resume them and prepare again.`).withNext(
        ...open.map((k) => nextStep('resume', ['--id', k])),
      )
    return open[0]!
  }
}
