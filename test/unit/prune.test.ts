import {mkdir, readdir, symlink, utimes, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {applyPrune, planPrune} from '../../src/storage/prune.js'
import {FORMAT_VERSION, publishLatest} from '../../src/storage/root.js'
import {tempDir} from '../helpers/tmp.js'

async function published(root: string, id: string, createdAt: number): Promise<void> {
  await mkdir(path.join(root, id, 'gym'), {recursive: true})
  await writeFile(path.join(root, id, 'gymckpt.json'), JSON.stringify({format_version: FORMAT_VERSION, checkpoint_id: id, created_at: createdAt, continued: [], restarted: [], participants: []}))
}

describe('planPrune', () => {
  it('keeps the newest published and LATEST, removes older ones, old partial commits and stale temp files only', async () => {
    const root = await tempDir()
    const t = Date.now() / 1000
    for (const [id, age] of [
      ['c1', 400],
      ['c2', 300],
      ['c3', 200],
      ['c4', 100],
    ] as const)
      await published(root, id, t - age)
    await publishLatest(root, 'c1')
    // A commit that never finished, older than LATEST; and one newer (maybe in progress).
    await mkdir(path.join(root, 'old-partial', 'gym'), {recursive: true})
    await utimes(path.join(root, 'old-partial'), t - 1000, t - 1000)
    await mkdir(path.join(root, 'new-partial', 'gym'), {recursive: true})
    await mkdir(path.join(root, 'notes'))
    await writeFile(path.join(root, 'README.txt'), 'mine')
    await writeFile(path.join(root, '.LATEST.deadbeef'), 'c0')
    await utimes(path.join(root, '.LATEST.deadbeef'), t - 3600, t - 3600)
    await symlink(path.join(root, 'c2'), path.join(root, 'link'))

    const plan = await planPrune(root, 2)
    expect(plan.latest).toBe('c1')
    expect(plan.remove.map((e) => e.name).sort()).toEqual(['.LATEST.deadbeef', 'c2', 'old-partial'])
    expect(plan.keep.map((e) => e.name).sort()).toEqual(['README.txt', 'c1', 'c3', 'c4', 'link', 'new-partial', 'notes'])

    // A plan is only a plan until applied.
    expect((await readdir(root)).length).toBe(11)
    await applyPrune(plan)
    expect((await readdir(root)).sort()).toEqual(['LATEST', 'README.txt', 'c1', 'c3', 'c4', 'link', 'new-partial', 'notes'])
  })

  it('without LATEST, never removes a checkpoint that was never published', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, 'partial', 'gym'), {recursive: true})
    await utimes(path.join(root, 'partial'), 1, 1)
    expect((await planPrune(root, 1)).remove).toEqual([])
  })
})
