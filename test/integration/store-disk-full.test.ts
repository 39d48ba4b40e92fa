// A records file is never shorter than the digest it is named for: on a file system that fills up
// in the middle of a write, the kernel writes what fits and returns that count; the rest must be
// written again (and then fail with ENOSPC), not skipped.
import {readdir} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {writeParticipantState} from '../../src/storage/participant-store.js'
import {mountTmpfs} from '../helpers/fault-matrix.js'
import {tempDir} from '../helpers/tmp.js'

const root = process.getuid?.() === 0

describe('writeParticipantState on a file system that fills up mid-write', () => {
  it.skipIf(!root)('a short write is finished or fails: no records file, no manifest, no temp file', async () => {
    const dir = path.join(await tempDir(), 'small')
    const unmount = await mountTmpfs(dir, 'size=256k')
    try {
      // One batch (smaller than the write buffer) larger than the whole file system: the kernel
      // writes the first ~256 KB of it and reports that count without an error.
      const lines = Array.from({length: 30}, (_, i) => `{"episode_id": {"rollout_id": "r${i}", "attempt": 0}, "s": "${'x'.repeat(10_000)}"}`)
      const err = await writeParticipantState({checkpointDir: dir, kind: 'agent', instance: 'a', checkpointId: 'c'}, lines).catch((e: unknown) => e)
      expect(err).toBeInstanceOf(Error)
      expect((err as Error).message).toMatch(/cannot write checkpoint state under .*ENOSPC/)
      expect(await readdir(path.join(dir, 'gym', 'agent', 'a'))).toEqual([])
    } finally {
      unmount()
    }
  })
})
