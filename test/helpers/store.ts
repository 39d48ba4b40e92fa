// Hand-made participant state and verify with real worker threads, shared by the storage tests.
import {createHash, randomBytes} from 'node:crypto'
import {cp, mkdir, rm, rmdir, writeFile} from 'node:fs/promises'
import path from 'node:path'
import {pathToFileURL} from 'node:url'

import {encodeManifest, writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, writeControllerManifest} from '../../src/storage/root.js'

export const sha256 = (s: string | Buffer) => createHash('sha256').update(s).digest('hex')

/** A participant directory written by hand: records bytes as given, a manifest naming them. */
export async function handWritten(dir: string, records: string | Buffer, recordCount: number): Promise<void> {
  await mkdir(dir, {recursive: true})
  const sha = sha256(records)
  const m = {
    checkpoint_id: 'c1',
    instance: path.basename(dir),
    kind: 'environment',
    record_count: recordCount,
    records_file: `records-${sha}.jsonl`,
    records_sha256: sha,
    schema_version: 1,
  }
  await writeFile(path.join(dir, m.records_file), records)
  await writeFile(path.join(dir, 'manifest.json'), encodeManifest(m))
}

/** A fresh scratch directory's path under .test-tmp (inside the project, where tsx resolves its packages). */
export const scratchDir = (name: string) => path.resolve('.test-tmp', `${name}-${process.pid}-${randomBytes(4).toString('hex')}`)

/**
 * src/ copied into the scratch directory `dir`, with `storage/verify-worker.js` replaced by `shim`
 * (which loads the TypeScript worker through tsx), and verify imported from that copy: its worker
 * threads then run, in process, the code under test. `remove` deletes the copy (and .test-tmp
 * itself when no other run uses it).
 */
export async function verifyWithWorkerShim(dir: string, shim: string): Promise<{verify: typeof import('../../src/storage/verify.js'); remove: () => Promise<void>}> {
  await mkdir(dir, {recursive: true})
  await cp(path.resolve('src'), path.join(dir, 'src'), {recursive: true})
  await writeFile(path.join(dir, 'src', 'storage', 'verify-worker.js'), shim)
  const verify = (await import(pathToFileURL(path.join(dir, 'src', 'storage', 'verify.ts')).href)) as typeof import('../../src/storage/verify.js')
  const remove = async () => {
    await rm(dir, {recursive: true, force: true})
    await rmdir(path.dirname(dir)).catch(() => {})
  }
  return {verify, remove}
}

/** A participant of writeCheckpoint: its record lines, and what the controller manifest says of it. */
export interface CheckpointPart {
  kind: string
  instance: string
  lines: string[]
  server?: string
  episodeIds?: string[]
}

/**
 * A checkpoint directory as a controller leaves it: each participant's state written by the real
 * store, then the controller manifest, continuing the rollouts `continued` (attempt 0).
 */
export async function writeCheckpoint(dir: string, id: string, parts: CheckpointPart[], continued: string[] = []): Promise<void> {
  const participants = []
  for (const {kind, instance, lines, server = `${kind}-${instance}`, episodeIds = []} of parts) {
    const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: id}, lines)
    participants.push({server, kind, instance, manifest, episode_ids: episodeIds})
  }
  await writeControllerManifest(dir, {
    format_version: FORMAT_VERSION,
    checkpoint_id: id,
    created_at: 1,
    continued: continued.map((r) => ({rollout_id: r, attempt: 0})),
    restarted: [],
    participants,
  })
}
