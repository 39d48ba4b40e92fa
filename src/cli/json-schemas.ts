// The --json contract of every command, as zod schemas: the README's "JSON output" section is
// generated from them (renderJsonDocs) and test/cli/json-contract.test.ts parses every command's
// real output with them. Strict objects: a field not documented here fails the test.
//
// Not imported by the commands at run time (offline commands never load zod); a command may
// import a type from here with `import type`.
import {z} from 'zod'

import {EXIT} from './exit-codes.js'
import {JSON_SCHEMA_VERSION} from './json-version.js'

export const SCHEMA_VERSION = JSON_SCHEMA_VERSION

const int = () => z.number().int()
const count = () => z.number().int().min(0)
/** RFC 3339 with a time zone offset (Z): every time this CLI writes, except wire fields. */
const time = () => z.iso.datetime({offset: true})
/** Absolute epoch seconds: only where Gym's wire protocol has the field (deadline_ts, lease_expires_at). */
const epoch = () => z.number()

export const Episode = z.strictObject({rollout_id: z.string(), attempt: int().min(0)}).describe('an episode: {rollout_id, attempt}')
const Unreachable = z.strictObject({server: z.string(), message: z.string()})
const Problem = z.strictObject({severity: z.enum(['error', 'warning', 'info']), where: z.string(), message: z.string()})

const ParticipantManifest = z.strictObject({
  schema_version: int(),
  kind: z.string(),
  instance: z.string(),
  checkpoint_id: z.string(),
  records_file: z.string(),
  records_sha256: z.string(),
  record_count: count(),
})

export const Timing = z.strictObject({
  server: z.string(),
  kind: z.string(),
  instance: z.string(),
  prepare_ms: count().nullable(),
  commit_ms: count().nullable(),
  restore_ms: count().nullable(),
  resume_ms: count().nullable(),
  records: count().nullable(),
  bytes: count().nullable(),
})
const timings = () => z.array(Timing).describe("per participant: each phase's call time in ms (null: not run), records committed or installed, bytes of its records file")
const next = () => z.array(z.string()).describe('next steps, as command lines that work when pasted')

const Stage = z.strictObject({stage: z.string(), servers: z.array(z.string())})
const WouldRefuse = z.strictObject({server: z.string(), phase: z.string(), checkpoint_id: z.string().nullable()})

const CatalogEntry = z.strictObject({
  checkpoint_id: z.string(),
  checkpoint_dir: z.string(),
  state: z.enum(['published', 'partial', 'unreadable']),
  latest: z.boolean(),
  manifest: z.string().nullable(),
  created: time(),
  age_seconds: count(),
  size_bytes: count(),
  participant_count: count(),
  continued_count: count().nullable(),
  restarted_count: count().nullable(),
  error: z.string().nullable(),
})

const commitFields = {
  checkpoint_id: z.string(),
  checkpoint_dir: z.string(),
  published: z.boolean().describe('gymckpt.json written and LATEST replaced'),
  continued: z.array(Episode).describe('the commit scope: continued(episodes)'),
  restarted: z.array(Episode),
  awaited_runs: z.array(Episode).describe('/run calls whose replies were awaited before the scope was built'),
  participants: z
    .array(
      z.strictObject({
        server: z.string(),
        manifest: ParticipantManifest,
        episode_ids: z.array(z.string()),
        staging_keys: z.array(z.string()).optional().describe("the policy model's token-store keys the checkpoint still references: keep them"),
      }),
    )
    .describe('what each participant committed'),
  timings: timings(),
}

const Missing = z.strictObject({
  kind: z.string(),
  instance: z.string(),
  records: count().nullable(),
  install: count().nullable().describe('its records in the restore scope (null: not read, --skip-verify)'),
})
const restorePlanFields = {
  checkpoint_id: z.string(),
  checkpoint_dir: z.string(),
  continued: z.array(Episode).describe("the restore's scope, as committed"),
  replacements: z.array(Episode).describe('dispatch next: each continued episode at attempt + 1'),
  restarted: z.array(Episode),
  restart_attempts: z.array(Episode).describe('start over from input: each restart at attempt + 1'),
  participants: z.array(z.strictObject({server: z.string(), kind: z.string(), instance: z.string(), records: count().nullable(), install: count().nullable(), skip: count().nullable()})),
  busy: z.array(z.strictObject({server: z.string(), reasons: z.array(z.string())})).describe('participants that are not fresh processes'),
  unreachable: z.array(Unreachable),
  missing: z.array(Missing).describe('participants the checkpoint holds state of that no server of the fleet restores'),
  problems: z.array(Problem).describe("the offline verification's problems"),
}

