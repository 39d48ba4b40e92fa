import {color, errColor, type Styler} from './color.js'
import {JSON_SCHEMA_VERSION} from './json-version.js'
import type {CommitOutcome, ParticipantTiming} from '../coordination/controller.js'
import type {DiscoveredParticipant} from '../coordination/discover.js'
import {EpisodeId, EpisodeIdWire, captureKey, toWire} from '../protocol/episode.js'

/** Human output: tables on stdout, notes and progress on stderr. */
export function table(rows: Record<string, unknown>[], columns: string[], c: Styler = color): string {
  if (rows.length === 0) return '(none)'
  const cells = rows.map((r) => columns.map((c) => fmt(r[c])))
  const widths = columns.map((c, i) => Math.max(c.length, ...cells.map((row) => row[i]!.length)))
  const line = (vals: string[]) =>
    vals
      .map((v, i) => v.padEnd(widths[i]!))
      .join('  ')
      .trimEnd()
  return [c.bold(line(columns.map((c) => c.toUpperCase()))), ...cells.map(line)].join('\n')
}

function fmt(v: unknown): string {
  if (v === null || v === undefined) return '-'
  if (typeof v === 'boolean') return v ? 'yes' : 'no'
  if (Array.isArray(v)) return v.length ? v.join(',') : '-'
  return String(v)
}

export function note(msg: string): void {
  process.stderr.write(`${msg}\n`)
}

/** Every warning of this process, for the `warnings` array of the --json envelope. */
export const warnings: string[] = []

export function warn(msg: string): void {
  warnings.push(msg)
  process.stderr.write(`${errColor.yellow('warning:')} ${msg}\n`)
}

/** A --json document on stdout, as oclif's logJson writes it (pretty, two spaces, a newline). */
export function writeJson(doc: unknown): void {
  process.stdout.write(`${JSON.stringify(doc, null, 2)}\n`)
}

/** The envelope of every successful --json document. */
export function successDocument(result: object): object {
  return {ok: true, schema_version: JSON_SCHEMA_VERSION, warnings, ...result}
}

export function keys(episodes: EpisodeId[], max = 20): string {
  const k = episodes.map(captureKey)
  return k.length <= max ? k.join(', ') || '(none)' : `${k.slice(0, max).join(', ')} … (+${k.length - max})`
}

/** Episodes in --json as on the wire: the one conversion, src/protocol's toWire. */
export function episodesJson(episodes: EpisodeId[]): EpisodeIdWire[] {
  return episodes.map(toWire)
}

/** The --json document of a commit, from `commit` and `checkpoint` alike. */
export function commitJson(out: CommitOutcome) {
  return {
    checkpoint_id: out.checkpointId,
    checkpoint_dir: out.checkpointDir,
    published: out.published,
    continued: episodesJson(out.continued),
    restarted: episodesJson(out.restarted),
    awaited_runs: episodesJson(out.awaitedRuns),
    participants: [...out.replies].map(([server, r]) => ({server, manifest: manifestJson(r.manifest), episode_ids: r.episode_ids})),
    timings: timingsJson(out.timings),
  }
}

/** A participant manifest's documented fields (a participant may add its own; they stay in its manifest.json). */
function manifestJson(m: CommitOutcome['replies'] extends Map<string, infer R> ? (R extends {manifest: infer M} ? M : never) : never) {
  return {
    schema_version: m.schema_version,
    kind: m.kind,
    instance: m.instance,
    checkpoint_id: m.checkpoint_id,
    records_file: m.records_file,
    records_sha256: m.records_sha256,
    record_count: m.record_count,
  }
}

/** Per participant: each phase's call time in ms (null: no such call), records and bytes. */
export function timingsJson(t: ParticipantTiming[]) {
  return t.map((r) => ({
    server: r.server,
    kind: r.kind,
    instance: r.instance,
    prepare_ms: r.prepareMs,
    commit_ms: r.commitMs,
    restore_ms: r.restoreMs,
    resume_ms: r.resumeMs,
    records: r.records,
    bytes: r.bytes,
  }))
}

/** The timing table printed (on stderr) at the end of checkpoint, commit and restore: only the phases that ran. */
export function timingsTable(t: ParticipantTiming[]): string {
  const rows = timingsJson(t)
  const phases = (['prepare_ms', 'commit_ms', 'restore_ms', 'resume_ms'] as const).filter((k) => rows.some((r) => r[k] !== null))
  return table(rows, ['server', 'kind', 'instance', ...phases, 'records', 'bytes'], errColor)
}

/** status's --json rows: each participant's status report, snake_case as on the wire. */
export function statusJson(participants: DiscoveredParticipant[]) {
  return participants.map((p) => {
    const s = p.status
    return {
      server: p.server,
      kind: p.kind,
      instance: p.instance,
      phase: s.phase,
      checkpoint_id: s.checkpoint_id,
      lease_expires_at: s.lease_expires_at,
      ready: s.report.ready,
      blocker_count: s.report.blocker_count ?? s.report.blockers.length,
      blockers: s.report.blockers,
      restarts: s.report.restarts,
      retired_rollouts: s.retired_rollouts,
      counts: s.report.counts,
    }
  })
}
