// A rollout collection of short episodes at concurrency 256 on the simulated fleet: rows/s with a
// checkpoint every 2 s against checkpointing off, in one invocation, alternating the two; and the
// pause each checkpoint puts on dispatch against the fleet's own prepare+commit time.
// Roles (one file): the main process; `--role fleet` hosts the simulated fleet (environment, policy
// model, agent, resources) in its own process; `--role controller` runs one collection (a Collector
// from dist/, as `gymckpt collect` wires it) in its own process, so each run's peak RSS is its own.
// Usage: npm run bench:collect -- [--rows 10000] [--concurrency 256] [--every 2] [--rounds 2] [--steps 3] [--step-ms 5]
import {spawn} from 'node:child_process'
import {mkdirSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {mkdtemp} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import {createInterface} from 'node:readline'
import {fileURLToPath} from 'node:url'

import {arg, machine, median} from './lib.mjs'

const ROWS = arg('rows', 10_000)
const CONCURRENCY = arg('concurrency', 256)
const EVERY_S = arg('every', 2)
const ROUNDS = arg('rounds', 2)
const STEPS = arg('steps', 3)
const STEP_MS = arg('step-ms', 5)
const TOKEN = 'bench-collect-token'
const SELF = fileURLToPath(import.meta.url)
const role = process.argv.includes('--role') ? process.argv[process.argv.indexOf('--role') + 1] : 'main'

const maxRssKb = () => process.resourceUsage().maxRSS

if (role === 'fleet') {
  const {Fleet, DEFAULT_FLEET} = await import('../dist/control-plane/fleet.js')
  const fleet = await Fleet.start({token: TOKEN, members: DEFAULT_FLEET})
  process.stdout.write(JSON.stringify(fleet.servers.map((s) => ({name: s.name, url: s.url}))) + '\n')
  process.stdin.resume()
  process.stdin.on('end', async () => {
    await fleet.close()
    process.stdout.write(JSON.stringify({peak_rss_kb: maxRssKb()}) + '\n')
    process.exit(0)
  })
} else if (role === 'controller') {
  const [servers, dir, every] = [JSON.parse(process.argv.at(-3)), process.argv.at(-2), Number(process.argv.at(-1))]
  const {ControlClient} = await import('../dist/coordination/client.js')
  const {discover} = await import('../dist/coordination/discover.js')
  const {Collector} = await import('../dist/coordination/collect.js')
  const {ResultsFile, readRows} = await import('../dist/storage/collector.js')
  const client = new ControlClient({token: TOKEN})
  const d = await discover(client, servers, {probeTimeoutMs: 10_000})
  // Each checkpoint's segments, from the stage events: before prepare (root check, status
  // preflight), prepare, commit (the fleet's own prepare+commit), publish (waiting for /run replies
  // already on the wire, gymckpt.json and collection.json, the publish gate's verify, LATEST),
  // resume (the fleet's), and after it (output sync, prune). `blocked`: the whole time dispatch
  // waited on the checkpoint, prune included.
  const segs = []
  let cur = null
  const onStage = (e) => {
    if (!cur) return
    const now = performance.now()
    if (e.operation === 'prepare' && !e.done) cur.prepareStart ??= now
    if (e.operation === 'prepare' && e.done) cur.prepareDone = now
    if (e.operation === 'commit' && !e.done) cur.commitStart ??= now
    if (e.operation === 'commit' && e.done) cur.commitDone = now
    if (e.operation === 'resume' && !e.done) cur.resumeStart ??= now
    if (e.operation === 'resume' && e.done) cur.resumeDone = now
  }
  const root = path.join(dir, 'root')
  mkdirSync(root, {recursive: true})
  const collector = new Collector(
    {client, participants: d.participants, onStage},
    {
      rows: await readRows(path.join(dir, '..', 'rows.jsonl')),
      root,
      output: await ResultsFile.open(path.join(dir, 'results.jsonl'), {resume: false}),
      runUrl: d.participants.find((p) => p.kind === 'environment').url,
      concurrency: CONCURRENCY,
      checkpointEveryMs: every > 0 ? every * 1000 : null,
      timeoutS: 300,
      maxAttempts: 3,
      resume: false,
      log: (m) => (m.startsWith('checkpoint ckpt-') ? null : process.stderr.write(`controller: ${m}\n`)),
    },
  )
  // Times each checkpoint as the dispatch loop sees it (an observation wrapper, nothing changed).
  const take = collector.takeCheckpoint.bind(collector)
  collector.takeCheckpoint = async (runId) => {
    cur = {start: performance.now()}
    try {
      return await take(runId)
    } finally {
      cur.end = performance.now()
      if (cur.commitDone && cur.resumeDone) segs.push(cur)
      cur = null
    }
  }
  const out = await collector.run()
  await client.close()
  // Rows are counted in the output itself; the outcome's own count (done_counted) must agree.
  const written = readFileSync(path.join(dir, 'results.jsonl'), 'utf8').split('\n').filter(Boolean).length
  process.stdout.write(
    JSON.stringify({
      rows: out.total,
      done: written,
      done_counted: out.done,
      failed: out.failed,
      wall_ms: out.wallMs,
      checkpoints: out.checkpoints,
      missed: out.checkpointsMissed + out.checkpointsFailed,
      pauses_ms: out.pausesMs,
      fleet_prepare_commit_ms: segs.map((x) => x.commitDone - x.prepareStart),
      fleet_resume_ms: segs.map((x) => x.resumeDone - x.resumeStart),
      segments_ms: segs.map((x) => ({
        before_prepare: x.prepareStart - x.start,
        prepare: x.prepareDone - x.prepareStart,
        commit: x.commitDone - x.commitStart,
        publish: x.resumeStart - x.commitDone,
        resume: x.resumeDone - x.resumeStart,
        after_resume: x.end - x.resumeDone,
        blocked: x.end - x.start,
      })),
      peak_rss_kb: maxRssKb(),
    }) + '\n',
  )
  process.exit(0)
} else {
  const tmp = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-bench-collect-'))
  writeFileSync(
    path.join(tmp, 'rows.jsonl'),
    Array.from({length: ROWS}, (_, i) => JSON.stringify({_ng_rollout_id: `b${String(i).padStart(6, '0')}`, input: `bench task ${i}`, steps: STEPS, step_ms: STEP_MS})).join('\n') + '\n',
  )

  const lines = (child) => {
    const rl = createInterface({input: child.stdout})
    const queue = []
    const waiting = []
    rl.on('line', (l) => (waiting.length ? waiting.shift()(l) : queue.push(l)))
    return () => (queue.length ? Promise.resolve(queue.shift()) : new Promise((r) => waiting.push(r)))
  }

  /** One collection on a fresh fleet: both in their own processes. */
  async function collection(every, n) {
    const fleet = spawn(process.execPath, [SELF, ...process.argv.slice(2), '--role', 'fleet'], {stdio: ['pipe', 'pipe', 'inherit']})
    const fleetLine = lines(fleet)
    const servers = await fleetLine()
    const dir = path.join(tmp, `run-${n}`)
    mkdirSync(dir, {recursive: true})
    const ctl = spawn(process.execPath, [SELF, ...process.argv.slice(2), '--role', 'controller', servers, dir, String(every)], {stdio: ['ignore', 'pipe', 'inherit']})
    const result = JSON.parse(await lines(ctl)())
    await new Promise((r) => ctl.on('exit', r))
    fleet.stdin.end()
    const fleetRss = JSON.parse(await fleetLine()).peak_rss_kb
    await new Promise((r) => fleet.on('exit', r))
    rmSync(dir, {recursive: true, force: true})
    if (result.done !== ROWS || result.failed) throw new Error(`run ${n}: ${result.done}/${ROWS} rows done, ${result.failed} failed`)
    return {...result, fleet_rss_kb: fleetRss, rows_per_s: (ROWS * 1000) / result.wall_ms}
  }

  const loadavg = () => {
    try {
      return readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ')
    } catch {
      return 'n/a'
    }
  }
  const loadBefore = loadavg()
  const on = []
  const off = []
  try {
    // Alternate, so a noisy stretch of the machine hits both sides alike.
    for (let r = 0; r < ROUNDS; r++) {
      off.push(await collection(0, `${r}-off`))
      on.push(await collection(EVERY_S, `${r}-on`))
      console.error(`round ${r + 1}/${ROUNDS}: off ${off.at(-1).rows_per_s.toFixed(0)} rows/s; every ${EVERY_S} s ${on.at(-1).rows_per_s.toFixed(0)} rows/s, ${on.at(-1).checkpoints} checkpoints`)
    }
  } finally {
    rmSync(tmp, {recursive: true, force: true})
  }

  const pct = (xs, p) => {
    const s = [...xs].sort((a, b) => a - b)
    return s.length ? s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] : null
  }
  const pauses = on.flatMap((x) => x.pauses_ms)
  const fleetMs = on.flatMap((x) => x.fleet_prepare_commit_ms)
  const resumeMs = on.flatMap((x) => x.fleet_resume_ms)
  const rateOn = median(on.map((x) => x.rows_per_s))
  const rateOff = median(off.map((x) => x.rows_per_s))
  // Per-round ratio (each pair taken back to back), then the median.
  const ratio = median(on.map((x, i) => x.rows_per_s / off[i].rows_per_s))
  const mb = (kb) => `${Math.round(kb / 1024)} MB`
  const ms = (x) => (x == null ? '-' : `${Math.round(x)} ms`)
  const rows = [
    ['metric', `gymckpt (checkpoint every ${EVERY_S} s)`, 'baseline (checkpointing off)', 'ratio'],
    ['rows/s (median of rounds)', rateOn.toFixed(0), rateOff.toFixed(0), ratio.toFixed(3)],
    [`wall per ${ROWS} rows`, `${(median(on.map((x) => x.wall_ms)) / 1000).toFixed(2)} s`, `${(median(off.map((x) => x.wall_ms)) / 1000).toFixed(2)} s`, ''],
    ['checkpoints per run', median(on.map((x) => x.checkpoints)), 0, ''],
    ['pause per checkpoint (outcome), median / p99', `${ms(pct(pauses, 50))} / ${ms(pct(pauses, 99))}`, '-', ''],
    ['fleet prepare+commit, median / p99', `${ms(pct(fleetMs, 50))} / ${ms(pct(fleetMs, 99))}`, '-', pauses.length ? `pause/fleet ${(pct(pauses, 50) / pct(fleetMs, 50)).toFixed(2)}` : ''],
    ['fleet resume, median / p99', `${ms(pct(resumeMs, 50))} / ${ms(pct(resumeMs, 99))}`, '-', ''],
    ...['before_prepare', 'prepare', 'commit', 'publish', 'resume', 'after_resume', 'blocked'].map((k) => {
      const xs = on.flatMap((x) => x.segments_ms.map((g) => g[k]))
      return [`  checkpoint ${k.replace('_', ' ')}, median / p99`, `${ms(pct(xs, 50))} / ${ms(pct(xs, 99))}`, '-', '']
    }),
    ['share of wall dispatch was blocked', `${((100 * on.reduce((a, x) => a + x.segments_ms.reduce((b, g) => b + g.blocked, 0), 0)) / on.reduce((a, x) => a + x.wall_ms, 0)).toFixed(1)}%`, '-', ''],
    [
      'peak RSS, controller',
      mb(Math.max(...on.map((x) => x.peak_rss_kb))),
      mb(Math.max(...off.map((x) => x.peak_rss_kb))),
      (Math.max(...on.map((x) => x.peak_rss_kb)) / Math.max(...off.map((x) => x.peak_rss_kb))).toFixed(2),
    ],
    ['peak RSS, fleet process', mb(Math.max(...on.map((x) => x.fleet_rss_kb))), mb(Math.max(...off.map((x) => x.fleet_rss_kb))), ''],
  ]
  const w = rows[0].map((_, c) => Math.max(...rows.map((r) => String(r[c]).length)))
  console.log(
    `\ncollect: ${ROWS} rows × ${STEPS} steps of ${STEP_MS} ms at concurrency ${CONCURRENCY}, ${ROUNDS} round(s) of each; fleet and controller each in their own process on 127.0.0.1; ${machine()}; load average ${loadBefore} before, ${loadavg()} after`,
  )
  for (const [i, r] of rows.entries()) {
    console.log(
      r
        .map((v, c) => String(v).padEnd(w[c]))
        .join('  ')
        .trimEnd(),
    )
    if (i === 0) console.log(w.map((n) => '-'.repeat(n)).join('  '))
  }
  const cost = (1 - ratio) * 100
  console.log(`checkpointing costs ${cost.toFixed(1)}% throughput (goal: under 10%): ${cost < 10 ? 'met' : 'MISSED'}`)
  console.log(
    JSON.stringify({bench: 'collect', rows: ROWS, concurrency: CONCURRENCY, every_s: EVERY_S, rounds: ROUNDS, on, off}, (k, v) => (typeof v === 'number' && k !== 'rows_per_s' ? Math.round(v) : v)),
  )
}
