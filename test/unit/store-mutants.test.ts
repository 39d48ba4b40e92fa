// Rules of the participant store that no other test holds (issue 12): each test here fails when
// the rule it names breaks; they were written against the surviving mutants of
// src/storage/participant-store.ts.
import {createHash} from 'node:crypto'
import {mkdir, readFile, readdir, rm, symlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError, WriteStoppedError} from '../../src/storage/errors.js'
import {RECORDS_FILE_PATTERN, encodeManifest, participantDir, readParticipantState, sortFindDuplicates, writeParticipantState} from '../../src/storage/participant-store.js'
import {pyDumps} from '../../src/storage/pyjson.js'
import {tempDir} from '../helpers/tmp.js'
import {rejection} from '../helpers/errors.js'

const line = (r: string, attempt = 0, extra = '') => `{"episode_id": {"rollout_id": "${r}", "attempt": ${attempt}}${extra}}`
const sha256 = (s: string | Buffer) => createHash('sha256').update(s).digest('hex')
const opts = (checkpointDir: string, checkpointId = 'c1', kind = 'environment', instance = 'env') => ({checkpointDir, kind, instance, checkpointId})

/** A participant directory written by hand: records bytes as given, a manifest naming them. */
async function handWritten(dir: string, records: string | Buffer, manifest: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
  await mkdir(dir, {recursive: true})
  const sha = sha256(records)
  const m = {
    checkpoint_id: 'c1',
    instance: 'env',
    kind: 'environment',
    record_count: 1,
    records_file: `records-${sha}.jsonl`,
    records_sha256: sha,
    schema_version: 1,
    ...manifest,
  }
  if (typeof m.records_file === 'string') await writeFile(path.join(dir, m.records_file), records)
  await writeFile(path.join(dir, 'manifest.json'), encodeManifest(m))
  return m
}

const stateError = (p: Promise<unknown>) => rejection(p, CheckpointStateError)

describe('commit conflicts', () => {
  it('a conflicting commit with the same records but another checkpoint ID keeps the records file the committed manifest names', async () => {
    const root = await tempDir()
    const lines = [line('r1'), line('r2', 3)]
    const first = await writeParticipantState(opts(root, 'c1'), lines)
    const dir = participantDir(root, 'environment', 'env')
    const err = await stateError(writeParticipantState(opts(root, 'c2'), lines))
    expect(err.message).toContain('already holds a different commit (c1, ' + first.records_file + ')')
    // Same content, same name: deleting "our" file would delete the committed one.
    expect((await readdir(dir)).sort()).toEqual(['manifest.json', first.records_file])
    const read = await readParticipantState(dir, {kind: 'environment', instance: 'env'})
    expect(read.manifest).toEqual(first)
    expect(read.keys).toEqual(['r1', 'r2-a3'])
  })

  it('a conflicting commit with other records removes its own records file and leaves the committed one', async () => {
    const root = await tempDir()
    const first = await writeParticipantState(opts(root, 'c1'), [line('r1')])
    const dir = participantDir(root, 'environment', 'env')
    const err = await stateError(writeParticipantState(opts(root, 'c1'), [line('r9')]))
    expect(err.message).toMatch(/already holds a different commit \(c1, records-[0-9a-f]{64}\.jsonl\)/)
    expect((await readdir(dir)).sort()).toEqual(['manifest.json', first.records_file])
    expect(await readFile(path.join(dir, 'manifest.json'), 'utf8')).toBe(encodeManifest(first))
  })

  it('a replay of the same commit returns the manifest on disk and leaves one records file', async () => {
    const root = await tempDir()
    const first = await writeParticipantState(opts(root), [line('a'), line('b')])
    const again = await writeParticipantState(opts(root), [line('a'), line('b')])
    expect(again).toEqual(first)
    const dir = participantDir(root, 'environment', 'env')
    expect((await readdir(dir)).sort()).toEqual(['manifest.json', first.records_file])
  })

  it('a manifest in place that cannot be read is named, left alone, and our records file removed', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await mkdir(dir, {recursive: true})
    await writeFile(path.join(dir, 'manifest.json'), '{not json')
    const err = await stateError(writeParticipantState(opts(root), [line('a')]))
    expect(err.message).toContain(`${dir} already holds a manifest that cannot be read`)
    expect(await readdir(dir)).toEqual(['manifest.json'])
    expect(await readFile(path.join(dir, 'manifest.json'), 'utf8')).toBe('{not json')
  })
})

