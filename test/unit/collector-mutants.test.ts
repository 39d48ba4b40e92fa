// The rollout collector's files (src/storage/collector.ts), pinned down for the mutants the other
// tests leave alive: the exact error messages, blank and whitespace lines, the bounds of an attempt,
// what a refused open leaves on disk, closed handles, and collector.pid's rarer paths (a live pid of
// another user, this process's own pid, a takeover that never frees, a file that changes while it is
// taken over, a name that exists but cannot be read).
import {existsSync} from 'node:fs'
import {mkdir, readFile, readdir, readlink, symlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {afterEach, describe, expect, it, vi} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {CollectInputError, DispatchLog, PID_FILE, ResultsFile, acquirePidLock, newRunId, readDispatchLog, readRows, rowRolloutId, writeCollectionManifest} from '../../src/storage/collector.js'
import {tempDir} from '../helpers/tmp.js'
import {rejection, thrown} from '../helpers/errors.js'

// A hook run before node:fs/promises' mkdir, for the takeover's races; nothing else changes.
const hooks = vi.hoisted(() => ({beforeMkdir: null as null | ((dir: string) => Promise<void>)}))
vi.mock('node:fs/promises', async (importOriginal) => {
  const real = await importOriginal<typeof import('node:fs/promises')>()
  const mkdir = (async (...args: Parameters<typeof real.mkdir>) => {
    if (hooks.beforeMkdir) await hooks.beforeMkdir(String(args[0]))
    return real.mkdir(...args)
  }) as typeof real.mkdir
  return {...real, mkdir, default: {...real, mkdir}}
})

afterEach(() => {
  hooks.beforeMkdir = null
  vi.restoreAllMocks()
})

async function rowsFile(text: string): Promise<string> {
  const f = path.join(await tempDir(), 'rows.jsonl')
  await writeFile(f, text)
  return f
}

describe('input rows: the messages', () => {
  it('an _ng_rollout_id that is not a string is shown as JSON, cut to 50 characters', () => {
    expect(thrown(() => rowRolloutId({_ng_rollout_id: 7}, 'f:2')).message).toBe('f:2: _ng_rollout_id must be a string, not 7')
    const long = Array.from({length: 40}, (_, i) => i)
    const e = thrown(() => rowRolloutId({_ng_rollout_id: long}, 'f:2'))
    expect(e).toBeInstanceOf(CollectInputError)
    expect(e.message).toBe(`f:2: _ng_rollout_id must be a string, not ${JSON.stringify(long).slice(0, 50)}`)
    // A value JSON cannot show (from a caller, never from a file) is still refused, as undefined.
    const fn = thrown(() => rowRolloutId({_ng_rollout_id: () => 0}, 'f:2'))
    expect(fn).toBeInstanceOf(CollectInputError)
    expect(fn.message).toBe('f:2: _ng_rollout_id must be a string, not undefined')
    expect(fn.name).toBe('CollectInputError')
  })

  it('the reserved suffix names the attempt and the rollout it would belong to; a bad ID names the pattern', () => {
    expect(thrown(() => rowRolloutId({_ng_rollout_id: 'job-a12'}, 'f:3')).message).toBe(
      "f:3: _ng_rollout_id 'job-a12' ends in the reserved suffix '-a12', which names attempt 12 of rollout 'job'; rename the row",
    )
    expect(thrown(() => rowRolloutId({_ng_rollout_id: '.hidden'}, 'f:3')).message).toBe("f:3: _ng_rollout_id '.hidden' must match ^[A-Za-z0-9][A-Za-z0-9._-]*$")
    expect(thrown(() => rowRolloutId({_ng_task_index: 1}, 'f:3')).message).toBe('f:3: a row needs _ng_rollout_id, or _ng_task_index and _ng_rollout_index (non-negative integers)')
  })

  it('null, a number and a string are not rows; a bad line, a duplicate and an empty file are named', async () => {
    for (const t of ['null', '5', '"text"']) {
      const f = await rowsFile(`{"_ng_rollout_id": "a"}\n${t}\n`)
      const e = await rejection(readRows(f))
      expect(e).toBeInstanceOf(CollectInputError)
      expect(e.message).toBe(`${f}:2: a row must be a JSON object: '${t}'`)
    }
    const bad = await rowsFile('{"_ng_rollout_id": "a"}\n{"_ng_rollout_id": x}\n')
    const e = await rejection(readRows(bad))
    let parseMessage = ''
    try {
      JSON.parse('{"_ng_rollout_id": x}')
    } catch (err) {
      parseMessage = (err as Error).message
    }
    expect(e.message).toBe(`${bad}:2: not JSON (${parseMessage.slice(0, 100)}): '{"_ng_rollout_id": x}'`)

    const dup = await rowsFile('\n{"_ng_rollout_id": "a"}\n{"_ng_rollout_id": "b"}\n{"_ng_rollout_id": "a"}\n')
    expect((await rejection(readRows(dup))).message).toBe(`${dup}:4: rollout 'a' is also on line 2; every row must name its own rollout`)

    const empty = await rowsFile('\n \n')
    expect((await rejection(readRows(empty))).message).toBe(`input ${empty} holds no rows`)
    const binary = await rowsFile('')
    await writeFile(binary, Buffer.from([0xff, 0x0a]))
    expect((await rejection(readRows(binary))).message).toBe(`input ${binary} is not UTF-8 text`)
    const dir = await tempDir()
    expect((await rejection(readRows(dir))).message).toMatch(new RegExp(`^cannot read input ${escape(dir)}: .+`))
  })
})

function escape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
}

