import {Flags} from '@oclif/core'

import {FleetCommand, fleetExitCodes} from '../cli/base.js'
import {color, errColor} from '../cli/color.js'
import {seconds} from '../cli/flags.js'
import {note, table} from '../cli/output.js'
import {conformanceJson, runConformance, selectChecks} from '../coordination/conformance.js'
import {ControllerError} from '../coordination/errors.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Conformance extends FleetCommand<typeof Conformance> {
  static override summary = 'Check checkpoint participants against the protocol, as csi-sanity does for CSI drivers.'
  static override description = [
    'For teams writing their own participant or upgrading Gym. Each check names the rule and the section of the protocol reference it tests, and passes, fails, or is skipped with the reason.',
    'By default only safe checks run, fit for a live fleet: status reads, and requests that a conforming participant refuses before any state change (a missing, wrong or inexact bearer; unknown keys; bad checkpoint IDs, deadlines, episode IDs and empty lists).',
    "--destructive drives the whole phase machine on each participant (prepare, renew, commit into a temporary directory, replays and conflicts, resume, fencing, retire and forget) and checks the files it writes byte for byte. Run it on a staging fleet: it is refused (exit 8, nothing sent) when a participant holds live work, unless --force (then each participant's commit, with an empty scope, deletes restored state that no replacement has claimed yet). It resumes whatever it opened, also when a check fails or on SIGINT, and it pushes older IDs out of each participant's 64-ID fence. The temporary directory is made under --dir (default: the OS temp directory), which every participant must see at the same path, and removed afterwards unless --keep-dir.",
    `Exit 0 when no check fails (skips allowed), 4 when one does.\n\n${fleetExitCodes('participant', 'fleet_state')}`,
  ].join('\n\n')
  static override examples = [
    '<%= config.bin %> conformance --server mine=http://10.0.0.7:8000',
    '<%= config.bin %> conformance --fleet staging.yaml --destructive --dir /shared/scratch',
    '<%= config.bin %> conformance --head http://head:11000 --only auth --only refuse --json',
    '<%= config.bin %> conformance --list',
  ]
  static override flags = {
    destructive: Flags.boolean({summary: 'Also run the checks that prepare, commit and resume (a staging fleet).'}),
    force: Flags.boolean({summary: 'Run destructive checks even on participants holding live work.', dependsOn: ['destructive']}),
    'keep-dir': Flags.boolean({summary: 'Keep the temporary checkpoint directory the destructive checks commit into.', dependsOn: ['destructive']}),
    dir: Flags.string({summary: 'Parent of the temporary checkpoint directory; every participant must see it at the same path.', dependsOn: ['destructive']}),
    only: Flags.string({summary: 'Run only this check, or this group: auth, status, report, refuse, retire, phase, lease, fence, outside, commit, store (repeatable).', multiple: true}),
    list: Flags.boolean({summary: 'List the checks (with --only: the selected ones) and exit; needs no fleet.'}),
    timeout: seconds({summary: 'Seconds each call may take (and the deadline_ts sent).', default: 30, max: 3600}),
  }

  async run(): Promise<CommandJson<'conformance'>> {
    const checks = selectChecks(this.flags.only)
    if (this.flags.list) {
      if (!this.jsonEnabled())
        this.log(
          table(
            checks.map((c) => ({...c})),
            ['id', 'section', 'destructive', 'rule'],
          ),
        )
      return {checks}
    }
    const {coordinator, discovery} = await this.connect({tolerant: true})
    const token = await this.controlToken()
    const report = await runConformance({
      client: coordinator.client,
      token,
      discovery,
      checks,
      destructive: this.flags.destructive,
      force: this.flags.force,
      keepDir: this.flags['keep-dir'],
      dir: this.flags.dir,
      timeoutS: this.flags.timeout,
      signal: this.signal,
    })
    const json = conformanceJson(report)
    if (!this.jsonEnabled()) {
      const mark = {pass: color.green('pass'), fail: color.red('FAIL'), skip: color.yellow('skip')}
      this.log(
        table(
          report.results.map((r) => ({check: r.id, section: r.section, server: r.server ?? '*', result: mark[r.result], message: r.message.length > 110 ? `${r.message.slice(0, 109)}…` : r.message})),
          ['check', 'section', 'server', 'result', 'message'],
        ),
      )
      for (const r of report.results.filter((x) => x.result === 'fail')) note(`${errColor.red('fail')} ${r.id} on ${r.server ?? 'the fleet'}: ${r.section} ${r.rule}\n  ${r.message}`)
      if (report.checkpointDir) note(`the checkpoint directory was kept: ${report.checkpointDir}`)
      const {pass, fail, skip} = report.counts
      note(
        `conformance: ${pass} passed, ${fail} failed, ${skip} skipped on ${report.participants.length} participant(s)${report.destructive ? '' : ' (safe checks; --destructive runs the phase machine on a staging fleet)'}`,
      )
    }
    if (report.interrupted) throw new ControllerError('interrupted', 'interrupted; every checkpoint the conformance run opened was resumed', json)
    const failed = report.results.filter((r) => r.result === 'fail')
    if (failed.length) {
      const names = failed.map((r) => `${r.id} (${r.server ?? 'fleet'})`)
      throw new ControllerError('participant', `${failed.length} conformance check(s) failed: ${names.slice(0, 12).join(', ')}${names.length > 12 ? ` … (+${names.length - 12})` : ''}`, json)
    }
    return json
  }
}