describe('a resume racing the publication', () => {
  it('a stop that arrives after the last record still stops the manifest from appearing', async () => {
    const root = await tempDir()
    let stopped = false
    function* lines() {
      yield line('a')
      yield line('b')
      // The resume lands once every record has been read, before the rename and manifest.
      stopped = true
    }
    const err = await writeParticipantState({...opts(root), shouldStop: () => stopped}, lines()).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(WriteStoppedError)
    const dir = participantDir(root, 'environment', 'env')
    // Nothing published: no manifest, no records file, no temporary file left behind.
    expect(await readdir(dir)).toEqual([])
  })

  it('a stop taken under the lock, just before the rename, publishes nothing', async () => {
    const root = await tempDir()
    let stopped = false
    let locked = 0
    const err = await writeParticipantState(
      {
        ...opts(root),
        shouldStop: () => stopped,
        runLocked: async (fn) => {
          locked++
          // The resume held the lock first and stopped the write.
          stopped = true
          return fn()
        },
      },
      [line('a')],
    ).catch((e: unknown) => e)
    expect(locked).toBe(1)
    expect(err).toBeInstanceOf(WriteStoppedError)
    expect((err as Error).message).toContain("checkpoint 'c1'")
    expect(await readdir(participantDir(root, 'environment', 'env'))).toEqual([])
  })

  it('a stop before a record ends the write at that record', async () => {
    const root = await tempDir()
    let asked = 0
    const err = await writeParticipantState({...opts(root), shouldStop: () => ++asked > 1}, [line('a'), line('b'), line('c')]).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(WriteStoppedError)
    expect(asked).toBe(2)
    expect(await readdir(participantDir(root, 'environment', 'env'))).toEqual([])
  })

  it('the rename and the manifest run under the caller lock, after every record', async () => {
    const root = await tempDir()
    const seen: string[] = []
    const dir = participantDir(root, 'environment', 'env')
    const m = await writeParticipantState(
      {
        ...opts(root),
        runLocked: async (fn) => {
          seen.push(`before:${(await readdir(dir)).filter((f) => !f.startsWith('.')).length}`)
          const r = await fn()
          seen.push(`after:${(await readdir(dir)).sort().join(',')}`)
          return r
        },
      },
      [line('a')],
    )
    expect(seen).toEqual(['before:0', `after:manifest.json,${m.records_file}`])
  })
})

describe("reading: the manifest must be this participant's", () => {
  it('a manifest of another kind with the same instance name is refused', async () => {
    const root = await tempDir()
    await writeParticipantState(opts(root, 'c1', 'agent', 'x'), [line('a')])
    const agentDir = participantDir(root, 'agent', 'x')
    const modelDir = participantDir(root, 'model', 'x')
    await mkdir(path.dirname(modelDir), {recursive: true})
    await symlink(agentDir, modelDir)
    const err = await stateError(readParticipantState(modelDir, {kind: 'model', instance: 'x'}))
    expect(err.message).toBe(`${path.join(modelDir, 'manifest.json')} belongs to agent/x, not model/x`)
    // Its own kind reads it.
    expect((await readParticipantState(agentDir, {kind: 'agent', instance: 'x'})).keys).toEqual(['a'])
  })

  it('a manifest of another instance of the same kind is refused', async () => {
    const root = await tempDir()
    await writeParticipantState(opts(root, 'c1', 'agent', 'x'), [line('a')])
    const err = await stateError(readParticipantState(participantDir(root, 'agent', 'x'), {kind: 'agent', instance: 'y'}))
    expect(err.message).toContain('belongs to agent/x, not agent/y')
  })

  it("without a kind to check, any participant's manifest is read", async () => {
    const root = await tempDir()
    await writeParticipantState(opts(root, 'c1', 'agent', 'x'), [line('a')])
    expect((await readParticipantState(participantDir(root, 'agent', 'x'))).manifest.kind).toBe('agent')
  })
})

