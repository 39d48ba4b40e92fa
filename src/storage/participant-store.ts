import {createHash} from 'node:crypto'
import {isAscii, isUtf8} from 'node:buffer'
import {createReadStream} from 'node:fs'
import {lstat, mkdir, open, readFile, realpath, rename, unlink} from 'node:fs/promises'
import path from 'node:path'

import {EpisodeIdWire, SAFE_ID_PATTERN, captureKey, fromWire} from '../protocol/episode.js'
import {ParticipantManifest} from '../protocol/wire.js'
import {CheckpointStateError, WriteStoppedError} from './errors.js'
import {episodeFromPrefix, isJsonValue} from './jsonscan.js'
import {createExclusive, fsyncDir, fsyncUpTo, tempName} from './fsutil.js'
import {PyValue, isPyDict, pyGet, pyLoads} from './pyjson.js'

export const STATE_SCHEMA_VERSION = 1
export const MANIFEST_FILE = 'manifest.json'
export const RECORDS_FILE_PATTERN = /^records(-[0-9a-f]{64})?\.jsonl$/
export const EMPTY_SHA256 = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'

export function participantDir(checkpointDir: string, kind: string, instance: string): string {
  for (const [what, v] of [['kind', kind], ['instance', instance]] as const) {
    if (!SAFE_ID_PATTERN.test(v)) throw new CheckpointStateError(`participant ${what} '${v}' is not a safe path component`)
  }
  return path.join(checkpointDir, 'gym', kind, instance)
}

/** Python's `json.dumps(m, sort_keys=True, indent=1)` (ASCII, no trailing newline). */
export function encodeManifest(m: Record<string, unknown>): string {
  return encodeSorted(m, 0)
}

function encodeSorted(v: unknown, level: number): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)
  const pad = '\n' + ' '.repeat(level + 1)
  if (Array.isArray(v)) return v.length === 0 ? '[]' : `[${v.map((x) => pad + encodeSorted(x, level + 1)).join(',')}\n${' '.repeat(level)}]`
  const keys = Object.keys(v).sort()
  if (keys.length === 0) return '{}'
  return `{${keys.map((k) => `${pad}${encodeSorted(k, 0)}: ${encodeSorted((v as Record<string, unknown>)[k], level + 1)}`).join(',')}\n${' '.repeat(level)}}`
}

export interface WriteStateOptions {
  checkpointDir: string
  kind: string
  instance: string
  checkpointId: string
  /** Checked before each record and once more under `runLocked` just before publication. */
  shouldStop?: () => boolean
  /** Runs the rename of the records file and the manifest's creation under the caller's stop lock. */
  runLocked?: <T>(fn: () => Promise<T>) => Promise<T>
}

const WRITE_BUFFER_BYTES = 1 << 20
const NEWLINE = Buffer.from('\n')

/**
 * Streams encoded record lines (each without its newline; strings are written as UTF-8; a
 * Buffer line is copied or written before the next one is read) into `records-<sha256>.jsonl`, then
 * creates `manifest.json` (never replacing one). Every directory from the participant directory up
 * to the checkpoint directory is fsynced before the manifest appears, so a host crash cannot lose
 * an entry under a committed manifest. Returns the manifest that is on disk.
 */
export async function writeParticipantState(opts: WriteStateOptions, lines: Iterable<string | Buffer> | AsyncIterable<string | Buffer>): Promise<ParticipantManifest> {
  try {
    return await writeInner(opts, lines)
  } catch (err) {
    if (err instanceof CheckpointStateError) throw err
    // ENOSPC, EIO, a failed fsync, a corrupt existing manifest: typed, never a bare 500.
    throw new CheckpointStateError(`cannot write checkpoint state under ${opts.checkpointDir}: ${(err as Error).message}`)
  }
}

