import {isUtf8} from 'node:buffer'
import path from 'node:path'

import {type EpisodeIdWire, SAFE_ID_PATTERN, clipInput, quoteInput, wireEpisode} from '../protocol/episode.js'
import type {ParticipantManifest} from '../protocol/wire.js'
import {CheckpointStateError} from './errors.js'
import {allInOrder, createExclusive, fsyncDir, mapLimit, replaceAtomic} from './fsutil.js'
import type {ControllerManifest, GymCollectionManifest} from './manifest-schemas.js'

// node:fs and node:fs/promises come from process.getBuiltinModule, not an import: see fsutil.ts.
const {lstat, readFile, readdir, rename, stat} = process.getBuiltinModule('node:fs/promises')

export type {ControllerManifest, GymCollectionManifest} from './manifest-schemas.js'

/** The controller's own manifest, created in a checkpoint directory only after every commit succeeded. */
export const CONTROLLER_MANIFEST = 'gymckpt.json'
/** Gym's own rollout-collection controller writes this one; we read it too. */
export const GYM_COLLECTION_MANIFEST = 'collection.json'
export const LATEST_FILE = 'LATEST'
export const FORMAT_VERSION = 1

/** What either manifest says, in one shape. */
export interface CheckpointSummary {
  source: typeof CONTROLLER_MANIFEST | typeof GYM_COLLECTION_MANIFEST
  checkpointId: string
  createdAt: number
  continued: EpisodeIdWire[]
  restarted: EpisodeIdWire[]
  participants: ControllerManifest['participants'] | null
  /** What the controller stored with the checkpoint (gymckpt.json's controller_state), if anything. */
  controllerState: unknown
}

/**
 * Makes the participants' directory entries durable before the controller manifest is written:
 * each `gym/<kind>/<instance>` (its manifest and records file), each `gym/<kind>`, then `gym`.
 * Gym's participants fsync their own directory once, after the manifest, and never gym/<kind> or
 * gym/ (reference 7.3), so after a power loss a published LATEST could name a checkpoint whose
 * participant state is gone. At most 16 at once. A missing directory is skipped: the publish gate
 * that follows names it.
 */
export async function syncParticipantDirs(checkpointDir: string, participants: readonly {kind: string; instance: string}[]): Promise<void> {
  const gym = path.join(checkpointDir, 'gym')
  const sync = (dir: string) =>
    fsyncDir(dir).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err
    })
  await mapLimit(
    participants.map((p) => path.join(gym, p.kind, p.instance)),
    16,
    sync,
  )
  await mapLimit(
    [...new Set(participants.map((p) => p.kind))].map((k) => path.join(gym, k)),
    16,
    sync,
  )
  await sync(gym)
}

export async function writeControllerManifest(checkpointDir: string, m: ControllerManifest): Promise<void> {
  const target = path.join(checkpointDir, CONTROLLER_MANIFEST)
  const created = await createExclusive(target, JSON.stringify(m, null, 1) + '\n')
  if (!created) {
    const existing = await readFile(target, 'utf8')
    throw new CheckpointStateError(`${target} already exists (${existing.length} bytes); a published checkpoint is never rewritten`)
  }
  await fsyncDir(checkpointDir)
}

/** Where a stateless commit records the scope of its first try: `ROOT/ID/.gymckpt-scope.json`. */
export const SCOPE_RECORD = '.gymckpt-scope.json'

/** The first try of a commit: the episodes the operator gave (capture keys, sorted) and the scope sent (in the order sent). */
export interface ScopeRecord {
  checkpoint_id: string
  given: string[] | null
  scope: string[] | null
}

/** The scope record in `checkpointDir`, or null when there is none (a record that does not parse is none). */
export async function readScopeRecord(checkpointDir: string): Promise<ScopeRecord | null> {
  let text: string
  try {
    text = await readFile(path.join(checkpointDir, SCOPE_RECORD), 'utf8')
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null
    throw err
  }
  try {
    const v = JSON.parse(text) as ScopeRecord
    const list = (x: unknown) => x === null || (Array.isArray(x) && x.every((k) => typeof k === 'string'))
    return typeof v.checkpoint_id === 'string' && list(v.given) && list(v.scope) ? v : null
  } catch {
    return null
  }
}