describe('reading: the records file name', () => {
  it('the pattern is anchored at both ends', () => {
    const hex = 'a'.repeat(64)
    for (const ok of ['records.jsonl', `records-${hex}.jsonl`]) expect(RECORDS_FILE_PATTERN.test(ok)).toBe(true)
    for (const bad of [
      '../../records.jsonl',
      `../records-${hex}.jsonl`,
      'xrecords.jsonl',
      'records.jsonl.bak',
      'records.jsonlx',
      `records-${hex}.jsonl/x`,
      `records-${'a'.repeat(63)}.jsonl`,
      `records-${'a'.repeat(65)}.jsonl`,
      `records-${'A'.repeat(64)}.jsonl`,
      `records-${'g'.repeat(64)}.jsonl`,
      'records-.jsonl',
      'recordsXjsonl',
    ]) {
      expect(RECORDS_FILE_PATTERN.test(bad), bad).toBe(false)
    }
  })

  it('a manifest naming ../../records.jsonl is refused even when that file exists and matches the digest', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const records = line('a') + '\n'
    // A valid records file two levels up: only the name check stands between it and a restore.
    await mkdir(dir, {recursive: true})
    await writeFile(path.join(dir, '..', '..', 'records.jsonl'), records)
    await handWritten(dir, records, {records_file: '../../records.jsonl'})
    const err = await stateError(readParticipantState(dir, {kind: 'environment', instance: 'env'}))
    expect(err.message).toBe(`${path.join(dir, 'manifest.json')} names an invalid records file "../../records.jsonl"`)
  })

  it("Gym's fixed records.jsonl name is read", async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const records = line('a') + '\n'
    await handWritten(dir, records, {records_file: 'records.jsonl'})
    expect((await readdir(dir)).sort()).toEqual(['manifest.json', 'records.jsonl'])
    const r = await readParticipantState(dir, {kind: 'environment', instance: 'env', within: root})
    expect(r.keys).toEqual(['a'])
  })

  it('a records_file that is not a string is refused', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await handWritten(dir, line('a') + '\n', {records_file: 7})
    expect((await stateError(readParticipantState(dir))).message).toContain('names an invalid records file 7')
  })
})

