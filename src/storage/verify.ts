import path from 'node:path'
import {fileURLToPath} from 'node:url'

import {captureKey, fromWire} from '../protocol/episode.js'
import type {ParticipantManifest} from '../protocol/wire.js'
import {CheckpointStateError} from './errors.js'
import {encodeManifest, readParticipantState, sortFindDuplicates} from './participant-store.js'
import {listParticipantDirs, readCheckpointSummary, resolveCheckpoint} from './root.js'

// node:fs and node:fs/promises come from process.getBuiltinModule, not an import: see fsutil.ts.
const {existsSync} = process.getBuiltinModule('node:fs')
const {readdir, stat} = process.getBuiltinModule('node:fs/promises')

export interface VerifyProblem {
  /** Errors make the checkpoint invalid; warnings and infos do not. */
  severity: 'error' | 'warning' | 'info'
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
  /** Capture keys of every record, sorted. */
  episodes: string[]
  /** Records whose episode is in the commit scope: the ones a restore installs. */
  inScope: number
  /**
   * Records of episodes outside the commit scope. Gym's environment, agent and resources servers
   * export every live episode they hold, so these are normal; a restore verifies and skips them.
   * Without a controller manifest (no scope known) every record counts here.
   */
  outsideScope: number
  /** Commit-scope episodes this participant holds no record of (it had no state for them). */
  scopeWithoutRecord: number
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
  /**
   * Participant directories verified at once (default: one per core): this thread and
   * `concurrency - 1` worker threads.
   */
  concurrency?: number
  /** Below this many bytes of state, directories are read in this thread alone (default 64 MiB). */
  workerMinBytes?: number
}

interface DirResult {
  manifest: ParticipantManifest
  /** Sorted. */
  keys: string[]
  bytes: number
  duplicates: ReturnType<typeof sortFindDuplicates>
}

export interface DirJob {
  dir: string
  kind: string
  instance: string
  /** The checkpoint directory every file must resolve inside. */
  within: string
}

/** One participant directory, as verify reads it (in this thread or in a worker). */
export async function verifyDir(job: DirJob): Promise<DirResult> {
  const r = await readParticipantState(job.dir, {kind: job.kind, instance: job.instance, keep: null, within: job.within})
  // Sorted in place: duplicates are found without holding more than the list of keys.
  const duplicates = sortFindDuplicates(r.keys)
  return {manifest: r.manifest, keys: r.keys, bytes: r.bytes, duplicates}
}

/**
 * The kinds whose records are one per episode (reference 7.6: an environment's EpisodeRecord, the
 * model's ModelRecord), where a second record of an episode is corrupt state. An agent writes one
 * record per session and a resources server one per session (keyed by session_key, session_id):
 * an episode with two sessions has two records there, and Gym's restore installs both.
 */
export const ONE_RECORD_PER_EPISODE: ReadonlySet<string> = new Set(['environment', 'model'])

const WORKER_URL = new URL('./verify-worker.js', import.meta.url)
const WORKER_MIN_BYTES = 64 << 20
/** Directories read at once in this thread when no worker is worth starting (libuv's pool has 4 threads). */
const INLINE_READERS = 8

/** The bytes in the directories, all asked at once: each file system call is a thread-pool round trip. */
async function totalBytes(dirs: {dir: string}[]): Promise<number> {
  const sizes = await Promise.all(
    dirs.map(async (d) => {
      const files = await readdir(d.dir).catch(() => [] as string[])
      const each = await Promise.all(
        files.map((f) =>
          stat(path.join(d.dir, f)).then(
            (s) => s.size,
            () => 0,
          ),
        ),
      )
      return each.reduce((a, b) => a + b, 0)
    }),
  )
  return sizes.reduce((a, b) => a + b, 0)
}

/**
 * Reads participant directories, several at once when there are several directories and cores
 * (hashing and scanning are CPU-bound): this thread verifies directories alongside
 * `concurrency - 1` worker threads, which take the first directories (they start cold, so they
 * start first) while this thread takes the next; each takes another when done.
 */
