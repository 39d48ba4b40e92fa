// The JavaScript SHA-256 that reads small records files without loading node:crypto
// (src/storage/sha256.ts): it must give node:crypto's digest for every input, however it is fed.
import {createHash, randomBytes} from 'node:crypto'

import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {JS_HASH_BUDGET, Sha256, sha256Hasher} from '../../src/storage/sha256.js'

const node = (b: Uint8Array) => createHash('sha256').update(b).digest('hex')

describe('Sha256', () => {
  it('gives the FIPS 180-4 example digests', () => {
    expect(new Sha256().digest('hex')).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855')
    expect(new Sha256().update(Buffer.from('abc')).digest('hex')).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad')
    expect(new Sha256().update(Buffer.from('abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq')).digest('hex')).toBe('248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1')
  })

  it("equals node:crypto for every length across the padding's block boundaries", () => {
    // 55 is the longest message whose length fits in its last block; 56 to 63 need another block.
    for (let n = 0; n <= 300; n++) {
      const b = randomBytes(n)
      expect(new Sha256().update(b).digest('hex'), `length ${n}`).toBe(node(b))
    }
  })

  it('equals node:crypto however the input is split into updates', () => {
    fc.assert(
      fc.property(fc.uint8Array({maxLength: 2000}), fc.array(fc.nat(2000), {maxLength: 8}), (data, cuts) => {
        const h = new Sha256()
        let at = 0
        for (const cut of [...new Set(cuts)].sort((a, b) => a - b).filter((c) => c <= data.length)) {
          h.update(data.subarray(at, cut))
          at = cut
        }
        h.update(data.subarray(at))
        return h.digest('hex') === node(data)
      }),
      {numRuns: 300},
    )
  })

  it('equals node:crypto on a multi-megabyte input fed in uneven chunks, and on views into larger buffers', () => {
    const big = randomBytes(3 * 1024 * 1024 + 17)
    const h = new Sha256()
    for (let i = 0; i < big.length; i += 65_537) h.update(big.subarray(i, i + 65_537))
    expect(h.digest('hex')).toBe(node(big))
    const view = new Uint8Array(big.buffer, big.byteOffset + 3, 1000)
    expect(new Sha256().update(view).digest('hex')).toBe(node(view))
  })

  it('refuses use after its digest, as node:crypto does', () => {
    const h = new Sha256().update(Buffer.from('x'))
    h.digest('hex')
    expect(() => h.update(Buffer.from('y'))).toThrow(/after digest/)
    expect(() => h.digest('hex')).toThrow(/twice/)
  })
})

describe('sha256Hasher', () => {
  it('hashes in JavaScript within the budget, then with node:crypto for good; both give the same digest', async () => {
    // This file's module instance is its own (vitest isolates test files): the budget is untouched.
    const small = await sha256Hasher(1000)
    expect(small).toBeInstanceOf(Sha256)
    const rest = await sha256Hasher(JS_HASH_BUDGET - 1000)
    expect(rest).toBeInstanceOf(Sha256)
    // The budget is spent: the next hasher, however small its input, is node:crypto's.
    const after = await sha256Hasher(1)
    expect(after).not.toBeInstanceOf(Sha256)
    const data = randomBytes(5000)
    small.update(data)
    after.update(data)
    expect(small.digest('hex')).toBe(after.digest('hex'))
    expect(await sha256Hasher(0)).not.toBeInstanceOf(Sha256)
  })
})