describe('reading: every line is checked', () => {
  it('a line that starts with a valid episode_id and then holds broken JSON is refused, with its line number', async () => {
    const root = await tempDir()
    for (const broken of [', "x": [1, }', ', "x": tru}', ', "x": "unterminated}', ', "x": 01}', ', "x": {"k" 1}}', '} trailing']) {
      const dir = participantDir(root, 'environment', `e${sha256(broken).slice(0, 8)}`)
      const records = `${line('ok')}\n{"episode_id": {"rollout_id": "r", "attempt": 0}${broken}\n`
      await handWritten(dir, records, {record_count: 2, instance: path.basename(dir)})
      const err = await stateError(readParticipantState(dir))
      expect(err.message, broken).toMatch(/line 2 holds a record that is not JSON$/)
      // Kept for a restore, the same line goes through the exact decoder and fails there too.
      const kept = await stateError(readParticipantState(dir, {keep: new Set(['r'])}))
      expect(kept.message, broken).toMatch(/line 2 holds a record that is not JSON$/)
    }
  })

  it("the fast path takes Python's own lines, and a kept record is decoded exactly", async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const lines = [line('a', 0, ', "v": [NaN, -Infinity, 1e400, 12345678901234567890]'), line('b', 2, ', "s": "\\u00e9"')]
    await handWritten(dir, lines.join('\n') + '\n', {record_count: 2})
    const r = await readParticipantState(dir, {keep: new Set(['b-a2'])})
    expect(r.keys).toEqual(['a', 'b-a2'])
    expect(r.kept.map((k) => [k.key, pyDumps(k.record)])).toEqual([['b-a2', lines[1]]])
    expect(r.bytes).toBe(Buffer.byteLength(lines.join('\n') + '\n'))
  })

  it('an episode_id the fast path reads but Gym refuses (reserved suffix) is an error', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await handWritten(dir, line('r-a1') + '\n')
    expect((await stateError(readParticipantState(dir))).message).toMatch(/line 1: checkpoint record has no valid episode_id$/)
  })

  it('records whose episode_id is not first, is duplicated, or is missing go through the decoder', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const lines = [
      '{"x": 1, "episode_id": {"attempt": 4, "rollout_id": "late"}}',
      // Python keeps the last of two keys.
      '{"episode_id": {"rollout_id": "first", "attempt": 0}, "episode_id": {"rollout_id": "second", "attempt": 1}}',
      '{"episode_id":{"rollout_id":"compact","attempt":2}}',
    ]
    await handWritten(dir, lines.join('\n') + '\n', {record_count: 3})
    expect((await readParticipantState(dir)).keys).toEqual(['late-a4', 'second-a1', 'compact-a2'])
    for (const [i, bad] of ['{"x": 1}', '[1, 2]', '{"episode_id": {"rollout_id": "r", "attempt": -1}}', '{"episode_id": "r"}', '{"episode_id": {"rollout_id": "r", "attempt": 0, "x": 1}}'].entries()) {
      const d = participantDir(root, 'environment', `bad${i}`)
      await handWritten(d, `${line('ok')}\n${bad}\n`, {record_count: 2, instance: `bad${i}`})
      expect((await stateError(readParticipantState(d))).message, bad).toMatch(/line 2: checkpoint record has no valid episode_id$/)
    }
  })

  it('a line that is not UTF-8 is refused; UTF-8 that is not ASCII is read', async () => {
    const root = await tempDir()
    const bad = participantDir(root, 'environment', 'bad')
    const records = Buffer.concat([Buffer.from(line('ok') + '\n'), Buffer.from('{"episode_id": {"rollout_id": "r", "attempt": 0}, "s": "'), Buffer.from([0xc3, 0x28]), Buffer.from('"}\n')])
    await handWritten(bad, records, {record_count: 2, instance: 'bad'})
    expect((await stateError(readParticipantState(bad))).message).toMatch(/line 2 holds a record that is not UTF-8$/)
    const good = participantDir(root, 'environment', 'good')
    const text = `${line('ok')}\n{"episode_id": {"rollout_id": "r", "attempt": 0}, "s": "é𝄞"}\n`
    await handWritten(good, text, {record_count: 2, instance: 'good'})
    const r = await readParticipantState(good, {keep: new Set(['r'])})
    expect(r.keys).toEqual(['ok', 'r'])
    expect((r.kept[0]!.record as Map<string, unknown>).get('s')).toBe('é𝄞')
  })

  it('records larger than the 1 MiB read chunk, and lines ending on a chunk boundary, are read whole', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const MiB = 1 << 20
    const small = line('a')
    // Ends exactly at the first chunk boundary (its newline is the chunk's last byte).
    const pad = (target: number, r: string) => {
      const head = `{"episode_id": {"rollout_id": "${r}", "attempt": 0}, "p": "`
      return head + 'x'.repeat(target - head.length - 2) + '"}'
    }
    const first = pad(MiB - small.length - 2, 'edge')
    const huge = line('huge', 1, `, "blob": "${'y'.repeat(2 * MiB + 17)}"`)
    const lines = [small, first, huge, line('z')]
    const text = lines.join('\n') + '\n'
    expect(Buffer.byteLength(small + '\n' + first + '\n')).toBe(MiB)
    await handWritten(dir, text, {record_count: lines.length})
    const r = await readParticipantState(dir, {keep: new Set(['huge-a1', 'z'])})
    expect(r.keys).toEqual(['a', 'edge', 'huge-a1', 'z'])
    expect(r.bytes).toBe(text.length)
    expect(r.kept.map((k) => k.key)).toEqual(['huge-a1', 'z'])
    expect(pyDumps(r.kept[0]!.record)).toBe(huge)
  })

  it('a last line without its newline is still a record', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await handWritten(dir, `${line('a')}\n${line('b')}`, {record_count: 2})
    expect((await readParticipantState(dir)).keys).toEqual(['a', 'b'])
  })

  it('an empty line is a record that is not JSON', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await handWritten(dir, `${line('a')}\n\n${line('b')}\n`, {record_count: 3})
    expect((await stateError(readParticipantState(dir))).message).toMatch(/line 2 holds a record that is not JSON$/)
  })
})

