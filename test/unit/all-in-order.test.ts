// File system calls run at once but report as if run one after another (storage/fsutil.ts
// allInOrder): the first failure in the order given, after every call has settled.
import {mkdir, symlink} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {allInOrder} from '../../src/storage/fsutil.js'
import {listParticipantDirs} from '../../src/storage/root.js'
import {rejection} from '../helpers/errors.js'
import {tempDir} from '../helpers/tmp.js'

/** f's value (or its throw) after ms. */
function after<T>(ms: number, f: () => T): Promise<T> {
  return new Promise<T>((resolve, reject) =>
    setTimeout(() => {
      try {
        resolve(f())
      } catch (err) {
        reject(err as Error)
      }
    }, ms),
  )
}

describe('allInOrder', () => {
  it('gives the values in the order given, not the order they arrive', async () => {
    expect(await allInOrder([after(30, () => 'a'), after(1, () => 'b'), after(15, () => 'c')])).toEqual(['a', 'b', 'c'])
  })

  it('throws the first failure in the order given, though a later one failed sooner, once all have settled', async () => {
    let lateSettled = false
    const err = await rejection(
      allInOrder<unknown>([
        after(5, () => 'ok'),
        after(40, () => {
          throw new Error('second given, fails last')
        }),
        after(1, () => {
          throw new Error('third given, fails first')
        }),
        after(60, () => {
          lateSettled = true
        }),
      ]),
      Error,
    )
    expect(err.message).toBe('second given, fails last')
    expect(lateSettled).toBe(true)
  })
})

describe('listParticipantDirs, every kind at once', () => {
  it('lists kinds and instances sorted, and raises the error of the first one in that order', async () => {
    const dir = await tempDir()
    for (const p of ['gym/resources/r1', 'gym/agent/b', 'gym/agent/a', 'gym/environment/e']) await mkdir(path.join(dir, p), {recursive: true})
    expect((await listParticipantDirs(dir)).map((d) => `${d.kind}/${d.instance}`)).toEqual(['agent/a', 'agent/b', 'environment/e', 'resources/r1'])
    // Two dangling links: the one in the kind sorted first is named, whichever is looked at first.
    await symlink(path.join(dir, 'nowhere-z'), path.join(dir, 'gym', 'resources', 'zz'))
    await symlink(path.join(dir, 'nowhere-a'), path.join(dir, 'gym', 'agent', 'zz'))
    const err = await rejection(listParticipantDirs(dir), CheckpointStateError)
    expect(err.message).toBe(`${path.join(dir, 'gym', 'agent', 'zz')} is a symbolic link to a path that does not exist`)
  })
})
