// Restore's big records files are hashed in a worker thread (src/storage/sha256.ts ThreadHasher):
// the same digest as node:crypto however the file is chunked, chunks handed over (not copied),
// and a worker that dies fails the read instead of hanging it.
import {createHash, randomBytes} from 'node:crypto'
import {writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {readParticipantState, writeParticipantState} from '../../src/storage/participant-store.js'
import {ThreadHasher} from '../../src/storage/sha256.js'
import {rejection} from '../helpers/errors.js'
import {tempDir} from '../helpers/tmp.js'

describe('ThreadHasher', () => {
  it("gives node:crypto's digest over many chunks, more than it lets wait at once", async () => {
    const h = await ThreadHasher.start()
    const all = createHash('sha256')
    try {
      for (let i = 0; i < 40; i++) {
        const chunk = randomBytes(1000 + i * 37)
        all.update(chunk)
        // A buffer of its own, larger than the bytes given: only `length` bytes count.
        const ab = new ArrayBuffer(chunk.length + 5)
        new Uint8Array(ab).set(chunk)
        await h.update(ab, chunk.length)
        // Handed over: this thread's view of it is gone.
        expect(ab.byteLength).toBe(0)
      }
      expect(await h.digest()).toBe(all.digest('hex'))
    } finally {
      await h.close()
    }
  })

  it('the digest of nothing', async () => {
    const h = await ThreadHasher.start()
    try {
      expect(await h.digest()).toBe(createHash('sha256').digest('hex'))
    } finally {
      await h.close()
    }
  })

  it('a worker that is gone fails the next update, not hangs it', async () => {
    const h = await ThreadHasher.start()
    await (h as unknown as {worker: {terminate(): Promise<number>}}).worker.terminate()
    await new Promise((r) => setTimeout(r, 20))
    expect((await rejection(h.update(new ArrayBuffer(8), 8), Error)).message).toMatch(/hashing thread exited/)
    await h.close()
  })
})

describe('readParticipantState hashing in a thread', () => {
  async function state(records: number) {
    const dir = await tempDir()
    function* lines() {
      for (let i = 0; i < records; i++) yield JSON.stringify({episode_id: {rollout_id: `r${i}`, attempt: 0}, pad: 'x'.repeat(3000 + (i % 7) * 1000)})
    }
    const m = await writeParticipantState({checkpointDir: dir, kind: 'agent', instance: 'a', checkpointId: 'c1'}, lines())
    return {dir: path.join(dir, 'gym', 'agent', 'a'), m}
  }

  it('reads the same as hashing inline, across many read chunks (a file of several MiB)', async () => {
    const {dir, m} = await state(1200)
    const keep = new Set(['r1', 'r600', 'r1199'])
    const inline = await readParticipantState(dir, {keep, hashThread: false})
    const threaded = await readParticipantState(dir, {keep, hashThread: true, hashThreadMinBytes: 0})
    expect(threaded.bytes).toBeGreaterThan(3 << 20)
    expect(threaded.manifest.records_sha256).toBe(m.records_sha256)
    expect(threaded.keys).toEqual(inline.keys)
    expect(threaded.kept.map((k) => k.key)).toEqual(['r1', 'r600', 'r1199'])
    expect(threaded.kept.map((k) => k.record)).toEqual(inline.kept.map((k) => k.record))
  })

  it('a changed byte is still a digest mismatch', async () => {
    const {dir, m} = await state(50)
    const file = path.join(dir, m.records_file)
    const {readFile} = await import('node:fs/promises')
    const text = await readFile(file, 'utf8')
    await writeFile(file, text.replace('"r7"', '"r8"'))
    const err = await rejection(readParticipantState(dir, {keep: new Set(), hashThread: true, hashThreadMinBytes: 0}), Error)
    expect(err.message).toMatch(/does not match its manifest digest/)
  })
})
