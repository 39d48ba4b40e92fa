// The bridge in test/helpers/store.ts that lets a mutation run see verify's worker threads: the
// active mutant reaches a new worker through its environment, and what the worker covered comes
// back into the running test's coverage, but for what it covered while loading, which is static
// coverage. Here a stand-in for Stryker's global plays both sides: the shim records what the worker
// sees and sets the coverage a worker would have recorded, loading and then at work.
import {readFile} from 'node:fs/promises'
import path from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {publishLatest} from '../../src/storage/root.js'
import {scratchDir, verifyWithWorkerShim, writeCheckpoint} from '../helpers/store.js'
import {tempDir} from '../helpers/tmp.js'

interface Ns {
  activeMutant?: string
  currentTestId?: string
  mutantCoverage?: {static: Record<string, number>; perTest: Record<string, Record<string, number>>}
}
const g = globalThis as {__stryker__?: Ns}

const scratch = scratchDir('verify-bridge')
const seen = path.join(scratch, 'worker-env.log')

const SHIM = `// Written by test/unit/verify-worker-bridge.test.ts: what the worker sees, and coverage it "recorded".
import {appendFileSync} from 'node:fs'
import {parentPort} from 'node:worker_threads'
import {register} from 'tsx/esm/api'

appendFileSync(${JSON.stringify(seen)}, String(process.env.__STRYKER_ACTIVE_MUTANT__) + '\\n')
// Covered while the worker's modules load (module-level code).
globalThis.__stryker__ = {mutantCoverage: {static: {l1: 1, w1: 1}, perTest: {}}}
// Covered at work: on each job, before the worker's own listener runs.
parentPort.on('message', () => {
  const c = globalThis.__stryker__.mutantCoverage.static
  c.w1 = (c.w1 ?? 0) + 2
  c.w2 = (c.w2 ?? 0) + 1
})
register()
await import('./verify-worker.ts')
`

let threaded: typeof import('../../src/storage/verify.js')
let remove: () => Promise<void>

beforeAll(async () => {
  ;({verify: threaded, remove} = await verifyWithWorkerShim(scratch, SHIM))
})

afterAll(() => remove())

/** A checkpoint of two small participant directories: with two cores, one of them goes to a worker. */
async function twoDirs(): Promise<string> {
  const root = await tempDir()
  const lines = ['{"episode_id": {"rollout_id": "r0", "attempt": 0}}']
  await writeCheckpoint(path.join(root, 'c'), 'c', [
    {kind: 'agent', instance: 'a1', lines},
    {kind: 'agent', instance: 'a2', lines},
  ])
  await publishLatest(root, 'c')
  return root
}

const workerSaw = async () => (await readFile(seen, 'utf8').catch(() => '')).split('\n').filter(Boolean)

// In a mutation run Stryker's own global is in use, and the bridge is exercised for real.
describe.skipIf(g.__stryker__ !== undefined)('the mutation run’s bridge into verify’s workers', () => {
  it('hands the active mutant to the worker, adds its coverage at work to the running test’s and its loading to the static coverage, and cleans up', async () => {
    const root = await twoDirs()
    g.__stryker__ = {activeMutant: '7', currentTestId: 'T', mutantCoverage: {static: {}, perTest: {T: {m: 1, w1: 1}}}}
    try {
      const before = (await workerSaw()).length
      expect((await threaded.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})).ok).toBe(true)
      expect((await workerSaw()).slice(before)).toEqual(['7'])
      // One worker, one reply: its coverage at work counted once, added to what the test had; what
      // its loading covered is static, as module-level code is in this thread.
      expect(g.__stryker__.mutantCoverage).toEqual({static: {l1: 1, w1: 1}, perTest: {T: {m: 1, w1: 3, w2: 1}}})
      expect(process.env.__STRYKER_ACTIVE_MUTANT__).toBeUndefined()
      // The file is read once: a second call adds only what its own worker covered.
      await threaded.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})
      expect(g.__stryker__.mutantCoverage).toEqual({static: {l1: 2, w1: 2}, perTest: {T: {m: 1, w1: 5, w2: 2}}})
    } finally {
      delete g.__stryker__
    }
  })

  it('between tests (no test ID), into the static coverage; with no active mutant, none is handed over', async () => {
    const root = await twoDirs()
    g.__stryker__ = {}
    try {
      const before = (await workerSaw()).length
      await threaded.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})
      expect((await workerSaw()).slice(before)).toEqual(['undefined'])
      expect(g.__stryker__.mutantCoverage).toEqual({static: {l1: 1, w1: 3, w2: 1}, perTest: {}})
    } finally {
      delete g.__stryker__
    }
  })
})