async function writeInner(opts: WriteStateOptions, lines: Iterable<string | Buffer> | AsyncIterable<string | Buffer>): Promise<ParticipantManifest> {
  const dir = participantDir(opts.checkpointDir, opts.kind, opts.instance)
  const label = `checkpoint '${opts.checkpointId}'`
  const runLocked = opts.runLocked ?? (<T>(fn: () => Promise<T>) => fn())
  try {
    await mkdir(dir, {recursive: true})
  } catch (err) {
    throw new CheckpointStateError(`cannot write checkpoint state under ${opts.checkpointDir}: ${(err as Error).message}`)
  }
  const tmp = tempName(dir, 'records.jsonl')
  let published = false
  try {
    const hash = createHash('sha256')
    let count = 0
    let fh
    try {
      fh = await open(tmp, 'wx')
    } catch (err) {
      throw new CheckpointStateError(`cannot write checkpoint state under ${dir}: ${(err as Error).message}`)
    }
    const sync = Symbol.iterator in lines
    const it = sync ? (lines as Iterable<string | Buffer>)[Symbol.iterator]() : (lines as AsyncIterable<string | Buffer>)[Symbol.asyncIterator]()
    let done = false
    try {
      // A line is hashed and copied before anything awaits: it may be a view of the encoder's
      // scratch buffer, which the next record encoded anywhere in this process overwrites (other
      // participants of one process commit at the same time). So a sync iterable is read without
      // `for await`, whose microtask hops let another writer encode in between. Lines go into one
      // reused batch buffer; a line that does not fit is first copied whole into a private spill.
      const batch = Buffer.allocUnsafe(WRITE_BUFFER_BYTES)
      let spill: Buffer | null = null
      let used = 0
      for (;;) {
        const step = sync ? (it as Iterator<string | Buffer>).next() : await it.next()
        if (step.done) {
          done = true
          break
        }
        const line = step.value
        if (opts.shouldStop?.()) throw new WriteStoppedError(label)
        const buf = typeof line === 'string' ? Buffer.from(line, 'utf8') : line
        hash.update(buf)
        hash.update(NEWLINE)
        count++
        const n = buf.length + 1
        if (used + n <= batch.length) {
          used += buf.copy(batch, used)
          batch[used++] = 0x0a
          continue
        }
        if (!spill || spill.length < n) spill = Buffer.allocUnsafe(Math.max(n, WRITE_BUFFER_BYTES))
        buf.copy(spill, 0)
        spill[n - 1] = 0x0a
        // From here on the line is private: awaiting is safe.
        if (used) await fh.write(batch, 0, used)
        used = 0
        if (n > batch.length) await fh.write(spill, 0, n)
        else used = spill.copy(batch, 0, 0, n)
      }
      if (used) await fh.write(batch, 0, used)
      await fh.sync()
    } finally {
      // Closes a generator left early (a stop, a failed write), as `for await` would.
      if (!done) {
        try {
          await it.return?.()
        } catch {}
      }
      await fh.close()
    }
    const sha = hash.digest('hex')
    const manifest: ParticipantManifest = {
      checkpoint_id: opts.checkpointId,
      instance: opts.instance,
      kind: opts.kind,
      record_count: count,
      records_file: `records-${sha}.jsonl`,
      records_sha256: sha,
      schema_version: STATE_SCHEMA_VERSION,
    }
    const recordsPath = path.join(dir, manifest.records_file)
    const manifestPath = path.join(dir, MANIFEST_FILE)
    const created = await runLocked(async () => {
      if (opts.shouldStop?.()) throw new WriteStoppedError(label)
      // Same name means same content, so replacing an identical records file is harmless.
      await rename(tmp, recordsPath)
      published = true
      await fsyncUpTo(dir, opts.checkpointDir)
      return createExclusive(manifestPath, encodeManifest(manifest))
    })
    if (!created) {
      let existing: ParticipantManifest
      try {
        existing = await readManifestFile(dir)
      } catch (err) {
        await unlink(recordsPath).catch(() => {})
        throw new CheckpointStateError(`${dir} already holds a manifest that cannot be read (${(err as Error).message}); it is left as it is`)
      }
      if (!sameJson(existing, manifest)) {
        if (existing.records_file !== manifest.records_file) await unlink(recordsPath).catch(() => {})
        throw new CheckpointStateError(`${dir} already holds a different commit (${existing.checkpoint_id}, ${existing.records_file})`)
      }
    }
    // Also on a retry that found the manifest already published: a commit that succeeds is durable.
    await fsyncDir(dir)
    return created ? manifest : await readManifestFile(dir)
  } finally {
    if (!published) await unlink(tmp).catch(() => {})
  }
}

function sameJson(a: unknown, b: unknown): boolean {
  return encodeManifest(a as Record<string, unknown>) === encodeManifest(b as Record<string, unknown>)
}

async function readManifestFile(dir: string): Promise<ParticipantManifest> {
  const text = await readFile(path.join(dir, MANIFEST_FILE), 'utf8')
  return JSON.parse(text) as ParticipantManifest
}

