import {defineConfig} from 'vitest/config'

import {MutationTiming} from './test/helpers/mutation-timing.js'
import base from './vitest.config.js'

// The tests Stryker runs against each mutant: the in-process ones only. test/cli runs the built
// CLI (dist/) as processes, which a mutant of src/ never reaches. The model-based test is left out
// too: it draws new random sequences on every run (a kill it makes cannot be replayed by Stryker's
// next run) and takes its 20 s budget each time, for every mutant its coverage touches.
// GYMCKPT_MUTATION_EXCLUDE (comma-separated globs) leaves more test files out of a local run;
// GYMCKPT_MUTATION_TIMING=FILE logs each test run's time there (test/helpers/mutation-timing.ts).
const extraExclude = (process.env.GYMCKPT_MUTATION_EXCLUDE ?? '')
  .split(',')
  .map((s) => s.trim())
  .filter(Boolean)

const timing = process.env.GYMCKPT_MUTATION_TIMING

export default defineConfig({
  test: {
    ...base.test,
    include: ['test/unit/**/*.test.ts', 'test/integration/**/*.test.ts'],
    exclude: ['**/node_modules/**', 'test/cli/**', 'test/integration/model-based.test.ts', ...extraExclude],
    ...(timing ? {reporters: [new MutationTiming(timing)]} : {}),
  },
})
