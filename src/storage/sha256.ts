/**
 * SHA-256 for reading records files. Loading node:crypto costs ~10 ms (Node compiles twenty
 * crypto builtins on first use), a quarter of a process start, and more than hashing a small
 * checkpoint in JavaScript takes; so a short command (verify of a small checkpoint) hashes its
 * first bytes here, and everything past that budget goes to node:crypto (OpenSSL, several times
 * faster per byte). Both give the same digest (test/unit/sha256.test.ts holds this one to
 * node:crypto over all lengths and split points).
 */

/** What reading a records file needs of a hash: node:crypto's Hash satisfies it. */
export interface Hasher {
  update(data: Uint8Array): unknown
  digest(encoding: 'hex'): string
}

/** Bytes a process hashes in JavaScript before it loads node:crypto (~2.5 ms at ~100 MB/s). */
export const JS_HASH_BUDGET = 256 * 1024

let budget = JS_HASH_BUDGET
let nodeCrypto: Promise<typeof import('node:crypto')> | undefined

/** node:crypto, loaded once, on first need. */
export function loadCrypto(): Promise<typeof import('node:crypto')> {
  return (nodeCrypto ??= import('node:crypto'))
}

/**
 * A SHA-256 hasher for `size` bytes: JavaScript while this process's budget lasts and node:crypto
 * is not loaded yet, node:crypto otherwise. `size` only chooses; any amount may be fed.
 */
export async function sha256Hasher(size: number): Promise<Hasher> {
  if (nodeCrypto === undefined && size <= budget) {
    budget -= size
    return new Sha256()
  }
  return (await loadCrypto()).createHash('sha256')
}

// The first 32 bits of the fractional parts of the square roots of the first 8 primes (initial
// state) and of the cube roots of the first 64 primes (round constants), FIPS 180-4 section 4.2.2.
// Written out, not computed: computing them cost a cold start ~1 ms of interpreted code.
const H0 = Int32Array.from([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19])
const K = Int32Array.from([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
])

/** FIPS 180-4 SHA-256, streaming. Int32 arithmetic throughout (`| 0`): the JIT keeps it in registers. */
export class Sha256 implements Hasher {
  private readonly h = Int32Array.from(H0)
  private readonly w = new Int32Array(64)
  private readonly block = new Uint8Array(64)
  private filled = 0
  private length = 0
  private finished = false

  update(data: Uint8Array): this {
    if (this.finished) throw new Error('Sha256: update after digest')
    let i = 0
    const n = data.length
    this.length += n
    if (this.filled > 0) {
      const take = Math.min(64 - this.filled, n)
      this.block.set(data.subarray(0, take), this.filled)
      this.filled += take
      i = take
      if (this.filled < 64) return this
      this.compress(this.block, 0)
      this.filled = 0
    }
    for (; i + 64 <= n; i += 64) this.compress(data, i)
    if (i < n) {
      this.block.set(data.subarray(i), 0)
      this.filled = n - i
    }
    return this
  }

  digest(_encoding: 'hex' = 'hex'): string {
    if (this.finished) throw new Error('Sha256: digest called twice')
    this.finished = true
    const b = this.block
    // Padding: 0x80, zeros to 56 bytes mod 64, then the length in bits as a 64-bit big-endian.
    b[this.filled++] = 0x80
    if (this.filled > 56) {
      b.fill(0, this.filled)
      this.compress(b, 0)
      this.filled = 0
    }
    b.fill(0, this.filled, 56)
    const hi = Math.floor(this.length / 0x20000000)
    const lo = (this.length % 0x20000000) * 8
    for (let k = 0; k < 4; k++) {
      b[56 + k] = hi >>> (24 - 8 * k)
      b[60 + k] = lo >>> (24 - 8 * k)
    }
    this.compress(b, 0)
    let hex = ''
    for (const word of this.h) hex += (word >>> 0).toString(16).padStart(8, '0')
    return hex
  }

  private compress(d: Uint8Array, o: number): void {
    const w = this.w
    for (let t = 0; t < 16; t++, o += 4) w[t] = (d[o]! << 24) | (d[o + 1]! << 16) | (d[o + 2]! << 8) | d[o + 3]!
    for (let t = 16; t < 64; t++) {
      const x = w[t - 15]!
      const y = w[t - 2]!
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3)
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10)
      w[t] = (w[t - 16]! + s0 + w[t - 7]! + s1) | 0
    }
    const h = this.h
    let a = h[0]!
    let b = h[1]!
    let c = h[2]!
    let dd = h[3]!
    let e = h[4]!
    let f = h[5]!
    let g = h[6]!
    let hh = h[7]!
    for (let t = 0; t < 64; t++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7))
      const t1 = (hh + S1 + ((e & f) ^ (~e & g)) + K[t]! + w[t]!) | 0
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10))
      const t2 = (S0 + ((a & b) ^ (a & c) ^ (b & c))) | 0
      hh = g
      g = f
      f = e
      e = (dd + t1) | 0
      dd = c
      c = b
      b = a
      a = (t1 + t2) | 0
    }
    h[0] = (h[0]! + a) | 0
    h[1] = (h[1]! + b) | 0
    h[2] = (h[2]! + c) | 0
    h[3] = (h[3]! + dd) | 0
    h[4] = (h[4]! + e) | 0
    h[5] = (h[5]! + f) | 0
    h[6] = (h[6]! + g) | 0
    h[7] = (h[7]! + hh) | 0
  }
}
