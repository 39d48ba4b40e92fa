import {existsSync} from 'node:fs'
import {readdir, stat} from 'node:fs/promises'
import path from 'node:path'
import os from 'node:os'
import {fileURLToPath} from 'node:url'
import {Worker} from 'node:worker_threads'

import {captureKey, fromWire} from '../protocol/episode.js'
import {ParticipantManifest} from '../protocol/wire.js'
import {CheckpointStateError} from './errors.js'
import {encodeManifest, readParticipantState} from './participant-store.js'
import {listParticipantDirs, readCheckpointSummary, resolveCheckpoint} from './root.js'

export interface VerifyProblem {
  severity: 'error' | 'warning'
  where: string
  message: string
}

export interface VerifiedParticipant {
  kind: string
  instance: string
  dir: string
  ok: boolean
  records: number
  bytes: number
  recordsSha256: string | null
  episodes: string[]
}

export interface VerifyReport {
  ok: boolean
  checkpointId: string
  checkpointDir: string
  manifest: string | null
  continued: string[]
  restarted: string[]
  participants: VerifiedParticipant[]
  /** Continued episodes that no participant holds a record of: they start over from their input. */
  uncovered: string[]
  problems: VerifyProblem[]
}

export interface VerifyOptions {
  id?: string
  /** Participants that a restore would ask; each must have its directory (restore --dry-run). */
  expect?: {kind: string; instance: string; server?: string}[]
  /** Participant directories verified at once (default: one per core, in worker threads). */
  concurrency?: number
  /** Below this many bytes of state, directories are read in this thread (default 128 MiB). */
  workerMinBytes?: number
}

interface DirResult {
  manifest: ParticipantManifest
  keys: string[]
  bytes: number
}

const WORKER_URL = new URL('./verify-worker.js', import.meta.url)
const WORKER_MIN_BYTES = 128 << 20

async function totalBytes(dirs: {dir: string}[]): Promise<number> {
  let n = 0
  for (const d of dirs) {
    for (const f of await readdir(d.dir).catch(() => [] as string[])) n += (await stat(path.join(d.dir, f)).catch(() => ({size: 0}))).size
  }
  return n
}

/**
 * Reads participant directories, several at once in worker threads when there are several
 * directories and cores (hashing and scanning are CPU-bound), else in this thread.
 */
async function readAll(dirs: {kind: string; instance: string; dir: string}[], concurrency: number, minBytes: number, each: (i: number, r: DirResult | CheckpointStateError) => void): Promise<void> {
  const threads = Math.min(concurrency, dirs.length)
  // A worker costs a start and a cold JIT: worth it only for enough bytes to hash and scan.
  const useWorkers = threads > 1 && existsSync(fileURLToPath(WORKER_URL)) && (await totalBytes(dirs)) >= minBytes
  let next = 0
  const runInline = async () => {
    while (next < dirs.length) {
      const i = next++
      const d = dirs[i]!
      try {
        each(i, await readParticipantState(d.dir, {kind: d.kind, instance: d.instance, keep: null}))
      } catch (err) {
        if (!(err instanceof CheckpointStateError)) throw err
        each(i, err)
      }
    }
  }
  if (!useWorkers) return void (await Promise.all(Array.from({length: Math.max(1, threads)}, runInline)))
  const runWorker = async () => {
    // Not --input-type, which only applies to the main entry of `node -e`.
    const w = new Worker(WORKER_URL, {execArgv: process.execArgv.filter((a) => !a.startsWith('--input-type'))})
    try {
      while (next < dirs.length) {
        const i = next++
        const d = dirs[i]!
        const reply = await new Promise<{ok: boolean; stateError?: boolean; message?: string} & Partial<DirResult>>((resolve, reject) => {
          w.once('message', resolve)
          w.once('error', reject)
          w.postMessage({id: i, dir: d.dir, kind: d.kind, instance: d.instance})
        })
        w.removeAllListeners('error')
        if (reply.ok) each(i, reply as DirResult)
        else if (reply.stateError) each(i, new CheckpointStateError(reply.message!))
        else throw new Error(reply.message)
      }
    } finally {
      await w.terminate()
    }
  }
  await Promise.all(Array.from({length: threads}, runWorker))
}

/**
 * Everything a restore would check, offline: the controller manifest, every participant manifest,
 * the streaming sha256 and count of every records file, each record's episode_id, and that the
 * records match the commit scope.
 */
