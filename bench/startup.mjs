// Start-up cost of the CLI (issue 7, item 3): each command as a process, against `node -e 0` taken
// in the same round, medians of the per-round ratios. The commands are interleaved round by round
// so a noisy neighbour hits all of them alike. Goal: `--version` and `verify` of a small checkpoint
// under 2x `node -e 0`.
//
// Also traces which packages each offline command loads (a resolve hook, Node's registerHooks):
// offline commands must not load undici or yaml (network, fleet files); zod is reported too.
//
// The small checkpoint: the built-in fleet (four participants, in this process) with 4 episodes,
// three checkpoints in a temp root (so prune has something to plan), the fleet closed before the
// measurements start.
// Usage: npm run bench:startup -- [--runs 15]
import {spawnSync} from 'node:child_process'
import {mkdtemp, readFile, rm} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

import {RUN_JS, load as loadDist} from './dist.mjs'
import {arg, load, machine, median, secs, table} from './lib.mjs'

const RUNS = arg('runs', 15)
const TOKEN = 'bench-startup-token'
const cli = fileURLToPath(RUN_JS)

const TRACE_HOOK = fileURLToPath(new URL('./trace-imports.mjs', import.meta.url))

const dir = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-bench-startup-'))
const root = path.join(dir, 'root')
try {
  await makeCheckpoints(root)
  const hook = TRACE_HOOK

  const node = process.execPath
  const cases = [
    {name: 'node -e 0', args: ['-e', '0'], base: true},
    {name: 'gymckpt --version', args: [cli, '--version'], goal: 2},
    {name: 'gymckpt --help', args: [cli, '--help']},
    {name: 'gymckpt verify (small checkpoint)', args: [cli, 'verify', root], goal: 2},
    {name: 'gymckpt list', args: [cli, 'list', root]},
    {name: 'gymckpt prune --dry-run', args: [cli, 'prune', root, '--dry-run']},
    // Node's on-disk compile cache (module.enableCompileCache / NODE_COMPILE_CACHE), warm: what
    // enabling it in bin/run.js would buy.
    {name: 'gymckpt --help, compile cache', args: [cli, '--help'], env: {NODE_COMPILE_CACHE: path.join(dir, 'ncc')}},
    {name: 'gymckpt verify, compile cache', args: [cli, 'verify', root], env: {NODE_COMPILE_CACHE: path.join(dir, 'ncc')}, goal: 2},
  ]
  const env = {...process.env, NO_COLOR: '1', NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: TOKEN}
  const runOnce = (args, extraEnv = {}) => {
    const t = performance.now()
    const r = spawnSync(node, args, {encoding: 'utf8', env: {...env, ...extraEnv}})
    const ms = performance.now() - t
    if (r.error) throw r.error
    if (r.status !== 0) throw new Error(`${args.join(' ')} exited ${r.status}: ${r.stderr.slice(-1000)}`)
    return ms
  }
  // One warm-up round (page cache, compile cache), not counted.
  for (const c of cases) runOnce(c.args, c.env)
  const ms = Object.fromEntries(cases.map((c) => [c.name, []]))
  for (let r = 0; r < RUNS; r++) {
    for (const c of cases) ms[c.name].push(runOnce(c.args, c.env))
    console.error(`round ${r + 1}/${RUNS}: ${cases.map((c) => `${c.name} ${secs(ms[c.name].at(-1))}`).join(', ')} — ${load()}`)
  }
  const base = ms['node -e 0']

  // Packages each command loads, from a resolve hook (one traced run each, not timed).
  const traced = {}
  for (const c of cases.filter((x) => !x.base && !x.env)) {
    const trace = path.join(dir, 'trace.txt')
    runOnce(['--import', hook, ...c.args], {TRACE_FILE: trace})
    const urls = (await readFile(trace, 'utf8')).split('\n').filter(Boolean)
    traced[c.name] = {modules: urls.length, packages: ['undici', 'yaml', 'zod'].filter((p) => urls.some((u) => u.includes(`/node_modules/${p}/`)))}
  }

  console.log(`\ngymckpt start-up, ${machine()}, ${RUNS} rounds (median of the per-round ratio to node -e 0, taken in the same round)`)
  const rows = cases.map((c) => {
    const ratio = c.base ? 1 : median(ms[c.name].map((m, i) => m / base[i]))
    const t = traced[c.name]
    return [
      c.name,
      secs(median(ms[c.name])),
      ratio.toFixed(2),
      c.goal ? `< ${c.goal}x: ${ratio < c.goal ? 'met' : 'NOT met'}` : '',
      t ? t.modules : '',
      t ? (t.packages.length ? t.packages.join(', ') : 'none') : '',
    ]
  })
  table('start-up', ['command', 'median wall', 'ratio to node -e 0', 'goal', 'modules resolved', 'of undici/yaml/zod loaded'], rows)
  const offlineNet = Object.entries(traced).filter(([, t]) => t.packages.includes('undici') || t.packages.includes('yaml'))
  console.log(offlineNet.length ? `\nNETWORK CODE LOADED OFFLINE: ${offlineNet.map(([n]) => n).join(', ')}` : '\nno offline command loads undici or yaml')
} finally {
  await rm(dir, {recursive: true, force: true})
}

async function makeCheckpoints(into) {
  const {Fleet} = await loadDist('control-plane/fleet.js')
  const {ControlClient} = await loadDist('coordination/client.js')
  const {discover} = await loadDist('coordination/discover.js')
  const {checkpoint} = await loadDist('coordination/controller.js')
  const fleet = await Fleet.start({token: TOKEN, head: false})
  const client = new ControlClient({token: TOKEN})
  try {
    const runs = Array.from({length: 4}, (_, i) => fleet.run({rolloutId: `r${i}`, steps: 100_000, stepMs: 10}).catch(() => {}))
    const d = await discover(
      client,
      fleet.servers.map((s) => ({name: s.name, url: s.url})),
      {probeTimeoutMs: 10_000},
    )
    const episodes = Array.from({length: 4}, (_, i) => ({rolloutId: `r${i}`, attempt: 0}))
    await new Promise((r) => setTimeout(r, 200))
    for (let i = 0; i < 3; i++) await checkpoint({client, participants: d.participants}, {root: into, episodes})
    void runs
  } finally {
    await client.close()
    await fleet.close()
  }
}
