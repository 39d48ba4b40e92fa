import {lstat, readdir, rm, stat} from 'node:fs/promises'
import path from 'node:path'

import {CheckpointStateError} from './errors.js'
import {CONTROLLER_MANIFEST, GYM_COLLECTION_MANIFEST, LATEST_FILE, describeFsError, readCheckpointSummary, readLatest} from './root.js'

export interface PruneEntry {
  name: string
  path: string
  reason: string
}

export interface PrunePlan {
  root: string
  latest: string | null
  keep: PruneEntry[]
  remove: PruneEntry[]
}

/** Leftover temp files of an interrupted LATEST replacement are removed once this old. */
const STALE_TEMP_MS = 10 * 60_000

/**
 * What a prune of `root` keeps and removes, like Gym's own collector: the `keep` newest published
 * checkpoints (by created_at) and the one LATEST names always stay; older published ones go;
 * unpublished checkpoint directories (a commit that never finished) go only when older than the
 * LATEST checkpoint, since a newer one may be a commit in progress; stale temp files go. Anything
 * that is not a checkpoint directory, and every symbolic link, is left alone.
 */
export async function planPrune(root: string, keep: number, now = Date.now()): Promise<PrunePlan> {
  const abs = path.resolve(root)
  let rootStat
  try {
    rootStat = await stat(abs)
  } catch (err) {
    throw new CheckpointStateError(`checkpoint root ${abs}: ${describeFsError(err)}`)
  }
  if (!rootStat.isDirectory()) throw new CheckpointStateError(`checkpoint root ${abs} is not a directory`)
  // A LATEST that cannot be read fails the prune: without it, the published checkpoint is unknown.
  const latest = await readLatest(abs)
  let names: string[]
  try {
    names = await readdir(abs)
  } catch (err) {
    throw new CheckpointStateError(`cannot list checkpoint root ${abs}: ${describeFsError(err)}`)
  }
  const plan: PrunePlan = {root: abs, latest, keep: [], remove: []}
  const published: {name: string; createdAt: number}[] = []
  const unpublished: {name: string; mtimeMs: number}[] = []
  for (const name of names.sort()) {
    const p = path.join(abs, name)
    let st
    try {
      st = await lstat(p)
    } catch (err) {
      // Gone since the listing (another prune, say): nothing to plan for it.
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue
      plan.keep.push({name, path: p, reason: `cannot inspect: ${describeFsError(err)}`})
      continue
    }
    if (st.isSymbolicLink()) {
      plan.keep.push({name, path: p, reason: 'symbolic link'})
      continue
    }
    if (st.isFile()) {
      if (name.startsWith(`.${LATEST_FILE}.`) && now - st.mtimeMs > STALE_TEMP_MS) plan.remove.push({name, path: p, reason: 'temp file of an interrupted publication'})
      else if (name !== LATEST_FILE) plan.keep.push({name, path: p, reason: 'not a checkpoint'})
      continue
    }
    if (!st.isDirectory()) continue
    let inside: string[]
    try {
      inside = await readdir(p)
    } catch (err) {
      plan.keep.push({name, path: p, reason: `cannot list: ${describeFsError(err)}; inspect it by hand`})
      continue
    }
    const isCheckpoint = inside.includes('gym') || inside.includes(CONTROLLER_MANIFEST) || inside.includes(GYM_COLLECTION_MANIFEST)
    if (!isCheckpoint) {
      plan.keep.push({name, path: p, reason: 'not a checkpoint'})
      continue
    }
    const summary = await readCheckpointSummary(p).catch(() => undefined)
    if (summary) published.push({name, createdAt: summary.createdAt})
    else if (summary === null) unpublished.push({name, mtimeMs: st.mtimeMs})
    else plan.keep.push({name, path: p, reason: 'controller manifest unreadable; inspect it by hand'})
  }
  published.sort((a, b) => b.createdAt - a.createdAt || b.name.localeCompare(a.name))
  published.forEach((c, i) => {
    const p = path.join(abs, c.name)
    if (c.name === latest) plan.keep.push({name: c.name, path: p, reason: 'named by LATEST'})
    else if (i < keep) plan.keep.push({name: c.name, path: p, reason: `among the ${keep} newest published`})
    else plan.remove.push({name: c.name, path: p, reason: 'older published checkpoint'})
  })
  const latestCreated = published.find((c) => c.name === latest)?.createdAt
  for (const u of unpublished) {
    const p = path.join(abs, u.name)
    if (latestCreated !== undefined && u.mtimeMs < latestCreated * 1000) plan.remove.push({name: u.name, path: p, reason: 'never published, older than LATEST'})
    else plan.keep.push({name: u.name, path: p, reason: 'never published, may be a commit in progress'})
  }
  return plan
}

export async function applyPrune(plan: PrunePlan): Promise<void> {
  for (const [i, e] of plan.remove.entries()) {
    try {
      await rm(e.path, {recursive: true, force: true})
    } catch (err) {
      throw new CheckpointStateError(`could not remove ${e.path} (${i} of ${plan.remove.length} removed before it): ${describeFsError(err)}`)
    }
  }
}