export async function verifyCheckpoint(location: string, opts: VerifyOptions = {}): Promise<VerifyReport> {
  const problems: VerifyProblem[] = []
  const resolved = await resolveCheckpoint(location, opts.id)
  const {checkpointDir} = resolved
  const report: VerifyReport = {
    ok: false,
    checkpointId: resolved.checkpointId,
    checkpointDir,
    manifest: null,
    continued: [],
    restarted: [],
    participants: [],
    uncovered: [],
    problems,
  }
  const summary = await readCheckpointSummary(checkpointDir).catch((err: unknown) => {
    if (err instanceof CheckpointStateError) {
      problems.push({severity: 'error', where: checkpointDir, message: err.message})
      return undefined
    }
    throw err
  })
  if (summary === null) {
    problems.push({severity: 'error', where: checkpointDir, message: 'no controller manifest (gymckpt.json or collection.json): the checkpoint was never published, or its commit did not finish'})
  } else if (summary) {
    report.manifest = summary.source
    report.checkpointId = summary.checkpointId
    report.continued = summary.continued.map((e) => captureKey(fromWire(e)))
    report.restarted = summary.restarted.map((e) => captureKey(fromWire(e)))
    const continued = new Set(report.continued)
    const both = report.restarted.filter((k) => continued.has(k))
    if (both.length) problems.push({severity: 'error', where: summary.source, message: `episodes both continued and restarted: ${both.join(', ')}`})
  }

  const dirs = await listParticipantDirs(checkpointDir)
  if (dirs.length === 0) problems.push({severity: 'error', where: checkpointDir, message: 'no participant state under gym/'})
  const concurrency = Math.max(1, opts.concurrency ?? os.availableParallelism())
  const results: VerifiedParticipant[] = dirs.map((d) => ({...d, ok: false, records: 0, bytes: 0, recordsSha256: null, episodes: []}))
  // Problems per directory, reported in directory order whichever thread finishes first.
  const dirProblems: VerifyProblem[][] = dirs.map(() => [])
  await readAll(dirs, concurrency, opts.workerMinBytes ?? WORKER_MIN_BYTES, (i, r) => {
    const d = dirs[i]!
    const v = results[i]!
    const mine = dirProblems[i]!
    if (r instanceof CheckpointStateError) return void mine.push({severity: 'error', where: d.dir, message: r.message})
    Object.assign(v, {ok: true, records: r.keys.length, bytes: r.bytes, recordsSha256: r.manifest.records_sha256, episodes: r.keys})
    if (summary && r.manifest.checkpoint_id !== summary.checkpointId) {
      v.ok = false
      mine.push({severity: 'error', where: d.dir, message: `manifest is of checkpoint '${r.manifest.checkpoint_id}', not '${summary.checkpointId}'`})
    }
    const recorded = summary?.participants?.find((p) => p.kind === d.kind && p.instance === d.instance)
    if (recorded && encodeManifest(recorded.manifest) !== encodeManifest(r.manifest)) {
      v.ok = false
      mine.push({severity: 'error', where: d.dir, message: 'manifest differs from the one its participant returned at commit'})
    }
  })
  problems.push(...dirProblems.flat())
  report.participants = results

  if (summary?.participants) {
    for (const p of summary.participants) {
      if (!dirs.some((d) => d.kind === p.kind && d.instance === p.instance)) {
        problems.push({severity: 'error', where: `gym/${p.kind}/${p.instance}`, message: `participant ${p.server} committed but its directory is missing`})
      }
    }
    for (const d of dirs) {
      if (!summary.participants.some((p) => p.kind === d.kind && p.instance === d.instance)) {
        problems.push({severity: 'warning', where: d.dir, message: 'directory not named in the controller manifest'})
      }
    }
  }
  for (const e of opts.expect ?? []) {
    if (!dirs.some((d) => d.kind === e.kind && d.instance === e.instance)) {
      problems.push({severity: 'error', where: `gym/${e.kind}/${e.instance}`, message: `no state for participant ${e.server ?? e.instance} (${e.kind}/${e.instance}): a restore would fail there`})
    }
  }
  if (summary) {
    const scope = new Set(report.continued)
    const held = new Set<string>()
    for (const p of results) {
      const outside = new Set<string>()
      for (const k of p.episodes) {
        held.add(k)
        if (!scope.has(k)) outside.add(k)
      }
      if (outside.size) problems.push({severity: 'error', where: p.dir, message: `records outside the commit scope: ${[...outside].slice(0, 10).join(', ')}${outside.size > 10 ? ` (+${outside.size - 10} more)` : ''}`})
    }
    report.uncovered = report.continued.filter((k) => !held.has(k))
    if (report.uncovered.length) {
      problems.push({severity: 'warning', where: summary.source, message: `${report.uncovered.length} continued episode(s) have no record on any participant and would start over from their input: ${report.uncovered.slice(0, 10).join(', ')}`})
    }
  }
  report.ok = !problems.some((p) => p.severity === 'error')
  return report
}