describe('dispatch log: lines and bounds', () => {
  it('blank and whitespace-only lines are skipped, and later lines keep their own numbers', async () => {
    const root = await tempDir()
    const file = path.join(root, 'dispatched.jsonl')
    await writeFile(file, '{"run_id": "r"}\n\n   \n["a", 1]\r\n\t\n["b", 0]\n')
    const s = await readDispatchLog(root)
    expect(s).toEqual({
      runId: 'r',
      attempts: new Map([
        ['a', 1],
        ['b', 0],
      ]),
      torn: false,
    })
    await writeFile(file, '{"run_id": "r"}\n\n["a", 0]\nnot json\n')
    const e = await rejection(readDispatchLog(root))
    expect(e).toBeInstanceOf(CheckpointStateError)
    expect(e.message).toBe(`dispatch log ${file}:4 is not JSON: 'not json'`)
    // A bad entry after a blank line is named by its own line too (it was named by its count of
    // entries, one line too early per blank line before it).
    await writeFile(file, '{"run_id": "r"}\n\n["a", 0]\n["b", -1]\n')
    expect((await rejection(readDispatchLog(root))).message).toBe(`dispatch log ${file}:4 is not ["rollout_id", attempt]: '["b",-1]'`)
  })

  it('an empty log, or one with only blank lines or a torn line, is no log', async () => {
    const root = await tempDir()
    const file = path.join(root, 'dispatched.jsonl')
    for (const text of ['', '\n  \n', '{"run_id": "r"']) {
      await writeFile(file, text)
      expect(await readDispatchLog(root), JSON.stringify(text)).toBeNull()
    }
  })

  it('refuses a null head, a rollout that is not a string, an attempt that is not an integer or beyond the largest', async () => {
    const root = await tempDir()
    const file = path.join(root, 'dispatched.jsonl')
    await writeFile(file, 'null\n')
    const h = await rejection(readDispatchLog(root))
    expect(h).toBeInstanceOf(CheckpointStateError)
    expect(h.message).toBe(`dispatch log ${file} does not start with {"run_id": ...}`)
    for (const entry of ['[1, 0]', '["r", 1.5]', '["r", "1"]', '["r", 2147483648]', '["r", -1]']) {
      await writeFile(file, `{"run_id": "r"}\n["ok", 0]\n${entry}\n`)
      const e = await rejection(readDispatchLog(root))
      expect(e, entry).toBeInstanceOf(CheckpointStateError)
      expect(e.message, entry).toBe(`dispatch log ${file}:3 is not ["rollout_id", attempt]: '${JSON.stringify(JSON.parse(entry))}'`)
    }
    // The largest attempt itself is one.
    await writeFile(file, '{"run_id": "r"}\n["r", 2147483647]\n')
    expect((await readDispatchLog(root))!.attempts.get('r')).toBe(2147483647)
  })

  it('a log that cannot be read is an error naming it, not a missing log', async () => {
    const root = await tempDir()
    const file = path.join(root, 'dispatched.jsonl')
    await mkdir(file)
    const e = await rejection(readDispatchLog(root))
    expect(e).toBeInstanceOf(CheckpointStateError)
    expect(e.message).toMatch(new RegExp(`^cannot read dispatch log ${escape(file)}: .+`))
  })

  it('a closed log takes no more entries', async () => {
    const root = await tempDir()
    const log = await DispatchLog.create(root, 'run', new Map())
    expect(log.runId).toBe('run')
    await log.close()
    await log.close()
    await expect(log.append([['a', 0]])).rejects.toThrow()
    expect(await readFile(path.join(root, 'dispatched.jsonl'), 'utf8')).toBe('{"run_id":"run"}\n')
  })

  it('run IDs are 32 hex digits, new each time', () => {
    const a = newRunId()
    expect(a).toMatch(/^[0-9a-f]{32}$/)
    expect(newRunId()).not.toBe(a)
  })
})

