// Verify's worker threads, in process (issue 12, item 4), so that a mutation run sees them.
//
// verifyCheckpoint starts its workers from `verify-worker.js` next to verify's own module, which
// exists only in dist/. Here the sources under test (src/, or Stryker's instrumented copy of it)
// are copied into a scratch directory of the project, with a `verify-worker.js` that loads the
// TypeScript worker through tsx, and verify is imported from that copy: its main-thread code is
// exactly the code under test, and its workers run the real worker module.
import {readFile, readdir, stat, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import * as inline from '../../src/storage/verify.js'
import {scratchDir, verifyWithWorkerShim} from '../helpers/store.js'
import {tempDir} from '../helpers/tmp.js'

const scratch = scratchDir('verify-threads')
const startLog = path.join(scratch, 'worker-starts.log')
let threaded: typeof inline

const SHIM = `// Written by test/unit/verify-threads-mutants.test.ts: the TypeScript worker, through tsx.
import {appendFileSync} from 'node:fs'
import {parentPort} from 'node:worker_threads'
import {register} from 'tsx/esm/api'

appendFileSync(${JSON.stringify(startLog)}, 'start\\n')
// A directory named "crash" kills its worker, as an out-of-memory or a native fault would.
parentPort.on('message', (job) => {
  if (job.instance === 'crash') throw new Error('worker crashed')
  // "exit" ends its worker without an error event, as a kill would.
  if (job.instance === 'exit') process.exit(3)
})
register()
await import('./verify-worker.ts')
`

let remove: () => Promise<void>

beforeAll(async () => {
  ;({verify: threaded, remove} = await verifyWithWorkerShim(scratch, SHIM))
})

afterAll(() => remove())

async function starts(): Promise<number> {
  return (await readFile(startLog, 'utf8').catch(() => '')).split('\n').filter(Boolean).length
}

async function make(instances: string[], corrupt: string[] = []) {
  const root = await tempDir()
  const dir = path.join(root, 'c')
  const participants = []
  for (const instance of instances) {
    const lines = Array.from({length: 50}, (_, i) => `{"episode_id": {"rollout_id": "r${i}", "attempt": 0}, "v": [${i}, NaN]}`)
    const manifest = await writeParticipantState({checkpointDir: dir, kind: 'agent', instance, checkpointId: 'c'}, lines)
    participants.push({server: instance, kind: 'agent', instance, manifest, episode_ids: []})
  }
  const continued = Array.from({length: 49}, (_, i) => ({rollout_id: `r${i}`, attempt: 0}))
  await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: 'c', created_at: 1, continued, restarted: [], participants})
  await publishLatest(root, 'c')
  for (const p of participants.filter((x) => corrupt.includes(x.instance))) {
    await writeFile(path.join(dir, 'gym', 'agent', p.instance, p.manifest.records_file), 'not json\n')
  }
  let bytes = 0
  for (const instance of instances) {
    const d = path.join(dir, 'gym', 'agent', instance)
    for (const f of await readdir(d)) bytes += (await stat(path.join(d, f))).size
  }
  return {root, bytes}
}

describe('verify in worker threads, in process', () => {
  it('gives the same report as one thread, errors included, in directory order', async () => {
    const {root} = await make(['a1', 'a2', 'a3', 'a4'], ['a1', 'a3'])
    const before = await starts()
    const r = await threaded.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})
    // This thread and one worker.
    expect(await starts()).toBe(before + 1)
    const one = await inline.verifyCheckpoint(root, {concurrency: 1})
    expect(r).toEqual(one)
    expect(r.ok).toBe(false)
    expect(r.problems.map((p) => [p.severity, p.where.split(path.sep).at(-1)])).toEqual([
      ['error', 'a1'],
      ['error', 'a3'],
      ['info', 'a2'],
      ['info', 'a4'],
    ])
    expect(r.problems[0]!.message).toMatch(/a1\/records-[0-9a-f]{64}\.jsonl line 1 holds a record that is not JSON$/)
    expect(r.participants.map((p) => [p.instance, p.ok, p.records])).toEqual([
      ['a1', false, 0],
      ['a2', true, 50],
      ['a3', false, 0],
      ['a4', true, 50],
    ])
    expect(r.participants[1]!.episodes).toEqual(one.participants[1]!.episodes)
  })

  it('starts a worker per directory but the one this thread takes, and none below the byte threshold', async () => {
    const {root, bytes} = await make(['b1', 'b2', 'b3'])
    let before = await starts()
    const all = await threaded.verifyCheckpoint(root, {concurrency: 8, workerMinBytes: bytes})
    expect(all.ok).toBe(true)
    // Exactly at the threshold: workers, one per directory but this thread's, even with more cores.
    expect(await starts()).toBe(before + 2)
    before = await starts()
    expect((await threaded.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})).ok).toBe(true)
    expect(await starts()).toBe(before + 1)
    before = await starts()
    expect((await threaded.verifyCheckpoint(root, {concurrency: 8, workerMinBytes: bytes + 1})).ok).toBe(true)
    expect(await starts()).toBe(before)
    expect((await threaded.verifyCheckpoint(root, {concurrency: 1, workerMinBytes: 0})).ok).toBe(true)
    expect(await starts()).toBe(before)
    const single = await make(['only'])
    expect((await threaded.verifyCheckpoint(single.root, {concurrency: 2, workerMinBytes: 0})).ok).toBe(true)
    expect(await starts()).toBe(before)
  })

  it('a worker that dies fails the verification instead of hanging it', async () => {
    // Workers take the first directories: the worker gets 'crash', this thread 'fine'.
    const {root} = await make(['crash', 'fine'])
    await expect(threaded.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})).rejects.toThrow('worker crashed')
    const quiet = await make(['exit', 'fine'])
    await expect(threaded.verifyCheckpoint(quiet.root, {concurrency: 2, workerMinBytes: 0})).rejects.toThrow(/verify worker exited \(code 3\) while verifying .*exit$/)
  })
})
