import {describe, expect, it} from 'vitest'

import {ControlPlane} from '../../src/control-plane/control-plane.js'
import {SimDownstream} from '../../src/control-plane/sim.js'

const soon = () => Date.now() / 1000 + 10

describe('ControlPlane fence', () => {
  it('remembers the last 64 resumed IDs, oldest evicted first', async () => {
    const p = new SimDownstream('model', 'm')
    const cp = new ControlPlane(p, {resumedIdsKept: 64})
    p.attach(cp)
    for (let i = 0; i < 65; i++) await cp.resume({checkpoint_id: `c${i}`, deadline_ts: soon()})
    // c0 fell out of the window; c1..c64 are still refused.
    await expect(cp.prepare({checkpoint_id: 'c1', deadline_ts: soon()})).rejects.toMatchObject({code: 'stale_checkpoint'})
    await expect(cp.prepare({checkpoint_id: 'c64', deadline_ts: soon()})).rejects.toMatchObject({code: 'stale_checkpoint'})
    expect((await cp.prepare({checkpoint_id: 'c0', deadline_ts: soon()})).phase).toBe('prepared')
    cp.close()
  })

  it('a resume that finds restored state still being deleted keeps the phase and succeeds when retried', async () => {
    const p = new SimDownstream('model', 'm')
    const cp = new ControlPlane(p, {})
    p.attach(cp)
    let release!: () => void
    let called!: () => void
    const deleting = new Promise<void>((r) => (called = r))
    p.deleteRestored = () => {
      called()
      return new Promise<void>((r) => (release = r))
    }
    p.sessions.set('x-a1', {ep: {rolloutId: 'x', attempt: 1}, chain: 'c', calls: 0, restart: false, restored: true})
    await cp.prepare({checkpoint_id: 'c', deadline_ts: soon()})
    const dir = (await import('node:os')).tmpdir() + `/gymckpt-cp-${process.pid}-${Date.now()}`
    // A deadline long enough to reach the deletion even on a loaded machine, where it then hangs.
    const commit = cp.commit({checkpoint_id: 'c', deadline_ts: Date.now() / 1000 + 3, checkpoint_dir: dir, episode_ids: []})
    await deleting
    await expect(commit).rejects.toMatchObject({code: 'deadline_exceeded'})
    await expect(cp.resume({checkpoint_id: 'c', deadline_ts: Date.now() / 1000 + 0.1})).rejects.toMatchObject({code: 'deadline_exceeded'})
    expect(cp.phase).toBe('prepared')
    release()
    expect(await cp.resume({checkpoint_id: 'c', deadline_ts: soon()})).toEqual({phase: 'idle', idempotent: false})
    await (await import('node:fs/promises')).rm(dir, {recursive: true, force: true})
    cp.close()
  })
})
