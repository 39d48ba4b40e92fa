import {createHash} from 'node:crypto'
import {mkdir, readFile, readdir, realpath, rename, symlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {EMPTY_SHA256, encodeManifest, participantDir, readParticipantState, sortFindDuplicates, writeParticipantState} from '../../src/storage/participant-store.js'
import {pyDumps} from '../../src/storage/pyjson.js'
import {tempDir} from '../helpers/tmp.js'

const line = (r: string, attempt = 0, extra = '') => `{"episode_id": {"rollout_id": "${r}", "attempt": ${attempt}}${extra}}`
const opts = (checkpointDir: string) => ({checkpointDir, kind: 'environment', instance: 'env', checkpointId: 'ckpt-1'})

describe('writeParticipantState', () => {
  it('writes records-<sha256>.jsonl and a sorted, indent-1 manifest that reads back', async () => {
    const root = await tempDir()
    const lines = [line('r1'), line('r2', 1, ', "boundary": {"score": NaN, "big": 1180591620717411303424}')]
    const m = await writeParticipantState(opts(root), lines)
    const bytes = lines.map((l) => l + '\n').join('')
    const sha = createHash('sha256').update(bytes).digest('hex')
    expect(m).toMatchObject({records_file: `records-${sha}.jsonl`, records_sha256: sha, record_count: 2, schema_version: 1})
    const dir = participantDir(root, 'environment', 'env')
    expect(await readFile(path.join(dir, m.records_file), 'utf8')).toBe(bytes)
    const manifestText = await readFile(path.join(dir, 'manifest.json'), 'utf8')
    // Python's json.dumps(sort_keys=True, indent=1), with no newline at the end.
    expect(manifestText).toBe(
      `{\n "checkpoint_id": "ckpt-1",\n "instance": "env",\n "kind": "environment",\n "record_count": 2,\n "records_file": "records-${sha}.jsonl",\n "records_sha256": "${sha}",\n "schema_version": 1\n}`,
    )
    expect(manifestText).toBe(encodeManifest(m))
    expect((await readdir(dir)).sort()).toEqual(['manifest.json', m.records_file])

    const read = await readParticipantState(dir, {kind: 'environment', instance: 'env', keep: new Set(['r2-a1'])})
    expect(read.keys).toEqual(['r1', 'r2-a1'])
    expect(read.kept.map((k) => k.key)).toEqual(['r2-a1'])
    expect(pyDumps(read.kept[0]!.record)).toBe(lines[1])
  })

  it('streams records larger than its write batch, and Buffer lines whose memory is reused', async () => {
    const root = await tempDir()
    const big = line('big', 0, `, "blob": "${'x'.repeat(3 << 20)}"`)
    const scratch = Buffer.alloc(64)
    function* lines() {
      for (const l of [line('a'), big, line('b')]) {
        // Reuse one buffer for the small lines, as pyDumpsView does.
        if (l.length <= scratch.length) {
          scratch.write(l, 'latin1')
          yield scratch.subarray(0, l.length)
        } else yield l
      }
    }
    const m = await writeParticipantState(opts(root), lines())
    const text = await readFile(path.join(participantDir(root, 'environment', 'env'), m.records_file), 'utf8')
    expect(text).toBe([line('a'), big, line('b')].join('\n') + '\n')
    expect(m.record_count).toBe(3)
  })

  it('an empty checkpoint has an empty records file with the empty digest', async () => {
    const root = await tempDir()
    const m = await writeParticipantState(opts(root), [])
    expect(m.records_sha256).toBe(EMPTY_SHA256)
    expect(m.record_count).toBe(0)
  })

  it('a retry with the same records finds the identical manifest and succeeds', async () => {
    const root = await tempDir()
    const a = await writeParticipantState(opts(root), [line('r1')])
    const b = await writeParticipantState(opts(root), [line('r1')])
    expect(b).toEqual(a)
  })

  it('never replaces a manifest: a different commit is a 422 and its records file is removed', async () => {
    const root = await tempDir()
    const a = await writeParticipantState(opts(root), [line('r1')])
    await expect(writeParticipantState(opts(root), [line('r9')])).rejects.toThrow(/already holds a different commit/)
    const dir = participantDir(root, 'environment', 'env')
    expect((await readdir(dir)).sort()).toEqual(['manifest.json', a.records_file])
    expect(JSON.parse(await readFile(path.join(dir, 'manifest.json'), 'utf8'))).toEqual(a)
  })

  it('a write stopped by resume publishes nothing and leaves no temporary file', async () => {
    const root = await tempDir()
    let n = 0
    await expect(writeParticipantState({...opts(root), shouldStop: () => ++n > 1}, [line('r1'), line('r2')])).rejects.toThrow(/resumed before its write finished/)
    expect(await readdir(participantDir(root, 'environment', 'env'))).toEqual([])
  })

  it('a checkpoint directory that is a file is a typed error', async () => {
    const root = await tempDir()
    const file = path.join(root, 'file')
    await writeFile(file, 'x')
    await expect(writeParticipantState(opts(file), [line('r1')])).rejects.toThrow(CheckpointStateError)
    await expect(writeParticipantState(opts(file), [line('r1')])).rejects.toThrow(/cannot write checkpoint state/)
  })

  it('a corrupt manifest already in place is a typed error, and nothing replaces it', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await mkdir(dir, {recursive: true})
    await writeFile(path.join(dir, 'manifest.json'), '{broken')
    const err = await writeParticipantState(opts(root), [line('r1')]).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(CheckpointStateError)
    expect((err as Error).message).toMatch(/already holds a manifest that cannot be read/)
    expect(await readFile(path.join(dir, 'manifest.json'), 'utf8')).toBe('{broken')
    expect(await readdir(dir)).toEqual(['manifest.json'])
  })

  it('refuses unsafe kind and instance names', () => {
    expect(() => participantDir('/x', '..', 'env')).toThrow(/not a safe path component/)
    expect(() => participantDir('/x', 'model', 'a/b')).toThrow(/not a safe path component/)
  })
})

