import {mkdir, readFile, rm, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import {verifyCheckpoint} from '../../src/storage/verify.js'
import {tempDir} from '../helpers/tmp.js'

const rec = (r: string, a = 0) => `{"episode_id": {"rollout_id": "${r}", "attempt": ${a}}, "state": {"x": NaN}}`

async function make(opts: {records?: Record<string, string[]>; continued?: [string, number][]; restarted?: [string, number][]; gymCollection?: boolean} = {}) {
  const root = await tempDir()
  const id = 'ckpt-1'
  const dir = path.join(root, id)
  const records = opts.records ?? {'environment/env': [rec('a'), rec('b', 1)], 'model/policy': [rec('a')]}
  const participants = []
  for (const [ki, lines] of Object.entries(records)) {
    const [kind, instance] = ki.split('/') as [string, string]
    const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: id}, lines)
    participants.push({server: instance, kind, instance, manifest, episode_ids: []})
  }
  const continued = (opts.continued ?? [['a', 0], ['b', 1]]).map(([r, a]) => ({rollout_id: r, attempt: a}))
  const restarted = (opts.restarted ?? []).map(([r, a]) => ({rollout_id: r, attempt: a}))
  if (opts.gymCollection) {
    await writeFile(path.join(dir, 'collection.json'), JSON.stringify({checkpoint_id: id, run_id: 'f'.repeat(32), created_at: 1, continued, restarted}))
  } else {
    await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: id, created_at: 1, continued, restarted, participants})
  }
  await publishLatest(root, id)
  return {root, dir}
}

describe('verifyCheckpoint', () => {
  it('accepts a valid root by following LATEST', async () => {
    const {root, dir} = await make()
    const r = await verifyCheckpoint(root)
    expect(r.ok).toBe(true)
    expect(r.checkpointDir).toBe(dir)
    expect(r.problems).toEqual([])
    expect(r.participants.map((p) => [p.kind, p.records])).toEqual([
      ['environment', 2],
      ['model', 1],
    ])
  })

  it("reads a checkpoint made by Gym's own collector (collection.json)", async () => {
    const {root} = await make({gymCollection: true})
    const r = await verifyCheckpoint(root)
    expect(r.ok).toBe(true)
    expect(r.manifest).toBe('collection.json')
  })

  it('flags a corrupted records file, naming the file', async () => {
    const {dir} = await make()
    const envDir = path.join(dir, 'gym', 'environment', 'env')
    const m = JSON.parse(await readFile(path.join(envDir, 'manifest.json'), 'utf8'))
    const file = path.join(envDir, m.records_file)
    const text = await readFile(file, 'utf8')
    await writeFile(file, text.replace('"a"', '"z"'))
    const r = await verifyCheckpoint(dir)
    expect(r.ok).toBe(false)
    expect(r.problems[0]).toMatchObject({severity: 'error', where: envDir, message: expect.stringMatching(/does not match its manifest digest/)})
  })

  it('records outside the commit scope are errors; continued episodes with no record are warnings', async () => {
    const {root} = await make({continued: [['b', 1], ['c', 0]]})
    const r = await verifyCheckpoint(root)
    expect(r.ok).toBe(false)
    expect(r.problems.map((p) => p.message)).toEqual(
      expect.arrayContaining([expect.stringMatching(/records outside the commit scope: a$/), expect.stringMatching(/1 continued episode\(s\) have no record .*: c$/)]),
    )
    expect(r.uncovered).toEqual(['c'])
  })

  it('an episode both continued and restarted is an error', async () => {
    const {root} = await make({restarted: [['a', 0]]})
    expect((await verifyCheckpoint(root)).problems.map((p) => p.message)).toContain('episodes both continued and restarted: a')
  })

  it('a checkpoint directory without a controller manifest was never published', async () => {
    const {dir} = await make()
    await rm(path.join(dir, 'gymckpt.json'))
    const r = await verifyCheckpoint(dir)
    expect(r.ok).toBe(false)
    expect(r.problems[0]!.message).toMatch(/never published/)
  })

  it('a participant directory whose manifest belongs to another participant is an error', async () => {
    const {dir} = await make()
    await mkdir(path.join(dir, 'gym', 'model', 'other'), {recursive: true})
    const src = path.join(dir, 'gym', 'model', 'policy')
    for (const f of ['manifest.json']) await writeFile(path.join(dir, 'gym', 'model', 'other', f), await readFile(path.join(src, f)))
    const r = await verifyCheckpoint(dir)
    expect(r.problems.some((p) => /belongs to model\/policy, not model\/other/.test(p.message))).toBe(true)
  })

  it('expects the given participants (restore --dry-run)', async () => {
    const {root} = await make()
    const r = await verifyCheckpoint(root, {expect: [{kind: 'agent', instance: 'agent', server: 'agent'}]})
    expect(r.ok).toBe(false)
    expect(r.problems.at(-1)!.message).toMatch(/no state for participant agent/)
  })

  it('names what is wrong with the location itself', async () => {
    const root = await tempDir()
    await expect(verifyCheckpoint(path.join(root, 'nope'))).rejects.toThrow(/does not exist/)
    await expect(verifyCheckpoint(root)).rejects.toThrow(/neither a checkpoint root/)
    await writeFile(path.join(root, 'LATEST'), '../etc')
    await expect(verifyCheckpoint(root)).rejects.toThrow(/names no valid checkpoint ID/)
  })
})
