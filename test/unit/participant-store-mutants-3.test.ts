// More rules of the participant store (src/storage/participant-store.ts), written against the
// survivors of its mutation run of 2026-12-04 that had been listed as equivalent (issue 12): a line
// out of the kept scope is scanned (streamed, never held) whenever its episode is at its start,
// also when its first 256 bytes are cut by the 1 MiB read chunk or name episode_id again. Only
// memory shows that directly; what the tests see is the error named for a line with two faults,
// a byte that is not JSON and, later, bytes that are not UTF-8: the scanner names the first one
// where it finds it ("not JSON"), a held line is decoded whole and checked for UTF-8 first.
// Also a write of the records file that makes no progress (which a regular file on Linux does not
// do: the system call is made to, through the file handle's prototype).
import {open, readdir, readFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {participantDir, readParticipantState, writeParticipantState} from '../../src/storage/participant-store.js'
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

/** Line 2 of episode `two`: `before`, a bad byte x, then a string holding bytes that are not UTF-8. */
const twoFaults = (before: string) => Buffer.concat([Buffer.from(`{"episode_id": {"rollout_id": "two", "attempt": 0}${before}, "a": x, "s": "`), Buffer.from([0xff, 0xfe]), Buffer.from('"}')])

/** Reads `dir` with nothing kept and with episode `two` kept: the messages of both reads. */
const bothWays = async (dir: string) => [(await stateError(readParticipantState(dir))).message, (await stateError(readParticipantState(dir, {keep: new Set(['two'])}))).message]

describe('reading: a line out of the kept scope is scanned, not held', () => {
  it('a line within one chunk: scanned, its first fault is named; kept, it is decoded whole', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await handWritten(dir, Buffer.concat([Buffer.from(line('one') + '\n'), twoFaults(''), Buffer.from('\n' + line('three') + '\n')]), 3)
    const [scanned, kept] = await bothWays(dir)
    expect(scanned).toMatch(/line 2 holds a record that is not JSON$/)
    expect(kept).toMatch(/line 2 holds a record that is not UTF-8$/)
  })

  it('a line that names episode_id again in its first 256 bytes is still scanned (the repeat is checked as it streams)', async () => {
    const root = await tempDir()
    const dir = participantDir(root, 'environment', 'env')
    await handWritten(dir, Buffer.concat([Buffer.from(line('one') + '\n'), twoFaults(', "t": "episode_id"'), Buffer.from('\n')]), 2)
    const [scanned, kept] = await bothWays(dir)
    expect(scanned).toMatch(/line 2 holds a record that is not JSON$/)
    expect(kept).toMatch(/line 2 holds a record that is not UTF-8$/)
  })

  // The line starts `cut` bytes before the first chunk ends, inside its episode prefix (51 bytes):
  // its first 256 bytes are gathered across the boundary before its episode is read off them.
  for (const cut of [10, 40]) {
    for (const [what, before] of [
      ['shorter than 256 bytes', ''],
      ['longer than 256 bytes', `, "q": "${'q'.repeat(300)}"`],
    ] as const) {
      it(`a line ${what} whose start is cut by the read chunk ${cut} bytes in is scanned too`, async () => {
        const root = await tempDir()
        const dir = participantDir(root, 'environment', 'env')
        const records = Buffer.concat([Buffer.from(filler(MiB - cut)), twoFaults(before), Buffer.from('\n' + line('three') + '\n')])
        await handWritten(dir, records, 3)
        const [scanned, kept] = await bothWays(dir)
        expect(scanned).toMatch(/line 2 holds a record that is not JSON$/)
        expect(kept).toMatch(/line 2 holds a record that is not UTF-8$/)
      })
    }
  }
})

