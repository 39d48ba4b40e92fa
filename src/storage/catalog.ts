import type {Dirent} from 'node:fs'
import {lstat, readFile, readdir, stat} from 'node:fs/promises'
import path from 'node:path'

import {type EpisodeIdWire, SAFE_ID_PATTERN, quoteInput} from '../protocol/episode.js'
import {ParticipantManifest} from '../protocol/wire.js'
import {mapLimit} from './fsutil.js'
import {CheckpointStateError} from './errors.js'
import {MANIFEST_FILE, RECORDS_FILE_PATTERN} from './participant-store.js'
import {RestoreLogEntry, readRestoreLog} from './restore-log.js'
import {CONTROLLER_MANIFEST, CheckpointSummary, GYM_COLLECTION_MANIFEST, LATEST_FILE, describeFsError, readCheckpointSummary, readLatest} from './root.js'

// What `list` and `describe` read: manifests, LATEST, the restore log and stat sizes. Never a
// records file (describe --verify hands that to verifyCheckpoint), so listing stays fast on any root.

/**
 * published: it has a controller manifest (gymckpt.json or Gym's collection.json);
 * partial: it has none (a commit that never finished, or one still running);
 * unreadable: its manifest exists but cannot be read or is not a manifest (see `error`).
 */
export type CheckpointState = 'published' | 'partial' | 'unreadable'

export interface CatalogEntry {
  id: string
  dir: string
  state: CheckpointState
  /** LATEST names it. */
  latest: boolean
  manifest: CheckpointSummary['source'] | null
  /** Epoch seconds: the manifest's created_at, or for a checkpoint without a readable one its directory's mtime. */
  createdAt: number
  ageSeconds: number
  /** Sum of the sizes of its files (stat, symbolic links not followed). */
  sizeBytes: number
  /** gym/<kind>/<instance> directories on disk. */
  participants: number
  /** From the manifest; null without one. */
  continued: number | null
  restarted: number | null
  error: string | null
}

export interface Catalog {
  root: string
  latest: string | null
  /** Newest first. */
  checkpoints: CatalogEntry[]
  warnings: string[]
}

export interface CatalogOptions {
  /** Epoch milliseconds that ages are measured against (default: now). */
  now?: number
}

/** Directories listed at once: a root of hundreds of checkpoints is stat calls, not waiting. */
const CONCURRENCY = 16

async function rootDir(root: string): Promise<string> {
  const abs = path.resolve(root)
  let st
  try {
    st = await stat(abs)
  } catch (err) {
    throw new CheckpointStateError(`checkpoint root ${abs}: ${describeFsError(err)}`)
  }
  if (!st.isDirectory()) throw new CheckpointStateError(`checkpoint root ${abs} is not a directory`)
  return abs
}

/** LATEST, or null with a warning when it cannot be read: a listing still shows what is there. */
async function latestOrWarn(root: string, warnings: string[]): Promise<string | null> {
  try {
    return await readLatest(root)
  } catch (err) {
    if (!(err instanceof CheckpointStateError)) throw err
    warnings.push(`${err.message}; no checkpoint is marked LATEST`)
    return null
  }
}

/** A directory is a checkpoint when it holds gym/ or a controller manifest (as prune decides). */
function looksLikeCheckpoint(entries: Dirent[]): boolean {
  return entries.some((e) => e.name === 'gym' || e.name === CONTROLLER_MANIFEST || e.name === GYM_COLLECTION_MANIFEST)
}

