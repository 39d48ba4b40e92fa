import {lstat, readdir, rm} from 'node:fs/promises'
import path from 'node:path'

import {CheckpointStateError} from './errors.js'
import {CONTROLLER_MANIFEST, GYM_COLLECTION_MANIFEST, LATEST_FILE, readCheckpointSummary, readLatest} from './root.js'

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
  const latest = await readLatest(abs)
  let names: string[]
  try {
    names = await readdir(abs)
  } catch (err) {
    throw new CheckpointStateError(`cannot read checkpoint root ${abs}: ${(err as Error).message}`)
  }
  const plan: PrunePlan = {root: abs, latest, keep: [], remove: []}
  const published: {name: string; createdAt: number}[] = []
  const unpublished: {name: string; mtimeMs: number}[] = []
  for (const name of names.sort()) {
    const p = path.join(abs, name)
    const st = await lstat(p)
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
    const inside = await readdir(p)
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
  for (const e of plan.remove) await rm(e.path, {recursive: true, force: true})
}
