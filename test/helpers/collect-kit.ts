import {ChildProcess, spawn} from 'node:child_process'
import {mkdir, readFile, writeFile} from 'node:fs/promises'
import path from 'node:path'
import {createInterface} from 'node:readline'
import {fileURLToPath} from 'node:url'

import {expect} from 'vitest'

import {Fleet} from '../../src/control-plane/fleet.js'
import {ParticipantServer} from '../../src/control-plane/server.js'
import {RunResult, SimEnvironment} from '../../src/control-plane/sim.js'
import {CollectOptions, CollectOutcome, Collector} from '../../src/coordination/collect.js'
import {Coordinator} from '../../src/coordination/operations.js'
import {ResultsFile, readRows} from '../../src/storage/collector.js'
import {FULL, TOKEN, later} from './fleet.js'

/** A Gym run body as the simulated environment takes it. */
export type RowBody = Record<string, unknown> & {_ng_rollout_id?: string; input: string; steps: number; step_ms: number}

/** `n` rows named r00..r<n-1>, `steps` each (some one or two more), so rows finish at different times. */
export function makeRows(n: number, opts: {steps?: number; stepMs?: number; prefix?: string} = {}): RowBody[] {
  const steps = opts.steps ?? 6
  return Array.from({length: n}, (_, i) => ({
    _ng_rollout_id: `${opts.prefix ?? 'r'}${String(i).padStart(2, '0')}`,
    input: `task ${i}`,
    steps: steps + (i % 3),
    step_ms: opts.stepMs ?? 20,
  }))
}

export const idOf = (b: Record<string, unknown>): string => (typeof b._ng_rollout_id === 'string' ? b._ng_rollout_id : `${String(b._ng_task_index)}-${String(b._ng_rollout_index)}`)

export async function writeRows(file: string, rows: Record<string, unknown>[]): Promise<string> {
  await writeFile(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n')
  return file
}

/** The complete lines of a results file, parsed. */
export async function readOutput(file: string): Promise<Record<string, any>[]> {
  let text: string
  try {
    text = await readFile(file, 'utf8')
  } catch {
    return []
  }
  const end = text.lastIndexOf('\n') + 1
  return text
    .slice(0, end)
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as Record<string, any>)
}

/** Results already computed in this test file, by rollout, input and steps. */
const known = new Map<string, string>()
const keyOf = (b: RowBody) => JSON.stringify([idOf(b), b.input, b.steps])

/**
 * The results of an uninterrupted run: every row once on a fresh fleet with the same server names
 * (the simulated result depends on the rollout, its input and steps and the servers, not on the
 * step duration or the attempt), so it runs with no step delay, and each row only once per file.
 */
export async function uninterrupted(rows: RowBody[]): Promise<Map<string, string>> {
  const missing = rows.filter((b) => !known.has(keyOf(b)))
  if (missing.length) {
    const fleet = await Fleet.start({token: TOKEN, members: FULL})
    try {
      await Promise.all(
        missing.map(async (b) => {
          const r = await fleet.run({rolloutId: idOf(b), input: b.input, steps: b.steps, stepMs: 0})
          if (r.status !== 200) throw new Error(`reference run of ${idOf(b)} failed: ${JSON.stringify(r.body)}`)
          known.set(keyOf(b), (r.body as RunResult).result)
        }),
      )
    } finally {
      await fleet.close()
    }
  }
  return new Map(rows.map((b) => [idOf(b), known.get(keyOf(b))!]))
}

/** Every row exactly once in the output, each result equal to the uninterrupted run's. */
export function expectSameAsUninterrupted(output: Record<string, any>[], reference: Map<string, string>): void {
  const ids = output.map((r) => r._ng_rollout_id as string)
  const dupes = ids.filter((id, i) => ids.indexOf(id) !== i)
  expect(dupes, 'rows written twice').toEqual([])
  expect([...ids].sort(), 'rows in the output').toEqual([...reference.keys()].sort())
  const wrong = output.filter((r) => r.result !== reference.get(r._ng_rollout_id)).map((r) => r._ng_rollout_id)
  expect(wrong, 'results that differ from the uninterrupted run').toEqual([])
}

/**
 * The episodes an environment server started, in order, as [rollout, attempt]: each /run that ran.
 * A /run refused before it ran (admission closed while a checkpoint is open: it never left the
 * server's door) may be sent again; one that started may not. Install before the collector runs.
 */
export function watchStarts(server: ParticipantServer): [string, number][] {
  const env = server.participant as SimEnvironment
  const started: [string, number][] = []
  const run = env.run.bind(env)
  env.run = (body) => {
    const p = run(body)
    started.push([body.rollout_id, body.attempt])
    return p
  }
  return started
}

/** The /run calls a server received, in order, as [rollout, attempt]. */
export function runsSent(server: ParticipantServer): [string, number][] {
  return server.journal
    .filter((j) => j.route === 'run')
    .map((j) => {
      const b = JSON.parse(j.body) as Record<string, unknown>
      return [idOf(b), (b._ng_attempt_index as number | undefined) ?? 0]
    })
}

/** The episodes of every retire a server received, as capture-free [rollout, attempt] pairs. */
export function retiresSent(server: ParticipantServer): [string, number][] {
  return server.journal
    .filter((j) => j.route === 'retire')
    .flatMap((j) => (JSON.parse(j.body) as {episode_ids: {rollout_id: string; attempt: number}[]}).episode_ids.map((e): [string, number] => [e.rollout_id, e.attempt]))
}

export function forgetsSent(server: ParticipantServer): string[] {
  return server.journal.filter((j) => j.route === 'forget').flatMap((j) => (JSON.parse(j.body) as {rollout_ids: string[]}).rollout_ids)
}