/** Total file size under `dir` and its gym/<kind>/<instance> directories; links are not followed. */
async function footprint(dir: string, top: Dirent[]): Promise<{bytes: number; participants: number}> {
  let bytes = 0
  let participants = 0
  const walk = async (d: string, depth: number, inGym: boolean): Promise<void> => {
    const entries = depth === 0 ? top : await readdir(d, {withFileTypes: true})
    await Promise.all(
      entries.map(async (e) => {
        const p = path.join(d, e.name)
        if (e.isDirectory()) {
          const gym = inGym || (depth === 0 && e.name === 'gym')
          if (gym && depth === 2) participants++
          await walk(p, depth + 1, gym)
        } else if (e.isFile()) {
          // Awaited first: `bytes += await …` would add to the value read before the await.
          const {size} = await lstat(p).catch(() => ({size: 0}))
          bytes += size
        }
      }),
    )
  }
  await walk(dir, 0, false)
  return {bytes, participants}
}

/** A checkpoint directory's entry, and the manifest it was read from (null: none, or unreadable). */
async function inspect(dir: string, top: Dirent[], latest: string | null, now: number): Promise<{entry: CatalogEntry; summary: CheckpointSummary | null}> {
  const id = path.basename(dir)
  let summary: CheckpointSummary | null = null
  let manifestError: string | null = null
  try {
    summary = await readCheckpointSummary(dir)
  } catch (err) {
    if (!(err instanceof CheckpointStateError)) throw err
    manifestError = err.message
  }
  let fp = {bytes: 0, participants: 0}
  let listError: string | null = null
  try {
    fp = await footprint(dir, top)
  } catch (err) {
    listError = `cannot list everything under ${dir}: ${describeFsError(err)}`
  }
  // Without a manifest nothing says when it was made: its directory's mtime is the best there is.
  const createdAt = summary?.createdAt ?? ((await lstat(dir).catch(() => null))?.mtimeMs ?? 0) / 1000
  const entry: CatalogEntry = {
    id,
    dir,
    state: manifestError !== null ? 'unreadable' : summary ? 'published' : 'partial',
    latest: id === latest,
    manifest: summary?.source ?? null,
    createdAt,
    ageSeconds: Math.max(0, Math.floor(now / 1000 - createdAt)),
    sizeBytes: fp.bytes,
    participants: fp.participants,
    continued: summary ? summary.continued.length : null,
    restarted: summary ? summary.restarted.length : null,
    error: manifestError ?? listError,
  }
  return {entry, summary}
}

function newestFirst(a: CatalogEntry, b: CatalogEntry): number {
  return b.createdAt - a.createdAt || (a.id < b.id ? 1 : a.id > b.id ? -1 : 0)
}

/**
 * Every checkpoint directory in a root, newest first, from manifests and stat sizes only. A
 * directory that is not a checkpoint, a file, and a symbolic link are not listed (as prune leaves
 * them alone); an unreadable manifest or LATEST is reported on its entry or as a warning, not thrown.
 */
export async function listCheckpoints(root: string, opts: CatalogOptions = {}): Promise<Catalog> {
  const abs = await rootDir(root)
  const now = opts.now ?? Date.now()
  const warnings: string[] = []
  const latest = await latestOrWarn(abs, warnings)
  let names: Dirent[]
  try {
    names = await readdir(abs, {withFileTypes: true})
  } catch (err) {
    throw new CheckpointStateError(`cannot list checkpoint root ${abs}: ${describeFsError(err)}`)
  }
  if (looksLikeCheckpoint(names)) warnings.push(`${abs} looks like a checkpoint directory, not a checkpoint root: gymckpt describe ${abs} shows it`)
  // Dirent types come with the listing (no stat); a symbolic link is neither a directory nor listed.
  const found = await mapLimit(
    names.filter((d) => d.isDirectory()),
    CONCURRENCY,
    async ({name}): Promise<CatalogEntry | null> => {
      const dir = path.join(abs, name)
      let inside: Dirent[]
      try {
        inside = await readdir(dir, {withFileTypes: true})
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null
        warnings.push(`cannot list ${dir}: ${describeFsError(err)}; not listed`)
        return null
      }
      return looksLikeCheckpoint(inside) ? (await inspect(dir, inside, latest, now)).entry : null
    },
  )
  const checkpoints = found.filter((e): e is CatalogEntry => e !== null).sort(newestFirst)
  if (latest !== null && !checkpoints.some((c) => c.latest)) warnings.push(`${path.join(abs, LATEST_FILE)} names '${latest}', which is not a checkpoint directory in this root`)
  return {root: abs, latest, checkpoints, warnings}
}