// ---------------------------------------------------------------- reading

export interface ReadStateOptions {
  /** When given, the manifest must belong to this participant. */
  kind?: string
  instance?: string
  /**
   * Capture keys whose records are kept and decoded (Python-style) for the caller; null keeps
   * none. Every line is still hashed, counted and checked to be a JSON object with an episode_id.
   */
  keep?: ReadonlySet<string> | null
  /**
   * Offline verification only (Gym's restore checks neither): the checkpoint directory that the
   * participant directory, its manifest and its records file must resolve inside (a symlink
   * leaving it is an error naming the link and its target), and a `records-<hex>.jsonl` whose
   * <hex> is not its content's sha256 is an error.
   */
  within?: string
}

export interface StoredRecord {
  key: string
  /** The record as decoded by pyLoads: dicts are Maps. */
  record: PyValue
}

export interface ReadStateResult {
  dir: string
  manifest: ParticipantManifest
  /** Capture keys of every record, in file order. */
  keys: string[]
  kept: StoredRecord[]
  bytes: number
}

const READ_CHUNK = 1 << 20

/**
 * Verifies and reads a participant directory in one streaming pass, holding at most one record in
 * memory besides the kept ones. Every problem is a CheckpointStateError naming what is wrong.
 */
export async function readParticipantState(dir: string, opts: ReadStateOptions = {}): Promise<ReadStateResult> {
  try {
    return await readInner(dir, opts)
  } catch (err) {
    if (err instanceof CheckpointStateError) throw err
    throw new CheckpointStateError(`cannot read checkpoint state from ${dir}: ${(err as Error).message}`)
  }
}

async function readInner(dir: string, opts: ReadStateOptions): Promise<ReadStateResult> {
  const manifestPath = path.join(dir, MANIFEST_FILE)
  const base = opts.within === undefined ? null : await realpath(opts.within)
  if (base !== null) {
    await staysInside(opts.within!, base, dir)
    await staysInside(opts.within!, base, manifestPath)
  }
  let text: string
  try {
    text = await readFile(manifestPath, 'utf8')
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new CheckpointStateError(`missing manifest ${manifestPath}`)
    throw err
  }
  let raw: unknown
  try {
    raw = JSON.parse(text)
  } catch {
    throw new CheckpointStateError(`${manifestPath} is not JSON`)
  }
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new CheckpointStateError(`${manifestPath} is not a manifest`)
  const m = raw as Record<string, unknown>
  if (m.schema_version !== STATE_SCHEMA_VERSION) throw new CheckpointStateError(`${manifestPath} has an unsupported schema ${JSON.stringify(m.schema_version)}`)
  if (opts.kind !== undefined && (m.kind !== opts.kind || m.instance !== opts.instance)) {
    throw new CheckpointStateError(`${manifestPath} belongs to ${String(m.kind)}/${String(m.instance)}, not ${opts.kind}/${opts.instance}`)
  }
  if (typeof m.checkpoint_id !== 'string') throw new CheckpointStateError(`${manifestPath} names no checkpoint`)
  if (typeof m.records_file !== 'string' || !RECORDS_FILE_PATTERN.test(m.records_file)) {
    throw new CheckpointStateError(`${manifestPath} names an invalid records file ${JSON.stringify(m.records_file)}`)
  }
  const recordsPath = path.join(dir, m.records_file)
  if (base !== null) await staysInside(opts.within!, base, recordsPath)
  const hash = createHash('sha256')
  const keys: string[] = []
  const kept: StoredRecord[] = []
  let bytes = 0
  let pending: Buffer[] = []
  const onLine = (line: Buffer) => {
    const lineNo = keys.length + 1
    const ascii = isAscii(line)
    // Python writes ASCII (ensure_ascii); other writers may write UTF-8, which must be valid.
    if (!ascii && !isUtf8(line)) throw new CheckpointStateError(`${recordsPath} line ${lineNo} holds a record that is not UTF-8`)
    // Fast path: the episode read off the line's start, the rest only checked to be JSON.
    const quick = episodeFromPrefix(line)
    if (quick) {
      const ep = EpisodeIdWire.safeParse({rollout_id: quick.rolloutId, attempt: quick.attempt})
      if (!ep.success) throw new CheckpointStateError(`${recordsPath} line ${lineNo}: checkpoint record has no valid episode_id`)
      const key = captureKey(quick)
      if (!opts.keep?.has(key)) {
        if (!isJsonValue(line)) throw new CheckpointStateError(`${recordsPath} line ${lineNo} holds a record that is not JSON`)
        keys.push(key)
        return
      }
    }
    // Decoded exactly (key order, NaN, big integers); in this codec that is also faster than JSON.parse.
    const lineText = ascii ? line.toString('latin1') : line.toString('utf8')
    let decoded: PyValue
    try {
      decoded = pyLoads(lineText)
    } catch {
      throw new CheckpointStateError(`${recordsPath} line ${lineNo} holds a record that is not JSON`)
    }
    const e = isPyDict(decoded) ? pyGet(decoded, 'episode_id') : undefined
    const ep = EpisodeIdWire.safeParse(e instanceof Map ? Object.fromEntries(e) : e)
    if (!ep.success) throw new CheckpointStateError(`${recordsPath} line ${lineNo}: checkpoint record has no valid episode_id`)
    const key = captureKey(fromWire(ep.data))
    keys.push(key)
    if (opts.keep?.has(key)) kept.push({key, record: decoded})
  }
  const stream = createReadStream(recordsPath, {highWaterMark: READ_CHUNK})
  for await (const chunk of stream as AsyncIterable<Buffer>) {
    hash.update(chunk)
    bytes += chunk.length
    let start = 0
    for (;;) {
      const nl = chunk.indexOf(0x0a, start)
      if (nl < 0) break
      const piece = chunk.subarray(start, nl)
      if (pending.length) {
        pending.push(piece)
        onLine(Buffer.concat(pending))
        pending = []
      } else onLine(piece)
      start = nl + 1
    }
    if (start < chunk.length) pending.push(chunk.subarray(start))
  }
  if (pending.length) onLine(Buffer.concat(pending))
  const sha = hash.digest('hex')
  if (m.records_sha256 !== sha) throw new CheckpointStateError(`${recordsPath} does not match its manifest digest`)
  const named = /^records-([0-9a-f]{64})\.jsonl$/.exec(m.records_file)?.[1]
  if (base !== null && named !== undefined && named !== sha) {
    throw new CheckpointStateError(`${recordsPath} is named for sha256 ${named}, but its content and its manifest's records_sha256 are ${sha}`)
  }
  if (m.record_count !== keys.length) throw new CheckpointStateError(`${manifestPath} expects ${JSON.stringify(m.record_count)} records, found ${keys.length}`)
  return {dir, manifest: m as ParticipantManifest, keys, kept, bytes}
}