/** No (rollout, attempt) twice. */
export function expectNoAttemptTwice(sent: [string, number][]): void {
  const keys = sent.map(([r, a]) => `${r}@${a}`)
  expect(
    keys.filter((k, i) => keys.indexOf(k) !== i),
    '/run attempts sent twice',
  ).toEqual([])
}

/** The dispatch log as written: the run ID line, then [rollout, attempt] entries. */
export async function readDispatched(root: string): Promise<{runId: string; entries: [string, number][]}> {
  const lines = (await readFile(path.join(root, 'dispatched.jsonl'), 'utf8')).split('\n').filter((l) => l.trim())
  const head = JSON.parse(lines[0]!) as {run_id: string}
  return {runId: head.run_id, entries: lines.slice(1).map((l) => JSON.parse(l) as [string, number])}
}

export function highestAttempts(entries: [string, number][]): Map<string, number> {
  const m = new Map<string, number>()
  for (const [r, a] of entries) m.set(r, Math.max(m.get(r) ?? -1, a))
  return m
}

export interface Workdir {
  dir: string
  input: string
  output: string
  root: string
}

export async function workdir(dir: string, rows: Record<string, unknown>[]): Promise<Workdir> {
  const root = path.join(dir, 'root')
  await mkdir(root, {recursive: true})
  return {dir, input: await writeRows(path.join(dir, 'rows.jsonl'), rows), output: path.join(dir, 'results.jsonl'), root}
}

/** A Collector driven in this process, as the collect command wires it. */
export async function inProcess(
  c: Coordinator,
  fleet: Fleet,
  w: Workdir,
  opts: Partial<Omit<CollectOptions, 'rows' | 'output' | 'root' | 'runUrl'>> & {log?: (m: string) => void} = {},
): Promise<{collector: Collector; logs: string[]}> {
  const logs: string[] = []
  const resume = opts.resume ?? false
  const collector = new Collector(c, {
    rows: await readRows(w.input),
    root: w.root,
    output: await ResultsFile.open(w.output, {resume}),
    runUrl: fleet.server('env').url,
    concurrency: 8,
    checkpointEveryMs: null,
    timeoutS: 30,
    maxAttempts: 3,
    ...opts,
    resume,
    log: (m) => {
      logs.push(m)
      opts.log?.(m)
    },
  })
  return {collector, logs}
}

// ---------------------------------------------------------------- a collector in a child process

const CHILD = path.join(path.dirname(fileURLToPath(import.meta.url)), 'collect-child.ts')

export interface ChildConfig {
  servers: {name: string; url: string}[]
  input: string
  output: string
  root: string
  concurrency: number
  checkpointEveryMs: number | null
  resume: boolean
}

/** A message the child prints: a log line, a progress snapshot, or the outcome. */
export type ChildMessage = {log: string} | {progress: {done: number; inFlight: number; checkpoints: number}} | {outcome: CollectOutcome} | {error: string}

/**
 * A Collector in its own process (run from the sources through tsx), so a test can SIGKILL it
 * mid-run: nothing of it survives but what it wrote to disk. SIGUSR1 checkpoints, SIGTERM stops.
 */
export class CollectorProcess {
  readonly messages: ChildMessage[] = []
  readonly exited: Promise<number | null>
  private readonly child: ChildProcess
  private stderr = ''
  private waiters: (() => void)[] = []

  constructor(cfg: ChildConfig) {
    this.child = spawn(process.execPath, ['--import', 'tsx', CHILD, JSON.stringify({...cfg, token: TOKEN})], {stdio: ['ignore', 'pipe', 'pipe']})
    createInterface({input: this.child.stdout!}).on('line', (l) => {
      try {
        this.messages.push(JSON.parse(l) as ChildMessage)
      } catch {
        this.stderr += l + '\n'
      }
      for (const w of this.waiters.splice(0)) w()
    })
    this.child.stderr!.on('data', (d) => (this.stderr += d))
    this.exited = new Promise((resolve) =>
      this.child.on('exit', (code) => {
        for (const w of this.waiters.splice(0)) w()
        resolve(code)
      }),
    )
    later(() => this.kill())
  }

  get pid(): number {
    return this.child.pid!
  }

  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null
  }

  logs(): string[] {
    return this.messages.flatMap((m) => ('log' in m ? [m.log] : []))
  }

  /** Waits until a message satisfies `cond` (bounded; fails naming what it waited for). */
  async waitFor(what: string, cond: (m: ChildMessage) => boolean, ms = 20_000): Promise<ChildMessage> {
    const until = Date.now() + ms
    for (;;) {
      const hit = this.messages.find(cond)
      if (hit) return hit
      if (!this.alive) throw new Error(`collector child exited before ${what}: ${this.stderr.slice(-2000)} ${JSON.stringify(this.messages.slice(-5))}`)
      if (Date.now() > until) throw new Error(`timed out waiting for ${what}; last messages: ${JSON.stringify(this.messages.slice(-5))}`)
      await new Promise<void>((r) => {
        const t = setTimeout(r, 200)
        this.waiters.push(() => {
          clearTimeout(t)
          r()
        })
      })
    }
  }

  signal(sig: NodeJS.Signals): void {
    this.child.kill(sig)
  }

  /** SIGKILL, and wait until it is gone. */
  async kill(): Promise<void> {
    if (this.alive) this.child.kill('SIGKILL')
    await this.exited
  }

  async outcome(ms = 30_000): Promise<CollectOutcome> {
    const m = await this.waitFor('the outcome', (x) => 'outcome' in x || 'error' in x, ms)
    if ('error' in m) throw new Error(`collector child failed: ${m.error}`)
    return (m as {outcome: CollectOutcome}).outcome
  }
}