describe('results file: refusals', () => {
  it('without --resume, an existing file is left as it was, torn line and all, whatever it holds', async () => {
    const dir = await tempDir()
    const file = path.join(dir, 'results.jsonl')
    for (const text of ['{"_ng_rollout_id": "a"}\n{"_ng_rollout_id": "b", "res', '{"result": 1}\n', 'not json\n']) {
      await writeFile(file, text)
      const e = await rejection(ResultsFile.open(file, {resume: false}))
      expect(e).toBeInstanceOf(CollectInputError)
      expect(e.message).toBe(`output ${file} already exists: pass --resume to continue that run, or choose another file`)
      expect(await readFile(file, 'utf8')).toBe(text)
    }
  })

  it('an output that cannot be opened or read is named, with the reason', async () => {
    const dir = await tempDir()
    const missing = path.join(dir, 'no-such-dir', 'results.jsonl')
    for (const resume of [false, true]) {
      const e = await rejection(ResultsFile.open(missing, {resume}))
      expect(e).toBeInstanceOf(CollectInputError)
      expect(e.message).toMatch(new RegExp(`^cannot open output ${escape(missing)}: .+`))
    }
    const e = await rejection(ResultsFile.open(dir, {resume: true}))
    expect(e).toBeInstanceOf(CheckpointStateError)
    expect(e.message).toMatch(new RegExp(`^cannot read output ${escape(dir)}: .+`))
  })

  it('on resume, a null row or one that is not JSON is named by its line; blank lines are skipped', async () => {
    const dir = await tempDir()
    const file = path.join(dir, 'results.jsonl')
    await writeFile(file, '{"_ng_rollout_id": "a"}\nnull\n')
    const n = await rejection(ResultsFile.open(file, {resume: true}))
    expect(n).toBeInstanceOf(CheckpointStateError)
    expect(n.message).toBe(`output ${file}:2 has no _ng_rollout_id`)
    await writeFile(file, '{"_ng_rollout_id": "a"}\n\n{"result": 1}\n')
    expect((await rejection(ResultsFile.open(file, {resume: true}))).message).toBe(`output ${file}:3 has no _ng_rollout_id`)
    await writeFile(file, '{"_ng_rollout_id": "a"}\n\n{"_ng_rollout_id": "b"\n')
    const j = await rejection(ResultsFile.open(file, {resume: true}))
    expect(j).toBeInstanceOf(CheckpointStateError)
    expect(j.message).toBe(`output ${file}:3 is not JSON: '{"_ng_rollout_id": "b"'`)
    await writeFile(file, '{"_ng_rollout_id": "a"}\n  \n{"_ng_rollout_id": "b"}\n')
    const r = await ResultsFile.open(file, {resume: true})
    expect([...r.done]).toEqual(['a', 'b'])
    expect(r.tornBytes).toBe(0)
    expect(r.file).toBe(file)
    await r.append({_ng_rollout_id: 'c'})
    await r.sync()
    await r.close()
    expect(await readFile(file, 'utf8')).toBe('{"_ng_rollout_id": "a"}\n  \n{"_ng_rollout_id": "b"}\n{"_ng_rollout_id":"c"}\n')
    // Closed: no more rows.
    await expect(r.append({_ng_rollout_id: 'd'})).rejects.toThrow()
    await r.close()
    expect(await readFile(file, 'utf8')).toBe('{"_ng_rollout_id": "a"}\n  \n{"_ng_rollout_id": "b"}\n{"_ng_rollout_id":"c"}\n')
  })
})

