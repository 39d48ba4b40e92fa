import {describe, expect, it} from 'vitest'

import {runDemo} from '../../src/demo/scenario.js'
import {verifyCheckpoint} from '../../src/storage/verify.js'
import {tempDir} from '../helpers/tmp.js'

describe('demo rehearsal', () => {
  it('checkpoint, crash and restore give the results of an uninterrupted run', async () => {
    const root = await tempDir()
    const r = await runDemo({episodes: 12, steps: 6, stepMs: 20, restarts: 2, root})
    expect(r.mismatches).toEqual([])
    expect(r.ok).toBe(true)
    expect(r.restarted).toBe(2)
    expect(r.continued + r.completedAtCheckpoint + r.restarted).toBe(12)
    // The point of partial-rollout checkpoints: episodes continued from mid-episode boundaries.
    expect(r.continuedFromBoundary).toBeGreaterThan(0)
    expect((await verifyCheckpoint(root)).ok).toBe(true)
  })
})
