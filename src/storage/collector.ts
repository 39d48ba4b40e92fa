import {randomBytes} from 'node:crypto'
import {FileHandle, mkdir, open, readFile, rename, rmdir, truncate, unlink} from 'node:fs/promises'
import path from 'node:path'
import {isUtf8} from 'node:buffer'

import {MAX_ATTEMPT, RESERVED_SUFFIX, SAFE_ID_PATTERN, quoteInput} from '../protocol/episode.js'
import {CheckpointStateError} from './errors.js'
import {createExclusive, fsyncDir, replaceAtomic, tempName} from './fsutil.js'
import {describeFsError} from './root.js'

/**
 * A collection root, laid out as Gym's own rollout collection lays it out (reference 7.7):
 *   LATEST, dispatched.jsonl, collector.pid, <checkpoint_id>/collection.json, <checkpoint_id>/gym/…
 */
export const DISPATCH_LOG = 'dispatched.jsonl'
export const PID_FILE = 'collector.pid'
export const COLLECTION_MANIFEST = 'collection.json'

export class CollectInputError extends Error {
  constructor(message: string) {
    super(message)
    this.name = 'CollectInputError'
  }
}

/** One input row: a Gym run body, and the rollout it runs. */
export interface Row {
  rolloutId: string
  body: Record<string, unknown>
  line: number
}

/**
 * The rollout a run body names, as Gym derives it: `_ng_rollout_id`, else
 * `<_ng_task_index>-<_ng_rollout_index>`. An explicit ID ending in the reserved -a<N> is refused:
 * it would name attempt N of another rollout, and a retry stamping an attempt would fail mid-run.
 */
export function rowRolloutId(body: Record<string, unknown>, where: string): string {
  const explicit = body._ng_rollout_id
  if (explicit !== undefined) {
    if (typeof explicit !== 'string') throw new CollectInputError(`${where}: _ng_rollout_id must be a string, not ${JSON.stringify(explicit)?.slice(0, 50)}`)
    const m = RESERVED_SUFFIX.exec(explicit)
    if (m) {
      throw new CollectInputError(
        `${where}: _ng_rollout_id ${quoteInput(explicit)} ends in the reserved suffix '-a${m[1]}', which names attempt ${m[1]} of rollout ${quoteInput(explicit.slice(0, m.index))}; rename the row`,
      )
    }
    if (!SAFE_ID_PATTERN.test(explicit)) throw new CollectInputError(`${where}: _ng_rollout_id ${quoteInput(explicit)} must match ${SAFE_ID_PATTERN.source}`)
    return explicit
  }
  const task = body._ng_task_index
  const rollout = body._ng_rollout_index
  const isIndex = (v: unknown) => typeof v === 'number' && Number.isInteger(v) && v >= 0
  if (isIndex(task) && isIndex(rollout)) return `${task}-${rollout}`
  throw new CollectInputError(`${where}: a row needs _ng_rollout_id, or _ng_task_index and _ng_rollout_index (non-negative integers)`)
}

async function readUtf8(file: string, what: string): Promise<string> {
  let bytes: Buffer
  try {
    bytes = await readFile(file)
  } catch (err) {
    throw new CollectInputError(`cannot read ${what} ${file}: ${describeFsError(err)}`)
  }
  if (!isUtf8(bytes)) throw new CollectInputError(`${what} ${file} is not UTF-8 text`)
  return bytes.toString('utf8')
}

/** Reads the input rows (JSONL). Errors name the file and the line. */
export async function readRows(file: string): Promise<Row[]> {
  const text = await readUtf8(file, 'input')
  const rows: Row[] = []
  const seen = new Map<string, number>()
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const t = lines[i]!.trim()
    if (!t) continue
    const where = `${file}:${i + 1}`
    let body: unknown
    try {
      body = JSON.parse(t)
    } catch (err) {
      throw new CollectInputError(`${where}: not JSON (${(err as Error).message.slice(0, 100)}): ${quoteInput(t)}`)
    }
    if (!body || typeof body !== 'object' || Array.isArray(body)) throw new CollectInputError(`${where}: a row must be a JSON object: ${quoteInput(t)}`)
    const rolloutId = rowRolloutId(body as Record<string, unknown>, where)
    const first = seen.get(rolloutId)
    if (first !== undefined) throw new CollectInputError(`${where}: rollout ${quoteInput(rolloutId)} is also on line ${first}; every row must name its own rollout`)
    seen.set(rolloutId, i + 1)
    rows.push({rolloutId, body: body as Record<string, unknown>, line: i + 1})
  }
  if (rows.length === 0) throw new CollectInputError(`input ${file} holds no rows`)
  return rows
}