export async function writeScopeRecord(checkpointDir: string, r: ScopeRecord): Promise<void> {
  await replaceAtomic(path.join(checkpointDir, SCOPE_RECORD), JSON.stringify(r) + '\n')
}

/** What a controller manifest is renamed to when its checkpoint is refused: `gymckpt.refused.json`. */
export function refusedName(manifest: string): string {
  return manifest.replace(/\.json$/, '.refused.json')
}

/**
 * Sets the controller manifests of a checkpoint that was committed but refused (the publish gate)
 * aside under their refused names: a directory with gymckpt.json or collection.json counts as
 * published (list, prune's "newest published"), which a refused one must not. Returns the names
 * set aside; the content is kept for inspection.
 */
export async function setAsideControllerManifests(checkpointDir: string): Promise<string[]> {
  const moved: string[] = []
  for (const name of [CONTROLLER_MANIFEST, GYM_COLLECTION_MANIFEST]) {
    try {
      await rename(path.join(checkpointDir, name), path.join(checkpointDir, refusedName(name)))
      moved.push(refusedName(name))
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err
    }
  }
  if (moved.length) await fsyncDir(checkpointDir)
  return moved
}

/** Publication: LATEST is replaced atomically, so readers see the old or the new ID, never half. */
export async function publishLatest(root: string, checkpointId: string): Promise<void> {
  await replaceAtomic(path.join(root, LATEST_FILE), checkpointId)
}

const FS_CAUSES: Record<string, string> = {
  ENOENT: 'it does not exist',
  EISDIR: 'it is a directory, not a file',
  ENOTDIR: 'a part of the path is not a directory',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  ELOOP: 'too many levels of symbolic links',
  ENAMETOOLONG: 'the name is too long',
  EMFILE: 'too many open files',
  EIO: 'an I/O error',
  EROFS: 'the file system is read-only',
  ENOSPC: 'no space left on the device',
  EDQUOT: 'the disk quota is exceeded',
  EEXIST: 'it exists and is not a directory',
}

/** The real cause of a file system error in words, with its code: "it is a directory, not a file (EISDIR)". */
export function describeFsError(err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code
  if (code && FS_CAUSES[code]) return `${FS_CAUSES[code]} (${code})`
  return clipInput(err instanceof Error ? err.message : String(err))
}

/**
 * A file's text, or undefined when it does not exist. Any other failure, and bytes that are not
 * UTF-8, is a CheckpointStateError naming the file and the cause.
 */
async function readTextIfExists(file: string): Promise<string | undefined> {
  let bytes: Buffer
  try {
    bytes = await readFile(file)
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw new CheckpointStateError(`cannot read ${file}: ${describeFsError(err)}`)
  }
  if (!isUtf8(bytes)) throw new CheckpointStateError(`${file} is not UTF-8 text`)
  return bytes.toString('utf8')
}

/** The checkpoint ID LATEST names (surrounding whitespace, such as echo's newline, ignored), or null when there is no LATEST. */
export async function readLatest(root: string): Promise<string | null> {
  const file = path.join(root, LATEST_FILE)
  const text = await readTextIfExists(file)
  if (text === undefined) return null
  const id = text.trim()
  if (!id) throw new CheckpointStateError(`${file} is empty: it names no checkpoint`)
  if (!SAFE_ID_PATTERN.test(id)) throw new CheckpointStateError(`${file} names no valid checkpoint ID: ${quoteInput(id)}`)
  return id
}

async function readJsonIfExists(file: string): Promise<unknown | undefined> {
  const text = await readTextIfExists(file)
  if (text === undefined) return undefined
  try {
    return JSON.parse(text)
  } catch (err) {
    throw new CheckpointStateError(`${file} is not JSON (${clipInput((err as Error).message)})`)
  }
}

