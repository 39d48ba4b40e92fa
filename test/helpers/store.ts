// Hand-made participant state and verify with real worker threads, shared by the storage tests.
import {createHash, randomBytes} from 'node:crypto'
import {cp, mkdir, readFile, rm, rmdir, writeFile} from 'node:fs/promises'
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
 * Stryker's instrumented code keeps the active mutant and the coverage it records in a global
 * (`__stryker__`), which a worker thread does not share: in a mutation run the worker would run
 * every mutant unmutated, and its coverage would be lost, so the worker body's mutants would show as
 * "no coverage". The bridge passes both across: the active mutant in the environment a new worker
 * copies (`__STRYKER_ACTIVE_MUTANT__`, which the instrumented code reads when its global has
 * none), and the worker's coverage in a file it writes before each reply, which the test's thread
 * adds to the running test's. What the worker covered while its modules loaded is static
 * coverage, as module-level code is in the test's own thread (and so left out by `ignoreStatic`):
 * it goes to Stryker's static coverage, not to the test that started the worker. Outside a
 * mutation run there is no `__stryker__`, and it does nothing.
 */
interface StrykerGlobal {
  activeMutant?: string
  currentTestId?: string
  mutantCoverage?: {static: Record<string, number>; perTest: Record<string, Record<string, number>>}
}
const ACTIVE_MUTANT_ENV = '__STRYKER_ACTIVE_MUTANT__'
const strykerGlobal = () => (globalThis as {__stryker__?: StrykerGlobal}).__stryker__

/**
 * The shim's prelude and epilogue: once its modules have loaded (the shim's last line has run),
 * the worker writes what loading covered, marked `load`; before each reply, what it has covered
 * since. Each is written once: a worker given several directories reports each one's anew.
 */
const coveragePrelude = (log: string) => `// Written by test/helpers/store.ts: a mutation run's coverage, passed out of the worker.
import {appendFileSync as __appendCoverage} from 'node:fs'
import {parentPort as __port} from 'node:worker_threads'
const __writeCoverage = (load) => {
  const coverage = globalThis.__stryker__?.mutantCoverage?.static
  if (!coverage) return
  __appendCoverage(${JSON.stringify(log)}, JSON.stringify({load, coverage}) + '\\n')
  for (const id of Object.keys(coverage)) delete coverage[id]
}
const __post = __port.postMessage.bind(__port)
__port.postMessage = (message) => {
  __writeCoverage(false)
  __post(message)
}
`
const coverageEpilogue = `
__writeCoverage(true)
`

/**
 * Adds what the workers covered to the running test's coverage (or the static one between tests);
 * what they covered while loading, to the static coverage.
 */
async function takeWorkerCoverage(log: string, ns: StrykerGlobal): Promise<void> {
  const text = await readFile(log, 'utf8').catch(() => '')
  await rm(log, {force: true})
  const cov = (ns.mutantCoverage ??= {static: {}, perTest: {}})
  const test = ns.currentTestId ? (cov.perTest[ns.currentTestId] ??= {}) : cov.static
  for (const line of text.split('\n').filter(Boolean)) {
    const {load, coverage} = JSON.parse(line) as {load: boolean; coverage: Record<string, number>}
    const into = load ? cov.static : test
    for (const [id, n] of Object.entries(coverage)) into[id] = (into[id] ?? 0) + n
  }
}

/**
 * src/ copied into the scratch directory `dir`, with `storage/verify-worker.js` replaced by `shim`
 * (which loads the TypeScript worker through tsx), and verify imported from that copy: its worker
 * threads then run, in process, the code under test, mutants included (the bridge above). `shim`
 * must load the worker with a top-level `await import(...)` as its last statement: the line the
 * bridge appends after it marks the end of loading. `remove` deletes the copy (and .test-tmp itself
 * when no other run uses it).
 */
export async function verifyWithWorkerShim(dir: string, shim: string): Promise<{verify: typeof import('../../src/storage/verify.js'); remove: () => Promise<void>}> {
  await mkdir(dir, {recursive: true})
  await cp(path.resolve('src'), path.join(dir, 'src'), {recursive: true})
  const log = path.join(dir, 'worker-coverage.jsonl')
  await writeFile(path.join(dir, 'src', 'storage', 'verify-worker.js'), coveragePrelude(log) + shim + coverageEpilogue)
  const mod = (await import(pathToFileURL(path.join(dir, 'src', 'storage', 'verify.ts')).href)) as typeof import('../../src/storage/verify.js')
  const verifyCheckpoint: typeof mod.verifyCheckpoint = async (...args) => {
    const ns = strykerGlobal()
    if (!ns) return mod.verifyCheckpoint(...args)
    if (ns.activeMutant !== undefined) process.env[ACTIVE_MUTANT_ENV] = ns.activeMutant
    try {
      return await mod.verifyCheckpoint(...args)
    } finally {
      delete process.env[ACTIVE_MUTANT_ENV]
      await takeWorkerCoverage(log, ns)
    }
  }
  const remove = async () => {
    await rm(dir, {recursive: true, force: true})
    await rmdir(path.dirname(dir)).catch(() => {})
  }
  return {verify: {...mod, verifyCheckpoint}, remove}
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
