import {describe, expect, it} from 'vitest'

import {RolloutMap} from '../../src/control-plane/util.js'

describe('RolloutMap (the doubles index their episodes by rollout for retire)', () => {
  it('finds every key of a rollout, through sets, overwrites, deletes and clear', () => {
    const m = new RolloutMap<number>()
    m.set('r1', 1).set('r1-a2', 2).set('r2', 3).set('r1-a2', 4).set('r10-a1', 5)
    expect(m.size).toBe(4)
    expect(m.keysOf('r1').sort()).toEqual(['r1', 'r1-a2'])
    expect(m.keysOf('r10')).toEqual(['r10-a1'])
    expect(m.keysOf('none')).toEqual([])
    expect(m.get('r1-a2')).toBe(4)
    // A copy: deleting while reading it skips nothing.
    for (const k of m.keysOf('r1')) expect(m.delete(k)).toBe(true)
    expect(m.keysOf('r1')).toEqual([])
    expect(m.delete('r1')).toBe(false)
    expect([...m.keys()].sort()).toEqual(['r10-a1', 'r2'])
    m.clear()
    expect(m.keysOf('r2')).toEqual([])
    expect(m.size).toBe(0)
    m.set('r2-a1', 6)
    expect(m.keysOf('r2')).toEqual(['r2-a1'])
  })
})
