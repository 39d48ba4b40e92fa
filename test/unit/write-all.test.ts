// verify's fast path writes its output straight to fds 1 and 2 (cli/output.ts writeAll): every
// byte is written however the writes split, and a descriptor that would block hands the rest,
// whole, to the stream.
import {describe, expect, it} from 'vitest'

import {writeAll} from '../../src/cli/output.js'

describe('writeAll', () => {
  it('writes every byte when the system takes them a few at a time', () => {
    const got: number[] = []
    const sync = (_fd: number, b: Buffer, off: number) => {
      const n = Math.min(3, b.length - off)
      got.push(...b.subarray(off, off + n))
      return n
    }
    const bytes = Buffer.from('valid: ckpt-1 — ünïcödé 😀\n')
    expect(writeAll(1, bytes, sync, () => expect.unreachable())).toBe(true)
    expect(Buffer.from(got).toString()).toBe(bytes.toString())
  })

  it('on EAGAIN hands the unwritten bytes (even mid-character) to the stream and says to stop', () => {
    const bytes = Buffer.from('abc😀def')
    let calls = 0
    const sync = (fd: number) => {
      expect(fd).toBe(2)
      if (calls++ === 0) return 5 // 'abc' and half of the emoji
      throw Object.assign(new Error('EAGAIN: resource temporarily unavailable, write'), {code: 'EAGAIN'})
    }
    let rest: Buffer | undefined
    expect(writeAll(2, bytes, sync, (r) => (rest = r))).toBe(false)
    expect(Buffer.concat([bytes.subarray(0, 5), rest!]).toString()).toBe('abc😀def')
    expect(rest!.length).toBe(bytes.length - 5)
  })

  it('throws any other error (EPIPE: the reader went away) without touching the stream', () => {
    const sync = () => {
      throw Object.assign(new Error('EPIPE: broken pipe, write'), {code: 'EPIPE'})
    }
    expect(() => writeAll(1, Buffer.from('x'), sync, () => expect.unreachable())).toThrow(/EPIPE/)
  })
})
