import {constants} from 'node:fs'
import {FileHandle, open, readFile} from 'node:fs/promises'
import path from 'node:path'
import {z} from 'zod'

import {CheckpointStateError} from './errors.js'
import {fsyncDir} from './fsutil.js'
import {describeFsError} from './root.js'

/** The restore log of a checkpoint root: one JSON line per restore attempt, appended, never rewritten. */
export const RESTORE_LOG = 'restores.jsonl'

export const RestoreOutcome = z.enum(['restored', 'failed', 'refused'])
export type RestoreOutcome = z.infer<typeof RestoreOutcome>

/** One line of the restore log, as written (snake_case, RFC 3339 time). Unknown keys are dropped on read. */
export const RestoreLogEntry = z.object({
  restore_id: z.string().min(1),
  /** When the attempt began. */
  time: z.iso.datetime({offset: true}),
  checkpoint_id: z.string().min(1),
  checkpoint_dir: z.string(),
  outcome: RestoreOutcome,
  /** The attempt's error message (for 'restored': a failure after the state was installed, such as the resume). */
  error: z.string().nullable(),
  /** Participants the restore addressed. */
  participants: z.number().int().min(0),
})
export type RestoreLogEntry = z.infer<typeof RestoreLogEntry>

// O_NOFOLLOW: a restores.jsonl that is a symbolic link is refused, never followed out of the root.
const APPEND = constants.O_WRONLY | constants.O_APPEND | constants.O_NOFOLLOW

async function openForAppend(file: string): Promise<{fh: FileHandle; created: boolean}> {
  try {
    return {fh: await open(file, APPEND | constants.O_CREAT | constants.O_EXCL, 0o644), created: true}
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err
  }
  return {fh: await open(file, APPEND), created: false}
}

/**
 * Appends one entry to ROOT/restores.jsonl (created when missing) with O_APPEND in one write, and
 * fsyncs it (and the root when the file is new). If an earlier append was torn by a crash, the
 * entry starts on a new line so that it stays whole. Throws a CheckpointStateError naming the file.
 */
export async function appendRestoreLog(root: string, entry: RestoreLogEntry): Promise<void> {
  const file = path.join(root, RESTORE_LOG)
  const line = JSON.stringify(RestoreLogEntry.parse(entry)) + '\n'
  try {
    const {fh, created} = await openForAppend(file)
    try {
      const {size} = await fh.stat()
      const torn = size > 0 && (await lastByte(file, size)) !== 0x0a
      let buf = Buffer.from(torn ? `\n${line}` : line)
      while (buf.length) {
        const {bytesWritten} = await fh.write(buf)
        buf = buf.subarray(bytesWritten)
      }
      await fh.sync()
    } finally {
      await fh.close()
    }
    if (created) await fsyncDir(root)
  } catch (err) {
    throw new CheckpointStateError(`cannot append to the restore log ${file}: ${describeFsError(err)}`)
  }
}

async function lastByte(file: string, size: number): Promise<number | undefined> {
  const fh = await open(file, constants.O_RDONLY | constants.O_NOFOLLOW)
  try {
    const b = Buffer.alloc(1)
    const {bytesRead} = await fh.read(b, 0, 1, size - 1)
    return bytesRead ? b[0] : undefined
  } finally {
    await fh.close()
  }
}

export interface RestoreLog {
  file: string
  /** In the order they were appended. */
  entries: RestoreLogEntry[]
  /**
   * Lines that are not an entry, other than a torn last line (which is ignored silently): a torn
   * line followed by later appends, or text someone else wrote. They are skipped.
   */
  skipped: number
}

/** Reads ROOT/restores.jsonl; a missing file is an empty log. A torn last line is ignored. */
export async function readRestoreLog(root: string): Promise<RestoreLog> {
  const file = path.join(root, RESTORE_LOG)
  let text: string
  try {
    const fh = await open(file, constants.O_RDONLY | constants.O_NOFOLLOW)
    try {
      text = await readFile(fh, 'utf8')
    } finally {
      await fh.close()
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {file, entries: [], skipped: 0}
    throw new CheckpointStateError(`cannot read the restore log ${file}: ${describeFsError(err)}`)
  }
  const lines = text.split('\n')
  // The text after the last newline is an unfinished append (or nothing): used only if whole.
  const unterminated = lines.pop() ?? ''
  const entries: RestoreLogEntry[] = []
  let skipped = 0
  for (const line of lines) {
    if (!line.trim()) continue
    const e = parseEntry(line)
    if (e) entries.push(e)
    else skipped++
  }
  const last = unterminated.trim() ? parseEntry(unterminated) : null
  if (last) entries.push(last)
  return {file, entries, skipped}
}

function parseEntry(line: string): RestoreLogEntry | null {
  let raw: unknown
  try {
    raw = JSON.parse(line)
  } catch {
    return null
  }
  const p = RestoreLogEntry.safeParse(raw)
  return p.success ? p.data : null
}
