// More rules of the participant store (src/storage/participant-store.ts) that no other test holds
// (issue 12), written against the survivors of its first mutation run: a stopped write closes its
// record source, kept records are checked as strictly as scanned ones and stay in file order, the
// offline symlink and missing-file rules, and lines whose start is cut by the 1 MiB read chunk.
import {mkdir, rm, symlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError, WriteStoppedError} from '../../src/storage/errors.js'
import {participantDir, readParticipantState, writeParticipantState} from '../../src/storage/participant-store.js'
import {pyDumps} from '../../src/storage/pyjson.js'
import {tempDir} from '../helpers/tmp.js'
import {rejection} from '../helpers/errors.js'
import {handWritten, sha256} from '../helpers/store.js'

const line = (r: string, attempt = 0, extra = '') => `{"episode_id": {"rollout_id": "${r}", "attempt": ${attempt}}${extra}}`

const stateError = (p: Promise<unknown>) => rejection(p, CheckpointStateError)

describe('writing', () => {
  it('a write stopped part way closes the source of its records, sync or async', async () => {
    const root = await tempDir()
    for (const async of [false, true]) {
      let closed = false
      let sent = 0
      function* syncLines() {
        try {
          for (;;) yield line(`r${sent++}`)
        } finally {
          closed = true
        }
      }
      async function* asyncLines() {
        yield* syncLines()
      }
      const err = await writeParticipantState(
        {checkpointDir: root, kind: 'environment', instance: async ? 'a' : 's', checkpointId: 'c1', shouldStop: () => sent >= 3},
        async ? asyncLines() : syncLines(),
      ).catch((e: unknown) => e)
      expect(err, `async: ${async}`).toBeInstanceOf(WriteStoppedError)
      expect(closed, `async: ${async}`).toBe(true)
    }
  })
})

describe('reading: kept records are checked like every other', () => {
  it('a kept record that is not UTF-8 is refused, with its line number', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const records = Buffer.concat([Buffer.from(line('ok') + '\n'), Buffer.from('{"episode_id": {"rollout_id": "r", "attempt": 0}, "s": "'), Buffer.from([0xc3, 0x28]), Buffer.from('"}\n')])
    await handWritten(dir, records, 2)
    expect((await stateError(readParticipantState(dir, {keep: new Set(['r'])}))).message).toMatch(/line 2 holds a record that is not UTF-8$/)
  })

  it('kept records come in file order when several of them name their episode twice', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    // Python keeps the last of repeated keys: these lines belong to b, d and f, not to x.
    const twice = (r: string) => `{"episode_id": {"rollout_id": "x", "attempt": 0}, "episode_id": {"rollout_id": "${r}", "attempt": 0}}`
    const lines = [line('a'), twice('b'), line('c'), twice('d'), line('e'), twice('f')]
    await handWritten(dir, lines.join('\n') + '\n', lines.length)
    const r = await readParticipantState(dir, {keep: new Set(['a', 'b', 'c', 'd', 'e', 'f'])})
    expect(r.keys).toEqual(['a', 'b', 'c', 'd', 'e', 'f'])
    expect(r.kept.map((k) => k.key)).toEqual(['a', 'b', 'c', 'd', 'e', 'f'])
    // Decoded as Python does: the last of the repeated keys is the record's episode_id.
    expect(r.kept.map((k) => pyDumps(k.record))).toEqual(['a', 'b', 'c', 'd', 'e', 'f'].map((x) => line(x)))
  })
})

describe('reading: the manifest and the offline path rules', () => {
  it('a manifest that cannot be read is named with its cause, not as missing', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await mkdir(path.join(dir, 'manifest.json'), {recursive: true})
    const err = await stateError(readParticipantState(dir))
    expect(err.message).toMatch(/^cannot read checkpoint state from .*EISDIR/)
    expect(err.message).not.toMatch(/missing manifest/)
  })

  it('offline, a participant directory without a manifest is a missing manifest', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await mkdir(dir, {recursive: true})
    const err = await stateError(readParticipantState(dir, {within: root}))
    expect(err.message).toBe(`missing manifest ${path.join(dir, 'manifest.json')}`)
  })

  it("offline, a participant directory that is a symlink to the checkpoint directory's parent is named as leaving it", async () => {
    const parent = await tempDir()
    const root = path.join(parent, 'ck')
    await mkdir(path.join(root, 'gym', 'environment'), {recursive: true})
    const dir = path.join(root, 'gym', 'environment', 'env')
    await symlink(parent, dir)
    const err = await stateError(readParticipantState(dir, {within: root}))
    expect(err.message).toBe(`${dir} is a symlink to ${parent}, outside the checkpoint directory ${root}`)
  })

  it('offline, a link that stays inside is followed and the link further on that leaves is the one named', async () => {
    const root = await tempDir()
    const outside = await tempDir()
    const real = participantDir(root, 'environment', 'real')
    const records = line('a') + '\n'
    await handWritten(real, records, 1)
    // The records file is moved out and linked back; the participant directory is a link to `real`.
    const name = `records-${sha256(records)}.jsonl`
    await writeFile(path.join(outside, name), records)
    await rm(path.join(real, name))
    await symlink(path.join(outside, name), path.join(real, name))
    const dir = participantDir(root, 'environment', 'env')
    await symlink(real, dir)
    const err = await stateError(readParticipantState(dir, {within: root}))
    expect(err.message).toBe(`${path.join(dir, name)} is a symlink to ${path.join(outside, name)}, outside the checkpoint directory ${root}`)
  })
})

