import {color, errColor, type Styler} from './color.js'
import {JSON_SCHEMA_VERSION} from './json-version.js'
import type {CommitOutcome, ParticipantTiming} from '../coordination/controller.js'
import type {DiscoveredParticipant} from '../coordination/discover.js'
import {EpisodeId, EpisodeIdWire, captureKey, toWire} from '../protocol/episode.js'
import type {VerifyProblem} from '../storage/verify.js'

// node:fs and node:fs/promises come from process.getBuiltinModule, not an import: see fsutil.ts.
const {writeSync} = process.getBuiltinModule('node:fs')

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

/**
 * Whether output goes straight to file descriptors 1 and 2 (fs.writeSync) instead of through
 * process.stdout and process.stderr. Only verify's fast path turns it on: opening those streams on
 * a pipe loads Node's net and stream modules, ~7 ms of a 40 ms process start. Writes to a file, a
 * pipe or a terminal are synchronous on Linux either way, so nothing is reordered; an fd that
 * would block (EAGAIN: the reader set it non-blocking) goes back to the streams for good.
 */
let direct = false

export function writeDirect(on = true): void {
  direct = on
}

function write(fd: 1 | 2, text: string): void {
  // The stream is named only when it is used: naming process.stdout opens it.
  const stream = () => (fd === 1 ? process.stdout : process.stderr)
  if (direct) direct = writeAll(fd, Buffer.from(text), writeSync, (rest) => stream().write(rest))
  else stream().write(text)
}

/**
 * Writes all of `bytes` to `fd` with `sync` (a write may take part of them). When the fd would
 * block (EAGAIN), what is left goes to `fallback` and it returns false: write through the stream
 * from then on. Any other error is thrown.
 */
export function writeAll(fd: number, bytes: Buffer, sync: (fd: number, b: Buffer, offset: number) => number, fallback: (rest: Buffer) => void): boolean {
  let done = 0
  try {
    while (done < bytes.length) done += sync(fd, bytes, done)
    return true
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') throw err
    fallback(bytes.subarray(done))
    return false
  }
}

/** Text to stdout (the command's result). */
export function toStdout(text: string): void {
  write(1, text)
}

/** Text to stderr (notes, warnings, errors, progress). */
export function toStderr(text: string): void {
  write(2, text)
}

export function note(msg: string): void {
  toStderr(`${msg}\n`)
}

/** A verify problem on stderr, `error|warning|note: WHERE: MESSAGE`, the severity coloured (verify, describe, restore). */
export function problemNote(p: VerifyProblem): void {
  note(`${p.severity === 'error' ? errColor.red('error') : p.severity === 'warning' ? errColor.yellow('warning') : 'note'}: ${p.where}: ${p.message}`)
}

/** Every warning of this process, for the `warnings` array of the --json envelope. */
export const warnings: string[] = []

export function warn(msg: string): void {
  warnings.push(msg)
  toStderr(`${errColor.yellow('warning:')} ${msg}\n`)
}

/** A --json document on stdout, as oclif's logJson writes it (pretty, two spaces, a newline). */
export function writeJson(doc: unknown): void {
  toStdout(`${JSON.stringify(doc, null, 2)}\n`)
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
    participants: [...out.replies].map(([server, r]) => ({server, manifest: manifestJson(r.manifest), episode_ids: r.episode_ids, ...(r.staging_keys ? {staging_keys: r.staging_keys} : {})})),
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
