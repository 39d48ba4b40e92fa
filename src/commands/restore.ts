import {Args, Flags} from '@oclif/core'

import {errColor} from '../cli/color.js'
import {checkpointId, rootFlag} from '../cli/flags.js'
import {FleetCommand, timeoutFlag, fleetExitCodes} from '../cli/base.js'
import {episodesJson, keys, note, problemNote, table, timingsJson, timingsTable} from '../cli/output.js'
import {progressMode, withProgress} from '../cli/progress.js'
import {nextStep} from '../coordination/errors.js'
import {RestorePlan, assertRestorable, planRestore, restoreCheckpoint} from '../coordination/restore.js'
import {nextAttempt} from '../protocol/episode.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Restore extends FleetCommand<typeof Restore> {
  static override summary = 'Restore a published checkpoint into freshly started servers, all or nothing.'
  static override description = `First a preflight that sends nothing but status probes: every participant must be a fresh
process (idle, no open checkpoint, no live episodes or sessions, no restored state, no retired
marks) or the restore is refused (exit 8) naming each busy server; the checkpoint is verified
offline (exit 6 if invalid). Then every participant restores at once under a new restore ID, the
crashed attempts of restarts are retired under that ID while admission is still closed, and the
fleet is resumed (unless --no-resume). If any
participant fails, each participant that installed state retires exactly what it installed,
every participant is resumed, and the restore's own error is reported (exit 4). Dispatch each
continued episode next at attempt + 1; start restarts over from input at attempt + 1.
--dry-run runs the same preflight and reports what the restore would do, exiting as it would.

Progress (each phase's stage, the servers still pending, the time left to the deadline) goes to stderr on a terminal (GYMCKPT_PROGRESS=plain also elsewhere, off never); at the end a table of each participant's call times, records and bytes goes to stderr, and to --json as timings.\n\n${fleetExitCodes('participant', 'invalid_checkpoint', 'fleet_state')}`
  static override examples = ['<%= config.bin %> restore /shared/ckpt --fleet fleet.yaml', '<%= config.bin %> restore /shared/ckpt --head http://head:11000 --dry-run --json']
  static override args = {location: Args.string({description: 'Checkpoint root (LATEST is followed) or checkpoint directory (default: --root, GYMCKPT_ROOT, or the config context).'})}
  static override flags = {
    id: checkpointId({summary: 'Checkpoint ID under the root (default: LATEST).'}),
    root: rootFlag('Checkpoint root, instead of the positional'),
    'dry-run': Flags.boolean({summary: 'Run the preflight and show what the restore would do; send nothing.'}),
    'no-resume': Flags.boolean({summary: 'Leave the restored fleet closed; resume it yourself with the restore ID.', aliases: ['keep-closed']}),
    'skip-verify': Flags.boolean({summary: 'Skip the offline verification (the fleet preflight still runs).'}),
    timeout: timeoutFlag,
  }

  async run(): Promise<CommandJson<'restore'>> {
    const {coordinator} = await this.connect()
    const opts = {
      location: await this.rootDir(this.args.location, this.flags.root),
      checkpointId: this.flags.id,
      timeoutS: this.flags.timeout,
      skipVerify: this.flags['skip-verify'],
      keepClosed: this.flags['no-resume'],
      log: note,
    }
    if (this.flags['dry-run']) {
      const plan = await planRestore(coordinator, opts)
      if (!this.jsonEnabled()) this.render(plan, true)
      // Exits as the real restore would: refused fleets and invalid checkpoints are errors, whose
      // JSON details carry the plan.
      this.failureContext = {dry_run: true, valid: false, ...planJson(plan)}
      assertRestorable(plan, {dryRun: true})
      return {dry_run: true, valid: true, ...planJson(plan)}
    }
    const r = await withProgress(
      {
        preflight: {title: 'preflight (fresh fleet, verify the checkpoint)', operations: []},
        restore: {title: 'restore', operations: ['restore']},
        retire: {title: 'retire the crashed attempts of restarts', operations: ['retire']},
        resume: {title: 'resume (resources → agent → model → environment)', operations: ['resume']},
      },
      {mode: progressMode(this.jsonEnabled()), signal: this.signal},
      ({onPhase, onCall}) => {
        onPhase('preflight', 'start')
        return restoreCheckpoint({...coordinator, onCall}, opts)
      },
    )
    const next = r.resumed ? [] : [this.nextLine(nextStep('resume', ['--id', r.restoreId]))]
    if (!this.jsonEnabled()) {
      this.log(r.restoreId)
      this.render(r, false)
      note(timingsTable(r.timings))
      note(r.resumed ? `restored '${r.checkpointId}' and resumed the fleet` : `restored '${r.checkpointId}'; the fleet is closed until you resume it: ${next[0]}`)
    }
    return {
      dry_run: false,
      restore_id: r.restoreId,
      resumed: r.resumed,
      ...planJson(r),
      restored: r.participants.map((p) => ({server: p.server, kind: p.kind, instance: p.instance, restored: r.restoredByServer[p.server] ?? []})),
      timings: timingsJson(r.timings),
      next,
    }
  }

  private render(plan: RestorePlan, dryRun: boolean): void {
    for (const p of plan.verify?.problems ?? []) problemNote(p)
    for (const b of plan.busy) note(`busy: ${b.server} ${b.reasons.join(', ')}`)
    for (const u of plan.unreachable) note(`unreachable: ${u.server}: ${u.message}`)
    note(
      table(
        plan.participants.map((p) => ({server: p.server, kind: p.kind, instance: p.instance, records: p.records, install: p.install, skip: p.skip})),
        ['server', 'kind', 'instance', 'records', 'install', 'skip'],
        errColor,
      ),
    )
    const verb = dryRun ? 'would ' : ''
    note(`${dryRun ? 'restore would' : 'restore'} of ${plan.checkpointId}: ${verb}continue ${plan.replacements.length} episode(s) at attempt + 1 on ${plan.participants.length} participant(s)`)
    note(`dispatch next (attempt + 1, from its boundary): ${keys(plan.replacements)}`)
    note(`start over from input (attempt + 1, old attempt retired before the resume): ${keys(plan.restarted.map(nextAttempt))}`)
  }
}

function planJson(plan: RestorePlan) {
  return {
    checkpoint_id: plan.checkpointId,
    checkpoint_dir: plan.checkpointDir,
    continued: episodesJson(plan.continued),
    replacements: episodesJson(plan.replacements),
    restarted: episodesJson(plan.restarted),
    restart_attempts: episodesJson(plan.restarted.map(nextAttempt)),
    participants: plan.participants,
    busy: plan.busy,
    unreachable: plan.unreachable.map((u) => ({server: u.server, message: u.message})),
    missing: plan.missing,
    problems: plan.verify?.problems ?? [],
  }
}