/**
 * Complete lines of a JSONL file and the byte length they cover; a last line without its newline
 * is torn (a crash mid-write) and not returned. Lines that are not JSON are errors.
 */
async function readJsonLines(file: string, what: string): Promise<{lines: {n: number; value: unknown}[]; goodBytes: number; torn: boolean} | null> {
  let bytes: Buffer
  try {
    bytes = await readFile(file)
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null
    throw new CheckpointStateError(`cannot read ${what} ${file}: ${describeFsError(err)}`)
  }
  const end = bytes.lastIndexOf(0x0a) + 1
  // Each value with its line number: blank lines are skipped, so the index does not tell it.
  const lines: {n: number; value: unknown}[] = []
  let start = 0
  let n = 0
  while (start < end) {
    const nl = bytes.indexOf(0x0a, start)
    n++
    const line = bytes.subarray(start, nl).toString('utf8').trim()
    start = nl + 1
    if (!line) continue
    try {
      lines.push({n, value: JSON.parse(line)})
    } catch {
      throw new CheckpointStateError(`${what} ${file}:${n} is not JSON: ${quoteInput(line)}`)
    }
  }
  return {lines, goodBytes: end, torn: end < bytes.length}
}

export interface DispatchLogState {
  runId: string
  /** rollout -> highest attempt ever dispatched. */
  attempts: Map<string, number>
  torn: boolean
}

/** Reads `<root>/dispatched.jsonl`: the run ID line, then `["rollout", attempt]` lines. */
export async function readDispatchLog(root: string): Promise<DispatchLogState | null> {
  const file = path.join(root, DISPATCH_LOG)
  const r = await readJsonLines(file, 'dispatch log')
  if (!r || r.lines.length === 0) return null
  const head = r.lines[0]!.value as {run_id?: unknown}
  if (!head || typeof head !== 'object' || typeof head.run_id !== 'string') throw new CheckpointStateError(`dispatch log ${file} does not start with {"run_id": ...}`)
  const attempts = new Map<string, number>()
  for (const {n, value: e} of r.lines.slice(1)) {
    if (!Array.isArray(e) || e.length !== 2 || typeof e[0] !== 'string' || !Number.isInteger(e[1]) || e[1] < 0 || e[1] > MAX_ATTEMPT) {
      throw new CheckpointStateError(`dispatch log ${file}:${n} is not ["rollout_id", attempt]: ${quoteInput(JSON.stringify(e))}`)
    }
    attempts.set(e[0], Math.max(attempts.get(e[0]) ?? -1, e[1] as number))
  }
  return {runId: head.run_id, attempts, torn: r.torn}
}

export function newRunId(): string {
  return randomBytes(16).toString('hex')
}

/**
 * The dispatch log of this run: written whole (run ID, then `carry`: the highest attempt of every
 * rollout an earlier run left unfinished, so the log never forgets an attempt), then appended to,
 * one fsync per batch, before the batch's /run calls are sent.
 */
export class DispatchLog {
  private constructor(
    private readonly fh: FileHandle,
    readonly runId: string,
  ) {}

  static async create(root: string, runId: string, carry: Map<string, number>): Promise<DispatchLog> {
    const file = path.join(root, DISPATCH_LOG)
    const head = [JSON.stringify({run_id: runId}), ...[...carry].map(([r, a]) => JSON.stringify([r, a]))].join('\n') + '\n'
    await replaceAtomic(file, head)
    return new DispatchLog(await open(file, 'a'), runId)
  }

  async append(entries: [string, number][]): Promise<void> {
    if (entries.length === 0) return
    await this.fh.write(entries.map((e) => JSON.stringify(e)).join('\n') + '\n')
    await this.fh.datasync()
  }

  async close(): Promise<void> {
    await this.fh.close().catch(() => {})
  }
}

