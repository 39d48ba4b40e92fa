// The small modules' contracts, as their callers see them: error classes and their messages, the
// file helpers' results and what they leave on disk, and the schema helpers (tests of StrykerJS's
// surviving mutants of coordination/errors.ts, storage/errors.ts, storage/fsutil.ts,
// storage/manifest-schemas.ts, protocol/episode-schema.ts and storage/sha256.ts).
import {createHash} from 'node:crypto'
import {mkdir, readFile, readdir, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it, vi} from 'vitest'
import {z} from 'zod'

import {ControllerError, CoordinationError, failureMessage, nextStep} from '../../src/coordination/errors.js'
import {CheckpointStateError, WriteStoppedError} from '../../src/storage/errors.js'
import {createExclusive, mapLimit, probeWritableDir, replaceAtomic, tempName} from '../../src/storage/fsutil.js'
import {describeIssue} from '../../src/storage/manifest-schemas.js'
import {Sha256} from '../../src/storage/sha256.js'
import {mountTmpfs} from '../helpers/fault-matrix.js'
import {tempDir} from '../helpers/tmp.js'

describe('coordination errors', () => {
  it('a controller error carries its code, message and details, no next step and no timings until given', () => {
    const e = new ControllerError('input', 'bad flag', {flag: '--id'})
    expect(e).toBeInstanceOf(Error)
    expect([e.name, e.code, e.message, e.details, e.next, e.timings]).toEqual(['ControllerError', 'input', 'bad flag', {flag: '--id'}, [], null])
    const steps = [nextStep('resume', ['--id', 'x']), nextStep('status', [], false)]
    expect(e.withNext(...steps)).toBe(e)
    expect(e.next).toEqual([
      {command: 'resume', args: ['--id', 'x'], fleet: true},
      {command: 'status', args: [], fleet: false},
    ])
    expect(nextStep('list')).toEqual({command: 'list', args: [], fleet: true})
  })

  it('a failure reads as its message without a status, else as HTTP, code and message on one spaced line', () => {
    expect(failureMessage({server: 's', status: null, code: 'timeout', message: 'no reply within 1.0 seconds'})).toBe('no reply within 1.0 seconds')
    expect(failureMessage({server: 's', status: 409, code: 'stale_checkpoint', message: 'old  one\n'})).toBe('HTTP 409 stale_checkpoint old one')
    expect(failureMessage({server: 's', status: 500, code: null, message: ' boom '})).toBe('HTTP 500 boom')
    expect(failureMessage({server: 's', status: 500, code: null, message: ''})).toBe('HTTP 500')
  })

  it('a coordination error lists every failure by server, with the hint, and takes its code from the operation', () => {
    const fs = [
      {server: 'b', status: 409, code: 'stale_checkpoint', message: 'old'},
      {server: 'a', status: null, code: 'connection', message: 'connection refused'},
    ]
    const e = new CoordinationError('commit', fs, 'nothing was published')
    expect(e).toBeInstanceOf(ControllerError)
    expect(e.name).toBe('CoordinationError')
    expect(e.code).toBe('participant')
    expect(e.operation).toBe('commit')
    expect(e.published).toBeNull()
    expect(e.message).toBe('checkpoint commit failed on 2 participant(s): a: connection refused; b: HTTP 409 stale_checkpoint old. nothing was published')
    expect(e.failures.map((f) => f.server)).toEqual(['a', 'b'])
    expect(e.details).toEqual(e.failures)
    expect(fs.map((f) => f.server)).toEqual(['b', 'a'])
    expect(new CoordinationError('prepare', fs).message).toBe('checkpoint prepare failed on 2 participant(s): a: connection refused; b: HTTP 409 stale_checkpoint old')
    expect(new CoordinationError('discover', fs).code).toBe('discovery')
    expect(new CoordinationError('discover', []).code).toBe('discovery')
    expect(new CoordinationError('resume', []).code).toBe('participant')
  })

  it('is unauthorized only when every failure is', () => {
    const u = {server: 'a', status: 401, code: 'unauthorized', message: 'bad token'}
    expect(new CoordinationError('prepare', [u, {...u, server: 'b'}]).code).toBe('unauthorized')
    expect(new CoordinationError('discover', [u]).code).toBe('unauthorized')
    expect(new CoordinationError('prepare', [u, {server: 'b', status: 409, code: 'invalid_phase', message: ''}]).code).toBe('participant')
  })
})

describe('storage errors', () => {
  it('invalid checkpoint state has Gym code and its own name; a stopped write names what was stopped', () => {
    const e = new CheckpointStateError('records file is short')
    expect([e.name, e.code, e.message]).toEqual(['CheckpointStateError', 'invalid_checkpoint_state', 'records file is short'])
    expect(e).toBeInstanceOf(Error)
    const w = new WriteStoppedError('the records file of agent/a')
    expect(w).toBeInstanceOf(CheckpointStateError)
    expect([w.name, w.code, w.message]).toEqual(['WriteStoppedError', 'invalid_checkpoint_state', 'the records file of agent/a was resumed before its write finished'])
  })
})