const ConformanceCheck = z.strictObject({id: z.string(), section: z.string(), destructive: z.boolean(), rule: z.string()})

const Setting = <T extends z.ZodType>(value: T) => z.strictObject({value, from: z.string().describe('a flag, an environment variable, or the config context')})

const demoTimings = z.record(z.string(), z.number()).describe('milliseconds per step of the rehearsal')
const Mismatch = z.strictObject({rollout_id: z.string(), expected: z.string(), got: z.string().nullable()})

/** Each command's own fields (the envelope is added by `successSchema`). */
export const COMMAND_FIELDS = {
  discover: {
    participants: z.array(z.strictObject({server: z.string(), kind: z.string(), instance: z.string(), url: z.string(), phase: z.string()})).describe('in Gym order'),
    skipped: z.array(z.strictObject({server: z.string(), url: z.string()})).describe('servers that are not participants (404)'),
  },
  status: {
    participants: z.array(
      z.strictObject({
        server: z.string(),
        kind: z.string(),
        instance: z.string(),
        phase: z.string(),
        checkpoint_id: z.string().nullable(),
        lease_expires_at: epoch().nullable().describe('epoch seconds, as on the wire'),
        ready: z.boolean(),
        blocker_count: count(),
        blockers: z.array(z.string()),
        restarts: z.array(z.string()),
        retired_rollouts: count(),
        counts: z.record(z.string(), z.number()),
      }),
    ),
  },
  prepare: {
    checkpoint_id: z.string(),
    prepared: z.literal(true),
    deadline_ts: epoch().describe('epoch seconds, as sent on the wire'),
    restarted: z.array(Episode).describe('restarts the participants reported'),
    next: next(),
  },
  commit: {...commitFields, next: next()},
  checkpoint: commitFields,
  resume: {
    checkpoint_id: z.string().nullable().describe('null: no participant had an active checkpoint'),
    participants: z.array(z.strictObject({server: z.string(), phase: z.string(), idempotent: z.boolean().describe('it had nothing open under the ID')})),
    unreachable: z.array(Unreachable),
  },
  renew: {
    checkpoint_id: z.string(),
    participants: z.array(z.strictObject({server: z.string(), lease_expires_at: epoch().describe('epoch seconds, as on the wire')})),
  },
  restore: z.discriminatedUnion('dry_run', [
    z.strictObject({dry_run: z.literal(true), valid: z.literal(true), ...restorePlanFields}),
    z.strictObject({
      dry_run: z.literal(false),
      restore_id: z.string(),
      resumed: z.boolean(),
      ...restorePlanFields,
      restored: z
        .array(z.strictObject({server: z.string(), kind: z.string(), instance: z.string(), restored: z.array(z.string())}))
        .describe('per participant, in Gym order: the capture keys it restored (each continued episode at attempt + 1), as it replied'),
      timings: timings(),
      next: next(),
    }),
  ]),
  retire: z.discriminatedUnion('dry_run', [
    z.strictObject({dry_run: z.literal(true), episode_count: count(), participant_count: count(), stages: z.array(Stage), calls_per_server: count(), would_refuse: z.array(WouldRefuse)}),
    z.strictObject({dry_run: z.literal(false), episode_count: count(), participant_count: count()}),
  ]),
  forget: z.discriminatedUnion('dry_run', [
    z.strictObject({dry_run: z.literal(true), rollout_count: count(), participant_count: count(), stages: z.array(Stage), calls_per_server: count(), would_refuse: z.array(WouldRefuse)}),
    z.strictObject({dry_run: z.literal(false), rollout_count: count(), participant_count: count()}),
  ]),
  verify: {
    valid: z.boolean(),
    checkpoint_id: z.string(),
    checkpoint_dir: z.string(),
    manifest: z.string().nullable().describe('the controller manifest read: gymckpt.json, collection.json, or null'),
    continued_count: count(),
    restarted_count: count(),
    uncovered: z.array(z.string()),
    participants: z.array(
      z.strictObject({
        kind: z.string(),
        instance: z.string(),
        ok: z.boolean(),
        records: count(),
        in_scope: count(),
        outside_scope: count(),
        scope_without_record: count(),
        bytes: count(),
        records_sha256: z.string().nullable(),
      }),
    ),
    problems: z.array(Problem),
  },
  prune: {
    root: z.string(),
    latest: z.string().nullable(),
    dry_run: z.boolean().describe('true unless --yes: nothing was removed'),
    remove: z.array(z.strictObject({name: z.string(), path: z.string(), reason: z.string()})),
    keep: z.array(z.strictObject({name: z.string(), path: z.string(), reason: z.string()})),
  },
  list: {
    root: z.string(),
    latest: z.string().nullable(),
    checkpoints: z.array(CatalogEntry).describe('newest first'),
  },
  describe: {
    root: z.string(),
    checkpoint: CatalogEntry,
    manifest: z.strictObject({file: z.string(), created: time().nullable(), run_id: z.string().nullable(), continued: z.array(Episode), restarted: z.array(Episode)}).nullable(),
    participants: z.array(
      z.strictObject({
        kind: z.string(),
        instance: z.string(),
        server: z.string().nullable(),
        records: count().nullable(),
        bytes: count().nullable(),
        records_file: z.string().nullable(),
        records_sha256: z.string().nullable(),
        error: z.string().nullable(),
        ok: z.boolean().optional(),
        in_scope: count().nullable().optional(),
        outside_scope: count().nullable().optional(),
        scope_without_record: count().nullable().optional(),
      }),
    ),
    restores: z.array(
      z.strictObject({
        restore_id: z.string(),
        time: time(),
        checkpoint_id: z.string(),
        checkpoint_dir: z.string(),
        outcome: z.enum(['restored', 'failed', 'refused']),
        error: z.string().nullable(),
        participant_count: count(),
      }),
    ),
    verify: z
      .strictObject({valid: z.boolean(), uncovered: z.array(z.string()), problems: z.array(Problem)})
      .nullable()
      .describe('with --verify'),
  },
  'config show': {
    config_file: z.string().nullable(),
    context: z.string().nullable(),
    config_dir: z.string(),
    fleet: Setting(z.union([z.strictObject({head: z.string()}), z.strictObject({fleet: z.string()}), z.strictObject({servers: z.array(z.string())})])).nullable(),
    root: Setting(z.string()).nullable(),
    token_source: Setting(z.string()).describe('where the token would be read from; never the token'),
  },
  conformance: z.union([
    z.strictObject({checks: z.array(ConformanceCheck)}).describe('--list'),
    z.strictObject({
      passed: z.boolean(),
      destructive: z.boolean(),
      interrupted: z.boolean(),
      checkpoint_dir: z.string().nullable(),
      participants: z.array(z.strictObject({server: z.string(), kind: z.string(), instance: z.string()})),
      counts: z.strictObject({pass: count(), fail: count(), skip: count()}),
      checks: z.array(z.strictObject({id: z.string(), section: z.string(), rule: z.string(), server: z.string().nullable(), result: z.enum(['pass', 'fail', 'skip']), message: z.string()})),
    }),
  ]),
  collect: {
    run_id: z.string(),
    end: z.enum(['finished', 'stopped']),
    rows: count(),
    done: count(),
    failed: count(),
    retried: count(),
    checkpoints: count(),
    checkpoints_missed: count(),
    checkpoints_failed: count(),
    restores: count(),
    restores_failed: count(),
    last_checkpoint_id: z.string().nullable(),
    pause_ms_median: z.number().nullable(),
    wall_ms: z.number(),
    failed_rows: z.array(z.strictObject({rollout_id: z.string(), attempts: count(), error: z.string()})),
  },
  demo: z.union([
    z.strictObject({
      passed: z.boolean(),
      episodes: count(),
      checkpoint_id: z.string(),
      checkpoint_dir: z.string(),
      root: z.string(),
      completed_at_checkpoint: count(),
      continued: count(),
      continued_from_boundary: count(),
      restarted: count(),
      mismatches: z.array(Mismatch),
      timings_ms: demoTimings,
    }),
    z.strictObject({
      passed: z.boolean(),
      scenario: z.literal('collect'),
      rows: count(),
      checkpoint_id: z.string(),
      root: z.string(),
      output: z.string(),
      done_before_crash: count(),
      continued: count(),
      continued_from_boundary: count(),
      started_over: count(),
      never_started: count(),
      missing: z.array(z.string()),
      duplicated: z.array(z.string()),
      mismatches: z.array(Mismatch),
      timings_ms: demoTimings,
    }),
  ]),
  fleet: {
    head: z.string().describe('the head server URL (for --head)'),
    servers: z.array(z.strictObject({server: z.string(), kind: z.string(), url: z.string()})),
  },
} satisfies Record<string, z.ZodRawShape | z.ZodType>

