// Mutation testing: `npm run mutation` (everything, slow) or one file:
// `npm run mutation -- --mutate src/storage/root.ts`. Reports go to reports/mutation/.
/** @type {import('@stryker-mutator/api/core').PartialStrykerOptions} */
export default {
  packageManager: 'npm',
  testRunner: 'vitest',
  vitest: {configFile: 'vitest.stryker.config.ts'},
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
  // The machine has 2 cores and is shared; each runner also starts real HTTP servers.
  concurrency: 2,
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
