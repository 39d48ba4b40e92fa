// planPrune and applyPrune (src/storage/prune.ts), pinned down for the mutants prune.test.ts
// leaves alive: the whole plan of a root with every kind of entry, exactly (order, paths,
// reasons), at the edges of each age rule; the root's errors; and what a failed removal says.
import {execFileSync} from 'node:child_process'
import {mkdir, open, rename, rm, symlink, utimes, writeFile} from 'node:fs/promises'
import {createServer} from 'node:net'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {PrunePlan, applyPrune, planPrune} from '../../src/storage/prune.js'
import {FORMAT_VERSION, publishLatest} from '../../src/storage/root.js'
import {rejection} from '../helpers/errors.js'
import {tempDir} from '../helpers/tmp.js'

/** A directory with a controller manifest (and a gym directory unless `gym` is false). */
async function ours(root: string, id: string, createdAt: number, gym = true): Promise<void> {
  await mkdir(path.join(root, id), {recursive: true})
  if (gym) await mkdir(path.join(root, id, 'gym'))
  await writeFile(path.join(root, id, 'gymckpt.json'), JSON.stringify({format_version: FORMAT_VERSION, checkpoint_id: id, created_at: createdAt, continued: [], restarted: [], participants: []}))
}

/** A directory with only Gym's collection.json. */
async function gymOnly(root: string, id: string, createdAt: number): Promise<void> {
  await mkdir(path.join(root, id), {recursive: true})
  await writeFile(path.join(root, id, 'collection.json'), JSON.stringify({checkpoint_id: id, created_at: createdAt, continued: []}))
}

/** A checkpoint directory that was never published, last modified at `mtimeS`. */
async function unpublished(root: string, id: string, mtimeS: number): Promise<void> {
  await mkdir(path.join(root, id, 'gym'), {recursive: true})
  await utimes(path.join(root, id), mtimeS, mtimeS)
}

/** A Unix socket at `file` (neither a file, a directory nor a link), closed after `fn`. */
async function withSocket<T>(file: string, fn: () => Promise<T>): Promise<T> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(file, resolve))
  try {
    return await fn()
  } finally {
    await new Promise((resolve) => server.close(resolve))
  }
}

const T = 1_700_000_000 // seconds
const names = (es: {name: string}[]) => es.map((e) => e.name)

