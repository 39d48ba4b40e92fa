import {spawn} from 'node:child_process'
import {mkdir, readFile, readdir, writeFile} from 'node:fs/promises'
import path from 'node:path'
import {pathToFileURL} from 'node:url'

import {describe, expect, it} from 'vitest'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {CollectInputError, DispatchLog, PID_FILE, ResultsFile, acquirePidLock, readDispatchLog, readRows, rowRolloutId} from '../../src/storage/collector.js'
import {tempDir} from '../helpers/tmp.js'

async function rowsFile(lines: string[]): Promise<string> {
  const f = path.join(await tempDir(), 'rows.jsonl')
  await writeFile(f, lines.join('\n') + '\n')
  return f
}

async function inputError(file: string): Promise<string> {
  const err = await readRows(file).then(
    () => null,
    (e: unknown) => e,
  )
  expect(err).toBeInstanceOf(CollectInputError)
  return (err as Error).message
}

describe('input rows', () => {
  it('take the rollout from _ng_rollout_id, else <task>-<rollout> from the indices', async () => {
    expect(rowRolloutId({_ng_rollout_id: 'job-7'}, 'x')).toBe('job-7')
    expect(rowRolloutId({_ng_task_index: 3, _ng_rollout_index: 0}, 'x')).toBe('3-0')
    // An explicit ID wins over indices in the same row.
    expect(rowRolloutId({_ng_rollout_id: 'e', _ng_task_index: 1, _ng_rollout_index: 2}, 'x')).toBe('e')
    // -a0 and -a01 are not the reserved suffix (section 8: r-a0 -> rollout 'r-a0', attempt 0).
    expect(rowRolloutId({_ng_rollout_id: 'r-a0'}, 'x')).toBe('r-a0')
    expect(rowRolloutId({_ng_rollout_id: 'r-a01'}, 'x')).toBe('r-a01')
    for (const bad of [
      {},
      {_ng_task_index: 1},
      {_ng_task_index: -1, _ng_rollout_index: 0},
      {_ng_task_index: 1.5, _ng_rollout_index: 0},
      {_ng_task_index: '1', _ng_rollout_index: 0},
      {_ng_rollout_id: 7},
      {_ng_rollout_id: '.hidden'},
    ]) {
      expect(() => rowRolloutId(bad, 'rows.jsonl:4'), JSON.stringify(bad)).toThrow(/rows\.jsonl:4/)
    }

    const f = await rowsFile(['{"_ng_rollout_id": "a", "input": "x"}', '', '{"_ng_task_index": 0, "_ng_rollout_index": 1, "steps": 2}', '  {"_ng_task_index": 10, "_ng_rollout_index": 0}  '])
    const rows = await readRows(f)
    expect(rows.map((r) => [r.rolloutId, r.line])).toEqual([
      ['a', 1],
      ['0-1', 3],
      ['10-0', 4],
    ])
    expect(rows[1]!.body).toEqual({_ng_task_index: 0, _ng_rollout_index: 1, steps: 2})
  })

  it('refuse an explicit ID ending in the reserved -a<N>, naming the file, the line, the ID and the suffix', async () => {
    const f = await rowsFile(['{"_ng_rollout_id": "ok"}', '{"_ng_task_index": 1, "_ng_rollout_index": 2}', '{"_ng_rollout_id": "job-a12", "input": "y"}', '{"_ng_rollout_id": "later"}'])
    const msg = await inputError(f)
    expect(msg).toContain(`${f}:3`)
    expect(msg).toContain('job-a12')
    expect(msg).toContain("'-a12'")
    expect(msg).toMatch(/reserved/)
  })

  it('refuse duplicates (explicit or derived), JSON that is not an object, text that is not JSON, and an empty file', async () => {
    const dup = await rowsFile(['{"_ng_task_index": 4, "_ng_rollout_index": 1}', '{"_ng_rollout_id": "x"}', '{"_ng_rollout_id": "4-1"}'])
    const d = await inputError(dup)
    expect(d).toContain(`${dup}:3`)
    expect(d).toMatch(/also on line 1/)

    const notJson = await rowsFile(['{"_ng_rollout_id": "a"}', '{"_ng_rollout_id": "b",'])
    expect(await inputError(notJson)).toMatch(new RegExp(`${notJson.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:2: not JSON`))

    const arr = await rowsFile(['["a", 0]'])
    expect(await inputError(arr)).toContain(`${arr}:1: a row must be a JSON object`)

    const empty = await rowsFile(['', '   '])
    expect(await inputError(empty)).toMatch(/holds no rows/)

    const binary = path.join(await tempDir(), 'bin.jsonl')
    await writeFile(binary, Buffer.from([0x7b, 0xff, 0xfe, 0x7d, 0x0a]))
    expect(await inputError(binary)).toMatch(/not UTF-8/)
    expect(await inputError(path.join(await tempDir(), 'missing.jsonl'))).toMatch(/cannot read input/)
  })
})

