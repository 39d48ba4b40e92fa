import {captureKey, fromWire} from '../protocol/episode.js'
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
  /** Participant directories verified at once. */
  concurrency?: number
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
    const both = report.restarted.filter((k) => report.continued.includes(k))
    if (both.length) problems.push({severity: 'error', where: summary.source, message: `episodes both continued and restarted: ${both.join(', ')}`})
  }

  const dirs = await listParticipantDirs(checkpointDir)
  if (dirs.length === 0) problems.push({severity: 'error', where: checkpointDir, message: 'no participant state under gym/'})
  const concurrency = Math.max(1, opts.concurrency ?? 4)
  const results: VerifiedParticipant[] = new Array(dirs.length)
  let next = 0
  const worker = async () => {
    while (next < dirs.length) {
      const i = next++
      const d = dirs[i]!
      const v: VerifiedParticipant = {...d, ok: false, records: 0, bytes: 0, recordsSha256: null, episodes: []}
      results[i] = v
      try {
        const r = await readParticipantState(d.dir, {kind: d.kind, instance: d.instance, keep: null})
        Object.assign(v, {ok: true, records: r.keys.length, bytes: r.bytes, recordsSha256: r.manifest.records_sha256, episodes: r.keys})
        if (summary && r.manifest.checkpoint_id !== summary.checkpointId) {
          v.ok = false
          problems.push({severity: 'error', where: d.dir, message: `manifest is of checkpoint '${r.manifest.checkpoint_id}', not '${summary.checkpointId}'`})
        }
        const recorded = summary?.participants?.find((p) => p.kind === d.kind && p.instance === d.instance)
        if (recorded && encodeManifest(recorded.manifest) !== encodeManifest(r.manifest)) {
          v.ok = false
          problems.push({severity: 'error', where: d.dir, message: 'manifest differs from the one its participant returned at commit'})
        }
      } catch (err) {
        if (!(err instanceof CheckpointStateError)) throw err
        problems.push({severity: 'error', where: d.dir, message: err.message})
      }
    }
  }
  await Promise.all(Array.from({length: Math.min(concurrency, dirs.length)}, worker))
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
