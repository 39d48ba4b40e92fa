// The double's deadline race (src/control-plane/util.ts): a deadline further away than a timer can
// hold (2^31 - 1 ms, ~24.8 days) must not fire at once, as Node fires such a timer after 1 ms.
import {describe, expect, it} from 'vitest'

import {raceDeadline} from '../../src/control-plane/util.js'

describe('raceDeadline', () => {
  it('a deadline 30 days away waits for the work', async () => {
    const work = new Promise<string>((r) => setTimeout(() => r('done'), 50))
    expect(await raceDeadline(work, Date.now() + 30 * 86_400_000)).toEqual({value: 'done'})
  })

  it('a near deadline still wins over slower work, and a passed one at once', async () => {
    const slow = new Promise<string>((r) => setTimeout(() => r('late'), 500))
    expect(await raceDeadline(slow, Date.now() + 20)).toBe('timeout')
    expect(await raceDeadline(Promise.resolve('x'), Date.now() - 1)).toBe('timeout')
  })

  it('work that fails after its deadline passed is no unhandled rejection', async () => {
    const unhandled: unknown[] = []
    const seen = (reason: unknown) => unhandled.push(reason)
    process.on('unhandledRejection', seen)
    try {
      for (const deadline of [Date.now() - 1, Date.now() + 5]) {
        const failing = new Promise<string>((_, reject) => setTimeout(() => reject(new Error('read failed late')), 20))
        expect(await raceDeadline(failing, deadline)).toBe('timeout')
      }
      await new Promise((r) => setTimeout(r, 60))
      expect(unhandled).toEqual([])
    } finally {
      process.off('unhandledRejection', seen)
    }
  })
})