describe('dispatch log', () => {
  it('reads the run ID and the highest attempt per rollout, and drops a torn last line', async () => {
    const root = await tempDir()
    const file = path.join(root, 'dispatched.jsonl')
    expect(await readDispatchLog(root)).toBeNull()
    // Python's json.dumps spacing, as Gym's collector writes it; the last append was cut mid-line.
    await writeFile(file, '{"run_id": "0123456789abcdef0123456789abcdef"}\n["r1", 0]\n["r2", 0]\n["r1", 2]\n["r1", 1]\n["r3", ')
    const s = await readDispatchLog(root)
    expect(s).not.toBeNull()
    expect(s!.runId).toBe('0123456789abcdef0123456789abcdef')
    expect(s!.torn).toBe(true)
    expect([...s!.attempts]).toEqual([
      ['r1', 2],
      ['r2', 0],
    ])
    // A whole entry without its newline is torn too: the append never finished, so its /run was never sent.
    await writeFile(file, '{"run_id": "r"}\n["r1", 0]\n["r2", 0]')
    const t = await readDispatchLog(root)
    expect(t!.torn).toBe(true)
    expect([...t!.attempts.keys()]).toEqual(['r1'])
    await writeFile(file, '{"run_id": "r"}\n["r1", 0]\n')
    expect((await readDispatchLog(root))!.torn).toBe(false)
  })

  it('refuses a log that is not one: no run ID first, a bad entry, a line that is not JSON (naming the line)', async () => {
    const root = await tempDir()
    const file = path.join(root, 'dispatched.jsonl')
    const cases: [string, RegExp][] = [
      ['["r1", 0]\n', /does not start with \{"run_id"/],
      ['{"run_id": "r"}\n["r1", 0]\n["r2", -1]\n', /dispatched\.jsonl:3 is not \["rollout_id", attempt\]/],
      ['{"run_id": "r"}\n["r1", 0, 1]\n', /dispatched\.jsonl:2 is not/],
      ['{"run_id": "r"}\n{"rollout_id": "r1", "attempt": 0}\n', /dispatched\.jsonl:2 is not/],
      ['{"run_id": "r"}\nnot json\n["r1", 0]\n', /dispatched\.jsonl:2 is not JSON/],
    ]
    for (const [text, re] of cases) {
      await writeFile(file, text)
      const err = await readDispatchLog(root).then(
        () => null,
        (e: unknown) => e,
      )
      expect(err, text).toBeInstanceOf(CheckpointStateError)
      expect((err as Error).message, text).toMatch(re)
    }
  })

  it('a new run writes its run ID and every carried attempt, then appends; a reader sees all of it', async () => {
    const root = await tempDir()
    await writeFile(path.join(root, 'dispatched.jsonl'), '{"run_id": "old"}\n["gone", 5]\n')
    const log = await DispatchLog.create(root, 'new-run', new Map([['r1', 3]]))
    await log.append([
      ['r2', 0],
      ['r1', 4],
    ])
    await log.append([])
    await log.close()
    expect(await readFile(path.join(root, 'dispatched.jsonl'), 'utf8')).toBe('{"run_id":"new-run"}\n["r1",3]\n["r2",0]\n["r1",4]\n')
    const s = await readDispatchLog(root)
    expect(s!.runId).toBe('new-run')
    expect([...s!.attempts]).toEqual([
      ['r1', 4],
      ['r2', 0],
    ])
  })
})

describe('results file', () => {
  it('on resume, cuts a torn last line off, reads the rows done, and appends after them', async () => {
    const dir = await tempDir()
    const file = path.join(dir, 'results.jsonl')
    const good = '{"_ng_rollout_id": "a", "result": "1"}\n{"result": "2", "_ng_rollout_id": "b"}\n'
    await writeFile(file, good + '{"_ng_rollout_id": "c", "res')
    const r = await ResultsFile.open(file, {resume: true})
    expect([...r.done].sort()).toEqual(['a', 'b'])
    expect(r.tornBytes).toBe(1)
    expect(await readFile(file, 'utf8')).toBe(good)
    await r.append({_ng_rollout_id: 'c', result: '3'})
    await r.close()
    expect(await readFile(file, 'utf8')).toBe(good + '{"_ng_rollout_id":"c","result":"3"}\n')

    // Nothing torn: nothing cut.
    const again = await ResultsFile.open(file, {resume: true})
    expect(again.tornBytes).toBe(0)
    expect(again.done.size).toBe(3)
    await again.close()
  })

  it('refuses to overwrite without --resume, and a complete line without _ng_rollout_id on resume', async () => {
    const dir = await tempDir()
    const file = path.join(dir, 'results.jsonl')
    await writeFile(file, '{"_ng_rollout_id": "a"}\n')
    await expect(ResultsFile.open(file, {resume: false})).rejects.toThrow(/already exists: pass --resume/)
    expect(await readFile(file, 'utf8')).toBe('{"_ng_rollout_id": "a"}\n')
    await writeFile(file, '{"_ng_rollout_id": "a"}\n{"result": "x"}\n')
    await expect(ResultsFile.open(file, {resume: true})).rejects.toThrow(/results\.jsonl:2 has no _ng_rollout_id/)
    // A missing file on resume is a run that finished nothing yet.
    const fresh = await ResultsFile.open(path.join(dir, 'new.jsonl'), {resume: true})
    expect(fresh.done.size).toBe(0)
    await fresh.close()
  })
})

describe('collector.pid', () => {
  function child(): ReturnType<typeof spawn> {
    return spawn(process.execPath, ['-e', 'setTimeout(() => {}, 20000)'], {stdio: 'ignore'})
  }

  it('of collectors starting at once on one root, exactly one takes it, over a stale file too', {timeout: 120_000}, async () => {
    const src = pathToFileURL(path.resolve('src/storage/collector.ts')).href
    // Each child says ready once loaded, takes the lock when the parent says go, and holds it
    // (alive) until the parent closes its stdin: every one tries while the others are alive.
    const code = `
      const {acquirePidLock} = await import(${JSON.stringify(src)})
      const {createInterface} = await import('node:readline')
      const lines = createInterface({input: process.stdin})[Symbol.asyncIterator]()
      console.log('ready')
      await lines.next()
      const won = await acquirePidLock(process.argv[1]).then(() => 'won', (e) => 'refused: ' + e.message)
      console.log(won)
      await lines.next()`
    const N = 8
    for (const stale of [null, '999999999', '999999999', 'garbage']) {
      const root = await tempDir()
      if (stale) await writeFile(path.join(root, PID_FILE), stale)
      const kids = Array.from({length: N}, () => {
        const p = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code, root], {stdio: ['pipe', 'pipe', 'inherit']})
        const out: string[] = []
        let wake = () => {}
        p.stdout!.setEncoding('utf8')
        p.stdout!.on('data', (d: string) => {
          out.push(...d.split('\n').filter(Boolean))
          wake()
        })
        const next = async (n: number) => {
          while (out.length < n) await new Promise<void>((r) => (wake = r))
          return out[n - 1]!
        }
        return {p, next, exited: new Promise((r) => p.once('exit', r))}
      })
      for (const k of kids) expect(await k.next(1)).toBe('ready')
      for (const k of kids) k.p.stdin!.write('go\n')
      const outs = await Promise.all(kids.map(async (k) => ({pid: k.p.pid!, out: await k.next(2)})))
      const winners = outs.filter((o) => o.out === 'won')
      expect(winners, JSON.stringify(outs)).toHaveLength(1)
      for (const o of outs.filter((x) => x !== winners[0])) expect(o.out).toMatch(/^refused: another collector \(pid \d+\) holds/)
      expect(await readFile(path.join(root, PID_FILE), 'utf8')).toBe(String(winners[0]!.pid))
      // No takeover directory or temp file is left behind.
      expect(await readdir(root)).toEqual([PID_FILE])
      for (const k of kids) k.p.stdin!.end()
      await Promise.all(kids.map((k) => k.exited))
    }
  })

  it('a collector.pid that cannot be read is an error naming it, not a loop', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, PID_FILE))
    const err = await acquirePidLock(root).then(
      () => null,
      (e: unknown) => e,
    )
    expect(err).toBeInstanceOf(CollectInputError)
    expect((err as Error).message).toContain(`cannot read ${path.join(root, PID_FILE)}`)
  })

  it('a live process refuses the root; a dead one, or garbage, is taken over; release removes only our own', async () => {
    const root = await tempDir()
    const file = path.join(root, PID_FILE)
    const live = child()
    try {
      await writeFile(file, `${live.pid}\n`)
      const err = await acquirePidLock(root).then(
        () => null,
        (e: unknown) => e,
      )
      expect(err).toBeInstanceOf(CollectInputError)
      expect((err as Error).message).toContain(`another collector (pid ${live.pid}) holds ${root}`)
      expect(await readFile(file, 'utf8')).toBe(`${live.pid}\n`)
    } finally {
      live.kill('SIGKILL')
    }
    await new Promise((r) => live.once('exit', r))
    // The same pid, now dead: taken over.
    const release = await acquirePidLock(root)
    expect(await readFile(file, 'utf8')).toBe(String(process.pid))
    await release()
    await expect(readFile(file)).rejects.toThrow(/ENOENT/)

    for (const garbage of ['', 'not a pid', '-5', '0']) {
      await writeFile(file, garbage)
      const rel = await acquirePidLock(root)
      expect(await readFile(file, 'utf8')).toBe(String(process.pid))
      await rel()
    }

    // Another collector took the root over after us (ours was stale): release leaves its file alone.
    const rel = await acquirePidLock(root)
    await writeFile(file, '999999999')
    await rel()
    expect(await readFile(file, 'utf8')).toBe('999999999')
  })
})
