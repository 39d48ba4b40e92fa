import path from 'node:path'

import {Flags} from '@oclif/core'
import {Listr} from 'listr2'

import {FleetCommand, fleetExitCodes, timeoutFlag} from '../cli/base.js'
import {checked, parseDuration, rootFlag} from '../cli/flags.js'
import {note} from '../cli/output.js'
import {Collector, CollectOutcome, CollectStats} from '../coordination/collect.js'
import {checkRoot} from '../coordination/controller.js'
import {ControllerError} from '../coordination/errors.js'
import {CollectInputError, ResultsFile, acquirePidLock, readRows} from '../storage/collector.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Collect extends FleetCommand<typeof Collect> {
  static override summary = 'Run a rollout collection with partial-rollout checkpoints, and continue it after a crash.'
  static override description = `Sends every input row (a Gym run body) to /run, at most --concurrency at a time, and appends
each finished row to --output as it completes. Each attempt is logged in ROOT/dispatched.jsonl
before its /run is sent; a failed /run is never resent, but retired everywhere and sent again as
the next attempt. Checkpoints (every --checkpoint-every, and on SIGUSR1) pause dispatch, prepare
in Gym's order, commit continued(in flight + restored-unclaimed), publish ROOT/LATEST and resume.
On SIGTERM or SIGINT (preemption) it stops dispatching, takes a checkpoint and exits 75; run the
same command with --resume on a freshly started fleet to continue from it. The root is laid out
as Gym's own collector lays it out, so either can resume the other's run.\n\n${fleetExitCodes('participant', 'invalid_checkpoint', 'fleet_state', 'preempted')}`
  static override examples = [
    '<%= config.bin %> collect --fleet fleet.yaml --input rows.jsonl --output results.jsonl --root /shared/collect --checkpoint-every 5m',
    '<%= config.bin %> collect --fleet fleet.yaml --input rows.jsonl --output results.jsonl --root /shared/collect --resume',
  ]
  static override flags = {
    input: Flags.string({summary: 'Input rows, one Gym run body per line (JSONL).', required: true}),
    output: Flags.string({summary: 'Results file, one finished row per line (JSONL), appended as rows finish.', required: true}),
    root: rootFlag('Collection root: dispatch log, checkpoints, LATEST'),
    agent: Flags.string({summary: 'Server that takes /run (default: the only environment server).'}),
    concurrency: Flags.integer({summary: '/run calls in flight at most; 1 to 4096.', default: 64, min: 1, max: 4096}),
    'checkpoint-every': Flags.custom<number | null>({parse: checked((v) => parseDuration(v, '--checkpoint-every', 86_400))})({
      summary: 'Checkpoint period: 90, 90s, 5m, 1h, or off.',
      default: 300,
      defaultHelp: async () => '5m',
    }),
    'max-attempts': Flags.integer({summary: 'Failed /run calls a row may have before it counts as failed; 1 to 100.', default: 3, min: 1, max: 100}),
    resume: Flags.boolean({summary: 'Continue the run whose dispatch log and LATEST are in --root (on freshly started servers).'}),
    timeout: timeoutFlag,
  }

  private collector: Collector | null = null
  private stopping = false

  protected override onFirstSignal(sig: NodeJS.Signals): boolean {
    if (this.stopping || !this.collector) return false
    this.stopping = true
    process.stderr.write(`\n${sig}: checkpointing, then stopping (send again, after 2 s, to abort the checkpoint)\n`)
    this.collector.requestStop()
    return true
  }

  async run(): Promise<CommandJson<'collect'>> {
    const f = this.flags
    const every = f['checkpoint-every']
    const rows = await readRows(f.input).catch(asInput)
    const root = await checkRoot(await this.rootDir(f.root))
    const {coordinator, discovery} = await this.connect()
    const target = f.agent
      ? [...discovery.participants, ...discovery.skipped.map((s) => ({server: s.name, url: s.url, kind: 'none'}))].find((p) => p.server === f.agent)
      : discovery.participants.filter((p) => p.kind === 'environment').length === 1
        ? discovery.participants.find((p) => p.kind === 'environment')
        : undefined
    if (!target)
      throw new ControllerError('input', f.agent ? `--agent ${f.agent}: no such server in the fleet` : 'the fleet has no single environment server: pass --agent NAME, the server that takes /run')
    // The root's lock before the output is opened: opening it for --resume cuts a torn last line,
    // which must never happen to the output of another collector still running.
    const release = await acquirePidLock(root).catch(asInput)
    const output = await ResultsFile.open(path.resolve(f.output), {resume: f.resume}).catch(async (err: unknown) => {
      await release()
      return asInput(err)
    })
    const tty = !this.jsonEnabled() && process.stderr.isTTY === true
    let render: ((s: CollectStats) => void) | undefined
    let log = (m: string) => note(m)
    const collector = new Collector(coordinator, {
      rows,
      root,
      output,
      runUrl: target.url,
      concurrency: f.concurrency,
      checkpointEveryMs: every === null ? null : every * 1000,
      timeoutS: f.timeout,
      maxAttempts: f['max-attempts'],
      resume: f.resume,
      log: (m) => log(m),
      onProgress: (s) => render?.(s),
    })
    this.collector = collector
    process.on('SIGUSR1', onUsr1)
    function onUsr1() {
      note('SIGUSR1: checkpoint requested')
      collector.requestCheckpoint()
    }
    let out: CollectOutcome
    try {
      if (tty) {
        out = await new Listr<{out?: CollectOutcome}>(
          [
            {
              title: 'collect',
              task: async (ctx, task) => {
                let last = 0
                render = (s) => {
                  if (Date.now() - last < 200) return
                  last = Date.now()
                  task.title = progressLine(s)
                }
                log = (m) => (task.output = m)
                ctx.out = await collector.run()
                task.title = progressLine(ctx.out)
              },
              rendererOptions: {outputBar: 3},
            },
          ],
          {registerSignalListeners: false, rendererOptions: {collapseErrors: false}},
        )
          .run({})
          .then((ctx) => ctx.out!)
      } else out = await collector.run()
    } finally {
      process.off('SIGUSR1', onUsr1)
    }
    const summary = summaryJson(out)
    if (!this.jsonEnabled()) note(`${progressLine(out)}; wall ${(out.wallMs / 1000).toFixed(1)} s; output ${output.file}`)
    const failed = out.failedRows
      .slice(0, 5)
      .map((r) => `${r.rollout_id} after ${r.attempts} attempt(s) (${r.error})`)
      .join('; ')
    if (out.end === 'stopped') {
      // A stop of the run's own (its output could not be written) says why, before what to do.
      const why = failed ? ` (${out.failedRows.length} row(s) failed: ${failed})` : ''
      if (out.stopCheckpointed)
        throw new ControllerError('preempted', `stopped after checkpoint '${out.lastCheckpointId}'${why}; continue with the same command and --resume on a freshly started fleet`, summary)
      throw new ControllerError('interrupted', `stopped, but the stop checkpoint was not taken${why}; --resume continues from the previous checkpoint, if any`, summary)
    }
    if (out.failedRows.length) throw new ControllerError('participant', `${out.failedRows.length} row(s) failed: ${failed}`, summary)
    return summary
  }
}