describe('file helpers', () => {
  it('a temp name is the base name with a leading dot and 8 random hex digits, next to it', () => {
    const names = Array.from({length: 64}, () => tempName('/x/y', 'LATEST'))
    for (const n of names) expect(n).toMatch(/^\/x\/y\/\.LATEST\.[0-9a-f]{8}$/)
    expect(new Set(names).size).toBeGreaterThan(32)
  })

  it('mapLimit runs at most `limit` at once and gives results in the items order', async () => {
    let running = 0
    let most = 0
    const seen: number[] = []
    const out = await mapLimit([5, 1, 4, 2, 3, 0, 6], 2, async (n) => {
      seen.push(n)
      running++
      most = Math.max(most, running)
      await new Promise((r) => setTimeout(r, n * 3))
      running--
      return n * 10
    })
    expect(out).toEqual([50, 10, 40, 20, 30, 0, 60])
    expect(most).toBe(2)
    expect(seen.sort()).toEqual([0, 1, 2, 3, 4, 5, 6])
    expect(await mapLimit([], 4, () => Promise.resolve(1))).toEqual([])
    const calls: number[] = []
    expect(await mapLimit([7], 8, async (n) => (calls.push(n), n))).toEqual([7])
    expect(calls).toEqual([7])
  })

  it('createExclusive creates a file once, never replaces one, and leaves no temp file', async () => {
    const dir = await tempDir()
    const f = path.join(dir, 'LATEST')
    expect(await createExclusive(f, 'one\n')).toBe(true)
    expect(await createExclusive(f, 'two\n')).toBe(false)
    expect(await readFile(f, 'utf8')).toBe('one\n')
    expect(await readdir(dir)).toEqual(['LATEST'])
    const missing = path.join(dir, 'no', 'such')
    // The write's own error, not that of removing a temp file it never created.
    await expect(createExclusive(missing, 'x')).rejects.toMatchObject({code: 'ENOENT', syscall: 'open'})
    // A link that fails for another reason than an existing name (a trailing slash: the name would
    // have to be a directory) is that failure, not "already there".
    const err = (await createExclusive(path.join(dir, 'other') + '/', 'x').catch((e: unknown) => e)) as NodeJS.ErrnoException
    expect(err).toBeInstanceOf(Error)
    expect(err.code).not.toBe('EEXIST')
    expect(await readdir(dir)).toEqual(['LATEST'])
  })

  it('replaceAtomic replaces a file whole and leaves no temp file, also when it fails', async () => {
    const dir = await tempDir()
    const f = path.join(dir, 'state.json')
    await replaceAtomic(f, 'one')
    await replaceAtomic(f, Buffer.from('two'))
    expect(await readFile(f, 'utf8')).toBe('two')
    expect(await readdir(dir)).toEqual(['state.json'])
    // A non-empty directory of that name cannot be replaced by a file.
    const d = path.join(dir, 'taken')
    await mkdir(d)
    await writeFile(path.join(d, 'x'), 'x')
    await expect(replaceAtomic(d, 'data')).rejects.toMatchObject({code: expect.stringMatching(/^E/)})
    await expect(replaceAtomic(path.join(dir, 'no', 'such'), 'data')).rejects.toMatchObject({code: 'ENOENT', syscall: 'open'})
    expect((await readdir(dir)).sort()).toEqual(['state.json', 'taken'])
  })

  it('probeWritableDir creates a missing directory, leaves it empty, and refuses a file with the real cause', async () => {
    const dir = await tempDir()
    const fresh = path.join(dir, 'a', 'b')
    await probeWritableDir(fresh)
    expect(await readdir(fresh)).toEqual([])
    await probeWritableDir(fresh)
    expect(await readdir(fresh)).toEqual([])
    const file = path.join(dir, 'file')
    await writeFile(file, 'x')
    await expect(probeWritableDir(file)).rejects.toMatchObject({code: 'EEXIST', message: 'it is not a directory'})
    const under = path.join(file, 'sub')
    const err = (await probeWritableDir(under).catch((e: unknown) => e)) as NodeJS.ErrnoException
    expect(err.code).toBe('ENOTDIR')
    expect(err.syscall).toBe('stat')
  })
})

/**
 * fsutil loaded afresh with node:fs/promises' `open` wrapped, so that each sync and close of a file
 * handle it opens is recorded (what it fsyncs is its whole effect, and nothing else shows it).
 */
async function recordingFsutil(): Promise<{fsutil: typeof import('../../src/storage/fsutil.js'); events: string[]}> {
  const fsp = process.getBuiltinModule('node:fs/promises')
  const realOpen = fsp.open
  const events: string[] = []
  fsp.open = (async (...args: Parameters<typeof realOpen>) => {
    const fh = await realOpen(...args)
    const name = String(args[0])
    const sync = fh.sync.bind(fh)
    const close = fh.close.bind(fh)
    fh.sync = () => (events.push(`sync ${name}`), sync())
    fh.close = () => (events.push(`close ${name}`), close())
    return fh
  }) as typeof realOpen
  try {
    vi.resetModules()
    return {fsutil: await import('../../src/storage/fsutil.js'), events}
  } finally {
    fsp.open = realOpen
  }
}