/**
 * The output file: one finished row per line, appended as each completes. On open, a torn last
 * line (a crash mid-write) is cut off, and the rollouts already done are read back.
 */
export class ResultsFile {
  private constructor(
    private readonly fh: FileHandle,
    readonly file: string,
    readonly done: Set<string>,
    readonly tornBytes: number,
  ) {}

  static async open(file: string, opts: {resume: boolean}): Promise<ResultsFile> {
    const done = new Set<string>()
    let torn = 0
    if (opts.resume) {
      const r = await readJsonLines(file, 'output')
      if (r) {
        for (const {n, value: row} of r.lines) {
          const id = (row as {_ng_rollout_id?: unknown})?._ng_rollout_id
          if (typeof id !== 'string') throw new CheckpointStateError(`output ${file}:${n} has no _ng_rollout_id`)
          done.add(id)
        }
        const size = r.goodBytes
        if (r.torn) {
          await truncate(file, size)
          torn = 1
        }
      }
    }
    let fh: FileHandle
    try {
      fh = await open(file, opts.resume ? 'a' : 'wx')
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw new CollectInputError(`output ${file} already exists: pass --resume to continue that run, or choose another file`)
      throw new CollectInputError(`cannot open output ${file}: ${describeFsError(err)}`)
    }
    return new ResultsFile(fh, file, done, torn)
  }

  async append(row: Record<string, unknown>): Promise<void> {
    await this.fh.write(JSON.stringify(row) + '\n')
  }

  async sync(): Promise<void> {
    await this.fh.datasync()
  }

  async close(): Promise<void> {
    await this.fh.datasync().catch(() => {})
    await this.fh.close().catch(() => {})
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
}

/**
 * Takes `<root>/collector.pid`; refuses while another live collector holds it (this process may
 * take it again). Atomic: the file is created with a hard link, which never replaces a name, so of
 * collectors starting at once exactly one wins. A stale file (a dead pid, or garbage) is removed
 * only under `collector.pid.takeover` (a directory: mkdir is atomic), and only if it still holds
 * what was read as stale, so a live collector's file is never removed.
 */
export async function acquirePidLock(root: string): Promise<() => Promise<void>> {
  const file = path.join(root, PID_FILE)
  const takeover = `${file}.takeover`
  const mine = String(process.pid)
  const read = () =>
    readFile(file, 'utf8').catch((err: unknown) => {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null
      throw new CollectInputError(`cannot read ${file}: ${describeFsError(err)}`)
    })
  for (let tries = 0; ; tries++) {
    if (tries >= 100) throw new CollectInputError(`cannot take ${file}: it keeps changing, or another collector is taking it over (remove ${takeover} if no collector is starting)`)
    if (await createExclusive(file, mine)) break
    const text = await read()
    if (text === null) continue
    const pid = Number(text.trim())
    if (Number.isInteger(pid) && pid > 0 && alive(pid)) {
      if (pid === process.pid) break
      throw new CollectInputError(`another collector (pid ${pid}) holds ${root}: stop it first, or remove ${file} if that process is not a collector`)
    }
    try {
      await mkdir(takeover)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err
      // Another collector is removing the stale file: wait for it, then try again.
      await new Promise((r) => setTimeout(r, 20))
      continue
    }
    try {
      if ((await read()) === text) await unlink(file)
    } finally {
      await rmdir(takeover).catch(() => {})
    }
  }
  return async () => {
    const now = await readFile(file, 'utf8').catch(() => null)
    if (now?.trim() === mine) await unlink(file).catch(() => {})
  }
}

/** collection.json, written as Gym's collector writes it: temp file, fsync, rename, fsync dir. */
export async function writeCollectionManifest(checkpointDir: string, m: {checkpoint_id: string; run_id: string; created_at: number; continued: unknown[]; restarted: unknown[]}): Promise<void> {
  const target = path.join(checkpointDir, COLLECTION_MANIFEST)
  const tmp = tempName(checkpointDir, COLLECTION_MANIFEST)
  const fh = await open(tmp, 'wx')
  try {
    await fh.writeFile(JSON.stringify(m))
    await fh.sync()
  } finally {
    await fh.close()
  }
  await rename(tmp, target)
  await fsyncDir(checkpointDir)
}