export type CommandName = keyof typeof COMMAND_FIELDS

const envelope = {
  ok: z.literal(true),
  schema_version: z.literal(SCHEMA_VERSION),
  warnings: z.array(z.string()).describe("this run's warnings (also on stderr)"),
}

/** A command's whole success document: the envelope and its own fields. */
export function successSchema(command: CommandName): z.ZodType {
  const f = COMMAND_FIELDS[command] as z.ZodRawShape | z.ZodType
  if (f instanceof z.ZodType) {
    const variants = f instanceof z.ZodUnion || f instanceof z.ZodDiscriminatedUnion ? (f.options as z.ZodObject[]) : [f as z.ZodObject]
    return z.union(variants.map((v) => v.extend(envelope)) as unknown as [z.ZodObject, z.ZodObject])
  }
  return z.strictObject({...envelope, ...f})
}

// ---------------------------------------------------------------- errors

const Failure = z.strictObject({
  server: z.string(),
  status: int().nullable().describe('HTTP status; null when no reply came'),
  code: z.string().nullable().describe("the participant's error code, validation_error, timeout, connection"),
  message: z.string(),
})
const failureFields = {
  operation: z.string().describe('the fan-out that failed: discover, prepare, commit, restore, resume, retire, forget, renew'),
  failures: z.array(Failure).describe('each server that failed, sorted by name'),
}
const Busy = z.strictObject({server: z.string(), reasons: z.array(z.string())})
/** One shape of an error's details; `timings` wherever an operation that times its calls failed. */
const details = (shape: z.ZodRawShape, what: string) => z.strictObject({...shape, timings: timings().optional()}).describe(what)
const documentOf = (fields: z.ZodRawShape | z.ZodType, what: string) => (fields instanceof z.ZodType ? fields : z.strictObject(fields)).describe(what)

