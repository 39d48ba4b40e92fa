import {Flags} from '@oclif/core'

import {BaseCommand} from '../cli/base.js'
import {exitCodesHelp} from '../cli/exit-codes.js'
import {color, errColor} from '../cli/color.js'
import {note} from '../cli/output.js'
import {ControllerError} from '../coordination/errors.js'
import {runCollectDemo} from '../demo/collect-scenario.js'
import {runDemo} from '../demo/scenario.js'
import type {CommandJson} from '../cli/json-schemas.js'

export default class Demo extends BaseCommand<typeof Demo> {
  static override summary = 'Rehearse on the embedded fleet: checkpoint mid-flight, crash, restore, compare.'
  static override description = `Starts an in-process Gym fleet on 127.0.0.1 (environment, policy model, agent, resources, and
a judge model that takes no part), runs the episodes once uninterrupted, then again with a
checkpoint while they are in flight, a crash of every server, and a restore into a fresh fleet
discovered through a head server. Passes only when every episode's result equals the
uninterrupted run's. Needs no token and no network.

--scenario collect rehearses a rollout collection instead: \`gymckpt fleet\` and \`gymckpt collect\` run
as processes, both are SIGKILLed mid-run, a fresh fleet starts, and \`collect --resume\` finishes the
run; it passes when the output, sorted by rollout ID, equals an uninterrupted run's row for row
(no row lost or duplicated). There --episode-count is the number of rows and --root the work directory.\n\n${exitCodesHelp('input', 'participant')}`
  static override examples = ['<%= config.bin %> demo', '<%= config.bin %> demo --episode-count 200 --steps 12 --root /tmp/rehearsal --json', '<%= config.bin %> demo --scenario collect']
  static override flags = {
    scenario: Flags.string({
      summary: 'restore: checkpoint, crash, restore (in-process); collect: a collection SIGKILLed mid-run and resumed (processes).',
      options: ['restore', 'collect'],
      default: 'restore',
    }),
    'episode-count': Flags.integer({summary: 'Episodes to run.', default: 24, min: 1, max: 10_000, aliases: ['episodes']}),
    steps: Flags.integer({summary: 'Steps per episode (each gets 0-2 more).', default: 8, min: 2, max: 1000}),
    'step-ms': Flags.integer({summary: 'Duration of one step, ms.', default: 40, min: 1, max: 10_000}),
    restarts: Flags.integer({summary: 'Episodes that cannot be captured (they start over).', default: 2, min: 0}),
    root: Flags.string({summary: 'Checkpoint root to write (default: a new temp directory).'}),
  }

  async run(): Promise<CommandJson<'demo'>> {
    if (this.flags.scenario === 'collect') return this.collect()
    const r = await runDemo({
      episodes: this.flags['episode-count'],
      steps: this.flags.steps,
      stepMs: this.flags['step-ms'],
      restarts: this.flags.restarts,
      root: this.flags.root,
      log: this.jsonEnabled() ? undefined : (m) => note(errColor.dim(m)),
    })
    if (!this.jsonEnabled()) {
      this.log(
        `${r.ok ? color.green('PASS') : color.red('FAIL')}: ${r.episodes - r.mismatches.length}/${r.episodes} results equal the uninterrupted run ` +
          `(${r.completedAtCheckpoint} complete at the checkpoint, ${r.continued} continued — ${r.continuedFromBoundary} from a mid-episode boundary — and ${r.restarted} restarted)`,
      )
      this.log(`checkpoint: ${r.checkpointDir}`)
      this.log(`verify it:  gymckpt verify ${r.root}`)
    }
    const json = {
      passed: r.ok,
      episodes: r.episodes,
      checkpoint_id: r.checkpointId,
      checkpoint_dir: r.checkpointDir,
      root: r.root,
      completed_at_checkpoint: r.completedAtCheckpoint,
      continued: r.continued,
      continued_from_boundary: r.continuedFromBoundary,
      restarted: r.restarted,
      mismatches: mismatchesJson(r.mismatches),
      timings_ms: snakeKeys(r.timingsMs),
    }
    if (!r.ok)
      throw new ControllerError(
        'participant',
        `demo failed: ${r.mismatches.length} result(s) differ from the uninterrupted run: ${r.mismatches
          .slice(0, 5)
          .map((m) => m.rolloutId)
          .join(', ')}`,
        json,
      )
    return json
  }

  private async collect() {
    const r = await runCollectDemo({
      rows: this.flags['episode-count'],
      steps: this.flags.steps,
      stepMs: this.flags['step-ms'],
      restarts: this.flags.restarts,
      dir: this.flags.root,
      log: this.jsonEnabled() ? undefined : (m) => note(errColor.dim(m)),
    })
    const bad = r.missing.length + r.duplicated.length + r.mismatches.length
    if (!this.jsonEnabled()) {
      this.log(
        `${r.ok ? color.green('PASS') : color.red('FAIL')}: ${r.rows - r.mismatches.length - r.missing.length}/${r.rows} rows equal the uninterrupted run, sorted by rollout ID ` +
          `(${r.doneBeforeCrash} done before the crash, ${r.continued} continued from ${r.checkpointId} — ${r.continuedFromBoundary} from a mid-episode boundary — ${r.startedOver} started over, ${r.neverStarted} not yet sent); ` +
          `${r.missing.length} lost, ${r.duplicated.length} duplicated`,
      )
      this.log(`results:    ${r.output}`)
      this.log(`root:       ${r.root}`)
    }
    const json = {
      passed: r.ok,
      scenario: 'collect' as const,
      rows: r.rows,
      checkpoint_id: r.checkpointId,
      root: r.root,
      output: r.output,
      done_before_crash: r.doneBeforeCrash,
      continued: r.continued,
      continued_from_boundary: r.continuedFromBoundary,
      started_over: r.startedOver,
      never_started: r.neverStarted,
      missing: r.missing,
      duplicated: r.duplicated,
      mismatches: mismatchesJson(r.mismatches),
      timings_ms: snakeKeys(r.timingsMs),
    }
    if (!r.ok) {
      throw new ControllerError(
        'participant',
        `demo failed: ${bad} row(s) differ from the uninterrupted run: lost ${r.missing.slice(0, 5).join(', ') || 'none'}; duplicated ${r.duplicated.slice(0, 5).join(', ') || 'none'}; different ${
          r.mismatches
            .slice(0, 5)
            .map((m) => m.rolloutId)
            .join(', ') || 'none'
        }`,
        json,
      )
    }
    return json
  }
}

function mismatchesJson(m: {rolloutId: string; expected: string; got: string | null}[]) {
  return m.map((x) => ({rollout_id: x.rolloutId, expected: x.expected, got: x.got}))
}

/** {untilCheckpoint: 1} -> {until_checkpoint: 1}: the JSON contract is snake_case. */
function snakeKeys(o: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(o).map(([k, v]) => [k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`), v]))
}
