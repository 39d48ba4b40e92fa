import {isAscii, isUtf8} from 'node:buffer'
import path from 'node:path'

import {RESERVED_SUFFIX, SAFE_ID_PATTERN, captureKey, fromWire, wireEpisode} from '../protocol/episode.js'
import type {ParticipantManifest} from '../protocol/wire.js'
import {CheckpointStateError, WriteStoppedError} from './errors.js'
import {JsonScanner, PREFIX_BYTES, ScanError, episodeFromPrefix} from './jsonscan.js'
import {allInOrder, createExclusive, fsyncDir, fsyncUpTo, tempName} from './fsutil.js'
import {type Hasher, loadCrypto, sha256Hasher} from './sha256.js'
import {MAX_NESTING, PyValue, isPyDict, pyGet, pyLoads} from './pyjson.js'

// node:fs and node:fs/promises come from process.getBuiltinModule, not an import: see fsutil.ts.
const {lstat, mkdir, open, readFile, realpath, rename, unlink} = process.getBuiltinModule('node:fs/promises')

export const STATE_SCHEMA_VERSION = 1
export const MANIFEST_FILE = 'manifest.json'
export const RECORDS_FILE_PATTERN = /^records(-[0-9a-f]{64})?\.jsonl$/
export const EMPTY_SHA256 = 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'