export interface DescribedParticipant {
  kind: string
  instance: string
  /** The server that committed it (gymckpt.json only). */
  server: string | null
  /** Its manifest.json's record_count. */
  records: number | null
  /** The records file's size (stat). */
  bytes: number | null
  recordsFile: string | null
  recordsSha256: string | null
  /** What is wrong with its directory or manifest; null when both read. */
  error: string | null
  /** With --verify: verifyCheckpoint's counts for this participant. */
  verify: {ok: boolean; inScope: number; outsideScope: number; scopeWithoutRecord: number} | null
}

export interface CheckpointDescription {
  /** The root whose restore log was read: the root given, or a checkpoint directory's parent. */
  root: string
  entry: CatalogEntry
  /** The controller manifest; null for a partial or unreadable checkpoint. */
  manifest: {file: CheckpointSummary['source']; createdAt: number; continued: EpisodeIdWire[]; restarted: EpisodeIdWire[]; runId: string | null} | null
  participants: DescribedParticipant[]
  /** Restores recorded for this checkpoint in ROOT/restores.jsonl, oldest first. */
  restores: RestoreLogEntry[]
  /** With --verify: the full offline verification. */
  verify: import('./verify.js').VerifyReport | null
  warnings: string[]
}

export interface DescribeOptions extends CatalogOptions {
  /** Run verifyCheckpoint too (reads every records file). */
  verify?: boolean
}

async function readJson(file: string): Promise<unknown> {
  return JSON.parse(await readFile(file, 'utf8'))
}

/** The run ID of Gym's collection.json, when the checkpoint has one. */
async function gymRunId(dir: string): Promise<string | null> {
  const raw = await readJson(path.join(dir, GYM_COLLECTION_MANIFEST)).catch(() => null)
  const runId = (raw as {run_id?: unknown} | null)?.run_id
  return typeof runId === 'string' ? runId : null
}

async function participantDirs(checkpointDir: string): Promise<{kind: string; instance: string; dir: string}[]> {
  const gym = path.join(checkpointDir, 'gym')
  const out: {kind: string; instance: string; dir: string}[] = []
  const kinds = await readdir(gym, {withFileTypes: true}).catch(() => [])
  for (const k of kinds.filter((e) => e.isDirectory()).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const instances = await readdir(path.join(gym, k.name), {withFileTypes: true}).catch(() => [])
    for (const i of instances.filter((e) => e.isDirectory()).sort((a, b) => (a.name < b.name ? -1 : 1))) out.push({kind: k.name, instance: i.name, dir: path.join(gym, k.name, i.name)})
  }
  return out
}

/** A participant from its manifest.json and the records file's stat; nothing else is read. */
async function describeParticipant(p: {kind: string; instance: string; dir: string}, server: string | null): Promise<DescribedParticipant> {
  const out: DescribedParticipant = {kind: p.kind, instance: p.instance, server, records: null, bytes: null, recordsFile: null, recordsSha256: null, error: null, verify: null}
  const manifestPath = path.join(p.dir, MANIFEST_FILE)
  let raw: unknown
  try {
    raw = await readJson(manifestPath)
  } catch (err) {
    out.error = err instanceof SyntaxError ? `${manifestPath} is not JSON` : `cannot read ${manifestPath}: ${describeFsError(err)}`
    return out
  }
  const m = ParticipantManifest.safeParse(raw)
  if (!m.success) {
    out.error = `${manifestPath} is not a participant manifest`
    return out
  }
  out.records = m.data.record_count
  out.recordsSha256 = m.data.records_sha256
  // A name from disk is used as a path only when it is a records file name: never ../ or a path.
  if (!RECORDS_FILE_PATTERN.test(m.data.records_file)) {
    out.error = `${manifestPath} names an invalid records file ${quoteInput(m.data.records_file)}`
    return out
  }
  out.recordsFile = m.data.records_file
  try {
    out.bytes = (await lstat(path.join(p.dir, m.data.records_file))).size
  } catch (err) {
    out.error = `records file ${path.join(p.dir, m.data.records_file)}: ${describeFsError(err)}`
  }
  return out
}