async function readAll(dirs: DirJob[], concurrency: number, minBytes: number, bytes: Promise<number>, each: (i: number, r: DirResult | CheckpointStateError) => void): Promise<void> {
  const threads = Math.min(concurrency, dirs.length)
  // A worker costs a start and a cold JIT: worth it only for enough bytes to hash and scan.
  const workers = threads > 1 && existsSync(fileURLToPath(WORKER_URL)) && (await bytes) >= minBytes ? threads - 1 : 0
  let next = 0
  let failed = false
  const take = () => (failed || next >= dirs.length ? -1 : next++)
  const runInline = async () => {
    for (let i = take(); i >= 0; i = take()) {
      try {
        each(i, await verifyDir(dirs[i]!))
      } catch (err) {
        if (!(err instanceof CheckpointStateError)) throw err
        each(i, err)
      }
    }
  }
  const runWorker = async (first: number) => {
    // Not --input-type, which only applies to the main entry of `node -e`.
    // Imported here: a small checkpoint is read in this thread, and its verify should start fast.
    const {Worker} = await import('node:worker_threads')
    const w = new Worker(WORKER_URL, {execArgv: process.execArgv.filter((a) => !a.startsWith('--input-type'))})
    try {
      for (let i = first; i >= 0; i = take()) {
        const reply = await new Promise<{ok: boolean; stateError?: boolean; message?: string} & Partial<DirResult>>((resolve, reject) => {
          w.once('message', resolve)
          w.once('error', reject)
          // A worker that exits without an error event (killed, out of memory) must not hang this.
          w.once('exit', (code) => reject(new Error(`verify worker exited (code ${code}) while verifying ${dirs[i]!.dir}`)))
          w.postMessage({id: i, ...dirs[i]!})
        })
        w.removeAllListeners('error')
        w.removeAllListeners('exit')
        if (reply.ok) each(i, reply as DirResult)
        else if (reply.stateError) each(i, new CheckpointStateError(reply.message!))
        else throw new Error(reply.message)
      }
    } finally {
      await w.terminate()
    }
  }
  const running = Array.from({length: workers}, () => runWorker(take()))
  // Without workers (few bytes), up to INLINE_READERS directories are read at once: what costs
  // then is the file system calls, each a thread-pool round trip, and those overlap. Bounded: each
  // reader holds two read buffers, and a fleet may have thousands of participants.
  for (let k = workers ? 1 : Math.max(1, Math.min(dirs.length, INLINE_READERS)); k > 0; k--) running.push(runInline())
  // The first failure (a worker that died, an I/O error) stops every thread taking more work, and
  // is raised once every thread has stopped: nothing changes the results after this returns.
  const settled = await Promise.allSettled(running.map((p) => p.catch((err: unknown) => ((failed = true), Promise.reject(err)))))
  const first = settled.find((r) => r.status === 'rejected')
  if (first) throw (first as PromiseRejectedResult).reason
}