function asInput(err: unknown): never {
  if (err instanceof CollectInputError) throw new ControllerError('input', err.message)
  throw err
}

function progressLine(s: CollectStats): string {
  return `rows ${s.done}/${s.total} done, ${s.inFlight} in flight, ${s.failed} failed; ${s.checkpoints} checkpoint(s)${s.lastCheckpointAt ? ` (last ${s.lastCheckpointAt})` : ''}${s.checkpointsMissed ? `, ${s.checkpointsMissed} missed` : ''}${s.restores ? `; restored ${s.restores}` : ''}`
}

function summaryJson(o: CollectOutcome) {
  const sorted = [...o.pausesMs].sort((a, b) => a - b)
  return {
    run_id: o.runId,
    end: o.end,
    rows: o.total,
    done: o.done,
    failed: o.failed,
    retried: o.retried,
    checkpoints: o.checkpoints,
    checkpoints_missed: o.checkpointsMissed,
    checkpoints_failed: o.checkpointsFailed,
    restores: o.restores,
    restores_failed: o.restoresFailed,
    last_checkpoint_id: o.lastCheckpointId,
    pause_ms_median: sorted[Math.floor(sorted.length / 2)] ?? null,
    wall_ms: o.wallMs,
    failed_rows: o.failedRows,
  }
}