/** The `details` of every error that has them, one shape per kind of failure (README: "Error details"). */
export const ERROR_DETAILS = [
  details(failureFields, 'a fan-out failed on some participants (participant, discovery, unauthorized)'),
  details({...failureFields, participants: COMMAND_FIELDS.status.participants}, 'status: a server failed its probe; the statuses that were read'),
  details(
    {dry_run: z.literal(true), valid: z.literal(false), ...restorePlanFields, operation: failureFields.operation.optional(), failures: failureFields.failures.optional()},
    'restore --dry-run: the restore would be refused; its plan (and the failures, when a participant did not answer)',
  ),
  details({busy: z.array(Busy)}, 'restore, or conformance --destructive, refused: participants that are not freshly started'),
  details({missing: z.array(Missing)}, 'restore refused: the checkpoint holds state in its scope of participants no server of the fleet restores'),
  details({checkpoint_dir: z.string(), problems: z.array(Problem)}, 'a checkpoint fails verification: restore refused it, or commit did not publish it'),
  details({restore_id: z.string()}, 'the restore succeeded everywhere, but resuming it failed: resume with this ID'),
  details(
    {restore_id: z.string(), retire: z.array(Episode)},
    'the restore succeeded everywhere, but retiring the crashed attempts after it failed or was interrupted: the fleet is still closed; retire these with the restore ID, then resume it',
  ),
  details(
    {restored: z.array(z.string())},
    'commit or checkpoint refused before sending: the scope leaves out these restored episodes whose replacement has not started (capture keys of the replacement attempts); name them, or pass --drop-restored',
  ),
  details({checkpoint_id: z.string(), unreachable: z.array(Unreachable), lost: z.array(z.string())}, 'commit: the prepared checkpoint can never be committed (a member down, or restarted empty)'),
  details(
    {checkpoint_id: z.string(), blockers: z.array(z.strictObject({server: z.string(), blockers: z.array(z.string()), blocker_count: count()})), not_reached: z.array(z.string())},
    'prepare missed its deadline: the blockers of each server that was not ready, and the stages never reached',
  ),
  details({open: z.array(z.strictObject({checkpoint_id: z.string(), participants: z.array(z.string())}))}, 'prepare refused: another checkpoint is open on these participants'),
  details({checkpoint_id: z.string(), checkpoint_dir: z.string(), published: z.boolean()}, 'interrupted after the checkpoint was published'),
  details({}, 'any other failure (interrupted, a refused call) of an operation that had made timed calls: only `timings`'),
  documentOf(COMMAND_FIELDS.verify, "verify found the checkpoint invalid: verify's document"),
  documentOf(COMMAND_FIELDS.describe, "describe --verify found it invalid: describe's document"),
  documentOf(COMMAND_FIELDS.conformance.options[1], "a conformance check failed, or the run was interrupted: conformance's document"),
  documentOf(COMMAND_FIELDS.collect, "collect stopped (preempted, interrupted) or rows failed: collect's document"),
  ...COMMAND_FIELDS.demo.options.map((o, i) => documentOf(o, `the demo${i ? "'s collect scenario" : ''} failed: its document`)),
] as const

