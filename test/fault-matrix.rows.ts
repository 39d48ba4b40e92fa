/**
 * The fault matrix as data: each row is one fault, what gymckpt does about it, the exit code, and
 * what the operator does next. Every row without a knownBug has a test (test/cli/fault-matrix.test.ts
 * for the rows where the CLI runs as a process, test/integration/fault-matrix.test.ts for the
 * in-process ones; each file checks it ran them all), and the README's "Failure behaviour" table
 * is generated from these rows (failureTable(); test/integration/fault-matrix.test.ts checks it).
 */

export type FaultRowId =
  | 'sigint-prepare'
  | 'sigterm-prepare'
  | 'sigkill-prepare'
  | 'sigint-commit'
  | 'sigterm-commit'
  | 'sigkill-commit'
  | 'sigint-before-resume'
  | 'sigterm-before-resume'
  | 'sigkill-before-resume'
  | 'sigint-restore'
  | 'sigterm-restore'
  | 'sigkill-restore'
  | 'member-killed'
  | 'member-hung'
  | 'member-500'
  | 'member-restarted'
  | 'wrong-token'
  | 'two-checkpoints'
  | 'checkpoint-during-restore'
  | 'two-restores'
  | 'two-restores-late'
  | 'root-read-only'
  | 'disk-full'
  | 'reply-huge'
  | 'reply-deep'
  | 'commit-reply-deep'
  | 'status-wrong-types'
  | 'commit-wrong-types'
  | 'commit-bad-keys'
  | 'unsafe-instance'
  | 'unsafe-kind'

export interface FaultRow {
  id: FaultRowId
  /** What goes wrong. */
  fault: string
  /** What gymckpt does about it. */
  does: string
  /** The exit codes the command may end with; 'killed' when the fault is the command being killed. */
  exit: readonly number[] | 'killed'
  /** What the operator does next. */
  operator: string
  /** Where the row's test lives. */
  test: 'cli' | 'integration'
  /**
   * Set while the product does not yet do what the row says: the row's test is not in the test
   * file (it would fail) and the coverage checks leave the row out. Remove it with the fix.
   */
  knownBug?: string
}

/** When a participant left closed reopens by itself. */
const LEASE = '`--timeout` (default 300 s) plus the lease grace (Gym: 600 s) after the last prepare or renewal'
const RESUMES = 'resumes every participant (reverse order)'