describe('planPrune: the whole plan', () => {
  it('every kind of entry, in order, with its path and reason', async () => {
    const root = await tempDir()
    const p = (n: string) => path.join(root, n)
    // Created out of name order, so the listing's own order is not the sorted one.
    await unpublished(root, 'u-older', 499)
    await unpublished(root, 'u-newer', 501)
    await unpublished(root, 'u-equal', 500)
    await mkdir(p('notes'))
    await writeFile(path.join(p('notes'), 'x.txt'), 'mine')
    await ours(root, 'c-old', 100, false)
    await gymOnly(root, 'c-new', 2000)
    await ours(root, 'c-latest', 500)
    await ours(root, 'c-b', 1000)
    await ours(root, 'c-a', 1000)
    await mkdir(p('bad-manifest'))
    await writeFile(p('bad-manifest/gymckpt.json'), '{')
    await symlink(p('c-a'), p('a-link'))
    await writeFile(p('README.txt'), 'mine')
    await utimes(p('README.txt'), T - 100_000, T - 100_000)
    await writeFile(p('.LATEST.stale'), 'c0')
    await utimes(p('.LATEST.stale'), T - 1, T - 1)
    await writeFile(p('.LATEST.fresh'), 'c0')
    await utimes(p('.LATEST.fresh'), T, T)
    await publishLatest(root, 'c-latest')
    // The unpublished directories' times, set again after everything inside them was made.
    for (const [n, s] of [
      ['u-older', 499],
      ['u-newer', 501],
      ['u-equal', 500],
    ] as const)
      await utimes(p(n), s, s)

    // `now` is exactly 10 minutes after .LATEST.fresh was written: not yet stale.
    const plan = await withSocket(p('sock'), () => planPrune(root, 2, T * 1000 + 600_000))
    expect(plan).toEqual({
      root,
      latest: 'c-latest',
      keep: [
        {name: '.LATEST.fresh', path: p('.LATEST.fresh'), reason: 'not a checkpoint'},
        {name: 'README.txt', path: p('README.txt'), reason: 'not a checkpoint'},
        {name: 'a-link', path: p('a-link'), reason: 'symbolic link'},
        {name: 'bad-manifest', path: p('bad-manifest'), reason: 'controller manifest unreadable; inspect it by hand'},
        {name: 'notes', path: p('notes'), reason: 'not a checkpoint'},
        {name: 'c-new', path: p('c-new'), reason: 'among the 2 newest published'},
        {name: 'c-b', path: p('c-b'), reason: 'among the 2 newest published'},
        {name: 'c-latest', path: p('c-latest'), reason: 'named by LATEST'},
        {name: 'u-equal', path: p('u-equal'), reason: 'never published, may be a commit in progress'},
        {name: 'u-newer', path: p('u-newer'), reason: 'never published, may be a commit in progress'},
      ],
      remove: [
        {name: '.LATEST.stale', path: p('.LATEST.stale'), reason: 'temp file of an interrupted publication'},
        {name: 'c-a', path: p('c-a'), reason: 'older published checkpoint'},
        {name: 'c-old', path: p('c-old'), reason: 'older published checkpoint'},
        {name: 'u-older', path: p('u-older'), reason: 'never published, older than LATEST'},
      ],
    })
  })

  it('a relative root is planned as its absolute path', async () => {
    const root = await tempDir()
    await ours(root, 'c1', 1)
    const plan = await planPrune(path.relative(process.cwd(), root), 0)
    expect(plan).toEqual({root, latest: null, keep: [], remove: [{name: 'c1', path: path.join(root, 'c1'), reason: 'older published checkpoint'}]})
  })

  it('a temp file of LATEST one millisecond past 10 minutes goes; a fresh one, or another old file, stays', async () => {
    const root = await tempDir()
    await writeFile(path.join(root, '.LATEST.a'), 'x')
    await utimes(path.join(root, '.LATEST.a'), T, T)
    await writeFile(path.join(root, 'LATEST.b'), 'x')
    await utimes(path.join(root, 'LATEST.b'), T - 3600, T - 3600)
    expect(names((await planPrune(root, 1, T * 1000 + 600_001)).remove)).toEqual(['.LATEST.a'])
    expect(names((await planPrune(root, 1, T * 1000 + 1)).remove)).toEqual([])
    expect(names((await planPrune(root, 1, T * 1000 + 1)).keep)).toEqual(['.LATEST.a', 'LATEST.b'])
  })

  it('published ones of the same time: the later name is the newer', async () => {
    const root = await tempDir()
    await ours(root, 'b', 7)
    await ours(root, 'a', 7)
    await ours(root, 'c', 7)
    const plan = await planPrune(root, 1)
    expect(names(plan.keep)).toEqual(['c'])
    expect(names(plan.remove)).toEqual(['b', 'a'])
  })

  it('an unpublished directory older than the LATEST checkpoint goes even when LATEST is not the newest', async () => {
    const root = await tempDir()
    await ours(root, 'new', 3000)
    await ours(root, 'mid', 2000)
    await unpublished(root, 'u', 2500)
    await publishLatest(root, 'mid')
    const plan = await planPrune(root, 5)
    expect(names(plan.keep)).toEqual(['new', 'mid', 'u'])
    expect(plan.remove).toEqual([])
  })

  it('names in the order of JavaScript strings (UTF-16), not of the listing (bytes)', async () => {
    const root = await tempDir()
    // U+10000 is a surrogate pair in UTF-16 (before U+E000) but 4 bytes from F0 in UTF-8 (after EE).
    for (const n of ['\uE000-b', '\u{10000}-a']) await writeFile(path.join(root, n), '')
    expect(names((await planPrune(root, 1)).keep)).toEqual(['\u{10000}-a', '\uE000-b'])
  })

  it('an entry that cannot be inspected is kept, saying why', async () => {
    // A root just short of PATH_MAX (4096) holding a name that takes its path past it: the root
    // can be listed, the entry's lstat fails with ENAMETOOLONG. Built with short names, then each
    // directory renamed to 250 characters from the top (every path renamed stays short enough).
    const base = await tempDir()
    const short = Array.from({length: 16}, (_, i) => `d${i}`)
    const long = short.map((d) => d.padEnd(250, 'x'))
    await mkdir(path.join(base, ...short), {recursive: true})
    const name = 'n'.repeat(250)
    await writeFile(path.join(base, ...short, name), '')
    const rn = async (from: string[], to: string[]) => {
      for (let i = 0; i < from.length; i++) await rename(path.join(base, ...to.slice(0, i), from[i]!), path.join(base, ...to.slice(0, i + 1)))
    }
    await rn(short, long)
    try {
      const root = path.join(base, ...long)
      expect(root.length).toBeLessThan(4096)
      expect((root + '/' + name).length).toBeGreaterThan(4096)
      expect(await planPrune(root, 1)).toEqual({
        root,
        latest: null,
        keep: [{name, path: path.join(root, name), reason: 'cannot inspect: the name is too long (ENAMETOOLONG)'}],
        remove: [],
      })
    } finally {
      await rn(long, short)
    }
  })
  it('an entry removed after the listing (by another prune, say) is left out of the plan', async () => {
    // a's manifest is a FIFO: the plan waits on it after listing the root, while the test removes
    // b, and goes on when the test writes the manifest; b's lstat then finds nothing.
    const root = await tempDir()
    await mkdir(path.join(root, 'a', 'gym'), {recursive: true})
    const fifo = path.join(root, 'a', 'gymckpt.json')
    execFileSync('mkfifo', [fifo])
    await writeFile(path.join(root, 'b'), '')
    const plan = planPrune(root, 5)
    const w = await open(fifo, 'w')
    await rm(path.join(root, 'b'))
    await w.writeFile(JSON.stringify({format_version: FORMAT_VERSION, checkpoint_id: 'a', created_at: 1, continued: [], restarted: [], participants: []}))
    await w.close()
    expect(await plan).toEqual({root, latest: null, keep: [{name: 'a', path: path.join(root, 'a'), reason: 'among the 5 newest published'}], remove: []})
  })
})

