import {appendFileSync} from 'node:fs'
import path from 'node:path'

import type {Reporter, TestModule} from 'vitest/node'

/**
 * A vitest reporter for `npm run mutation` only. With GYMCKPT_MUTATION_TIMING=FILE, every test run
 * Stryker makes (its first run, then one per mutant it tests) appends one line of JSON to FILE: the
 * run's wall time and, per test file it started, in the order it started them, the milliseconds
 * vitest took to set it up, to import it and to run its tests and hooks, with how many tests ran
 * and failed, and the first that failed (the one that killed the mutant). It shows where a whole
 * run's hours go.
 *
 * Stryker reuses one Vitest instance for every mutant, and the modules vitest hands to
 * `onTestRunEnd` include those of earlier runs that this run never started (bail skipped them), so
 * only the modules queued in this run are logged.
 */
export class MutationTiming implements Reporter {
  #start = 0
  #order: string[] = []
  readonly #modules = new Map<string, TestModule>()

  constructor(private readonly file: string) {}

  onTestRunStart(): void {
    this.#start = performance.now()
    this.#order = []
    this.#modules.clear()
  }

  // A module is queued when the worker takes its file, in the order the files run, then collected
  // (as a new object) once imported: the collected one carries the timings.
  onTestModuleQueued(module: TestModule): void {
    this.#order.push(module.moduleId)
    this.#modules.set(module.moduleId, module)
  }

  onTestModuleCollected(module: TestModule): void {
    this.#modules.set(module.moduleId, module)
  }

  onTestRunEnd(): void {
    const files = this.#order.map((id) => {
      const m = this.#modules.get(id)!
      const d = m.diagnostic()
      let ran = 0
      let failed = 0
      let firstFailed: string | undefined
      for (const t of m.children.allTests()) {
        const state = t.result().state
        if (state === 'passed' || state === 'failed') ran++
        if (state === 'failed') {
          failed++
          firstFailed ??= t.fullName
        }
      }
      return {
        file: path.relative(process.cwd(), m.moduleId),
        setup: Math.round(d.environmentSetupDuration + d.prepareDuration + d.setupDuration),
        collect: Math.round(d.collectDuration),
        tests: Math.round(d.duration),
        ran,
        failed,
        ...(firstFailed === undefined ? {} : {firstFailed}),
      }
    })
    const line = {pid: process.pid, ms: Math.round(performance.now() - this.#start), files}
    // One write per line, in append mode: the lines of several test runners do not interleave.
    appendFileSync(this.file, JSON.stringify(line) + '\n')
  }
}