export const FAULT_ROWS: readonly FaultRow[] = [
  // ---- the command is interrupted or killed
  {
    id: 'sigint-prepare',
    fault: '`checkpoint` gets SIGINT while prepare waits for blockers',
    does: `stops waiting, ${RESUMES}; nothing is written`,
    exit: [130],
    operator: 'nothing to clean up; checkpoint again when ready (a new ID)',
    test: 'cli',
  },
  {
    id: 'sigterm-prepare',
    fault: '`checkpoint` gets SIGTERM while prepare waits for blockers',
    does: `stops waiting, ${RESUMES}; nothing is written`,
    exit: [130],
    operator: 'nothing to clean up; checkpoint again when ready (a new ID)',
    test: 'cli',
  },
  {
    id: 'sigkill-prepare',
    fault: '`checkpoint` is killed (SIGKILL) while prepare waits for blockers',
    does: 'nothing more: the participants it prepared stay closed; later stages were never called',
    exit: 'killed',
    operator: `\`gymckpt resume --id ID\` (\`gymckpt status\` shows the ID), or wait: each participant reopens by itself when its lease ends, ${LEASE}`,
    test: 'cli',
  },
  {
    id: 'sigint-commit',
    fault: '`checkpoint` gets SIGINT during commit (a participant still writing)',
    does: `stops waiting, ${RESUMES}; LATEST keeps its value; the new directory gets no gymckpt.json`,
    exit: [130],
    operator: 'checkpoint again (a new ID); `gymckpt prune ROOT --yes` removes the unpublished directory once a newer checkpoint is published',
    test: 'cli',
  },
  {
    id: 'sigterm-commit',
    fault: '`checkpoint` gets SIGTERM during commit (a participant still writing)',
    does: `stops waiting, ${RESUMES}; LATEST keeps its value; the new directory gets no gymckpt.json`,
    exit: [130],
    operator: 'checkpoint again (a new ID); `gymckpt prune ROOT --yes` removes the unpublished directory once a newer checkpoint is published',
    test: 'cli',
  },
  {
    id: 'sigkill-commit',
    fault: '`checkpoint` is killed (SIGKILL) during commit',
    does: 'nothing more: the participants stay closed (committed, or prepared where the commit had not finished); LATEST keeps its value; the new directory has no gymckpt.json',
    exit: 'killed',
    operator: `\`gymckpt resume --id ID\`, or wait until the leases end, ${LEASE}; then checkpoint again (a new ID)`,
    test: 'cli',
  },
  {
    id: 'sigint-before-resume',
    fault: '`checkpoint` gets SIGINT after publishing, while it resumes',
    does: 'finishes resuming every participant; the new checkpoint stays published',
    exit: [130],
    operator: 'nothing: LATEST names the new checkpoint and the fleet runs',
    test: 'cli',
  },
  {
    id: 'sigterm-before-resume',
    fault: '`checkpoint` gets SIGTERM after publishing, while it resumes',
    does: 'finishes resuming every participant; the new checkpoint stays published',
    exit: [130],
    operator: 'nothing: LATEST names the new checkpoint and the fleet runs',
    test: 'cli',
  },
  {
    id: 'sigkill-before-resume',
    fault: '`checkpoint` is killed (SIGKILL) after publishing, before resuming',
    does: 'nothing more: LATEST names the new checkpoint, which verifies; the participants stay closed (committed)',
    exit: 'killed',
    operator: `\`gymckpt resume --id ID\`, or wait until the leases end, ${LEASE}`,
    test: 'cli',
  },
  {
    id: 'sigint-restore',
    fault: '`restore` gets SIGINT while participants restore',
    does: `stops waiting, retires the replacement attempts on each participant that restored or may have (idle, no reply), ${RESUMES}; LATEST is untouched`,
    exit: [130],
    operator: 'restart the servers and restore again: the retire marks left on this fleet make a new restore refuse it (exit 8)',
    test: 'cli',
  },
  {
    id: 'sigterm-restore',
    fault: '`restore` gets SIGTERM while participants restore',
    does: `stops waiting, retires the replacement attempts on each participant that restored or may have (idle, no reply), ${RESUMES}; LATEST is untouched`,
    exit: [130],
    operator: 'restart the servers and restore again: the retire marks left on this fleet make a new restore refuse it (exit 8)',
    test: 'cli',
  },
  {
    id: 'sigkill-restore',
    fault: '`restore` is killed (SIGKILL) while participants restore',
    does: 'nothing more: the participants that restored stay closed under the restore ID, the others stay idle',
    exit: 'killed',
    operator: '`gymckpt resume` (it finds the restore ID) or wait for the leases; then restart the servers and restore again: a partly restored fleet is refused by a new restore (exit 8)',
    test: 'cli',
  },
  // ---- a participant fails between prepare and commit (separate processes)
  {
    id: 'member-killed',
    fault: 'a participant dies between `prepare` and `commit`',
    does: '`commit` resumes every reachable participant under the open ID and names the dead one; nothing is written',
    exit: [3],
    operator: 'restart it (a fresh process holds no checkpoint), then checkpoint again (a new ID)',
    test: 'cli',
  },
  {
    id: 'member-hung',
    fault: 'a participant hangs between `prepare` and `commit`',
    does: '`commit` gives up on it after `--probe-timeout`, resumes every other participant under the open ID and names the silent one; nothing is written',
    exit: [3],
    operator: 'once it answers, `gymckpt resume --id ID` (or let its lease end); then checkpoint again (a new ID)',
    test: 'cli',
  },
  {
    id: 'member-500',
    fault: 'a participant answers HTTP 500 between `prepare` and `commit`',
    does: '`commit` resumes every other participant under the open ID and names the failing one; nothing is written',
    exit: [3],
    operator: 'once it answers, `gymckpt resume --id ID` (or let its lease end); then checkpoint again (a new ID)',
    test: 'cli',
  },
  {
    id: 'member-restarted',
    fault: 'a participant restarts empty between `prepare` and `commit`',
    does: '`commit` resumes every participant under the open ID (fencing it on the restarted one) and names that one; nothing is written',
    exit: [4],
    operator: 'checkpoint again (a new ID)',
    test: 'cli',
  },
  // ---- the fleet or the root is not as expected
  {
    id: 'wrong-token',
    fault: 'the control token is wrong',
    does: 'discovery fails on every participant (HTTP 401); nothing else is sent; the token is never printed',
    exit: [7],
    operator: 'fix `NEMO_GYM_CHECKPOINT_CONTROL_TOKEN` (or `--token-file`)',
    test: 'integration',
  },
  {
    id: 'two-checkpoints',
    fault: 'two `checkpoint` commands at once on one fleet and root',
    does: 'one publishes; the other is refused before preparing (another checkpoint is open) or loses the prepare race, and resumes only its own ID',
    exit: [8, 4],
    operator: 'nothing: LATEST names the winner; run one controller per fleet',
    test: 'integration',
  },
  {
    id: 'checkpoint-during-restore',
    fault: '`checkpoint` while a `restore` is in progress',
    does: 'refused before anything is sent (a restore is open); the restore finishes undisturbed',
    exit: [8],
    operator: 'checkpoint again once the restore has resumed the fleet',
    test: 'integration',
  },
  {
    id: 'two-restores',
    fault: 'two `restore` commands at once into one fresh fleet',
    does: 'at most one succeeds; the other fails where the first holds the fleet, and retires only what it installed itself',
    exit: [4, 8],
    operator: 'nothing if one succeeded; if none did, restart the servers and restore once',
    test: 'integration',
  },
  {
    id: 'two-restores-late',
    fault: 'a second `restore` whose preflight passed before the first one finished',
    does: "every participant refuses it (they hold the first restore's state); it retires nothing; the first restore's episodes continue",
    exit: [4],
    operator: 'nothing: the first restore stands; run one restore per fleet',
    test: 'integration',
  },
  {
    id: 'root-read-only',
    fault: 'the checkpoint root is not writable (read-only file system)',
    does: 'refuses before prepare, naming the cause (EROFS); only status probes are sent',
    exit: [2],
    operator: 'fix the mount, or pass another `--root`',
    test: 'cli',
  },
  {
    id: 'disk-full',
    fault: 'the disk fills up during commit',
    does: 'the participant reports its failed write (HTTP 422, ENOSPC); every participant is resumed; LATEST keeps its value; no manifest appears in the new directory',
    exit: [4, 6],
    operator: 'free space (`gymckpt prune ROOT --yes` removes old checkpoints), then checkpoint again',
    test: 'integration',
  },
  // ---- a participant's replies are malicious or broken
  {
    id: 'reply-huge',
    fault: 'a participant answers status with a 50 MB body that is not JSON',
    does: 'discovery refuses the reply, naming the server and quoting at most 200 bytes; nothing else is sent',
    exit: [3],
    operator: 'fix or remove that server',
    test: 'cli',
  },
  {
    id: 'reply-deep',
    fault: 'a participant answers status with JSON nested 100,000 levels deep',
    does: 'discovery refuses the reply, naming the server; nothing else is sent',
    exit: [3],
    operator: 'fix or remove that server',
    test: 'cli',
  },
  {
    id: 'commit-reply-deep',
    fault: 'a participant answers commit with a manifest field nested 100,000 levels deep',
    does: 'the commit fails naming that server; every participant is resumed; nothing is published',
    exit: [4, 6],
    operator: 'fix or remove that server, then checkpoint again',
    test: 'cli',
  },
  {
    id: 'status-wrong-types',
    fault: 'a participant answers status with fields of the wrong type',
    does: 'discovery refuses the reply, naming the server and the field; nothing else is sent',
    exit: [3],
    operator: 'fix or remove that server',
    test: 'cli',
  },
  {
    id: 'commit-wrong-types',
    fault: 'a participant answers commit with fields of the wrong type',
    does: 'the commit fails naming the server and the field; every participant is resumed; nothing is published',
    exit: [4],
    operator: 'fix or remove that server, then checkpoint again',
    test: 'cli',
  },
  {
    id: 'commit-bad-keys',
    fault: 'a participant answers commit with an episode key that is no capture key (`../../etc/passwd`)',
    does: 'the commit fails naming that server; every participant is resumed; nothing is published',
    exit: [4],
    operator: 'fix or remove that server, then checkpoint again',
    test: 'cli',
  },
  {
    id: 'unsafe-instance',
    fault: 'a participant reports an instance name with `../` or `/`',
    does: 'discovery fails naming it (unsafe_instance); nothing else is sent, nothing is written',
    exit: [3],
    operator: "fix that server's instance name",
    test: 'cli',
  },
  {
    id: 'unsafe-kind',
    fault: 'a participant reports a kind with `../` or `/`',
    does: 'discovery fails naming it (unknown_kind); nothing else is sent, nothing is written',
    exit: [3],
    operator: 'fix or remove that server',
    test: 'cli',
  },
]

