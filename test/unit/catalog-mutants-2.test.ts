// More rules of list/describe (src/storage/catalog.ts), from the survivors of its Stryker run with
// every in-process test (2026-12-05): a directory named gym below the top, the order of kinds and
// instances where a JavaScript sort and Node's listing order differ, participants told apart by
// kind and instance together, and describe --verify of a checkpoint that holds a file named LATEST.
import {mkdir, rm, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {describeCheckpoint, listCheckpoints} from '../../src/storage/catalog.js'
import {writeCheckpoint} from '../helpers/store.js'
import {tempDir} from '../helpers/tmp.js'

const rec = (r: string) => `{"episode_id": {"rollout_id": "${r}", "attempt": 0}}`

/** A published checkpoint continuing `continued`: one participant per [kind, instance, rollouts], written in this order. */
async function published(root: string, id: string, continued: string[], parts: [string, string, string[]][]): Promise<string> {
  const dir = path.join(root, id)
  await writeCheckpoint(
    dir,
    id,
    parts.map(([kind, instance, rollouts]) => ({kind, instance, lines: rollouts.map(rec), episodeIds: rollouts})),
    continued,
  )
  return dir
}

describe('listCheckpoints: what counts as a participant', () => {
  it('a directory named gym below the top of a checkpoint starts no participant count', async () => {
    const root = await tempDir()
    const dir = path.join(root, 'c1')
    await mkdir(path.join(dir, 'gym', 'model', 'm1'), {recursive: true})
    await mkdir(path.join(dir, 'logs', 'gym', 'x'), {recursive: true})
    const [e] = (await listCheckpoints(root)).checkpoints
    expect(e!.participants).toBe(1)
  })
})

describe('describeCheckpoint: participants', () => {
  it('kinds and instances are sorted as strings, not in the byte order a listing comes in', async () => {
    // Node lists a directory sorted by its UTF-8 bytes (code points); a JavaScript sort compares
    // UTF-16 units, where an astral character (a surrogate pair, D800-DFFF) comes before U+FF01.
    const root = await tempDir()
    const gym = path.join(root, 'c1', 'gym')
    for (const k of ['k\uFF01', 'k\u{1F600}']) for (const i of ['i\uFF01', 'i\u{1F600}']) await mkdir(path.join(gym, k, i), {recursive: true})
    const d = await describeCheckpoint(root, 'c1')
    expect(d.participants.map((p) => `${p.kind}/${p.instance}`)).toEqual(['k\u{1F600}/i\u{1F600}', 'k\u{1F600}/i\uFF01', 'k\uFF01/i\u{1F600}', 'k\uFF01/i\uFF01'])
  })

  it('a participant the manifest names is shown as gone even when another kind has an instance of its name', async () => {
    const root = await tempDir()
    const dir = await published(
      root,
      'c1',
      [],
      [
        ['model', 'x', []],
        ['resources', 'x', []],
      ],
    )
    await rm(path.join(dir, 'gym', 'model'), {recursive: true})
    const d = await describeCheckpoint(root, 'c1')
    expect(d.participants.map((p) => [p.kind, p.instance, p.error])).toEqual([
      ['resources', 'x', null],
      ['model', 'x', 'no directory gym/model/x'],
    ])
  })

  it('--verify: each participant gets its own counts, told apart by kind and instance together', async () => {
    const root = await tempDir()
    await published(
      root,
      'c1',
      ['a', 'b'],
      [
        ['model', 'x', ['a', 'b']],
        ['resources', 'x', ['a']],
        ['resources', 'y', []],
      ],
    )
    const d = await describeCheckpoint(root, 'c1', {verify: true})
    expect(d.verify!.ok).toBe(true)
    expect(d.participants.map((p) => [p.kind, p.instance, p.verify?.inScope])).toEqual([
      ['model', 'x', 2],
      ['resources', 'x', 1],
      ['resources', 'y', 0],
    ])
  })

  it('--verify of a checkpoint named in a root reads that checkpoint, even when it holds a file named LATEST', async () => {
    const root = await tempDir()
    const dir = await published(root, 'c1', ['a'], [['model', 'x', ['a']]])
    await writeFile(path.join(dir, 'LATEST'), 'elsewhere\n')
    const d = await describeCheckpoint(root, 'c1', {verify: true})
    expect(d.verify!.checkpointDir).toBe(dir)
    expect(d.verify!.ok).toBe(true)
  })
})