describe('fsync helpers', () => {
  it('fsyncUpTo syncs and closes the directory and each parent up to and including the top, and no further', async () => {
    const {fsutil, events} = await recordingFsutil()
    const top = await tempDir()
    const leaf = path.join(top, 'a', 'b')
    await mkdir(leaf, {recursive: true})
    await fsutil.fsyncUpTo(leaf + path.sep, top)
    const each = (d: string) => [`sync ${d}`, `close ${d}`]
    expect(events.splice(0)).toEqual([...each(leaf), ...each(path.join(top, 'a')), ...each(top)])
    await fsutil.fsyncUpTo(top, top)
    expect(events.splice(0)).toEqual(each(top))
    // A top that does not contain the directory: the directory alone.
    const other = await tempDir()
    await fsutil.fsyncUpTo(leaf, other)
    expect(events.splice(0)).toEqual(each(leaf))
  })

  it('fsyncDir fails for a directory that cannot be opened, and syncs and closes one that can', async () => {
    const {fsutil, events} = await recordingFsutil()
    const top = await tempDir()
    await expect(fsutil.fsyncDir(path.join(top, 'gone'))).rejects.toMatchObject({code: 'ENOENT'})
    expect(events).toEqual([])
    await fsutil.fsyncDir(top)
    expect(events).toEqual([`sync ${top}`, `close ${top}`])
  })

  it('the files the helpers write are synced and closed', async () => {
    const {fsutil, events} = await recordingFsutil()
    const dir = await tempDir()
    const f = path.join(dir, 'LATEST')
    expect(await fsutil.createExclusive(f, 'x')).toBe(true)
    const tmp = events[0]!.slice('sync '.length)
    expect(path.dirname(tmp)).toBe(dir)
    expect(events.splice(0)).toEqual([`sync ${tmp}`, `close ${tmp}`])
    await fsutil.replaceAtomic(f, 'y')
    const tmp2 = events[0]!.slice('sync '.length)
    expect(events.splice(0)).toEqual([`sync ${tmp2}`, `close ${tmp2}`, `sync ${dir}`, `close ${dir}`])
    await fsutil.probeWritableDir(dir)
    expect(events.length).toBe(1)
    expect(events[0]).toMatch(/^close .*\.gymckpt-probe\.[0-9a-f]{8}$/)
  })
})

describe('file helpers on a full file system', () => {
  // Root mounts a small tmpfs (Linux): a write that the open allowed fails part-way with ENOSPC.
  it.skipIf(process.getuid?.() !== 0 || process.platform !== 'linux')('a write that fails after its temp file was created leaves no temp file', async () => {
    const dir = path.join(await tempDir(), 'small')
    const unmount = await mountTmpfs(dir, 'size=64k')
    try {
      const big = Buffer.alloc(1 << 20, 0x61)
      await expect(createExclusive(path.join(dir, 'LATEST'), big)).rejects.toMatchObject({code: 'ENOSPC'})
      expect(await readdir(dir)).toEqual([])
      await writeFile(path.join(dir, 'state.json'), '{}')
      await expect(replaceAtomic(path.join(dir, 'state.json'), big)).rejects.toMatchObject({code: 'ENOSPC'})
      expect(await readdir(dir)).toEqual(['state.json'])
      expect(await readFile(path.join(dir, 'state.json'), 'utf8')).toBe('{}')
    } finally {
      unmount()
    }
  })
})

describe('schema helpers', () => {
  it('describeIssue names the first issue at its path, the root as (root), and no issue as invalid', () => {
    const r = z.object({a: z.object({b: z.string()})}).safeParse({a: {b: 1}})
    expect(r.success).toBe(false)
    expect(describeIssue(r.error!)).toMatch(/^a\.b: \S/)
    const root = z.string().safeParse(1)
    expect(describeIssue(root.error!)).toMatch(/^\(root\): \S/)
    expect(describeIssue(new z.ZodError([]))).toBe('invalid')
  })
})

describe('Sha256', () => {
  it('pads a last block of 55 to 63 bytes over the bytes an earlier block left in its buffer', () => {
    // 10 + 54 bytes fill the block buffer whole; the last update leaves its bytes in the buffer's
    // start, and the buffer's end still holds the second update's bytes: padding must zero them.
    const bytes = (n: number, seed: number) => Uint8Array.from({length: n}, (_, i) => (i * 31 + seed) % 251 || 1)
    for (let tail = 55; tail < 64; tail++) {
      const parts = [bytes(10, 1), bytes(54, 2), bytes(tail, 3)]
      const h = new Sha256()
      const want = createHash('sha256')
      for (const p of parts) {
        h.update(p)
        want.update(p)
      }
      expect(h.digest('hex'), `last block of ${tail} bytes`).toBe(want.digest('hex'))
    }
  })
})