/**
 * Everything a restore would check, offline: the controller manifest, every participant manifest,
 * the streaming sha256 and count of every records file, each record's episode_id, plus what only
 * an offline check can afford: duplicate records, symlinks leaving the checkpoint directory, and
 * records file names that disagree with their digest. Records outside the commit scope are not an
 * error (Gym writes them); they are counted per participant, as are scope episodes without a
 * record, and a restore skips them.
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
  // The participant directories are listed while the controller manifest is read; a listing error
  // is raised where it was before, after the manifest.
  const listing = listParticipantDirs(checkpointDir)
  listing.catch(() => {})
  // Their size (whether workers are worth starting) too: a failure counts as no bytes.
  const sized = listing.then(totalBytes, () => 0)
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

  const dirs = await listing
  if (dirs.length === 0) problems.push({severity: 'error', where: checkpointDir, message: 'no participant state under gym/'})
  // navigator.hardwareConcurrency is os.availableParallelism() without loading node:os (start-up).
  const concurrency = Math.max(1, opts.concurrency ?? navigator.hardwareConcurrency)
  const results: VerifiedParticipant[] = dirs.map((d) => ({...d, ok: false, records: 0, bytes: 0, recordsSha256: null, episodes: [], inScope: 0, outsideScope: 0, scopeWithoutRecord: 0}))
  const scope = new Set(report.continued)
  // Problems per directory, reported in directory order whichever thread finishes first.
  const dirProblems: VerifyProblem[][] = dirs.map(() => [])
  // Notes on records outside the scope follow every directory's problems, in directory order.
  const scopeNotes: VerifyProblem[][] = dirs.map(() => [])
  await readAll(
    dirs.map((d) => ({...d, within: checkpointDir})),
    concurrency,
    opts.workerMinBytes ?? WORKER_MIN_BYTES,
    sized,
    (i, r) => {
      const d = dirs[i]!
      const v = results[i]!
      const mine = dirProblems[i]!
      if (r instanceof CheckpointStateError) return void mine.push({severity: 'error', where: d.dir, message: r.message})
      Object.assign(v, {ok: true, records: r.keys.length, bytes: r.bytes, recordsSha256: r.manifest.records_sha256, episodes: r.keys})
      countScope(v, scope, summary ? scopeNotes[i]! : null)
      if (r.duplicates.count && ONE_RECORD_PER_EPISODE.has(d.kind)) {
        v.ok = false
        const named = r.duplicates.first.map((x) => `'${x.key}' (${x.records} records)`).join(', ')
        const more = r.duplicates.count > r.duplicates.first.length ? ` (+${r.duplicates.count - r.duplicates.first.length} more episodes)` : ''
        mine.push({
          severity: 'error',
          where: d.dir,
          message: `${r.manifest.records_file} holds more than one record of ${r.duplicates.count === 1 ? 'episode' : `${r.duplicates.count} episodes`} ${named}${more}: a restore would install one episode twice`,
        })
      }
      if (summary && r.manifest.checkpoint_id !== summary.checkpointId) {
        v.ok = false
        mine.push({severity: 'error', where: d.dir, message: `manifest is of checkpoint '${r.manifest.checkpoint_id}', not '${summary.checkpointId}'`})
      }
      const recorded = summary?.participants?.find((p) => p.kind === d.kind && p.instance === d.instance)
      if (recorded && encodeManifest(recorded.manifest) !== encodeManifest(r.manifest)) {
        v.ok = false
        mine.push({severity: 'error', where: d.dir, message: 'manifest differs from the one its participant returned at commit'})
      }
    },
  )
  problems.push(...dirProblems.flat(), ...scopeNotes.flat())
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
    // Only scope episodes are looked up: no set of every record's key is built.
    const held = new Set<string>()
    for (const p of results) for (const k of p.episodes) if (scope.has(k)) held.add(k)
    report.uncovered = report.continued.filter((k) => !held.has(k))
    if (report.uncovered.length) {
      problems.push({
        severity: 'warning',
        where: summary.source,
        message: `${report.uncovered.length} continued episode(s) have no record on any participant and would start over from their input: ${report.uncovered.slice(0, 10).join(', ')}`,
      })
    }
  }
  report.ok = !problems.some((p) => p.severity === 'error')
  return report
}

/**
 * Counts a participant's records against the commit scope (its keys are sorted). With `notes`, a
 * participant holding records outside the scope gets an info line saying a restore skips them.
 */
function countScope(v: VerifiedParticipant, scope: ReadonlySet<string>, notes: VerifyProblem[] | null): void {
  const keys = v.episodes
  const outside: string[] = []
  let outsideKeys = 0
  let heldInScope = 0
  v.inScope = 0
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i]!
    const first = i === 0 || keys[i - 1] !== k
    if (scope.has(k)) {
      v.inScope++
      if (first) heldInScope++
    } else if (first) {
      outsideKeys++
      if (outside.length < 10) outside.push(k)
    }
  }
  v.outsideScope = keys.length - v.inScope
  v.scopeWithoutRecord = scope.size - heldInScope
  if (notes && v.outsideScope) {
    const more = outsideKeys > outside.length ? ` (+${outsideKeys - outside.length} more)` : ''
    notes.push({
      severity: 'info',
      where: v.dir,
      message: `${v.outsideScope} record(s) outside the commit scope: ${outside.join(', ')}${more}; a restore skips them and installs only the ${v.inScope} in scope`,
    })
  }
}
