// The restore log (src/storage/restore-log.ts), pinned down for the mutants the catalog tests leave
// alive: the entry schema's edges, exact error messages, which lines a read skips, and the file
// handles an append syncs (counted through the file handle's prototype, the only place in process
// where a missing fsync shows) and closes (none left open under the root, per /proc/self/fd).
import {appendFile, mkdir, open, readFile, readdir, readlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {afterEach, describe, expect, it} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {RESTORE_LOG, RestoreLogEntry, appendRestoreLog, readRestoreLog} from '../../src/storage/restore-log.js'
import {rejection} from '../helpers/errors.js'
import {tempDir} from '../helpers/tmp.js'

function entry(over: Partial<RestoreLogEntry> = {}): RestoreLogEntry {
  return {restore_id: 'restore-1', time: '2026-12-02T17:19:23.000Z', checkpoint_id: 'ck', checkpoint_dir: '/r/ck', outcome: 'restored', error: null, participants: 4, ...over}
}

type Method = (this: unknown, ...args: unknown[]) => Promise<unknown>
type Proto = Record<'sync' | 'write', Method>

/** The files and directories under `dir` this process holds open (from /proc/self/fd). */
async function openUnder(dir: string): Promise<string[]> {
  const out: string[] = []
  for (const fd of await readdir('/proc/self/fd')) {
    const target = await readlink(`/proc/self/fd/${fd}`).catch(() => '')
    if (target === dir || target.startsWith(dir + path.sep)) out.push(target)
  }
  return out
}

/** FileHandle.prototype, and the originals of the methods a test replaces. */
let proto: Proto | undefined
const saved: Partial<Proto> = {}

async function fileHandleProto(): Promise<Proto> {
  if (!proto) {
    const dir = await tempDir()
    const probe = await open(path.join(dir, 'probe'), 'w')
    proto = Object.getPrototypeOf(probe) as Proto
    await probe.close()
  }
  return proto
}

/** Counts the calls of FileHandle's sync until the test ends (close is an own property of each handle). */
async function countSyncs(): Promise<{sync: number}> {
  const p = await fileHandleProto()
  const n = {sync: 0}
  for (const m of ['sync'] as const) {
    const orig = (saved[m] ??= p[m])
    p[m] = function (this: unknown, ...args: unknown[]) {
      n[m]++
      return orig.apply(this, args)
    }
  }
  return n
}

afterEach(() => {
  if (!proto) return
  for (const m of ['sync', 'write'] as const) {
    if (saved[m]) proto[m] = saved[m]
    delete saved[m]
  }
})

describe('appendRestoreLog', () => {
  it('a new log: one line, the file synced and closed, then the root synced (its handle closed too)', async () => {
    const root = await tempDir()
    const n = await countSyncs()
    await appendRestoreLog(root, entry())
    expect(n).toEqual({sync: 2})
    expect(await openUnder(root)).toEqual([])
    expect(await readFile(path.join(root, RESTORE_LOG), 'utf8')).toBe(JSON.stringify(entry()) + '\n')
  })

  it('an existing log: the file synced, not the root; the handle that read its last byte closed', async () => {
    const root = await tempDir()
    await appendRestoreLog(root, entry())
    const n = await countSyncs()
    await appendRestoreLog(root, entry({restore_id: 'restore-2'}))
    expect(n).toEqual({sync: 1})
    expect(await openUnder(root)).toEqual([])
  })

  it('an existing empty log: no torn line to end, nothing read', async () => {
    const root = await tempDir()
    await writeFile(path.join(root, RESTORE_LOG), '')
    const n = await countSyncs()
    await appendRestoreLog(root, entry())
    expect(n).toEqual({sync: 1})
    expect(await openUnder(root)).toEqual([])
    expect(await readFile(path.join(root, RESTORE_LOG), 'utf8')).toBe(JSON.stringify(entry()) + '\n')
  })

  it('a write that takes a few bytes at a time still writes the whole line once', async () => {
    const root = await tempDir()
    const p = await fileHandleProto()
    const write = (saved.write ??= p.write)
    let calls = 0
    p.write = function (this: unknown, ...args: unknown[]) {
      calls++
      return write.call(this, (args[0] as Buffer).subarray(0, 7))
    }
    await appendRestoreLog(root, entry())
    p.write = write
    const line = JSON.stringify(entry()) + '\n'
    expect(calls).toBe(Math.ceil(line.length / 7))
    expect(await readFile(path.join(root, RESTORE_LOG), 'utf8')).toBe(line)
  })

  it('a failure names the log file and its cause', async () => {
    const root = path.join(await tempDir(), 'missing')
    const err = await rejection(appendRestoreLog(root, entry()), CheckpointStateError)
    expect(err.message).toBe(`cannot append to the restore log ${path.join(root, RESTORE_LOG)}: it does not exist (ENOENT)`)
  })

  it('takes every outcome, a time with an offset, a null or a text error, and 0 participants', async () => {
    const root = await tempDir()
    const entries = [
      entry({outcome: 'restored', time: '2026-12-02T19:19:23+02:00'}),
      entry({outcome: 'failed', error: 'boom', participants: 0}),
      entry({outcome: 'refused', error: 'busy', restore_id: 'r', checkpoint_id: 'c', checkpoint_dir: ''}),
    ]
    for (const e of entries) await appendRestoreLog(root, e)
    expect((await readRestoreLog(root)).entries).toEqual(entries)
  })

  it('refuses an empty restore or checkpoint ID, an unknown outcome and negative or fractional participants', async () => {
    const root = await tempDir()
    for (const bad of [entry({restore_id: ''}), entry({checkpoint_id: ''}), entry({outcome: 'done' as RestoreLogEntry['outcome']}), entry({participants: -1}), entry({participants: 1.5})])
      await expect(appendRestoreLog(root, bad)).rejects.toThrow()
    expect(await readRestoreLog(root)).toEqual({file: path.join(root, RESTORE_LOG), entries: [], skipped: 0})
  })
})

describe('readRestoreLog', () => {
  it('closes the file it read', async () => {
    const root = await tempDir()
    await appendRestoreLog(root, entry())
    expect((await readRestoreLog(root)).entries).toEqual([entry()])
    expect(await openUnder(root)).toEqual([])
  })

  it('a whole last entry without its newline is read; blank lines are no skipped lines; bad ones are', async () => {
    const root = await tempDir()
    const file = path.join(root, RESTORE_LOG)
    const lines = [
      JSON.stringify(entry()),
      '',
      '   ',
      '\t',
      'not json',
      JSON.stringify({...entry({restore_id: 'restore-2'}), extra: 1}),
      JSON.stringify(entry({outcome: 'unknown' as RestoreLogEntry['outcome']})),
      '{"restore_id": "x"}',
      JSON.stringify(entry({restore_id: 'restore-3'})),
    ]
    await writeFile(file, lines.join('\n'))
    expect(await readRestoreLog(root)).toEqual({file, entries: [entry(), entry({restore_id: 'restore-2'}), entry({restore_id: 'restore-3'})], skipped: 3})
    // An unfinished last line, blank or torn, is neither an entry nor skipped.
    await appendFile(file, '\n  ')
    expect(await readRestoreLog(root)).toMatchObject({entries: [{}, {}, {}], skipped: 3})
    await appendFile(file, '\n{"restore_id": "tor')
    expect(await readRestoreLog(root)).toMatchObject({entries: [{}, {}, {}], skipped: 3})
  })

  it('a log that cannot be read is an error naming it and its cause', async () => {
    const root = await tempDir()
    const file = path.join(root, RESTORE_LOG)
    await mkdir(file)
    const err = await rejection(readRestoreLog(root), CheckpointStateError)
    expect(err.message).toBe(`cannot read the restore log ${file}: it is a directory, not a file (EISDIR)`)
  })
})