/**
 * One checkpoint of a root (`id`, default the one LATEST names) or a checkpoint directory given
 * itself: its catalog entry, its controller manifest, each participant from its manifest.json and
 * a stat of its records file, and the restores recorded for it in the root's restore log. With
 * `verify`, the full offline verification too.
 */
export async function describeCheckpoint(location: string, id?: string, opts: DescribeOptions = {}): Promise<CheckpointDescription> {
  const abs = await rootDir(location)
  const now = opts.now ?? Date.now()
  const warnings: string[] = []
  let root = abs
  let checkpointDir: string
  // A checkpoint directory given itself (not a root): its restores are in its parent's log.
  let given = false
  let latest = await latestOrWarn(abs, warnings)
  if (id !== undefined) {
    if (!SAFE_ID_PATTERN.test(id)) throw new CheckpointStateError(`${quoteInput(id)} is not a valid checkpoint ID`)
    checkpointDir = path.join(abs, id)
  } else {
    if (latest !== null) {
      checkpointDir = path.join(abs, latest)
    } else if (looksLikeCheckpoint(await readdir(abs, {withFileTypes: true}).catch(() => []))) {
      given = true
      checkpointDir = abs
      root = path.dirname(abs)
      latest = await readLatest(root).catch(() => null)
    } else {
      const why = warnings.length ? warnings.join('; ') : `${abs} has no ${LATEST_FILE} (nothing is published) and is not a checkpoint directory`
      throw new CheckpointStateError(`${why}: name a checkpoint ID (gymckpt list ${abs} shows them)`)
    }
  }
  const st = await lstat(checkpointDir).catch(() => null)
  if (!st?.isDirectory()) {
    throw new CheckpointStateError(`no checkpoint directory ${checkpointDir}${st ? ' (it is not a directory)' : ''}: gymckpt list ${root} shows the checkpoints there`)
  }
  const {entry, summary} = await inspect(checkpointDir, await readdir(checkpointDir, {withFileTypes: true}).catch(() => []), latest, now)
  const manifest = summary ? {file: summary.source, createdAt: summary.createdAt, continued: summary.continued, restarted: summary.restarted, runId: await gymRunId(checkpointDir)} : null

  const servers = new Map((summary?.participants ?? []).map((p) => [`${p.kind}/${p.instance}`, p.server]))
  const onDisk = await participantDirs(checkpointDir)
  const participants = await Promise.all(onDisk.map((p) => describeParticipant(p, servers.get(`${p.kind}/${p.instance}`) ?? null)))
  // A participant the manifest names but whose directory is gone is shown, not dropped.
  for (const p of summary?.participants ?? []) {
    if (!onDisk.some((d) => d.kind === p.kind && d.instance === p.instance)) {
      participants.push({
        kind: p.kind,
        instance: p.instance,
        server: p.server,
        records: null,
        bytes: null,
        recordsFile: null,
        recordsSha256: null,
        error: `no directory gym/${p.kind}/${p.instance}`,
        verify: null,
      })
    }
  }

  let restores: RestoreLogEntry[] = []
  try {
    const log = await readRestoreLog(root)
    restores = log.entries.filter((r) => r.checkpoint_id === entry.id)
    if (log.skipped) warnings.push(`${log.file}: ${log.skipped} line(s) that are not restore entries were skipped (a torn append, or text written by something else)`)
  } catch (err) {
    if (!(err instanceof CheckpointStateError)) throw err
    warnings.push(`${err.message}; restores not shown`)
  }

  let verify: CheckpointDescription['verify'] = null
  if (opts.verify) {
    const {verifyCheckpoint} = await import('./verify.js')
    verify = given ? await verifyCheckpoint(checkpointDir) : await verifyCheckpoint(abs, {id: entry.id})
    for (const p of participants) {
      const v = verify.participants.find((d) => d.kind === p.kind && d.instance === p.instance)
      if (v) p.verify = {ok: v.ok, inScope: v.inScope, outsideScope: v.outsideScope, scopeWithoutRecord: v.scopeWithoutRecord}
    }
  }
  return {root, entry, manifest, participants, restores, verify, warnings}
}

