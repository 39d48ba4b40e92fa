// More rules of the participant store (src/storage/participant-store.ts), written against the
// survivors of its mutation run of 2026-12-04 (issue 12): a source read to its end is not closed
// again, the offline path rules for a directory outside the checkpoint and a link that cannot be
// resolved, and a scanned line whose token is cut by the 1 MiB read chunk (an error is raised where
// it is found, not only at the line's end; a long number is one token).
import {mkdir, realpath, symlink} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {participantDir, readParticipantState, writeParticipantState} from '../../src/storage/participant-store.js'
import {pyDumps} from '../../src/storage/pyjson.js'
import {tempDir} from '../helpers/tmp.js'
import {rejection} from '../helpers/errors.js'
import {handWritten} from '../helpers/store.js'

const MiB = 1 << 20
const line = (r: string, attempt = 0, extra = '') => `{"episode_id": {"rollout_id": "${r}", "attempt": ${attempt}}${extra}}`
const stateError = (p: Promise<unknown>) => rejection(p, CheckpointStateError)

/** A first line (with its newline) of exactly `n` bytes. */
const filler = (n: number) => {
  const head = `{"episode_id": {"rollout_id": "fill", "attempt": 0}, "p": "`
  return head + 'x'.repeat(n - 1 - head.length - 2) + '"}\n'
}

describe('writing: the source of the records', () => {
  it('a source read to its end is not closed again, as for-of and for-await leave it', async () => {
    const root = await tempDir()
    for (const async of [false, true]) {
      const lines = [line('a'), line('b')]
      let returned = 0
      let i = 0
      const next = () => (i < lines.length ? {done: false as const, value: lines[i++]!} : {done: true as const, value: undefined})
      const ret = () => {
        returned++
        return {done: true as const, value: undefined}
      }
      const source = async ? {[Symbol.asyncIterator]: () => ({next: async () => next(), return: async () => ret()})} : {[Symbol.iterator]: () => ({next, return: ret})}
      const m = await writeParticipantState({checkpointDir: root, kind: 'environment', instance: async ? 'a' : 's', checkpointId: 'c1'}, source)
      expect(m.record_count, `async: ${async}`).toBe(2)
      expect(returned, `async: ${async}`).toBe(0)
    }
  })
})

describe('reading offline: where the paths lead', () => {
  it('a participant directory outside the checkpoint directory, with no link on the way, is named with where it resolves', async () => {
    const root = await tempDir()
    const elsewhere = await tempDir()
    const dir = participantDir(elsewhere, 'environment', 'env')
    await handWritten(dir, line('a') + '\n', 1)
    const base = await realpath(root)
    const err = await stateError(readParticipantState(dir, {within: root}))
    expect(err.message).toBe(`${dir} resolves to ${await realpath(dir)}, outside the checkpoint directory ${base}`)
  })

  it('a participant directory that is a link loop is refused by the path check, not read', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await mkdir(path.dirname(dir), {recursive: true})
    await symlink(dir, dir)
    const err = await stateError(readParticipantState(dir, {within: root}))
    // The error is the path check's own (realpath), not the manifest read's that would follow it.
    expect(err.message).toBe(`cannot read checkpoint state from ${dir}: ELOOP: too many symbolic links encountered, realpath '${dir}'`)
  })
})

describe('reading: a broken token cut by the 1 MiB read chunk, in a scanned line', () => {
  // Line 2 is out of scope (scanned, never held). Its bad byte is found in the first or the
  // second chunk; the line goes on into a later chunk, where a string holds bytes that are not
  // UTF-8. The error named is the first one, where it is found.
  it('a number cut by the chunk and followed by a bad byte is not JSON', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    // Longer than the 256 bytes its episode is read from, so that it is scanned before the cut.
    const start = line('cut', 0, `, "q": "${'q'.repeat(300)}"`).slice(0, -1) + ', "n": 12'
    const first = filler(MiB - start.length)
    // Chunk 1 ends inside the number 12…; chunk 2 is "3x" and padding, up to a quote as its last byte.
    const chunk2 = '3x' + 'y'.repeat(MiB - 3) + '"'
    const records = Buffer.concat([Buffer.from(first + start + chunk2), Buffer.from([0xff, 0xff, 0xff, 0xff]), Buffer.from('"}\n' + line('after') + '\n')])
    expect(Buffer.byteLength(first + start)).toBe(MiB)
    expect(Buffer.byteLength(first + start + chunk2)).toBe(2 * MiB)
    await handWritten(dir, records, 3)
    expect((await stateError(readParticipantState(dir))).message).toMatch(/line 2 holds a record that is not JSON$/)
  })

  it('a bad byte before the chunk ends is not JSON', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const first = filler(1000)
    // Chunk 1 ends with a quote after the bad byte x; chunk 2 starts with bytes that are not UTF-8.
    const start = line('cut', 0, `, "q": "${'q'.repeat(300)}"`).slice(0, -1) + ', "a": x'
    const rest = ' '.repeat(MiB - first.length - start.length - 1) + '"'
    const records = Buffer.concat([Buffer.from(first + start + rest), Buffer.from([0xff, 0xff, 0xff, 0xff]), Buffer.from('": 1}\n' + line('after') + '\n')])
    expect(Buffer.byteLength(first + start + rest)).toBe(MiB)
    await handWritten(dir, records, 3)
    expect((await stateError(readParticipantState(dir))).message).toMatch(/line 2 holds a record that is not JSON$/)
  })
})