describe('reading: the manifest', () => {
  it('each broken manifest names its problem', async () => {
    const root = await tempDir()
    const cases: [string, string | Record<string, unknown>, RegExp][] = [
      ['notjson', '{"a": ', /manifest\.json is not JSON$/],
      ['array', '[1]', /manifest\.json is not a manifest$/],
      ['null', 'null', /manifest\.json is not a manifest$/],
      ['string', '"x"', /manifest\.json is not a manifest$/],
      ['schema', {schema_version: 2}, /manifest\.json has an unsupported schema 2$/],
      ['noschema', {schema_version: undefined}, /manifest\.json has an unsupported schema undefined$/],
      ['noid', {checkpoint_id: 5}, /manifest\.json names no checkpoint$/],
      ['count', {record_count: 2}, /manifest\.json expects 2 records, found 1$/],
      ['countstr', {record_count: '1'}, /manifest\.json expects "1" records, found 1$/],
      ['digest', {records_sha256: 'f'.repeat(64)}, /does not match its manifest digest$/],
    ]
    for (const [name, m, want] of cases) {
      const dir = participantDir(root, 'environment', name)
      await handWritten(dir, line('a') + '\n', {instance: name})
      if (typeof m === 'string') await writeFile(path.join(dir, 'manifest.json'), m)
      else {
        const cur = JSON.parse(await readFile(path.join(dir, 'manifest.json'), 'utf8')) as Record<string, unknown>
        await writeFile(path.join(dir, 'manifest.json'), JSON.stringify({...cur, ...m}))
      }
      expect((await stateError(readParticipantState(dir))).message, name).toMatch(want)
    }
    const missing = participantDir(root, 'environment', 'missing')
    await mkdir(missing, {recursive: true})
    expect((await stateError(readParticipantState(missing))).message).toBe(`missing manifest ${path.join(missing, 'manifest.json')}`)
  })

  it('a records file named for another digest is an error offline, where its content matches its manifest', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const records = line('a') + '\n'
    const other = 'b'.repeat(64)
    await handWritten(dir, records, {records_file: `records-${other}.jsonl`})
    await writeFile(path.join(dir, `records-${other}.jsonl`), records)
    // A restore reads it (Gym checks the digest, not the name)...
    expect((await readParticipantState(dir)).keys).toEqual(['a'])
    // ...verify names the mismatch.
    const err = await stateError(readParticipantState(dir, {within: root}))
    expect(err.message).toBe(`${path.join(dir, `records-${other}.jsonl`)} is named for sha256 ${other}, but its content and its manifest's records_sha256 are ${sha256(records)}`)
  })

  it('a records file or manifest reached through a symlink leaving the checkpoint directory is named offline', async () => {
    const root = await tempDir()
    const outside = await tempDir()
    const ckpt = path.join(root, 'c')
    const dir = participantDir(ckpt, 'environment', 'env')
    const records = line('a') + '\n'
    const m = await handWritten(dir, records)
    await writeFile(path.join(outside, 'r.jsonl'), records)
    await rm(path.join(dir, m.records_file as string))
    await symlink(path.join(outside, 'r.jsonl'), path.join(dir, m.records_file as string))
    const err = await stateError(readParticipantState(dir, {within: ckpt}))
    expect(err.message).toContain(`${path.join(dir, m.records_file as string)} is a symlink to ${path.join(outside, 'r.jsonl')}, outside the checkpoint directory`)
    // Without `within` (a restore), it is read.
    expect((await readParticipantState(dir)).keys).toEqual(['a'])
  })

  it('a participant directory that is a symlink out of the checkpoint is named offline', async () => {
    const root = await tempDir()
    const outside = await tempDir()
    const ckpt = path.join(root, 'c')
    await handWritten(path.join(outside, 'env'), line('a') + '\n')
    const dir = participantDir(ckpt, 'environment', 'env')
    await mkdir(path.dirname(dir), {recursive: true})
    await symlink(path.join(outside, 'env'), dir)
    const err = await stateError(readParticipantState(dir, {within: ckpt}))
    expect(err.message).toBe(`${dir} is a symlink to ${path.join(outside, 'env')}, outside the checkpoint directory ${ckpt}`)
  })

  it('a symlink inside the checkpoint directory is followed', async () => {
    const root = await tempDir()
    const ckpt = path.join(root, 'c')
    const real = path.join(ckpt, 'elsewhere')
    await handWritten(real, line('a') + '\n')
    const dir = participantDir(ckpt, 'environment', 'env')
    await mkdir(path.dirname(dir), {recursive: true})
    await symlink(real, dir)
    expect((await readParticipantState(dir, {within: ckpt})).keys).toEqual(['a'])
  })
})

