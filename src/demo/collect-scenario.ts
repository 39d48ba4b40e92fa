import {ChildProcess, spawn} from 'node:child_process'
import {randomBytes} from 'node:crypto'
import {mkdir, mkdtemp, readFile, stat, writeFile} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import {createInterface} from 'node:readline'
import {fileURLToPath} from 'node:url'

import {DEFAULT_FLEET, Fleet} from '../control-plane/fleet.js'
import {ControlClient} from '../coordination/client.js'
import {Collector} from '../coordination/collect.js'
import {discover} from '../coordination/discover.js'
import {ResultsFile, readRows} from '../storage/collector.js'

/**
 * The collect rehearsal: a rollout collection run as separate processes (`gymckpt fleet`,
 * `gymckpt collect`), SIGKILLed mid-run together with every server, continued with
 * `collect --resume` on a freshly started fleet. Passes when the output, sorted by rollout id,
 * equals an uninterrupted run's row for row: no row lost, none duplicated, every result equal.
 */
export interface CollectDemoOptions {
  rows?: number
  steps?: number
  stepMs?: number
  /** Rows whose resources server cannot capture them (restarts: they start over after the crash). */
  restarts?: number
  /** Work directory: rows, results and the collection root go here (default: a new temp directory). */
  dir?: string
  log?: (msg: string) => void
  /** The gymckpt entry point the processes run (default: this package's bin/run.js). */
  bin?: string
}

export interface CollectDemoReport {
  ok: boolean
  rows: number
  dir: string
  root: string
  output: string
  /** The checkpoint LATEST named when everything was killed. */
  checkpointId: string
  doneBeforeCrash: number
  /** Rows the resumed run continued from that checkpoint (restored at attempt + 1). */
  continued: number
  /** Continued rows that resumed from a boundary past their first step. */
  continuedFromBoundary: number
  /** Rows started over from their input after the crash (restarts, rows sent after the checkpoint). */
  startedOver: number
  neverStarted: number
  missing: string[]
  duplicated: string[]
  mismatches: {rolloutId: string; expected: string; got: string | null}[]
  timingsMs: {reference: number; untilCrash: number; resume: number}
}

const DEFAULT_BIN = fileURLToPath(new URL('../../bin/run.js', import.meta.url))

interface Row {
  _ng_rollout_id: string
  input: string
  steps: number
  step_ms: number
  restart?: boolean
}

type Result = Record<string, unknown> & {_ng_rollout_id: string; result: string; _ng_attempt_index: number; resumed_from_step: number}

async function readResults(file: string): Promise<Result[]> {
  const text = await readFile(file, 'utf8').catch(() => '')
  return text
    .slice(0, text.lastIndexOf('\n') + 1)
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as Result)
}

async function readManifest(root: string, id: string): Promise<{continued: {rollout_id: string}[]; restarted: {rollout_id: string}[]}> {
  return JSON.parse(await readFile(path.join(root, id, 'collection.json'), 'utf8')) as {continued: {rollout_id: string}[]; restarted: {rollout_id: string}[]}
}

const exists = (f: string) =>
  stat(f).then(
    () => true,
    () => false,
  )