describe('reading: a scanned line whose start is cut by the read chunk and which ends in its first 256 bytes', () => {
  // The gathered head is the whole line: it is scanned as the line's end, so a UTF-8 sequence
  // that the line's end cuts is named as such, as in a line that no chunk cuts.
  for (const cut of [10, 60]) {
    it(`a line ending inside a UTF-8 sequence, cut by the chunk ${cut} bytes in, is not UTF-8`, async () => {
      const root = await tempDir()
      const dir = participantDir(root, 'environment', 'env')
      const lineTwo = Buffer.concat([Buffer.from(`{"episode_id": {"rollout_id": "two", "attempt": 0}, "s": "ab`), Buffer.from([0xe2, 0x82])])
      expect(lineTwo.length).toBeLessThan(256)
      const records = Buffer.concat([Buffer.from(filler(MiB - cut)), lineTwo, Buffer.from('\n' + line('three') + '\n')])
      await handWritten(dir, records, 3)
      expect((await stateError(readParticipantState(dir))).message).toMatch(/line 2 holds a record that is not UTF-8$/)
    })
  }
})

type Write = (this: unknown, b: unknown, off: number, len: number, at: number) => Promise<{bytesWritten: number; buffer?: unknown}>

/**
 * Runs `fn` with every FileHandle's write replaced by `patched` (given the real one and the call's
 * number, from 1), restored after; the prototype is reached through a handle opened under `dir`.
 */
async function withWrite<T>(dir: string, patched: (real: Write, call: number) => Write, fn: () => Promise<T>): Promise<T> {
  const probe = await open(path.join(dir, 'probe'), 'w')
  const proto = Object.getPrototypeOf(probe) as {write: Write}
  await probe.close()
  const real = proto.write
  let calls = 0
  proto.write = function (this: unknown, ...args: Parameters<Write>) {
    return patched(real, ++calls).apply(this, args)
  }
  try {
    return await fn()
  } finally {
    proto.write = real
  }
}

describe('writing: a write of the records file that makes no progress', () => {
  it('is an error naming the temp file and the byte it stopped at, and leaves no file behind', async () => {
    const root = await tempDir()
    let calls = 0
    // The first write takes 5 bytes, every later one none; a writer that asks again and again
    // (instead of failing) is stopped after 100 asks.
    const err = await withWrite(
      root,
      (real, call) =>
        async function (this: unknown, b, off, len, at) {
          calls = call
          if (call === 1) return real.call(this, b, off, Math.min(len, 5), at)
          if (call > 100) throw new Error('asked 100 times')
          return {bytesWritten: 0, buffer: b}
        },
      () => stateError(writeParticipantState({checkpointDir: root, kind: 'environment', instance: 'env', checkpointId: 'c1'}, [line('a'), line('b')])),
    )
    const dir = participantDir(root, 'environment', 'env')
    const tmp = `${dir}${path.sep}.records.jsonl.`
    expect(err.message.slice(0, `cannot write checkpoint state under ${root}: writing ${tmp}`.length)).toBe(`cannot write checkpoint state under ${root}: writing ${tmp}`)
    expect(err.message).toMatch(/\.records\.jsonl\.[0-9a-f]{8} made no progress at byte 5$/)
    expect(calls).toBe(2)
    expect(await readdir(dir)).toEqual([])
  })
})

describe('writing: a batch is not refilled while its write is in flight', () => {
  it('a slow first write (the system call made late, through the prototype) leaves the file as hashed', async () => {
    const root = await tempDir()
    let calls = 0
    // The first write reaches the disk 50 ms late: a writer that refills that batch meanwhile
    // (two batches of 1 MiB, ~3 MiB of lines) writes the refilled bytes under the old digest.
    const lines = Array.from({length: 30}, (_, i) => line(`r${i}`, 0, `, "p": "${String.fromCharCode(97 + (i % 26)).repeat(100_000)}"`))
    await withWrite(
      root,
      (real, call) =>
        async function (this: unknown, b, off, len, at) {
          calls = call
          if (call === 1) await new Promise((r) => setTimeout(r, 50))
          return real.call(this, b, off, len, at)
        },
      () => writeParticipantState({checkpointDir: root, kind: 'environment', instance: 'env', checkpointId: 'c1'}, lines),
    )
    expect(calls).toBeGreaterThanOrEqual(3)
    const dir = participantDir(root, 'environment', 'env')
    const got = await readParticipantState(dir)
    expect(got.keys).toHaveLength(30)
    const [file] = (await readdir(dir)).filter((f) => f.startsWith('records'))
    expect(await readFile(path.join(dir, file!), 'utf8')).toBe(lines.join('\n') + '\n')
  })
})