describe('collector.pid: the rarer paths', () => {
  it('a live pid this process may not signal (another user) holds the root', async () => {
    const root = await tempDir()
    const file = path.join(root, PID_FILE)
    await writeFile(file, '4242\n')
    const kill = vi.spyOn(process, 'kill').mockImplementation((pid: number) => {
      if (pid === 4242) throw Object.assign(new Error('kill EPERM'), {code: 'EPERM'})
      return true
    })
    const e = await rejection(acquirePidLock(root))
    kill.mockRestore()
    expect(e).toBeInstanceOf(CollectInputError)
    expect(e.message).toBe(`another collector (pid 4242) holds ${root}: stop it first, or remove ${file} if that process is not a collector`)
    expect(await readFile(file, 'utf8')).toBe('4242\n')
  })

  it('this process may take it again, and its release removes a file naming it with a newline', async () => {
    const root = await tempDir()
    const file = path.join(root, PID_FILE)
    const first = await acquirePidLock(root)
    const again = await acquirePidLock(root)
    expect(await readFile(file, 'utf8')).toBe(String(process.pid))
    await again()
    await expect(readFile(file)).rejects.toThrow(/ENOENT/)
    // Released twice, or after the file went: nothing to do, no error.
    await first()
    await writeFile(file, `${process.pid}\n`)
    const rel = await acquirePidLock(root)
    expect(await readFile(file, 'utf8')).toBe(`${process.pid}\n`)
    await rel()
    expect(await readdir(root)).toEqual([])
  })

  it('a takeover that never ends is given up after 100 tries, 20 ms apart, naming the takeover directory', {timeout: 30_000}, async () => {
    const root = await tempDir()
    const file = path.join(root, PID_FILE)
    await writeFile(file, '999999999')
    await mkdir(`${file}.takeover`)
    const timer = vi.spyOn(globalThis, 'setTimeout')
    const e = await rejection(acquirePidLock(root))
    const waits = timer.mock.calls.filter((c) => c[1] === 20).length
    timer.mockRestore()
    expect(e).toBeInstanceOf(CollectInputError)
    expect(e.message).toBe(`cannot take ${file}: it keeps changing, or another collector is taking it over (remove ${file}.takeover if no collector is starting)`)
    expect(waits).toBe(100)
    // Another collector's takeover directory is not ours to remove; the stale file waits for it.
    expect((await readdir(root)).sort()).toEqual([PID_FILE, `${PID_FILE}.takeover`])
    expect(await readFile(file, 'utf8')).toBe('999999999')
  })

  it('a stale file replaced by a live collector before the takeover starts is left to it', async () => {
    const root = await tempDir()
    const file = path.join(root, PID_FILE)
    await writeFile(file, '999999999')
    hooks.beforeMkdir = async (dir) => {
      if (dir === `${file}.takeover`) await writeFile(file, `${process.ppid}`)
    }
    const e = await rejection(acquirePidLock(root))
    expect(e).toBeInstanceOf(CollectInputError)
    expect(e.message).toContain(`another collector (pid ${process.ppid}) holds ${root}`)
    expect(await readFile(file, 'utf8')).toBe(`${process.ppid}`)
    expect(await readdir(root)).toEqual([PID_FILE])
  })

  it('a takeover directory that cannot be made is that error, at once', async () => {
    const root = await tempDir()
    const file = path.join(root, PID_FILE)
    await writeFile(file, 'garbage')
    const timer = vi.spyOn(globalThis, 'setTimeout')
    hooks.beforeMkdir = async (dir) => {
      if (dir === `${file}.takeover`) throw Object.assign(new Error('mkdir EIO'), {code: 'EIO'})
    }
    const e = await rejection(acquirePidLock(root))
    const waits = timer.mock.calls.filter((c) => c[1] === 20).length
    timer.mockRestore()
    expect(e.message).toBe('mkdir EIO')
    expect(waits).toBe(0)
    expect(await readFile(file, 'utf8')).toBe('garbage')
  })

  it.skipIf(process.platform === 'win32')('a name that exists but reads as missing (a dangling link) is retried, then given up', async () => {
    const root = await tempDir()
    const file = path.join(root, PID_FILE)
    await symlink(path.join(root, 'nowhere'), file)
    const e = await rejection(acquirePidLock(root))
    expect(e).toBeInstanceOf(CollectInputError)
    expect(e.message).toMatch(/^cannot take .*: it keeps changing/)
    expect(await readdir(root)).toEqual([PID_FILE])
  })
})

describe('collection.json', () => {
  it('is the manifest as JSON, replacing an older one, with no temp file left', async () => {
    const dir = await tempDir()
    const m = {checkpoint_id: 'c', run_id: 'r', created_at: 12.5, continued: [{rollout_id: 'a', attempt: 1}], restarted: ['b']}
    await writeFile(path.join(dir, 'collection.json'), 'old')
    await writeCollectionManifest(dir, m)
    expect(await readFile(path.join(dir, 'collection.json'), 'utf8')).toBe(JSON.stringify(m))
    expect(await readdir(dir)).toEqual(['collection.json'])
  })

  it.runIf(existsSync('/proc/self/fd'))('leaves no file handle open on it (Linux: /proc/self/fd)', async () => {
    const dir = await tempDir()
    await writeCollectionManifest(dir, {checkpoint_id: 'c', run_id: 'r', created_at: 1, continued: [], restarted: []})
    const target = path.join(dir, 'collection.json')
    const open: string[] = []
    for (const fd of await readdir('/proc/self/fd')) {
      const to = await readlink(path.join('/proc/self/fd', fd)).catch(() => '')
      if (to.startsWith(dir)) open.push(to)
    }
    expect(open).toEqual([])
    expect(JSON.parse(await readFile(target, 'utf8'))).toEqual({checkpoint_id: 'c', run_id: 'r', created_at: 1, continued: [], restarted: []})
  })
})