/** Every command's failure document. `details` differ per error and are snake_case objects. */
export const ErrorJson = z.strictObject({
  ok: z.literal(false),
  schema_version: z.literal(SCHEMA_VERSION),
  warnings: z.array(z.string()),
  error: z.strictObject({
    code: z.enum(Object.keys(EXIT).filter((k) => k !== 'ok') as [string, ...string[]]),
    exit_code: int(),
    message: z.string(),
    details: z.union(ERROR_DETAILS).optional(),
    next: z.array(z.string()).optional(),
  }),
})

// ---------------------------------------------------------------- README

/** A compact type for the README: `{rollout_id: string, attempt: integer}[]`. */
export function typeOf(s: z.ZodType): string {
  const d = (s as unknown as {def: {type: string}}).def
  switch (d.type) {
    case 'string':
      return (s as z.ZodString).format === 'datetime' ? 'RFC 3339 time' : 'string'
    case 'number':
      return (s as z.ZodNumber).isInt ? 'integer' : 'number'
    case 'boolean':
      return 'boolean'
    case 'literal':
      return (s as z.ZodLiteral).values.size === 1 ? JSON.stringify([...(s as z.ZodLiteral).values][0]) : 'literal'
    case 'enum':
      return (s as z.ZodEnum).options.map((o) => JSON.stringify(o)).join(' | ')
    case 'nullable':
      return `${typeOf((s as z.ZodNullable).unwrap() as z.ZodType)} | null`
    case 'optional':
      return `${typeOf((s as z.ZodOptional).unwrap() as z.ZodType)} (optional)`
    case 'array': {
      const inner = typeOf((s as z.ZodArray).element as z.ZodType)
      return inner.includes(' | ') && !inner.startsWith('{') ? `(${inner})[]` : `${inner}[]`
    }
    case 'record':
      return `{[key]: ${typeOf((s as z.ZodRecord).valueType as z.ZodType)}}`
    case 'object':
      return `{${Object.entries((s as z.ZodObject).shape)
        .map(([k, v]) => `${k}: ${typeOf(v as z.ZodType)}`)
        .join(', ')}}`
    case 'union':
      return (s as z.ZodUnion).options.map((o) => typeOf(o as z.ZodType)).join(' | ')
    default:
      return d.type
  }
}

function fieldLines(shape: z.ZodRawShape): string[] {
  return Object.entries(shape).map(([k, v]) => {
    const desc = (v as z.ZodType).description
    return `  - \`${k}\`: ${typeOf(v as z.ZodType)}${desc ? ` — ${desc}` : ''}`
  })
}

/** The README's "JSON output" section body, from the schemas above. */
export function renderJsonDocs(): string {
  const out: string[] = []
  for (const [name, f] of Object.entries(COMMAND_FIELDS) as [string, z.ZodRawShape | z.ZodType][]) {
    if (f instanceof z.ZodType) {
      const variants = (f as z.ZodUnion).options as z.ZodObject[]
      out.push(`- \`${name}\`, one of:`)
      for (const v of variants) {
        const tag = v.description ?? (v.shape.dry_run ? `dry_run ${typeOf(v.shape.dry_run as z.ZodType)}` : v.shape.scenario ? `scenario ${typeOf(v.shape.scenario as z.ZodType)}` : 'default')
        out.push(`  - ${tag}:`, ...fieldLines(v.shape).map((l) => `  ${l}`))
      }
    } else out.push(`- \`${name}\`:`, ...fieldLines(f))
  }
  out.push(
    '',
    "An error's `details`, when it has them, is one of the shapes below. Each shape that is not a command's document may also have `timings` (as in `commit`): each participant's call times up to the failure, when the failed operation had made timed calls.",
    '',
  )
  for (const d of ERROR_DETAILS) {
    const doc = d.description!
    if (doc.endsWith('document')) out.push(`- ${doc}`)
    else {
      const fields = fieldLines(Object.fromEntries(Object.entries((d as z.ZodObject).shape).filter(([k]) => k !== 'timings')))
      out.push(fields.length ? `- ${doc}:` : `- ${doc}`, ...fields)
    }
  }
  return out.join('\n')
}

type Fields<C extends CommandName> = (typeof COMMAND_FIELDS)[C]
/**
 * A command's own --json fields as a type (the envelope is added by the base class): each
 * command's run() returns it, so the compiler holds the commands to the documented contract.
 * Import it with `import type` (no zod at run time).
 */
export type CommandJson<C extends CommandName> = Fields<C> extends z.ZodType ? z.infer<Fields<C>> : Fields<C> extends z.ZodRawShape ? z.infer<z.ZodObject<Fields<C>>> : never
