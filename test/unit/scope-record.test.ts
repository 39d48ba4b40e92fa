// The scope record of a commit's first try (src/storage/root.ts): what counts as one, how it is
// written, and the refused manifests' names. Survivors of the Stryker run of 2026-12-05 (issue 12).
import {readFile, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {SCOPE_RECORD, readScopeRecord, refusedName, writeScopeRecord} from '../../src/storage/root.js'
import {tempDir} from '../helpers/tmp.js'

async function readAs(content: string) {
  const dir = await tempDir()
  await writeFile(path.join(dir, SCOPE_RECORD), content)
  return readScopeRecord(dir)
}

describe('readScopeRecord', () => {
  it('none when the file is missing', async () => {
    expect(await readScopeRecord(await tempDir())).toBeNull()
  })

  it('a record: a checkpoint id, and the given and committed scopes each a list of strings or null', async () => {
    const r = {checkpoint_id: 'c1', given: ['a', 'b'], scope: null}
    expect(await readAs(JSON.stringify(r))).toEqual(r)
    const s = {checkpoint_id: 'c1', given: null, scope: []}
    expect(await readAs(JSON.stringify(s))).toEqual(s)
  })

  it.each([
    ['not JSON', '{"checkpoint_id": "c1", '],
    ['a checkpoint id that is not a string', JSON.stringify({checkpoint_id: 7, given: null, scope: null})],
    ['given that is neither a list nor null', JSON.stringify({checkpoint_id: 'c1', given: 'a', scope: null})],
    ['given missing', JSON.stringify({checkpoint_id: 'c1', scope: null})],
    ['given with a key that is not a string', JSON.stringify({checkpoint_id: 'c1', given: ['a', 1], scope: null})],
    ['scope that is neither a list nor null', JSON.stringify({checkpoint_id: 'c1', given: null, scope: {}})],
    ['scope with a key that is not a string', JSON.stringify({checkpoint_id: 'c1', given: ['a'], scope: [null]})],
  ])('none for %s', async (_, content) => {
    expect(await readAs(content)).toBeNull()
  })
})

describe('writeScopeRecord', () => {
  it('writes the record as one line of JSON, ending in a newline, and reads it back', async () => {
    const dir = await tempDir()
    const r = {checkpoint_id: 'c2', given: ['x'], scope: ['x']}
    await writeScopeRecord(dir, r)
    expect(await readFile(path.join(dir, SCOPE_RECORD), 'utf8')).toBe(JSON.stringify(r) + '\n')
    expect(await readScopeRecord(dir)).toEqual(r)
  })
})

describe('refusedName', () => {
  it('replaces the .json at the end only', () => {
    expect(refusedName('gymckpt.json')).toBe('gymckpt.refused.json')
    expect(refusedName('a.json.json')).toBe('a.json.refused.json')
  })
})
