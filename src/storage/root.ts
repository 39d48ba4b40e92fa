import {isUtf8} from 'node:buffer'
import {lstat, readFile, readdir, stat} from 'node:fs/promises'
import path from 'node:path'
import {z} from 'zod'

import {EpisodeIdWire, SAFE_ID_PATTERN, clipInput, quoteInput} from '../protocol/episode.js'
import {ParticipantManifest} from '../protocol/wire.js'
import {CheckpointStateError} from './errors.js'
import {createExclusive, fsyncDir, replaceAtomic} from './fsutil.js'

/** The controller's own manifest, created in a checkpoint directory only after every commit succeeded. */
export const CONTROLLER_MANIFEST = 'gymckpt.json'
/** Gym's own rollout-collection controller writes this one; we read it too. */
export const GYM_COLLECTION_MANIFEST = 'collection.json'
export const LATEST_FILE = 'LATEST'
export const FORMAT_VERSION = 1

export const ControllerManifest = z.object({
  format_version: z.literal(FORMAT_VERSION),
  checkpoint_id: z.string().regex(SAFE_ID_PATTERN),
  created_at: z.number(),
  continued: z.array(EpisodeIdWire),
  restarted: z.array(EpisodeIdWire),
  participants: z.array(z.object({server: z.string(), kind: z.string(), instance: z.string(), manifest: ParticipantManifest, episode_ids: z.array(z.string())})),
  /** Opaque state the controller keeps with the checkpoint (the demo keeps completed results). */
  controller_state: z.unknown().optional(),
})
export type ControllerManifest = z.infer<typeof ControllerManifest>

export const GymCollectionManifest = z.looseObject({
  checkpoint_id: z.string(),
  run_id: z.string().optional(),
  created_at: z.number(),
  continued: z.array(EpisodeIdWire),
  restarted: z.array(EpisodeIdWire).default([]),
})

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

export async function writeControllerManifest(checkpointDir: string, m: ControllerManifest): Promise<void> {
  const target = path.join(checkpointDir, CONTROLLER_MANIFEST)
  const created = await createExclusive(target, JSON.stringify(m, null, 1) + '\n')
  if (!created) {
    const existing = await readFile(target, 'utf8')
    throw new CheckpointStateError(`${target} already exists (${existing.length} bytes); a published checkpoint is never rewritten`)
  }
  await fsyncDir(checkpointDir)
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
  const ours = await readJsonIfExists(path.join(checkpointDir, CONTROLLER_MANIFEST))
  if (ours !== undefined) {
    const p = ControllerManifest.safeParse(ours)
    if (!p.success) throw new CheckpointStateError(`${path.join(checkpointDir, CONTROLLER_MANIFEST)} is not a gymckpt manifest: ${describeIssue(p.error)}`)
    const m = p.data
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
  const gym = await readJsonIfExists(path.join(checkpointDir, GYM_COLLECTION_MANIFEST))
  if (gym !== undefined) {
    const p = GymCollectionManifest.safeParse(gym)
    if (!p.success) throw new CheckpointStateError(`${path.join(checkpointDir, GYM_COLLECTION_MANIFEST)} is not a Gym collection manifest: ${describeIssue(p.error)}`)
    const m = p.data
    return {source: GYM_COLLECTION_MANIFEST, checkpointId: m.checkpoint_id, createdAt: m.created_at, continued: m.continued, restarted: m.restarted, participants: null, controllerState: undefined}
  }
  return null
}

export function describeIssue(err: z.ZodError): string {
  const i = err.issues[0]
  return i ? `${i.path.join('.') || '(root)'}: ${i.message}` : 'invalid'
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
  const out: {kind: string; instance: string; dir: string}[] = []
  for (const kind of kinds.sort()) {
    const kdir = path.join(gym, kind)
    if (!(await isDirectory(kdir))) continue
    for (const instance of (await listDir(kdir, 'participant kind directory')).sort()) {
      const dir = path.join(kdir, instance)
      if (await isDirectory(dir)) out.push({kind, instance, dir})
    }
  }
  return out
}