describe('writing', () => {
  it('lines that fill the write batch exactly, and one larger than it, give the same bytes and digest', async () => {
    const root = await tempDir()
    const MiB = 1 << 20
    const head = line('fill', 0, ', "p": "')
    // With its newline, this line fills the 1 MiB batch to the last byte.
    const fill = head + 'q'.repeat(MiB - 1 - head.length - 2) + '"}'
    const over = line('over', 0, `, "p": "${'w'.repeat(MiB)}"`)
    const lines = [fill, line('a'), over, line('b'), fill.replace('"fill"', '"fill2"')]
    const m = await writeParticipantState(opts(root), lines)
    const text = lines.join('\n') + '\n'
    const dir = participantDir(root, 'environment', 'env')
    expect(m.records_sha256).toBe(sha256(text))
    expect(m.record_count).toBe(5)
    expect(await readFile(path.join(dir, m.records_file), 'utf8')).toBe(text)
  })

  it('an unsafe kind or instance is refused before anything is written', async () => {
    const root = await tempDir()
    for (const [kind, instance, what] of [
      ['..', 'x', "kind '..'"],
      ['model', '../x', "instance '../x'"],
      ['model', '', "instance ''"],
    ] as const) {
      const err = await stateError(writeParticipantState(opts(root, 'c1', kind, instance), [line('a')]))
      expect(err.message).toBe(`participant ${what} is not a safe path component`)
    }
    expect(await readdir(root)).toEqual([])
  })

  it('an I/O failure is a CheckpointStateError naming the checkpoint directory', async () => {
    const root = await tempDir()
    await writeFile(path.join(root, 'gym'), 'a file where a directory must be')
    const err = await stateError(writeParticipantState(opts(root), [line('a')]))
    expect(err.message).toMatch(new RegExp(`^cannot write checkpoint state under ${root.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: `))
    // A line source that throws something else is typed too.
    const root2 = await tempDir()
    function* boom(): Generator<string> {
      yield line('a')
      throw new Error('encoder broke')
    }
    const e2 = await stateError(writeParticipantState(opts(root2), boom()))
    expect(e2.message).toBe(`cannot write checkpoint state under ${root2}: encoder broke`)
    expect(await readdir(participantDir(root2, 'environment', 'env'))).toEqual([])
  })

  it("the manifest is Python's json.dumps(sort_keys=True, indent=1), byte for byte", () => {
    // Literal output of Python 3: json.dumps(m, sort_keys=True, indent=1)
    const m = {b: [1, 'é', {z: null, a: true}, []], a: {}, 'c\n': 1.5, d: ['x']}
    expect(encodeManifest(m)).toBe('{\n "a": {},\n "b": [\n  1,\n  "\\u00e9",\n  {\n   "a": true,\n   "z": null\n  },\n  []\n ],\n "c\\n": 1.5,\n "d": [\n  "x"\n ]\n}')
    expect(encodeManifest({})).toBe('{}')
    expect(encodeManifest({k: '\u007f\uffff'})).toBe('{\n "k": "\\u007f\\uffff"\n}')
  })
})

describe('sortFindDuplicates', () => {
  it('sorts in place and counts each duplicated key once, with its number of records', () => {
    const keys = ['b', 'a', 'b', 'c', 'b', 'a', 'd']
    expect(sortFindDuplicates(keys)).toEqual({
      count: 2,
      first: [
        {key: 'a', records: 2},
        {key: 'b', records: 3},
      ],
    })
    expect(keys).toEqual(['a', 'a', 'b', 'b', 'b', 'c', 'd'])
    expect(sortFindDuplicates([])).toEqual({count: 0, first: []})
    expect(sortFindDuplicates(['x'])).toEqual({count: 0, first: []})
    expect(sortFindDuplicates(['x', 'x'])).toEqual({count: 1, first: [{key: 'x', records: 2}]})
  })

  it('names at most `max` keys and counts them all', () => {
    const keys = ['e', 'e', 'd', 'd', 'c', 'c', 'b', 'a', 'a']
    expect(sortFindDuplicates(keys, 2)).toEqual({
      count: 4,
      first: [
        {key: 'a', records: 2},
        {key: 'c', records: 2},
      ],
    })
    const many = Array.from({length: 12}, (_, i) => `k${String(i).padStart(2, '0')}`).flatMap((k) => [k, k])
    const r = sortFindDuplicates(many)
    expect(r.count).toBe(12)
    expect(r.first.map((x) => x.key)).toEqual(Array.from({length: 10}, (_, i) => `k${String(i).padStart(2, '0')}`))
  })
})