export function participantDir(checkpointDir: string, kind: string, instance: string): string {
  for (const [what, v] of [
    ['kind', kind],
    ['instance', instance],
  ] as const) {
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
    const hash = (await loadCrypto()).createHash('sha256')
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
    // Two batch buffers: one is written (in the thread pool) while the next is filled, so encoding
    // and the disk overlap. Writes name their file position, so their order cannot matter.
    const batches = [Buffer.allocUnsafe(WRITE_BUFFER_BYTES), Buffer.allocUnsafe(WRITE_BUFFER_BYTES)]
    let batch = batches[0]!
    let used = 0
    let position = 0
    let inflight: Promise<unknown> | null = null
    // A write may write less than asked (a disk filling up, a signal): the rest is written, or its
    // error raised, so the file is never shorter than the digest it is named for.
    const writeAll = async (b: Buffer, n: number, at: number) => {
      for (let off = 0; off < n;) {
        const {bytesWritten} = await fh.write(b, off, n - off, at + off)
        if (bytesWritten <= 0) throw new Error(`writing ${tmp} made no progress at byte ${at + off}`)
        off += bytesWritten
      }
    }
    const writeAt = async (b: Buffer, n: number) => {
      if (inflight) await inflight
      const w = writeAll(b, n, position)
      // Raised where it is awaited; until then a failure must not count as unhandled.
      w.catch(() => {})
      inflight = w
      position += n
    }
    /** Starts writing the current batch and switches to the other one (once its write is done). */
    const flush = async () => {
      if (!used) return
      await writeAt(batch, used)
      batch = batch === batches[0] ? batches[1]! : batches[0]!
      used = 0
    }
    try {
      // A line is hashed and copied before anything awaits: it may be a view of the encoder's
      // scratch buffer, which the next record encoded anywhere in this process overwrites (other
      // participants of one process commit at the same time). So a sync iterable is read without
      // `for await`, whose microtask hops let another writer encode in between. A line that does
      // not fit in the batch is first copied whole into a private spill.
      let spill: Buffer | null = null
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
        await flush()
        if (n <= batch.length) used = spill.copy(batch, 0, 0, n)
        else {
          // The spill is reused by the next large line: its write is waited for.
          await writeAt(spill, n)
          await inflight
        }
      }
      await flush()
      await inflight
      await fh.sync()
    } finally {
      // A write still running is waited for (its error was or will be raised) before the close.
      await (inflight as Promise<unknown> | null)?.catch(() => {})
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
  // Both resolved at once (each is a thread-pool round trip); a failure is reported in this order.
  if (base !== null) await allInOrder([staysInside(opts.within!, base, dir), staysInside(opts.within!, base, manifestPath)])
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
  const reader = new RecordsReader(recordsPath, opts.keep ?? null)
  let bytes = 0
  const fh = await open(recordsPath, 'r')
  let next: Promise<{bytesRead: number}> | null = null
  let sha: string
  try {
    let hash: Hasher | undefined
    // Two buffers: the next chunk is read while this one is hashed and scanned.
    const bufs = [Buffer.allocUnsafe(READ_CHUNK), Buffer.allocUnsafe(READ_CHUNK)]
    let which = 0
    next = fh.read(bufs[0]!, 0, READ_CHUNK, 0)
    for (;;) {
      const {bytesRead} = await next
      next = null
      if (bytesRead === 0) break
      const chunk = bufs[which]!.subarray(0, bytesRead)
      // A first read short of a chunk is (nearly always) the whole file: its size picks the hasher.
      hash ??= await sha256Hasher(bytesRead < READ_CHUNK ? bytesRead : Infinity)
      const at = bytes
      bytes += bytesRead
      which ^= 1
      next = fh.read(bufs[which]!, 0, READ_CHUNK, bytes)
      hash.update(chunk)
      try {
        reader.push(chunk, at)
      } catch (err) {
        // The first problem in file order: a line of this chunk to be read again may come first.
        for (const r of reader.takeRereads()) if (r.lineNo < reader.failedAt!) await readAgain(fh, reader, r)
        throw err
      }
      // A line that repeats its top-level episode_id is decoded whole: read it again.
      for (const r of reader.takeRereads()) await readAgain(fh, reader, r)
    }
    reader.end()
    sha = (hash ?? (await sha256Hasher(0))).digest('hex')
  } finally {
    await next?.catch(() => {})
    await fh.close()
  }
  const {keys, kept} = reader
  if (m.records_sha256 !== sha) throw new CheckpointStateError(`${recordsPath} does not match its manifest digest`)
  const named = /^records-([0-9a-f]{64})\.jsonl$/.exec(m.records_file)?.[1]
  if (base !== null && named !== undefined && named !== sha) {
    throw new CheckpointStateError(`${recordsPath} is named for sha256 ${named}, but its content and its manifest's records_sha256 are ${sha}`)
  }
  if (m.record_count !== keys.length) throw new CheckpointStateError(`${manifestPath} expects ${JSON.stringify(m.record_count)} records, found ${keys.length}`)
  return {dir, manifest: m as ParticipantManifest, keys, kept, bytes}
}

type FileHandle = Awaited<ReturnType<typeof open>>
type Reread = {index: number; lineNo: number; start: number; length: number}

/** A line that repeats its top-level episode_id, read again and decoded whole. */
async function readAgain(fh: FileHandle, reader: RecordsReader, r: Reread): Promise<void> {
  const line = Buffer.allocUnsafe(r.length)
  const {bytesRead: n} = await fh.read(line, 0, r.length, r.start)
  reader.decodeAgain(r, line.subarray(0, n))
}

const enum Mode {
  /** Gathering the line's first bytes, where its episode is read. */
  Head,
  /** Out of scope: checked by the streaming scanner, never held. */
  Scan,
  /** In scope, or its episode is not at its start: held and decoded whole. */
  Hold,
}

const NO_BYTES = Buffer.alloc(0)
const TOO_DEEP = ` holds a record nested deeper than ${MAX_NESTING} levels`

/**
 * Splits a records file's chunks into lines and checks each one as Gym's restore reads it: valid
 * UTF-8, one JSON value, a valid episode_id. A line whose episode (read off its start, where
 * Python writes it) is outside the kept scope is streamed through JsonScanner and never held, so
 * a record far larger than a chunk costs a chunk, not its size; a kept line, or one whose episode
 * is not at its start, is held and decoded exactly.
 */
class RecordsReader {
  readonly keys: string[] = []
  readonly kept: StoredRecord[] = []
  /** Line numbers of kept records, when a line read again put them out of file order. */
  private keptLines: number[] = []
  private reordered = false
  private mode = Mode.Head
  /** File offset of the current line's first byte, and its bytes so far. */
  private start = 0
  private length = 0
  private head: Buffer | null = null
  private held: Buffer[] = []
  private carry: Buffer = NO_BYTES
  private key = ''
  private readonly scanner = new JsonScanner()
  private rereads: Reread[] = []
  /** The line of the first problem found. */
  failedAt: number | undefined

  constructor(
    private readonly recordsPath: string,
    private readonly keep: ReadonlySet<string> | null,
  ) {}

  /** The next chunk, starting at file offset `at`. Its memory may be reused once this returns. */
  push(chunk: Buffer, at: number): void {
    let i = 0
    while (i <= chunk.length) {
      const nl = chunk.indexOf(0x0a, i)
      if (nl < 0) {
        if (i < chunk.length) this.piece(chunk, i, chunk.length, false, at)
        return
      }
      this.piece(chunk, i, nl, true, at)
      i = nl + 1
    }
  }

  /** The end of the file: a last line without its newline is still a record. */
  end(): void {
    if (this.length > 0 || this.mode !== Mode.Head || this.head !== null) this.piece(NO_BYTES, 0, 0, true, this.start + this.length)
  }

  takeRereads(): Reread[] {
    const r = this.rereads
    this.rereads = []
    return r
  }

  decodeAgain(r: {index: number; lineNo: number}, line: Buffer): void {
    const got = this.decode(line, r.lineNo)
    this.keys[r.index] = got.key
    if (got.record !== undefined) {
      this.kept.push({key: got.key, record: got.record})
      this.keptLines.push(r.lineNo)
      this.reordered = true
    }
    if (this.reordered) {
      // Kept records in file order, as they would be without the second read.
      const order = this.kept.map((k, i) => [this.keptLines[i]!, k] as const).sort((a, b) => a[0] - b[0])
      this.kept.length = 0
      this.keptLines = []
      for (const [n, k] of order) {
        this.kept.push(k)
        this.keptLines.push(n)
      }
    }
  }

  private fail(lineNo: number, what: string): never {
    this.failedAt ??= lineNo
    throw new CheckpointStateError(`${this.recordsPath} line ${lineNo}${what}`)
  }

  /** Bytes b[s, e) of the current line; `ends`: its newline (or the file's end) follows. */
  private piece(b: Buffer, s: number, e: number, ends: boolean, at: number): void {
    if (this.length === 0 && this.head === null) this.start = at + s
    this.length += e - s
    if (this.mode === Mode.Head) {
      const have = this.head?.length ?? 0
      if (have === 0 && (e - s >= PREFIX_BYTES || ends)) this.decide(b.subarray(s, Math.min(e, s + PREFIX_BYTES)))
      else {
        // The line's start is cut by the chunk's end: gathered first, then checked like the rest.
        const take = Math.min(e - s, PREFIX_BYTES - have)
        const head = Buffer.concat([this.head ?? NO_BYTES, b.subarray(s, s + take)])
        if (head.length < PREFIX_BYTES && !ends) {
          this.head = head
          return
        }
        this.head = null
        this.decide(head)
        s += take
        this.feed(head, 0, head.length, ends && s === e)
        if (s < e) this.feed(b, s, e, ends)
        if (ends) this.lineEnd()
        return
      }
    }
    this.feed(b, s, e, ends)
    if (ends) this.lineEnd()
  }

  /** Reads the episode off the line's start and chooses how the line is checked. */
  private decide(head: Buffer): void {
    const quick = episodeFromPrefix(head, false)
    if (quick && this.keep?.has(captureKey(quick)) !== true) {
      if (RESERVED_SUFFIX.test(quick.rolloutId)) this.fail(this.keys.length + 1, ': checkpoint record has no valid episode_id')
      this.key = captureKey(quick)
      this.mode = Mode.Scan
      this.scanner.reset()
      this.carry = NO_BYTES
    } else this.mode = Mode.Hold
  }

  private feed(b: Buffer, s: number, e: number, last: boolean): void {
    if (this.mode === Mode.Hold) {
      if (e > s) this.held.push(Buffer.from(b.subarray(s, e)))
      return
    }
    const sc = this.scanner
    let i = s
    if (this.carry.length) {
      // A token cut by the last chunk: finish it on a small bridge of its bytes and the next ones.
      let take = Math.min(e - s, 64)
      for (;;) {
        const bridge = Buffer.concat([this.carry, b.subarray(s, s + take)])
        const k = sc.feed(bridge, 0, bridge.length, last && s + take === e)
        if (sc.error) return this.scanFailed()
        if (k >= this.carry.length) {
          i = s + (k - this.carry.length)
          this.carry = NO_BYTES
          break
        }
        if (s + take === e) {
          this.carry = Buffer.from(bridge.subarray(k))
          return
        }
        take = Math.min(e - s, take * 4)
      }
      if (i === e && !last) return
    }
    const k = sc.feed(b, i, e, last)
    if (sc.error) return this.scanFailed()
    if (k < e) this.carry = Buffer.from(b.subarray(k, e))
  }

  private scanFailed(): void {
    const e = this.scanner.error
    this.fail(this.keys.length + 1, e === ScanError.Utf8 ? ' holds a record that is not UTF-8' : e === ScanError.Depth ? TOO_DEEP : ' holds a record that is not JSON')
  }

  private lineEnd(): void {
    const lineNo = this.keys.length + 1
    if (this.mode === Mode.Scan) {
      if (!this.scanner.complete) this.scanFailed()
      if (this.scanner.episodeKeys === 1) this.keys.push(this.key)
      else {
        // Python keeps the last of repeated keys: the line is decoded whole, read again.
        this.rereads.push({index: this.keys.length, lineNo, start: this.start, length: this.length})
        this.keys.push('')
      }
    } else {
      const line = this.held.length === 1 ? this.held[0]! : Buffer.concat(this.held)
      const got = this.decode(line, lineNo)
      this.keys.push(got.key)
      if (got.record !== undefined) {
        this.kept.push({key: got.key, record: got.record})
        this.keptLines.push(lineNo)
      }
    }
    this.mode = Mode.Head
    this.held = []
    this.head = null
    this.carry = NO_BYTES
    this.length = 0
  }

  /** A whole line decoded exactly (key order, NaN, big integers); the record when it is kept. */
  private decode(line: Buffer, lineNo: number): {key: string; record?: PyValue} {
    const ascii = isAscii(line)
    // Python writes ASCII (ensure_ascii); other writers may write UTF-8, which must be valid.
    if (!ascii && !isUtf8(line)) this.fail(lineNo, ' holds a record that is not UTF-8')
    let decoded: PyValue
    try {
      decoded = pyLoads(ascii ? line.toString('latin1') : line.toString('utf8'))
    } catch (err) {
      // The same words as the scanner's: verify and restore name a too-deep record alike.
      this.fail(lineNo, /nest/.test((err as Error).message) ? TOO_DEEP : ' holds a record that is not JSON')
    }
    const e = isPyDict(decoded) ? pyGet(decoded, 'episode_id') : undefined
    const ep = wireEpisode(e instanceof Map ? Object.fromEntries(e) : e)
    if (ep === null) this.fail(lineNo, ': checkpoint record has no valid episode_id')
    const key = captureKey(fromWire(ep))
    return this.keep?.has(key) ? {key, record: decoded} : {key}
  }
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
  for (let i = 1; i < keys.length;) {
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