/** Reads the controller manifest of a checkpoint directory (ours, else Gym's), or null if none. */
export async function readCheckpointSummary(checkpointDir: string): Promise<CheckpointSummary | null> {
  const oursFile = path.join(checkpointDir, CONTROLLER_MANIFEST)
  const ours = await readJsonIfExists(oursFile)
  if (ours !== undefined) {
    const m = controllerManifestFast(ours) ?? (await schemaChecked(ours, oursFile, 'controller'))
    return {
      source: CONTROLLER_MANIFEST,
      checkpointId: m.checkpoint_id,
      createdAt: m.created_at,
      continued: m.continued,
      restarted: m.restarted,
      participants: m.participants,
      controllerState: m.controller_state,
    }
  }
  const gymFile = path.join(checkpointDir, GYM_COLLECTION_MANIFEST)
  const gym = await readJsonIfExists(gymFile)
  if (gym !== undefined) {
    const m = gymCollectionManifestFast(gym) ?? (await schemaChecked(gym, gymFile, 'gym'))
    return {source: GYM_COLLECTION_MANIFEST, checkpointId: m.checkpoint_id, createdAt: m.created_at, continued: m.continued, restarted: m.restarted, participants: null, controllerState: undefined}
  }
  return null
}

// zod (manifest-schemas.ts) is the authority on a manifest, but loading it is a third of verify's
// start-up. So a manifest is first checked by hand: the checks below return a manifest only when
// zod would accept the input and give the same output (no key that z.object would strip, defaults
// as zod applies them), and null whenever they are not certain, for zod to decide and word the
// problem. test/unit/manifest-fast-check.test.ts holds them to the schemas.

async function schemaChecked(v: unknown, file: string, which: 'controller'): Promise<ControllerManifest>
async function schemaChecked(v: unknown, file: string, which: 'gym'): Promise<GymCollectionManifest>
async function schemaChecked(v: unknown, file: string, which: 'controller' | 'gym'): Promise<ControllerManifest | GymCollectionManifest> {
  const schemas = await import('./manifest-schemas.js')
  const p = which === 'controller' ? schemas.ControllerManifest.safeParse(v) : schemas.GymCollectionManifest.safeParse(v)
  if (!p.success) throw new CheckpointStateError(`${file} is not ${which === 'controller' ? 'a gymckpt manifest' : 'a Gym collection manifest'}: ${schemas.describeIssue(p.error)}`)
  return p.data
}

type Obj = Record<string, unknown>

const isObject = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v)
const isString = (v: unknown): v is string => typeof v === 'string'
// z.number() refuses NaN and the infinities.
const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v)

/** `v` when it is an object whose keys (walked as zod walks them, for…in) are all in `keys`: nothing a z.object would strip. */
function closedObject(v: unknown, keys: ReadonlySet<string>): Obj | null {
  if (!isObject(v)) return null
  for (const k in v) if (!keys.has(k)) return null
  return v
}

/** The keys of a looseObject's input that zod keeps besides its shape, copied onto `out`; false for __proto__ (zod drops it). */
function copyExtras(o: Obj, shape: ReadonlySet<string>, out: Obj): boolean {
  for (const k in o) {
    if (shape.has(k)) continue
    if (k === '__proto__') return false
    out[k] = o[k]
  }
  return true
}

/** Each element through `item` into a new array, or null when `v` is no array or `item` refuses an element. */
function arrayOf<T>(v: unknown, item: (x: unknown) => T | null): T[] | null {
  if (!Array.isArray(v)) return null
  const out: T[] = []
  for (let i = 0; i < v.length; i++) {
    const x = item(v[i])
    if (x === null) return null
    out.push(x)
  }
  return out
}

const asString = (v: unknown): string | null => (isString(v) ? v : null)

const PARTICIPANT_MANIFEST_KEYS: ReadonlySet<string> = new Set(['schema_version', 'kind', 'instance', 'checkpoint_id', 'records_file', 'records_sha256', 'record_count'])

