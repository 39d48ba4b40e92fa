import {Flags} from '@oclif/core'

import {FleetCommand, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {SCOPE_HINT, checkpointId, dropRestoredFlag, episodeArgs, episodeFlags, rootFlag, seconds} from '../cli/flags.js'
import {episodeInputs} from '../cli/inputs.js'
import {commitJson, keys, note, timingsTable} from '../cli/output.js'
import {progressMode, withProgress} from '../cli/progress.js'
import {checkpoint} from '../coordination/controller.js'
import {ControllerError, nextStep} from '../coordination/errors.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Checkpoint extends FleetCommand<typeof Checkpoint> {
  static override summary = 'One-shot checkpoint: prepare, commit, publish, resume.'
  static override description = `Prepares in Gym's order, commits continued(episodes) into ROOT/ID, writes gymckpt.json, replaces
ROOT/LATEST, and resumes. Whatever fails after prepare, and on SIGINT/SIGTERM, every participant
is resumed before the command exits. Leases are renewed while it runs.

Progress (each phase's stage, the servers still pending, the time left to the deadline) goes to stderr on a terminal (GYMCKPT_PROGRESS=plain also elsewhere, off never); at the end a table of each participant's call times, records and bytes goes to stderr, and to --json as timings.\n\n${fleetExitCodes('participant', 'not_prepared', 'invalid_checkpoint', 'fleet_state')}`
  static override examples = [
    '<%= config.bin %> checkpoint --fleet fleet.yaml --root /shared/ckpt --episodes-file inflight.txt',
    'trainer-inflight | <%= config.bin %> checkpoint --head http://head:11000 --root /shared/ckpt --episodes-file - --json',
  ]
  static override flags = {
    root: rootFlag(),
    id: checkpointId({summary: 'Checkpoint ID (default: a new ckpt-<time>-<hex>).'}),
    ...episodeFlags('Episodes the controller continues (required with a policy model)'),
    timeout: timeoutFlag,
    'renew-every': seconds({summary: 'Seconds between lease renewals while the checkpoint runs.', default: 60, max: 3600}),
    'keep-closed': Flags.boolean({summary: 'When prepare misses its deadline, leave the fleet closed for inspection.'}),
    'drop-restored': dropRestoredFlag,
  }

  async run(): Promise<CommandJson<'checkpoint'>> {
    const episodes = await episodeInputs(this.flags)
    const root = await this.rootDir(this.flags.root)
    const {coordinator} = await this.connect()
    const out = await withProgress(
      {
        prepare: {title: 'prepare (environment → model → agent → resources)', operations: ['prepare'], endsExplicitly: true},
        commit: {title: 'commit and publish', operations: ['commit'], endsExplicitly: true},
        resume: {title: 'resume (resources → agent → model → environment)', operations: ['resume']},
      },
      {mode: progressMode(this.jsonEnabled()), signal: this.signal},
      ({onPhase, onCall}) =>
        checkpoint(
          {...coordinator, onCall},
          {
            root,
            checkpointId: this.flags.id,
            timeoutS: this.flags.timeout,
            episodes,
            scopeHint: SCOPE_HINT,
            dropRestored: this.flags['drop-restored'],
            renewEveryMs: this.flags['renew-every'] * 1000,
            keepClosedOnBlockers: this.flags['keep-closed'],
            log: note,
            onPhase: (p, s) => (p === 'publish' ? undefined : onPhase(p, s)),
          },
        ),
    ).catch((err: unknown) => {
      // Every failure after prepare resumed the fleet: the next step is this command again, under
      // a new ID (a resumed ID is fenced for good).
      // Not after an input error (no scope, a bad root): the same line would fail the same way.
      if (err instanceof ControllerError && err.code !== 'interrupted' && err.code !== 'input') err.next.push(nextStep('checkpoint', this.again()))
      throw err
    })
    if (!this.jsonEnabled()) {
      this.log(out.checkpointDir)
      note(timingsTable(out.timings))
      note(`checkpoint '${out.checkpointId}' published; continued: ${keys(out.continued)}; restarted: ${keys(out.restarted)}`)
    }
    return commitJson(out)
  }

  private again(): string[] {
    const f = this.flags
    return [
      ...(f.root ? ['--root', f.root] : []),
      ...episodeArgs(f),
      ...(f.timeout !== 300 ? ['--timeout', String(f.timeout)] : []),
      ...(f['renew-every'] !== 60 ? ['--renew-every', String(f['renew-every'])] : []),
    ]
  }
}
