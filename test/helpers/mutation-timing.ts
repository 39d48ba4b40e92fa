import {appendFileSync} from 'node:fs'
import path from 'node:path'

import type {Reporter, TestModule} from 'vitest/node'

/**
 * A vitest reporter for `npm run mutation` only. With GYMCKPT_MUTATION_TIMING=FILE, every test run
 * Stryker makes (its first run, then one per mutant it tests) appends one line of JSON to FILE: the
 * run's wall time and, per test file, the milliseconds vitest took to set it up, to import it and to
 * run its tests and hooks, with how many tests ran and failed. It shows where a whole run's hours go.
 */
export class MutationTiming implements Reporter {
  #start = 0

  constructor(private readonly file: string) {}

  onTestRunStart(): void {
    this.#start = performance.now()
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    const files = modules.map((m) => {
      const d = m.diagnostic()
      let ran = 0
      let failed = 0
      for (const t of m.children.allTests()) {
        const state = t.result().state
        if (state === 'passed' || state === 'failed') ran++
        if (state === 'failed') failed++
      }
      return {
        file: path.relative(process.cwd(), m.moduleId),
        setup: Math.round(d.environmentSetupDuration + d.prepareDuration + d.setupDuration),
        collect: Math.round(d.collectDuration),
        tests: Math.round(d.duration),
        ran,
        failed,
      }
    })
    // One write per line, in append mode: the lines of several test runners do not interleave.
    appendFileSync(this.file, JSON.stringify({pid: process.pid, ms: Math.round(performance.now() - this.#start), files}) + '\n')
  }
}