/**
 * Throws when `target` (under `root`, whose real path is `base`) resolves outside `base`, naming
 * the first symlink on the way that leaves it. A path that does not exist is left to the reader.
 */
async function staysInside(root: string, base: string, target: string): Promise<void> {
  const inside = (p: string) => {
    const rel = path.relative(base, p)
    return rel !== '..' && !rel.startsWith('..' + path.sep) && !path.isAbsolute(rel)
  }
  let real: string
  try {
    real = await realpath(target)
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return
    throw err
  }
  if (inside(real)) return
  // The link to name: the first component below the checkpoint directory that is a symlink out.
  const parts = path.relative(root, target).split(path.sep)
  let p = root
  for (const part of parts) {
    p = path.join(p, part)
    if (!(await lstat(p)).isSymbolicLink()) continue
    const to = await realpath(p)
    if (!inside(to)) throw new CheckpointStateError(`${p} is a symlink to ${to}, outside the checkpoint directory ${base}`)
  }
  throw new CheckpointStateError(`${target} resolves to ${real}, outside the checkpoint directory ${base}`)
}

/**
 * Sorts capture keys in place and returns the keys that occur more than once (with how often),
 * at most `max` of them, plus how many there are in all. Nothing but the list itself is held.
 */
export function sortFindDuplicates(keys: string[], max = 10): {count: number; first: {key: string; records: number}[]} {
  keys.sort()
  const first: {key: string; records: number}[] = []
  let count = 0
  for (let i = 1; i < keys.length; ) {
    if (keys[i] !== keys[i - 1]) {
      i++
      continue
    }
    let j = i + 1
    while (j < keys.length && keys[j] === keys[i]) j++
    count++
    if (first.length < max) first.push({key: keys[i]!, records: j - i + 1})
    i = j
  }
  return {count, first}
}
