import {spawnSync} from 'node:child_process'
import {readFile, writeFile} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import {BIN} from '../helpers/cli.js'
import {tempDir} from '../helpers/tmp.js'

// The worker threads run the built JavaScript, so this test imports verify from dist/.
const dist = (await import(path.resolve('dist/storage/verify.js'))) as typeof import('../../src/storage/verify.js')

describe('verify in worker threads', () => {
  it('gives the same report as in one thread, errors included', async () => {
    const root = await tempDir()
    const dir = path.join(root, 'c')
    const participants = []
    for (const [kind, instance] of [
      ['environment', 'e'],
      ['model', 'm'],
      ['agent', 'a'],
    ] as const) {
      const lines = Array.from({length: 50}, (_, i) => `{"episode_id": {"rollout_id": "r${i}", "attempt": 0}, "v": [${i}, NaN]}`)
      const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: 'c'}, lines)
      participants.push({server: instance, kind, instance, manifest, episode_ids: []})
    }
    const continued = Array.from({length: 49}, (_, i) => ({rollout_id: `r${i}`, attempt: 0}))
    await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: 'c', created_at: 1, continued, restarted: [], participants})
    await publishLatest(root, 'c')
    // Two corrupt participants: their errors must come in directory order, whichever thread ends first.
    for (const p of participants.slice(0, 2)) await writeFile(path.join(dir, 'gym', p.kind, p.instance, p.manifest.records_file), 'not json\n')
    const threaded = await dist.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})
    const inline = await dist.verifyCheckpoint(root, {concurrency: 1})
    expect(threaded).toEqual(inline)
    expect(threaded.ok).toBe(false)
    expect(threaded.problems.map((p) => p.where.split(path.sep).slice(-2).join('/'))).toEqual(['environment/e', 'model/m', 'agent/a'])
    expect(threaded.problems[0]!.message).toMatch(/does not match its manifest digest|not JSON/)
    expect(threaded.problems[2]!.message).toMatch(/outside the commit scope: r49/)
  })
})

// bin/run.js runs verify from a bundle (dist/fast/, scripts/build.mjs), which finds its worker by a
// path relative to itself: a bundle that lost it would silently verify in one thread.
describe('verify of a big checkpoint from the command line', () => {
  it.skipIf(os.availableParallelism() < 2)('uses worker threads on the fast path and through oclif alike', {timeout: 60_000}, async () => {
    const root = await tempDir()
    const dir = path.join(root, 'big')
    const participants = []
    // Two participants of 33 x 1 MiB lines: past the 64 MiB at which verify starts workers.
    const filler = 'x'.repeat(1 << 20)
    for (const [kind, instance] of [
      ['environment', 'e'],
      ['model', 'm'],
    ] as const) {
      const lines = Array.from({length: 33}, (_, i) => `{"episode_id": {"rollout_id": "r${i}", "attempt": 0}, "v": "${filler}"}`)
      const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: 'big'}, lines)
      participants.push({server: instance, kind, instance, manifest, episode_ids: []})
    }
    const continued = Array.from({length: 33}, (_, i) => ({rollout_id: `r${i}`, attempt: 0}))
    await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: 'big', created_at: 1, continued, restarted: [], participants})
    await publishLatest(root, 'big')
    for (const fastPath of [true, false]) {
      const trace = path.join(root, `trace-${fastPath}.txt`)
      const env: NodeJS.ProcessEnv = {...process.env, TRACE_FILE: trace, NO_COLOR: '1'}
      if (fastPath) delete env.GYMCKPT_NO_FAST_PATH
      else env.GYMCKPT_NO_FAST_PATH = '1'
      const r = spawnSync(process.execPath, ['--import', path.resolve('bench/trace-imports.mjs'), BIN, 'verify', root, '--json'], {env, encoding: 'utf8'})
      expect(r.status, r.stderr).toBe(0)
      expect(JSON.parse(r.stdout)).toMatchObject({ok: true, valid: true, checkpoint_id: 'big'})
      const loaded = (await readFile(trace, 'utf8')).split('\n')
      expect(loaded, `fast path: ${fastPath}`).toContain('node:worker_threads')
      expect(
        loaded.some((u) => u.endsWith('/dist/fast/fast-verify.js')),
        `fast path: ${fastPath}`,
      ).toBe(fastPath)
    }
  })
})