describe('planPrune: the root', () => {
  it('a root that does not exist, or is a file, is an error naming it', async () => {
    const dir = await tempDir()
    const missing = path.join(dir, 'missing')
    expect((await rejection(planPrune(missing, 1), CheckpointStateError)).message).toBe(`checkpoint root ${missing}: it does not exist (ENOENT)`)
    const file = path.join(dir, 'file')
    await writeFile(file, '')
    expect((await rejection(planPrune(file, 1), CheckpointStateError)).message).toBe(`checkpoint root ${file} is not a directory`)
  })
  it('a root that cannot be listed is an error naming it', async () => {
    // LATEST is a FIFO: the plan waits on it between the root's stat and its listing, while the
    // test removes the root.
    const root = await tempDir()
    const fifo = path.join(root, 'LATEST')
    execFileSync('mkfifo', [fifo])
    const plan = planPrune(root, 1)
    const w = await open(fifo, 'w')
    await rm(root, {recursive: true})
    await w.writeFile('c1')
    await w.close()
    expect((await rejection(plan, CheckpointStateError)).message).toBe(`cannot list checkpoint root ${root}: it does not exist (ENOENT)`)
  })
})

describe('applyPrune', () => {
  it('removes directories and files; one already gone is no error', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, 'd', 'gym'), {recursive: true})
    await writeFile(path.join(root, 'f'), '')
    const plan: PrunePlan = {
      root,
      latest: null,
      keep: [],
      remove: ['d', 'gone', 'f'].map((name) => ({name, path: path.join(root, name), reason: 'test'})),
    }
    await applyPrune(plan)
    await expect(rm(path.join(root, 'd'))).rejects.toMatchObject({code: 'ENOENT'})
    await expect(rm(path.join(root, 'f'))).rejects.toMatchObject({code: 'ENOENT'})
  })

  it('a removal that fails names the path and how many were removed before it', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, 'd'))
    await writeFile(path.join(root, 'file'), '')
    const bad = path.join(root, 'file', 'x')
    const plan: PrunePlan = {
      root,
      latest: null,
      keep: [],
      remove: [
        {name: 'd', path: path.join(root, 'd'), reason: 'test'},
        {name: 'x', path: bad, reason: 'test'},
        {name: 'file', path: path.join(root, 'file'), reason: 'test'},
      ],
    }
    const err = await rejection(applyPrune(plan), CheckpointStateError)
    expect(err.message).toBe(`could not remove ${bad} (1 of 3 removed before it): a part of the path is not a directory (ENOTDIR)`)
    // It stops there.
    await expect(rm(path.join(root, 'file'))).resolves.toBeUndefined()
  })
})