describe('readParticipantState: every invalid_checkpoint_state case', () => {
  async function committed(): Promise<{dir: string; manifest: Record<string, unknown>}> {
    const root = await tempDir()
    const m = await writeParticipantState(opts(root), [line('r1'), line('r2')])
    return {dir: participantDir(root, 'environment', 'env'), manifest: m}
  }
  const read = (dir: string) => readParticipantState(dir, {kind: 'environment', instance: 'env'})

  it('missing manifest', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, 'p'))
    await expect(read(path.join(root, 'p'))).rejects.toThrow(/missing manifest/)
  })

  it.each([
    ['not JSON', () => '{', /is not JSON/],
    ['a list', () => '[]', /is not a manifest/],
    ['another schema', (m: Record<string, unknown>) => JSON.stringify({...m, schema_version: 2}), /unsupported schema/],
    ['another participant', (m: Record<string, unknown>) => JSON.stringify({...m, instance: 'other'}), /belongs to environment\/other/],
    ['no checkpoint_id', (m: Record<string, unknown>) => JSON.stringify({...m, checkpoint_id: undefined}), /names no checkpoint/],
    ['no records_file', (m: Record<string, unknown>) => JSON.stringify({...m, records_file: undefined}), /invalid records file/],
    ['records_file outside the directory', (m: Record<string, unknown>) => JSON.stringify({...m, records_file: '../../../outside.jsonl'}), /invalid records file/],
    ['records_file missing', (m: Record<string, unknown>) => JSON.stringify({...m, records_file: `records-${'0'.repeat(64)}.jsonl`}), /cannot read checkpoint state/],
    ['no records_sha256', (m: Record<string, unknown>) => JSON.stringify({...m, records_sha256: undefined}), /does not match its manifest digest/],
    ['record_count a string', (m: Record<string, unknown>) => JSON.stringify({...m, record_count: '2'}), /expects "2" records, found 2/],
    ['record_count off by one', (m: Record<string, unknown>) => JSON.stringify({...m, record_count: 3}), /expects 3 records, found 2/],
  ])('%s', async (_name, make, msg) => {
    const {dir, manifest} = await committed()
    await writeFile(path.join(dir, 'manifest.json'), make(manifest))
    const err = await read(dir).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(CheckpointStateError)
    expect((err as Error).message).toMatch(msg)
  })

  it('a records file that does not match its digest', async () => {
    const {dir, manifest} = await committed()
    await writeFile(path.join(dir, manifest.records_file as string), line('r1') + '\n' + line('r3') + '\n')
    await expect(read(dir)).rejects.toThrow(/does not match its manifest digest/)
  })

  it.each([
    ['not JSON', 'not json', /line 1 holds a record that is not JSON/],
    ['not an object', '[1]', /line 1: checkpoint record has no valid episode_id/],
    ['no episode_id', '{"x": 1}', /line 1: checkpoint record has no valid episode_id/],
    ['a reserved rollout id', line('r-a1'), /line 1: checkpoint record has no valid episode_id/],
  ])('a record that is %s is named by its line', async (_n, bad, msg) => {
    const root = await tempDir()
    const dir = path.join(root, 'p')
    await mkdir(dir)
    const body = bad + '\n'
    const sha = createHash('sha256').update(body).digest('hex')
    await writeFile(path.join(dir, `records-${sha}.jsonl`), body)
    await writeFile(
      path.join(dir, 'manifest.json'),
      encodeManifest({schema_version: 1, kind: 'environment', instance: 'env', checkpoint_id: 'c', records_file: `records-${sha}.jsonl`, records_sha256: sha, record_count: 1}),
    )
    await expect(read(dir)).rejects.toThrow(msg)
  })

  it('reads the legacy fixed records.jsonl name and a last line without newline', async () => {
    const root = await tempDir()
    const dir = path.join(root, 'p')
    await mkdir(dir)
    const body = line('a') + '\n' + line('b', 0, ', "v": Infinity')
    const sha = createHash('sha256').update(body).digest('hex')
    await writeFile(path.join(dir, 'records.jsonl'), body)
    await writeFile(
      path.join(dir, 'manifest.json'),
      JSON.stringify({schema_version: 1, kind: 'environment', instance: 'env', checkpoint_id: 'c', records_file: 'records.jsonl', records_sha256: sha, record_count: 2}),
    )
    expect((await read(dir)).keys).toEqual(['a', 'b'])
  })
})

