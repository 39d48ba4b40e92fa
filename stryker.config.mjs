// Mutation testing: `npm run mutation` (everything, slow) or one file:
// `npm run mutation -- --mutate src/storage/root.ts`. Reports go to reports/mutation/.
/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  packageManager: 'npm',
  testRunner: 'vitest',
  // `related` off: each mutant still runs only the tests that covered it (perTest), but Stryker's
  // vitest runner would also keep only test files that import the mutant's file, and no test file
  // imports verify-worker.ts (its code runs in worker threads, bridged by test/helpers/store.ts):
  // with it on, every mutant of that file ran no test and survived.
  vitest: {configFile: 'vitest.stryker.config.ts', related: false},
  checkers: ['typescript'],
  tsconfigFile: 'tsconfig.json',
  typescriptChecker: {prioritizePerformanceOverAccuracy: true},
  mutate: ['src/coordination/**/*.ts', 'src/protocol/**/*.ts', 'src/storage/**/*.ts', 'src/control-plane/control-plane.ts', '!src/**/index.ts'],
  coverageAnalysis: 'perTest',
  // A static mutant (module-level code, run once as a module loads: constant tables, schemas) has no
  // covering test to pick, so Stryker reruns the whole in-process suite for it (~5 min here, each).
  // A few hundred of them could take longer than every other mutant together, so they are left
  // out and counted in no score; GYMCKPT_MUTATION_STATIC=1 puts them back.
  ignoreStatic: process.env.GYMCKPT_MUTATION_STATIC !== '1',
  // With the TypeScript checker, half of this goes to checkers and half to test runners (the
  // checkers' share becomes runners once every mutant is checked). On the 2-core machines here, 4
  // tested about a fifth more mutants in the same time than 2: the checkers keep a core busy for the
  // first half hour and more, and the runners' tests spend much of their time waiting on servers.
  concurrency: 4,
  timeoutMS: 15000,
  timeoutFactor: 2,
  dryRunTimeoutMinutes: 15,
  reporters: ['html', 'json', 'clear-text', 'progress'],
  htmlReporter: {fileName: 'reports/mutation/mutation.html'},
  jsonReporter: {fileName: 'reports/mutation/mutation.json'},
  clearTextReporter: {allowColor: false, logTests: false, reportScoreTable: true},
  tempDirName: '.stryker-tmp',
  ignorePatterns: ['dist', 'reports', 'coverage', '.bench-tmp', 'oclif.manifest.json'],
  thresholds: {high: 90, low: 85, break: null},
}
