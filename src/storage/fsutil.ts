import path from 'node:path'

// node:fs and node:fs/promises are taken with process.getBuiltinModule, here and in the other
// modules a short command loads (verify's fast path), not imported: an ESM import of either builds
// a facade that reads every export, which runs fs's lazy getters (ReadStream, WriteStream, ...)
// and so loads Node's stream modules, ~5 ms of a ~40 ms process start (bench/startup).
const {constants} = process.getBuiltinModule('node:fs')
const {link, mkdir, open, rename, stat, unlink} = process.getBuiltinModule('node:fs/promises')

/**
 * A temporary file's name next to its final one: `.NAME.` and 8 hex digits, as Gym's collector
 * names its own (the collector's prune removes leftovers of both by that shape). The random part
 * needs no secrecy, only spread, so it is not node:crypto's: loading that costs every short
 * command ~10 ms.
 */
export function tempName(dir: string, base: string): string {
  const random = Math.floor(Math.random() * 2 ** 32)
    .toString(16)
    .padStart(8, '0')
  return path.join(dir, `.${base}.${random}`)
}

/**
 * Every promise's value, in order, once all have settled; a failure throws the first one in the
 * given order, not in time order, so running file system calls at once (each is a thread-pool
 * round trip) reports the same error as running them one after another.
 */
export async function allInOrder<T>(all: Promise<T>[]): Promise<T[]> {
  const settled = await Promise.allSettled(all)
  for (const r of settled) if (r.status === 'rejected') throw r.reason
  return settled.map((r) => (r as PromiseFulfilledResult<T>).value)
}

/** fsync a directory so the entries created in it survive a host crash. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, constants.O_RDONLY)
  try {
    await fh.sync()
  } finally {
    await fh.close()
  }
}

/** `fn` over `items`, at most `limit` at once; results in the items' order. */
export async function mapLimit<T, R>(items: T[], limit: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length)
  let next = 0
  const worker = async () => {
    while (next < items.length) {
      const i = next++
      out[i] = await fn(items[i]!)
    }
  }
  await Promise.all(Array.from({length: Math.min(limit, items.length)}, worker))
  return out
}

/** fsync `from` and each parent up to and including `upTo` (which must contain `from`). */
export async function fsyncUpTo(from: string, upTo: string): Promise<void> {
  let dir = path.resolve(from)
  const stop = path.resolve(upTo)
  for (;;) {
    await fsyncDir(dir)
    // Up to `stop` (the first directory that does not start with `stop/` is `stop` itself).
    const parent = path.dirname(dir)
    if (parent === dir || !dir.startsWith(stop + path.sep)) return
    dir = parent
  }
}

async function writeSynced(file: string, data: string | Uint8Array): Promise<void> {
  const fh = await open(file, 'wx')
  try {
    await fh.writeFile(data)
    await fh.sync()
  } finally {
    await fh.close()
  }
}

/**
 * Creates `target` with `data` only if no file has that name: write a temp file, fsync, hard-link.
 * A hard link never replaces a name, so of two racing writers exactly one wins.
 * Returns false when the name already existed (the caller decides whether that is an error).
 */
export async function createExclusive(target: string, data: string | Uint8Array): Promise<boolean> {
  const tmp = tempName(path.dirname(target), path.basename(target))
  try {
    await writeSynced(tmp, data)
  } catch (err) {
    // A full disk, say: leave no temp file behind.
    await unlink(tmp).catch(() => {})
    throw err
  }
  try {
    await link(tmp, target)
    return true
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false
    throw err
  } finally {
    await unlink(tmp).catch(() => {})
  }
}

/** Replaces `target` atomically (temp, fsync, rename, fsync dir). */
export async function replaceAtomic(target: string, data: string | Uint8Array): Promise<void> {
  const dir = path.dirname(target)
  const tmp = tempName(dir, path.basename(target))
  try {
    await writeSynced(tmp, data)
    await rename(tmp, target)
  } catch (err) {
    await unlink(tmp).catch(() => {})
    throw err
  }
  await fsyncDir(dir)
}

/**
 * Makes sure `dir` is (or can be made) a directory this process can create files in: creates it
 * and its parents, then creates and removes a probe file. Throws with the real cause.
 */
export async function probeWritableDir(dir: string): Promise<void> {
  const st = await stat(dir).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return null
    throw err
  })
  if (st && !st.isDirectory()) throw Object.assign(new Error('it is not a directory'), {code: 'EEXIST'})
  if (!st) await mkdir(dir, {recursive: true})
  const probe = tempName(dir, 'gymckpt-probe')
  const fh = await open(probe, 'wx')
  await fh.close()
  await unlink(probe)
}