// ---------------------------------------------------------------- --json documents
// snake_case and RFC 3339, as every command's --json; counts are *_count, lists keep the plain name.

/** One checkpoint in `list --json` (and `describe --json`'s `checkpoint`). */
export function entryJson(e: CatalogEntry) {
  return {
    id: e.id,
    dir: e.dir,
    state: e.state,
    latest: e.latest,
    manifest: e.manifest,
    created: rfc3339(e.createdAt),
    age_seconds: e.ageSeconds,
    size_bytes: e.sizeBytes,
    participants: e.participants,
    continued_count: e.continued,
    restarted_count: e.restarted,
    error: e.error,
  }
}

/** `list --json`. */
export function catalogJson(c: Catalog) {
  return {root: c.root, latest: c.latest, checkpoints: c.checkpoints.map(entryJson), warnings: c.warnings}
}

/** `describe --json`. */
export function descriptionJson(d: CheckpointDescription) {
  return {
    root: d.root,
    checkpoint: entryJson(d.entry),
    manifest: d.manifest && {
      file: d.manifest.file,
      created: rfc3339(d.manifest.createdAt),
      run_id: d.manifest.runId,
      continued: d.manifest.continued,
      restarted: d.manifest.restarted,
    },
    participants: d.participants.map((p) => ({
      kind: p.kind,
      instance: p.instance,
      server: p.server,
      records: p.records,
      bytes: p.bytes,
      records_file: p.recordsFile,
      records_sha256: p.recordsSha256,
      error: p.error,
      ...(d.verify ? {ok: p.verify?.ok ?? false, in_scope: p.verify?.inScope ?? null, outside_scope: p.verify?.outsideScope ?? null, scope_without_record: p.verify?.scopeWithoutRecord ?? null} : {}),
    })),
    restores: d.restores,
    verify: d.verify && {valid: d.verify.ok, uncovered: d.verify.uncovered, problems: d.verify.problems},
    warnings: d.warnings,
  }
}

// ---------------------------------------------------------------- human output

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB']

/** 1536 → "1.5 KiB". */
export function formatBytes(n: number): string {
  let v = n
  let u = 0
  while (v >= 1024 && u < UNITS.length - 1) {
    v /= 1024
    u++
  }
  return u === 0 ? `${n} B` : `${v < 10 ? v.toFixed(1) : Math.round(v)} ${UNITS[u]}`
}

/** 3700 → "1h1m", as kubectl shows ages. */
export function formatAge(s: number): string {
  if (s < 60) return `${s}s`
  if (s < 3600) return `${Math.floor(s / 60)}m${s % 60 ? `${s % 60}s` : ''}`
  if (s < 86_400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60) ? `${Math.floor((s % 3600) / 60)}m` : ''}`
  return `${Math.floor(s / 86_400)}d${Math.floor((s % 86_400) / 3600) ? `${Math.floor((s % 86_400) / 3600)}h` : ''}`
}

/** Epoch seconds as RFC 3339 in UTC, to the millisecond. */
export function rfc3339(epochSeconds: number): string {
  return new Date(Math.round(epochSeconds * 1000)).toISOString()
}