describe('reading: a UTF-8 sequence cut by the 1 MiB read chunk, in a scanned line', () => {
  // Line 2 ends (its newline) before the sequence that the chunk cut is complete: not UTF-8.
  for (const [what, tail] of [
    ['the newline the first byte of the next chunk', [0x0a]],
    ['one more byte of it in the next chunk', [0x82, 0x0a]],
  ] as const) {
    it(`a line ending inside a UTF-8 sequence, ${what}, is not UTF-8`, async () => {
      const root = await tempDir()
      const dir = participantDir(root, 'environment', 'env')
      const start = line('cut', 0, `, "q": "${'q'.repeat(300)}"`).slice(0, -1) + ', "s": "'
      const first = filler(MiB - start.length - 1)
      // 0xe2 0x82 0xac is '€': its first byte is the chunk's last.
      const records = Buffer.concat([Buffer.from(first + start), Buffer.from([0xe2, ...tail]), Buffer.from(line('after') + '\n')])
      expect(Buffer.byteLength(first + start) + 1).toBe(MiB)
      await handWritten(dir, records, 3)
      expect((await stateError(readParticipantState(dir))).message).toMatch(/line 2 holds a record that is not UTF-8$/)
    })
  }
})

describe('reading: a number cut by the 1 MiB read chunk, in a scanned line', () => {
  /** Line 2 holds a number of `digits` digits (and what follows it), cut `before` digits in. */
  const cutNumber = (before: number, digits: string, after: string) => {
    const start = line('cut', 0, `, "q": "${'q'.repeat(300)}"`).slice(0, -1) + ', "n": '
    const first = filler(MiB - start.length - before)
    return {first, lineTwo: start + digits + after}
  }

  it('a number that needs more than 64 bytes of the next chunk to end is one token', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const digits = '1' + '2'.repeat(399)
    const {first, lineTwo} = cutNumber(100, digits, ', "m": [3, 4]}')
    const text = first + lineTwo + '\n' + line('after') + '\n'
    expect(text.indexOf(digits) + 100).toBe(MiB)
    await handWritten(dir, text, 3)
    expect((await readParticipantState(dir)).keys).toEqual(['fill', 'cut', 'after'])
    const kept = await readParticipantState(dir, {keep: new Set(['cut'])})
    expect(kept.kept.map((k) => pyDumps(k.record))).toEqual([lineTwo])
  })

  it('a number cut by the chunk whose line ends a few bytes later, followed by more lines', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const {first, lineTwo} = cutNumber(2, '1234', '}')
    const text = first + lineTwo + '\n' + line('b') + '\n' + line('c') + '\n'
    expect(text.indexOf(lineTwo) + lineTwo.length - 3).toBe(MiB)
    await handWritten(dir, text, 4)
    expect((await readParticipantState(dir)).keys).toEqual(['fill', 'cut', 'b', 'c'])
  })

  // The line starts 10 bytes before the chunk ends, so its first 256 bytes are gathered across the
  // boundary and scanned first; the number is cut by the end of those 256 bytes, not of the chunk.
  for (const [what, rest] of [
    ['the rest of its line shorter than 64 bytes', '345'],
    ['more than 64 digits after the first 256 bytes', '3'.repeat(100)],
  ] as const) {
    it(`a number cut by the end of a line's first 256 bytes, ${what}, followed by more lines`, async () => {
      const root = await tempDir()
      const dir = participantDir(root, 'environment', 'env')
      const open = `{"episode_id": {"rollout_id": "cut", "attempt": 0}, "q": "`
      const before = open + 'q'.repeat(256 - 2 - open.length - '", "n": '.length) + '", "n": '
      expect(before.length).toBe(254)
      const lineTwo = before + '12' + rest + '}'
      const text = filler(MiB - 10) + lineTwo + '\n' + line('b') + '\n' + line('c') + '\n'
      await handWritten(dir, text, 4)
      expect((await readParticipantState(dir)).keys).toEqual(['fill', 'cut', 'b', 'c'])
    })
  }

  it('such a number followed by a bad byte is not JSON', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const {first, lineTwo} = cutNumber(100, '1' + '2'.repeat(399), 'x}')
    await handWritten(dir, first + lineTwo + '\n' + line('after') + '\n', 3)
    expect((await stateError(readParticipantState(dir))).message).toMatch(/line 2 holds a record that is not JSON$/)
  })

  it('a number that runs through a whole chunk is one token', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    const digits = '1' + '0'.repeat(MiB + 1000)
    const {first, lineTwo} = cutNumber(100, digits, '}')
    await handWritten(dir, first + lineTwo + '\n' + line('after') + '\n', 3)
    const r = await readParticipantState(dir)
    expect(r.keys).toEqual(['fill', 'cut', 'after'])
    expect(r.bytes).toBe(first.length + lineTwo.length + 1 + line('after').length + 1)
  })
})