export async function runCollectDemo(opts: CollectDemoOptions = {}): Promise<CollectDemoReport> {
  const log = opts.log ?? (() => {})
  const n = opts.rows ?? 24
  const steps = opts.steps ?? 8
  const stepMs = opts.stepMs ?? 40
  const nRestarts = Math.min(opts.restarts ?? 2, n)
  const bin = opts.bin ?? DEFAULT_BIN
  const dir = opts.dir ?? (await mkdtemp(path.join(os.tmpdir(), 'gymckpt-collect-demo-')))
  await mkdir(dir, {recursive: true})
  const root = path.join(dir, 'root')
  const input = path.join(dir, 'rows.jsonl')
  const output = path.join(dir, 'results.jsonl')
  // Four waves at least, so the crash finds rows done, rows in flight and rows not yet sent.
  const concurrency = Math.max(1, Math.ceil(n / 4))
  // Restarts run long, so they are still running (and left out of the checkpoint) at the crash.
  const rows: Row[] = Array.from({length: n}, (_, i) => ({
    _ng_rollout_id: `row-${String(i).padStart(4, '0')}`,
    input: `task ${i}: ${'x'.repeat(i % 7)}`,
    steps: i < nRestarts ? steps * 4 : steps + (i % 3),
    step_ms: stepMs,
    ...(i < nRestarts ? {restart: true} : {}),
  }))
  await writeFile(input, rows.map((r) => JSON.stringify(r)).join('\n') + '\n')
  // The rehearsal fleets live in this run only; their token never leaves it.
  const token = randomBytes(16).toString('hex')
  const children = new Set<ChildProcess>()
  const t0 = Date.now()

  const gymckpt = (args: string[]) => {
    const p = spawn(process.execPath, [bin, ...args], {
      env: {...process.env, NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: token, NO_COLOR: '1', FORCE_COLOR: '0'},
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    children.add(p)
    let stdout = ''
    let stderr = ''
    p.stdout!.on('data', (d) => (stdout += d))
    p.stderr!.on('data', (d) => (stderr += d))
    const exited = new Promise<{code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string}>((resolve) =>
      p.on('exit', (code, signal) => {
        children.delete(p)
        resolve({code, signal, stdout, stderr})
      }),
    )
    return {p, exited, stderr: () => stderr}
  }

  /** `gymckpt fleet` in its own process; resolves with its head server URL. */
  const startFleet = async () => {
    const f = gymckpt(['fleet', '--json'])
    const line = await Promise.race([
      new Promise<string>((resolve) => createInterface({input: f.p.stdout!}).once('line', resolve)),
      f.exited.then((e) => {
        throw new Error(`gymckpt fleet exited (${e.code ?? e.signal}) before it was ready: ${e.stderr.slice(-500)}`)
      }),
    ])
    const head = (JSON.parse(line) as {head: string}).head
    return {...f, head}
  }

  try {
    // 1. The uninterrupted run: the same collector, in this process, on a fresh fleet, no crash.
    log(`uninterrupted: ${n} rows of ${steps} to ${steps * 4} steps, ${concurrency} at a time`)
    const reference = new Map<string, string>()
    {
      const refDir = path.join(dir, 'uninterrupted')
      await mkdir(path.join(refDir, 'root'), {recursive: true})
      await writeFile(path.join(refDir, 'rows.jsonl'), rows.map((r) => JSON.stringify({...r, step_ms: 0})).join('\n') + '\n')
      const fleet = await Fleet.start({token, members: DEFAULT_FLEET})
      const client = new ControlClient({token})
      try {
        const d = await discover(
          client,
          fleet.servers.map((s) => ({name: s.name, url: s.url})),
          {probeTimeoutMs: 10_000},
        )
        const out = await new Collector(
          {client, participants: d.participants},
          {
            rows: await readRows(path.join(refDir, 'rows.jsonl')),
            root: path.join(refDir, 'root'),
            output: await ResultsFile.open(path.join(refDir, 'results.jsonl'), {resume: false}),
            runUrl: fleet.environments[0]!.url,
            concurrency,
            checkpointEveryMs: null,
            timeoutS: 60,
            maxAttempts: 1,
            resume: false,
            log: () => {},
          },
        ).run()
        if (out.failedRows.length) throw new Error(`the uninterrupted run failed rows: ${JSON.stringify(out.failedRows.slice(0, 3))}`)
        for (const r of await readResults(path.join(refDir, 'results.jsonl'))) reference.set(r._ng_rollout_id, r.result)
      } finally {
        await client.close()
        await fleet.close()
      }
    }
    const tRef = Date.now()

    // 2. The collection in its own processes: checkpointed every second and on SIGUSR1, then
    //    the collector and every server are SIGKILLed at once.
    const fleet1 = await startFleet()
    log(`fleet: gymckpt fleet (pid ${fleet1.p.pid}), head server ${fleet1.head}`)
    const collectArgs = (head: string) => ['collect', '--head', head, '--input', input, '--output', output, '--root', root, '--concurrency', String(concurrency), '--checkpoint-every', '1s']
    const run1 = gymckpt(collectArgs(fleet1.head))
    log(`collect: gymckpt ${collectArgs(fleet1.head).join(' ')} (pid ${run1.p.pid})`)
    const until = Date.now() + 120_000
    const finishedEarly = () => !children.has(run1.p)
    const waitUntil = async (what: string, cond: () => Promise<boolean>) => {
      while (!(await cond())) {
        if (finishedEarly()) throw new Error(`the collection ended before ${what} (${run1.stderr().slice(-500).trim()}); give it more rows or steps`)
        if (Date.now() > until) throw new Error(`timed out waiting for ${what}`)
        await new Promise((r) => setTimeout(r, 20))
      }
    }
    // The dispatch log exists once the collector runs (its SIGUSR1 handler is installed by then).
    await waitUntil('its first dispatch', () => exists(path.join(root, 'dispatched.jsonl')))
    await waitUntil(`${Math.ceil(n / 4)} rows done`, async () => (await readResults(output)).length >= Math.ceil(n / 4))
    run1.p.kill('SIGUSR1')
    await waitUntil('a published checkpoint', () => exists(path.join(root, 'LATEST')))
    // Crash once a row sent after that checkpoint is running: then the resume meets every case
    // (rows done, rows continued from the checkpoint, restarts and later rows started over, rows
    // never sent).
    const first = await readManifest(root, (await readFile(path.join(root, 'LATEST'), 'utf8')).trim())
    const known = new Set([...first.continued, ...first.restarted].map((e) => e.rollout_id))
    await waitUntil('a row sent after the checkpoint', async () => {
      const done = new Set((await readResults(output)).map((r) => r._ng_rollout_id))
      const sent = (await readFile(path.join(root, 'dispatched.jsonl'), 'utf8')).split('\n').slice(1, -1)
      return sent.some((l) => {
        const id = (JSON.parse(l) as [string, number])[0]
        return !known.has(id) && !done.has(id)
      })
    })
    run1.p.kill('SIGKILL')
    fleet1.p.kill('SIGKILL')
    await Promise.all([run1.exited, fleet1.exited])
    const tCrash = Date.now()
    const checkpointId = (await readFile(path.join(root, 'LATEST'), 'utf8')).trim()
    const doneBefore = new Set((await readResults(output)).map((r) => r._ng_rollout_id))
    // What the resume restores: the rows LATEST's checkpoint continued that were not done yet.
    const inCheckpoint = new Set((await readManifest(root, checkpointId)).continued.map((e) => e.rollout_id))
    log(`crash: SIGKILL to the collector and the fleet with ${doneBefore.size}/${n} rows done; LATEST names ${checkpointId}`)

    // 3. A fresh fleet, and the same command with --resume.
    const fleet2 = await startFleet()
    log(`fresh fleet (pid ${fleet2.p.pid}), head server ${fleet2.head}; gymckpt collect … --resume`)
    const run2 = gymckpt([...collectArgs(fleet2.head), '--resume', '--json'])
    const end = await run2.exited
    if (end.code !== 0) throw new Error(`collect --resume exited ${end.code ?? end.signal}: ${end.stderr.slice(-1000).trim()}`)
    const summary = JSON.parse(end.stdout) as {restores: number; checkpoints: number}
    log(`collect --resume: exit 0, ${summary.restores} restore(s), ${summary.checkpoints} checkpoint(s) of its own`)
    fleet2.p.kill('SIGINT')
    let grace: NodeJS.Timeout | undefined
    await Promise.race([fleet2.exited, new Promise((r) => (grace = setTimeout(r, 5000)))])
    clearTimeout(grace)
    const tDone = Date.now()

    // 4. Row for row, sorted by rollout id.
    const results = (await readResults(output)).sort((a, b) => a._ng_rollout_id.localeCompare(b._ng_rollout_id))
    const seen = new Map<string, number>()
    for (const r of results) seen.set(r._ng_rollout_id, (seen.get(r._ng_rollout_id) ?? 0) + 1)
    const ids = [...reference.keys()].sort()
    const missing = ids.filter((id) => !seen.has(id))
    const duplicated = [...seen].filter(([, c]) => c > 1).map(([id]) => id)
    const byId = new Map(results.map((r) => [r._ng_rollout_id, r]))
    const mismatches = ids.filter((id) => byId.has(id) && byId.get(id)!.result !== reference.get(id)).map((id) => ({rolloutId: id, expected: reference.get(id)!, got: byId.get(id)!.result}))
    const after = results.filter((r) => !doneBefore.has(r._ng_rollout_id))
    const continued = after.filter((r) => inCheckpoint.has(r._ng_rollout_id))
    return {
      ok: missing.length === 0 && duplicated.length === 0 && mismatches.length === 0 && results.length === n,
      rows: n,
      dir,
      root,
      output,
      checkpointId,
      doneBeforeCrash: doneBefore.size,
      continued: continued.length,
      continuedFromBoundary: continued.filter((r) => r.resumed_from_step > 0).length,
      startedOver: after.filter((r) => !inCheckpoint.has(r._ng_rollout_id) && r._ng_attempt_index > 0).length,
      neverStarted: after.filter((r) => !inCheckpoint.has(r._ng_rollout_id) && r._ng_attempt_index === 0).length,
      missing,
      duplicated,
      mismatches,
      timingsMs: {reference: tRef - t0, untilCrash: tCrash - tRef, resume: tDone - tCrash},
    }
  } finally {
    for (const p of children) p.kill('SIGKILL')
  }
}