/** wire.ts's ParticipantManifest (a looseObject: extra keys kept), without zod; null when not certain. */
function participantManifestFast(v: unknown): ParticipantManifest | null {
  if (!isObject(v)) return null
  const {schema_version, kind, instance, checkpoint_id, records_file, records_sha256, record_count} = v
  if (!isNumber(schema_version) || !isString(kind) || !isString(instance) || !isString(checkpoint_id) || !isString(records_file) || !isString(records_sha256)) return null
  if (typeof record_count !== 'number' || !Number.isSafeInteger(record_count)) return null
  const out: Obj = {schema_version, kind, instance, checkpoint_id, records_file, records_sha256, record_count}
  return copyExtras(v, PARTICIPANT_MANIFEST_KEYS, out) ? (out as ParticipantManifest) : null
}

const PARTICIPANT_KEYS: ReadonlySet<string> = new Set(['server', 'kind', 'instance', 'manifest', 'episode_ids', 'staging_keys'])

function participantFast(v: unknown): ControllerManifest['participants'][number] | null {
  const o = closedObject(v, PARTICIPANT_KEYS)
  if (o === null || !isString(o.server) || !isString(o.kind) || !isString(o.instance)) return null
  const manifest = participantManifestFast(o.manifest)
  const episodeIds = arrayOf(o.episode_ids, asString)
  if (manifest === null || episodeIds === null) return null
  const p: ControllerManifest['participants'][number] = {server: o.server, kind: o.kind, instance: o.instance, manifest, episode_ids: episodeIds}
  if ('staging_keys' in o) {
    // As zod's .optional(): a key present with undefined stays, undefined.
    const staging = o.staging_keys === undefined ? undefined : arrayOf(o.staging_keys, asString)
    if (staging === null) return null
    p.staging_keys = staging
  }
  return p
}

const CONTROLLER_KEYS: ReadonlySet<string> = new Set(['format_version', 'checkpoint_id', 'created_at', 'continued', 'restarted', 'participants', 'controller_state'])

/** ControllerManifest.safeParse(v)'s output without zod, or null: refused, or not certain (zod decides). */
export function controllerManifestFast(v: unknown): ControllerManifest | null {
  const o = closedObject(v, CONTROLLER_KEYS)
  if (o === null || o.format_version !== FORMAT_VERSION || !isString(o.checkpoint_id) || !SAFE_ID_PATTERN.test(o.checkpoint_id) || !isNumber(o.created_at)) return null
  const continued = arrayOf(o.continued, wireEpisode)
  const restarted = arrayOf(o.restarted, wireEpisode)
  const participants = arrayOf(o.participants, participantFast)
  if (continued === null || restarted === null || participants === null) return null
  const m: ControllerManifest = {format_version: FORMAT_VERSION, checkpoint_id: o.checkpoint_id, created_at: o.created_at, continued, restarted, participants}
  if ('controller_state' in o) m.controller_state = o.controller_state
  return m
}

const GYM_KEYS: ReadonlySet<string> = new Set(['checkpoint_id', 'run_id', 'created_at', 'continued', 'restarted'])

/** GymCollectionManifest.safeParse(v)'s output without zod (a looseObject: extra keys kept), or null: refused, or not certain. */
export function gymCollectionManifestFast(v: unknown): GymCollectionManifest | null {
  if (!isObject(v) || !isString(v.checkpoint_id) || !isNumber(v.created_at)) return null
  if (v.run_id !== undefined && !isString(v.run_id)) return null
  const continued = arrayOf(v.continued, wireEpisode)
  const restarted = v.restarted === undefined ? [] : arrayOf(v.restarted, wireEpisode)
  if (continued === null || restarted === null) return null
  const out: Obj = {checkpoint_id: v.checkpoint_id}
  if ('run_id' in v) out.run_id = v.run_id
  out.created_at = v.created_at
  out.continued = continued
  out.restarted = restarted
  return copyExtras(v, GYM_KEYS, out) ? (out as GymCollectionManifest) : null
}