describe('reading: a line whose start is cut by the 1 MiB read chunk', () => {
  const MiB = 1 << 20
  /** A first line padded so that the next line starts `before` bytes before the chunk boundary. */
  const filler = (before: number) => {
    const head = `{"episode_id": {"rollout_id": "fill", "attempt": 0}, "p": "`
    return head + 'x'.repeat(MiB - before - 1 - head.length - 2) + '"}'
  }

  for (const [what, cut] of [
    ['shorter than the prefix the episode is read from', line('cut', 0, ', "s": "short"')],
    ['longer than that prefix, with a string across the boundary', line('cut', 0, `, "s": "${'s'.repeat(1000)}", "n": [1, 2.5, NaN]`)],
  ] as const) {
    it(`${what}: read whole, scanned or kept`, async () => {
      const root = await tempDir()
      const dir = participantDir(root, 'environment', 'env')
      const lines = [filler(10), cut, line('after', 1, ', "v": 1')]
      const text = lines.join('\n') + '\n'
      expect(Buffer.byteLength(lines[0]! + '\n')).toBe(MiB - 10)
      await handWritten(dir, text, lines.length)
      const scanned = await readParticipantState(dir)
      expect(scanned.keys).toEqual(['fill', 'cut', 'after-a1'])
      expect(scanned.bytes).toBe(text.length)
      const kept = await readParticipantState(dir, {keep: new Set(['cut', 'after-a1'])})
      expect(kept.keys).toEqual(['fill', 'cut', 'after-a1'])
      expect(kept.kept.map((k) => pyDumps(k.record))).toEqual([cut, lines[2]])
    })
  }

  it('a line cut at its start that also runs past the next chunk is one record', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const long = line('long', 0, `, "s": "${'s'.repeat(MiB + 100)}"`)
    const lines = [filler(10), long, line('after')]
    const text = lines.join('\n') + '\n'
    await handWritten(dir, text, lines.length)
    expect((await readParticipantState(dir)).keys).toEqual(['fill', 'long', 'after'])
    const kept = await readParticipantState(dir, {keep: new Set(['long'])})
    expect(kept.keys).toEqual(['fill', 'long', 'after'])
    expect(kept.kept.map((k) => pyDumps(k.record))).toEqual([long])
  })

  it('a newline that is the first byte of a chunk ends the line before it', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const lines = [filler(-1), line('next')]
    expect(Buffer.byteLength(lines[0]!)).toBe(MiB)
    await handWritten(dir, lines.join('\n') + '\n', lines.length)
    expect((await readParticipantState(dir)).keys).toEqual(['fill', 'next'])
  })

  it('a last line without its newline, longer than the prefix the episode is read from, is still a record', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const last = line('b', 0, `, "s": "${'s'.repeat(400)}"`)
    await handWritten(dir, `${line('a')}\n${last}`, 2)
    expect((await readParticipantState(dir)).keys).toEqual(['a', 'b'])
    expect((await readParticipantState(dir, {keep: new Set(['b'])})).kept.map((k) => pyDumps(k.record))).toEqual([last])
  })

  it('a broken line across the boundary is refused with its line number, scanned or kept', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const broken = line('cut', 0, `, "s": "${'s'.repeat(600)}", "n": [1, }`)
    const lines = [filler(10), broken, line('after')]
    await handWritten(dir, lines.join('\n') + '\n', lines.length)
    expect((await stateError(readParticipantState(dir))).message).toMatch(/line 2 holds a record that is not JSON$/)
    expect((await stateError(readParticipantState(dir, {keep: new Set(['cut'])}))).message).toMatch(/line 2 holds a record that is not JSON$/)
  })
})