/** The rows whose test must be in `file` (rows with a known bug are left out until the fix). */
export function rowsTestedIn(file: FaultRow['test']): FaultRowId[] {
  return FAULT_ROWS.filter((r) => r.test === file && !r.knownBug)
    .map((r) => r.id)
    .sort()
}

export function row(id: FaultRowId): FaultRow {
  const r = FAULT_ROWS.find((x) => x.id === id)
  if (!r) throw new Error(`no fault row '${id}'`)
  return r
}

function exitText(exit: FaultRow['exit']): string {
  return exit === 'killed' ? 'none: killed' : exit.join(' or ')
}

const cell = (s: string) => s.replace(/\|/g, '\\|').replace(/\n/g, ' ')

/** The README's "Failure behaviour" table, as markdown. */
export function failureTable(rows: readonly FaultRow[] = FAULT_ROWS): string {
  return [
    '| fault | what gymckpt does | exit code | what the operator does |',
    '| --- | --- | --- | --- |',
    ...rows.map((r) => `| ${cell(r.fault)} | ${cell(r.does)} | ${exitText(r.exit)} | ${cell(r.operator)} |`),
  ].join('\n')
}

export const FAILURE_TABLE_START = '<!-- failure-table:start -->'
export const FAILURE_TABLE_END = '<!-- failure-table:end -->'