export interface ResolvedCheckpoint {
  /** The checkpoint root, when the path given was one (it holds LATEST). */
  root: string | null
  checkpointDir: string
  checkpointId: string
}

/**
 * Accepts a checkpoint root (follows LATEST, or `id` when given) or a checkpoint directory itself.
 */
export async function resolveCheckpoint(location: string, id?: string): Promise<ResolvedCheckpoint> {
  const abs = path.resolve(location)
  let st
  try {
    st = await stat(abs)
  } catch (err) {
    throw new CheckpointStateError(`${abs}: ${describeFsError(err)}`)
  }
  if (!st.isDirectory()) throw new CheckpointStateError(`${abs} is not a directory: give a checkpoint root (the directory holding ${LATEST_FILE}) or a checkpoint directory`)
  if (id !== undefined) {
    if (!SAFE_ID_PATTERN.test(id)) throw new CheckpointStateError(`${quoteInput(id)} is not a valid checkpoint ID`)
    return {root: abs, checkpointDir: path.join(abs, id), checkpointId: id}
  }
  const latest = await readLatest(abs)
  if (latest !== null) return {root: abs, checkpointDir: path.join(abs, latest), checkpointId: latest}
  const entries = await listDir(abs, 'checkpoint directory')
  if (entries.includes('gym') || entries.includes(CONTROLLER_MANIFEST) || entries.includes(GYM_COLLECTION_MANIFEST)) {
    return {root: null, checkpointDir: abs, checkpointId: path.basename(abs)}
  }
  throw new CheckpointStateError(`${abs} is neither a checkpoint root (no ${LATEST_FILE}) nor a checkpoint directory (no gym/ or manifest)`)
}

async function listDir(dir: string, what: string): Promise<string[]> {
  try {
    return await readdir(dir)
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code
    if (code === 'ENOTDIR') throw new CheckpointStateError(`${what} ${dir} is not a directory`)
    throw new CheckpointStateError(`cannot list ${what} ${dir}: ${describeFsError(err)}`)
  }
}

async function isDirectory(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isDirectory()
  } catch (err) {
    // Listed a moment ago, so ENOENT here is almost always a symbolic link to nothing.
    const dangling =
      (err as NodeJS.ErrnoException).code === 'ENOENT' &&
      (await lstat(p).then(
        (st) => st.isSymbolicLink(),
        () => false,
      ))
    throw new CheckpointStateError(dangling ? `${p} is a symbolic link to a path that does not exist` : `cannot read ${p}: ${describeFsError(err)}`)
  }
}

/**
 * Lists gym/<kind>/<instance> participant directories of a checkpoint directory. A missing gym/
 * is no participants; a gym/ that is not a directory, or anything unreadable, is an error. Stray
 * files among the kinds and instances are skipped.
 */
export async function listParticipantDirs(checkpointDir: string): Promise<{kind: string; instance: string; dir: string}[]> {
  const gym = path.join(checkpointDir, 'gym')
  let kinds: string[]
  try {
    kinds = await readdir(gym)
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code
    if (code === 'ENOENT') return []
    if (code === 'ENOTDIR') {
      if (!(await isDirectory(checkpointDir))) throw new CheckpointStateError(`checkpoint directory ${checkpointDir} is not a directory`)
      throw new CheckpointStateError(`${gym} is not a directory: it must hold one directory per participant kind`)
    }
    throw new CheckpointStateError(`cannot list ${gym}: ${describeFsError(err)}`)
  }
  // Every kind and instance looked at once; the first error in sorted order is the one raised.
  const perKind = await allInOrder(
    kinds.sort().map(async (kind) => {
      const kdir = path.join(gym, kind)
      if (!(await isDirectory(kdir))) return []
      const instances = (await listDir(kdir, 'participant kind directory')).sort()
      const dirs = await allInOrder(instances.map((instance) => isDirectory(path.join(kdir, instance))))
      return instances.filter((_, k) => dirs[k]).map((instance) => ({kind, instance, dir: path.join(kdir, instance)}))
    }),
  )
  return perKind.flat()
}
