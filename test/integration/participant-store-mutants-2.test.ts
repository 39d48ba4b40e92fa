// Writing participant state on a small tmpfs (src/storage/participant-store.ts, issue 12), against
// survivors of its mutation run of 2026-12-04: a temp file that cannot be created is named with
// the participant directory, the rest of a short write is asked for (so a full disk is ENOSPC, not
// an out-of-range length), and a write that fails while the source is awaited raises no unhandled
// rejection. Mounting needs root, as in store-disk-full.test.ts.
import {readdir} from 'node:fs/promises'
import path from 'node:path'
import {setTimeout as sleep} from 'node:timers/promises'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {participantDir, writeParticipantState} from '../../src/storage/participant-store.js'
import {mountTmpfs} from '../helpers/fault-matrix.js'
import {rejection} from '../helpers/errors.js'
import {tempDir} from '../helpers/tmp.js'

const root = process.getuid?.() === 0
const line = (r: string, size: number) => `{"episode_id": {"rollout_id": "${r}", "attempt": 0}, "s": "${'x'.repeat(size)}"}`

/** Runs `fn` on a new tmpfs mounted with `options`, unmounted after. */
async function onTmpfs<T>(options: string, fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = path.join(await tempDir(), 'small')
  const unmount = await mountTmpfs(dir, options)
  try {
    return await fn(dir)
  } finally {
    unmount()
  }
}

describe.skipIf(!root)('writeParticipantState on a small tmpfs', () => {
  it('a temp file that cannot be created (no inode left) is an error naming the participant directory', async () => {
    // The root and the three directories gym/agent/a take the four inodes.
    await onTmpfs('size=256k,nr_inodes=4', async (ck) => {
      const err = await rejection(writeParticipantState({checkpointDir: ck, kind: 'agent', instance: 'a', checkpointId: 'c'}, [line('r', 10)]), CheckpointStateError)
      const prefix = `cannot write checkpoint state under ${participantDir(ck, 'agent', 'a')}: ENOSPC`
      expect(err.message.slice(0, prefix.length)).toBe(prefix)
    })
  })

  it('a batch cut short by a full disk is written on from where it stopped: the error is ENOSPC', async () => {
    // One batch of ~900 KB (under the 1 MiB write buffer) on a 512 KB file system: the first write
    // is short; asking for more than the rest of the batch would be a length out of range instead.
    await onTmpfs('size=512k', async (ck) => {
      const lines = Array.from({length: 90}, (_, i) => line(`r${i}`, 10_000))
      const err = await rejection(writeParticipantState({checkpointDir: ck, kind: 'agent', instance: 'a', checkpointId: 'c'}, lines), CheckpointStateError)
      expect(err.message).toMatch(/^cannot write checkpoint state under .*ENOSPC/)
      expect(await readdir(path.join(ck, 'gym', 'agent', 'a'))).toEqual([])
    })
  })

  it('a write that fails while the next records are awaited raises no unhandled rejection', async () => {
    await onTmpfs('size=256k', async (ck) => {
      const unhandled: unknown[] = []
      const onUnhandled = (reason: unknown) => unhandled.push(reason)
      process.on('unhandledRejection', onUnhandled)
      try {
        // 110 lines of ~10 KB fill the first 1 MiB batch, whose write fails (the disk is 256 KB)
        // while the source waits before its next line.
        async function* slow() {
          for (let i = 0; i < 120; i++) {
            if (i >= 100) await sleep(20)
            yield line(`r${i}`, 10_000)
          }
        }
        const err = await rejection(writeParticipantState({checkpointDir: ck, kind: 'agent', instance: 'a', checkpointId: 'c'}, slow()), CheckpointStateError)
        expect(err.message).toMatch(/ENOSPC/)
        await sleep(50)
      } finally {
        process.off('unhandledRejection', onUnhandled)
      }
      expect(unhandled).toEqual([])
    })
  })
})
