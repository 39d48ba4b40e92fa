// More rules of offline verification (src/storage/verify.ts), from the survivors of the run of
// 2026-12-04 (issue 12): what a verify worker is started with, and that no worker is started when
// its module is missing, however many cores and bytes there are.
//
// As in verify-threads-mutants.test.ts, the sources under test are copied into a scratch directory
// with a `verify-worker.js` that loads the TypeScript worker through tsx; this one also records
// the execArgv each worker was started with.
import {readFile, writeFile} from 'node:fs/promises'
import path from 'node:path'
import {BroadcastChannel, Worker} from 'node:worker_threads'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import * as inline from '../../src/storage/verify.js'
import {scratchDir, verifyWithWorkerShim} from '../helpers/store.js'
import {tempDir} from '../helpers/tmp.js'

const scratch = scratchDir('verify-mutants-3')
const argvLog = path.join(scratch, 'worker-argv.log')
const CHANNEL = `verify-mutants-3-${process.pid}`
let threaded: typeof inline

const SHIM = `// Written by test/unit/verify-mutants-3.test.ts: the TypeScript worker, through tsx.
import {appendFileSync} from 'node:fs'
import {BroadcastChannel} from 'node:worker_threads'
import {register} from 'tsx/esm/api'

appendFileSync(${JSON.stringify(argvLog)}, JSON.stringify(process.execArgv) + '\\n')
// Answers a ping for as long as this worker lives (it does not keep the worker alive).
const alive = new BroadcastChannel(${JSON.stringify(CHANNEL)})
alive.unref()
alive.onmessage = (e) => {
  if (e.data === 'ping') alive.postMessage('pong')
}
register()
await import('./verify-worker.ts')
`

let remove: () => Promise<void>

beforeAll(async () => {
  ;({verify: threaded, remove} = await verifyWithWorkerShim(scratch, SHIM))
})

afterAll(() => remove())

async function workerArgv(): Promise<string[][]> {
  const text = await readFile(argvLog, 'utf8').catch(() => '')
  return text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as string[])
}

/** How many verify workers of this file answer a ping within `ms`. */
async function liveWorkers(ms = 300): Promise<number> {
  const ch = new BroadcastChannel(CHANNEL)
  let n = 0
  ch.onmessage = (e) => {
    if ((e as MessageEvent).data === 'pong') n++
  }
  ch.postMessage('ping')
  await new Promise((r) => setTimeout(r, ms))
  ch.close()
  return n
}

/** Waits until some worker of this file answers a ping (the probe's own check). */
async function waitForPong(): Promise<void> {
  for (let i = 0; i < 100; i++) if ((await liveWorkers(100)) > 0) return
  throw new Error('no worker answered')
}

/** A published checkpoint with `instances` agent directories of a few records each. */
async function make(instances: string[]): Promise<string> {
  const root = await tempDir()
  const dir = path.join(root, 'c')
  const participants = []
  for (const instance of instances) {
    const lines = Array.from({length: 5}, (_, i) => `{"episode_id": {"rollout_id": "r${i}", "attempt": 0}, "v": ${i}}`)
    const manifest = await writeParticipantState({checkpointDir: dir, kind: 'agent', instance, checkpointId: 'c'}, lines)
    participants.push({server: instance, kind: 'agent', instance, manifest, episode_ids: []})
  }
  const continued = Array.from({length: 5}, (_, i) => ({rollout_id: `r${i}`, attempt: 0}))
  await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: 'c', created_at: 1, continued, restarted: [], participants})
  await publishLatest(root, 'c')
  return root
}

describe('verify workers', () => {
  it("a worker gets this process's execArgv but --input-type (which only node -e accepts)", async () => {
    const root = await make(['w1', 'w2'])
    const saved = process.execArgv
    // As under `node --input-type=module -e`: a worker given --input-type fails to start.
    const parent = [...saved, '--no-deprecation', '--input-type=module']
    process.execArgv = parent
    let r: Awaited<ReturnType<typeof inline.verifyCheckpoint>>
    const before = (await workerArgv()).length
    try {
      r = await threaded.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})
    } finally {
      process.execArgv = saved
    }
    expect(r.ok).toBe(true)
    expect(r.participants.map((p) => [p.instance, p.ok, p.records])).toEqual([
      ['w1', true, 5],
      ['w2', true, 5],
    ])
    expect((await workerArgv()).slice(before)).toEqual([[...saved, '--no-deprecation']])
  })

  it('every worker is ended before verify returns', async () => {
    // The probe itself: a worker started on the module answers while it lives.
    const probe = new Worker(path.join(scratch, 'src', 'storage', 'verify-worker.js'))
    await new Promise((r) => probe.once('online', r))
    await waitForPong()
    await probe.terminate()
    expect(await liveWorkers()).toBe(0)
    const root = await make(['t1', 't2', 't3'])
    expect((await threaded.verifyCheckpoint(root, {concurrency: 3, workerMinBytes: 0})).ok).toBe(true)
    expect(await liveWorkers()).toBe(0)
  })

  it('without the worker module next to verify, directories are read in this thread, whatever the cores and bytes', async () => {
    // src/storage has no verify-worker.js (only dist/ does): a worker started anyway would fail.
    const root = await make(['i1', 'i2', 'i3'])
    const r = await inline.verifyCheckpoint(root, {concurrency: 4, workerMinBytes: 0})
    expect(r.ok).toBe(true)
    expect(r).toEqual(await inline.verifyCheckpoint(root, {concurrency: 1}))
    expect(r.participants.map((p) => [p.instance, p.records])).toEqual([
      ['i1', 5],
      ['i2', 5],
      ['i3', 5],
    ])
  })
})

describe('what a report holds where nothing was read', () => {
  it('without a controller manifest: no continued, restarted or uncovered episodes; a failed directory holds none either', async () => {
    const dir = path.join(await tempDir(), 'c')
    const lines = [`{"episode_id": {"rollout_id": "r0", "attempt": 0}}`]
    const good = await writeParticipantState({checkpointDir: dir, kind: 'agent', instance: 'good', checkpointId: 'c'}, lines)
    const bad = await writeParticipantState({checkpointDir: dir, kind: 'agent', instance: 'bad', checkpointId: 'c'}, lines)
    await writeFile(path.join(dir, 'gym', 'agent', 'bad', bad.records_file), 'not json\n')
    const r = await inline.verifyCheckpoint(dir)
    expect(r.ok).toBe(false)
    expect(r.manifest).toBeNull()
    expect([r.continued, r.restarted, r.uncovered]).toEqual([[], [], []])
    expect(r.problems.map((p) => [p.severity, path.basename(p.where)])).toEqual([
      ['error', 'c'],
      ['error', 'bad'],
    ])
    expect(r.problems[0]!.message).toMatch(/^no controller manifest/)
    const [b, g] = r.participants
    expect(b).toEqual({
      kind: 'agent',
      instance: 'bad',
      dir: path.join(dir, 'gym', 'agent', 'bad'),
      ok: false,
      records: 0,
      bytes: 0,
      recordsSha256: null,
      episodes: [],
      inScope: 0,
      outsideScope: 0,
      scopeWithoutRecord: 0,
    })
    // Without a scope every record counts outside it, and no note is written.
    expect(g).toMatchObject({instance: 'good', ok: true, records: 1, recordsSha256: good.records_sha256, episodes: ['r0'], inScope: 0, outsideScope: 1, scopeWithoutRecord: 0})
  })
})