describe('readParticipantState: the offline-only checks (within)', () => {
  it("a restore (no within) reads a records file whose name is not its digest, as Gym's does; verify (within) refuses it", async () => {
    const root = await tempDir()
    const m = await writeParticipantState(opts(root), [line('r1')])
    const dir = participantDir(root, 'environment', 'env')
    const wrong = `records-${'f'.repeat(64)}.jsonl`
    await rename(path.join(dir, m.records_file), path.join(dir, wrong))
    await writeFile(path.join(dir, 'manifest.json'), encodeManifest({...m, records_file: wrong}))
    expect((await readParticipantState(dir, {kind: 'environment', instance: 'env'})).keys).toEqual(['r1'])
    await expect(readParticipantState(dir, {kind: 'environment', instance: 'env', within: root})).rejects.toThrow(`is named for sha256 ${'f'.repeat(64)}, but its content`)
  })

  it('names the symlink that leaves the checkpoint directory and its target', async () => {
    const root = await tempDir()
    const m = await writeParticipantState(opts(root), [line('r1')])
    const dir = participantDir(root, 'environment', 'env')
    const target = path.join(await realpath(await tempDir()), m.records_file)
    await rename(path.join(dir, m.records_file), target)
    await symlink(target, path.join(dir, m.records_file))
    expect((await readParticipantState(dir)).keys).toEqual(['r1'])
    await expect(readParticipantState(dir, {within: root})).rejects.toThrow(`${path.join(dir, m.records_file)} is a symlink to ${target}, outside the checkpoint directory ${await realpath(root)}`)
  })
})

describe('sortFindDuplicates', () => {
  it('sorts the keys in place and names each key held more than once, with its count, up to a limit', () => {
    const keys = ['b', 'a', 'c', 'b', 'a', 'b', 'd', 'e', 'e']
    expect(sortFindDuplicates(keys, 2)).toEqual({
      count: 3,
      first: [
        {key: 'a', records: 2},
        {key: 'b', records: 3},
      ],
    })
    expect(keys).toEqual(['a', 'a', 'b', 'b', 'b', 'c', 'd', 'e', 'e'])
    expect(sortFindDuplicates(['x', 'y'])).toEqual({count: 0, first: []})
  })
})
