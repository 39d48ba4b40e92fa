// gymckpt's participant store against a stdlib-only Python store (bench/baseline_store.py, written
// as Gym's store.py writes and reads), side by side in one invocation on the same realistic records
// (bench/data.mjs): commit, commit of restored state, restore of every record, restore of a 10%
// scope. Each measurement runs in its own process (peak RSS is its own); both stores must write
// byte-identical records files. Ratio = gymckpt time / baseline time, the median of the per-run
// ratios; below 1 means gymckpt is faster.
// Usage: npm run bench:commit -- [--records 1000] [--kb 350] [--runs 3] [--scope-pct 10]
import {readdirSync, rmSync, statSync, writeFileSync} from 'node:fs'
import {mkdtemp} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

import {arg, have, load, machine, mb, median, ratio, run, secs, table} from './lib.mjs'

const N = arg('records', 1000)
const KB = arg('kb', 350)
const RUNS = arg('runs', 3)
const SCOPE_PCT = arg('scope-pct', 10)
const here = (f) => fileURLToPath(new URL(f, import.meta.url))
const NODE = [process.execPath, '--expose-gc', here('./store-child.mjs')]
const PY = have('python3') ? 'python3' : null
if (!PY) console.error('python3 not found: the Python baseline is skipped')

const root = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-bench-store-'))
const agentDir = (d) => path.join(d, 'gym', 'agent', 'agent')
const recordsFile = (d) =>
  path.join(
    agentDir(d),
    readdirSync(agentDir(d)).find((f) => f.startsWith('records-')),
  )
const node = (...args) => run(NODE[0], [...NODE.slice(1), ...args], {json: true})
const py = (...args) => (PY ? run(PY, [here('./baseline_store.py'), ...args], {json: true}) : null)
const same = (what, a, b) => {
  if (a && b && a !== b) throw new Error(`${what}: gymckpt wrote ${a}, the baseline ${b}: not byte-identical`)
}

// The scope of the partial restore: every (100 / SCOPE_PCT)th episode.
const scopeFile = path.join(root, 'scope.txt')
const every = Math.max(1, Math.round(100 / SCOPE_PCT))
writeFileSync(
  scopeFile,
  Array.from({length: N}, (_, i) => i)
    .filter((i) => i % every === 0)
    .map((i) => `r${i}\n`)
    .join(''),
)

const m = {gymCommit: [], pyCommit: [], gymRestoredCommit: [], gymRestoreAll: [], pyRestoreAll: [], gymRestoreScope: [], pyScopeLineStart: [], pyScopeDecodeAll: []}
const rss = {}
const peak = (k, r) => {
  if (!r) return
  rss[k] = Math.max(rss[k] ?? 0, r.peak_rss_kb)
  if (r.data_rss_kb != null) rss[`${k}Over`] = Math.max(rss[`${k}Over`] ?? 0, r.peak_rss_kb - r.data_rss_kb)
}
let bytes = 0
try {
  for (let r = 0; r < RUNS; r++) {
    const fresh = path.join(root, `fresh-${r}`)
    const gc = node('commit', fresh, String(N), String(KB))
    m.gymCommit.push(gc.ms)
    peak('gymCommit', gc)
    const src = recordsFile(fresh)
    bytes = statSync(src).size
    const pc = py('commit', src, path.join(root, `py-${r}`), 'agent', 'agent', 'bench')
    if (pc) {
      same('commit', gc.sha256, pc.sha256)
      m.pyCommit.push(pc.ms)
      peak('pyCommit', pc)
    }
    const ra = node('restore', agentDir(fresh), '--commit', path.join(root, `again-${r}`))
    same('commit of restored state', gc.sha256, ra.commit_sha256)
    if (ra.kept !== N) throw new Error(`restored ${ra.kept} of ${N}`)
    m.gymRestoreAll.push(ra.ms)
    m.gymRestoredCommit.push(ra.commit_ms)
    peak('gymRestoreAll', {peak_rss_kb: ra.restore_peak_rss_kb})
    rss.gymRestoredCommitOver = Math.max(rss.gymRestoredCommitOver ?? 0, ra.peak_rss_kb - ra.restored_rss_kb)
    const pa = py('restore', agentDir(fresh), 'decode-every')
    if (pa) {
      m.pyRestoreAll.push(pa.ms)
      peak('pyRestoreAll', pa)
    }
    const rs = node('restore', agentDir(fresh), scopeFile)
    m.gymRestoreScope.push(rs.ms)
    peak('gymRestoreScope', rs)
    const pl = py('restore', agentDir(fresh), 'line-start', scopeFile)
    const pd = py('restore', agentDir(fresh), 'decode-every', scopeFile)
    if (pl) {
      if (pl.kept !== rs.kept || pd.kept !== rs.kept) throw new Error(`scope: gymckpt kept ${rs.kept}, Python ${pl.kept}/${pd.kept}`)
      m.pyScopeLineStart.push(pl.ms)
      m.pyScopeDecodeAll.push(pd.ms)
      peak('pyScopeLineStart', pl)
      peak('pyScopeDecodeAll', pd)
    }
    console.error(
      `run ${r + 1}/${RUNS}: commit ${secs(gc.ms)} (py ${secs(pc?.ms)}), restored-state commit ${secs(ra.commit_ms)}, restore all ${secs(ra.ms)} (py ${secs(pa?.ms)}), ` +
        `restore ${SCOPE_PCT}% ${secs(rs.ms)} (py line-start ${secs(pl?.ms)}, py decode-every ${secs(pd?.ms)}) — ${load()}`,
    )
    for (const d of [fresh, path.join(root, `py-${r}`), path.join(root, `again-${r}`)]) rmSync(d, {recursive: true, force: true})
  }
} finally {
  rmSync(root, {recursive: true, force: true})
}

const row = (name, g, b, bName, goal, gRss, bRss) => {
  const q = b.length ? ratio(g, b) : null
  return [
    name,
    secs(median(g)),
    b.length ? `${bName} ${secs(median(b))}` : `${bName}: skipped`,
    q == null ? 'n/a' : q.toFixed(2),
    goal,
    q == null ? 'n/a' : eval(`${q.toFixed(4)} ${goal}`) ? 'met' : 'not met',
    gRss,
    bRss,
  ]
}
const total = `${N.toLocaleString('en')} x ${Math.round(bytes / N / 1024)} KB (${Math.round(bytes / 1e6)} MB)`
console.log(
  `\ncommit/restore: ${total}, ${RUNS} runs, medians; ratio = gymckpt / baseline (median of same-run ratios). ${machine()}; python ${PY ? run(PY, ['-c', 'import sys; print(sys.version.split()[0])']).stdout.trim() : 'missing'}`,
)
table(
  '',
  ['measurement', 'gymckpt', 'baseline', 'ratio', 'goal', '', 'gymckpt peak RSS', 'baseline peak RSS'],
  [
    row(`commit ${total}`, m.gymCommit, m.pyCommit, 'Python', '<= 0.7', `${mb(rss.gymCommit)} (+${mb(rss.gymCommitOver)} over the data)`, PY ? `${mb(rss.pyCommit)} (+${mb(rss.pyCommitOver)})` : ''),
    row('commit of state gymckpt restored', m.gymRestoredCommit, m.gymCommit, 'gymckpt fresh', '<= 1.1', `+${mb(rss.gymRestoredCommitOver)} over the data`, ''),
    row('commit of state gymckpt restored', m.gymRestoredCommit, m.pyCommit, 'Python', '<= 0.7', '', ''),
    row('restore, all in scope', m.gymRestoreAll, m.pyRestoreAll, 'Python', '<= 1.0', mb(rss.gymRestoreAll), PY ? mb(rss.pyRestoreAll) : ''),
    row(`restore, ${SCOPE_PCT}% in scope`, m.gymRestoreScope, m.pyScopeLineStart, 'Python, episode off the line start', '<= 1.0', mb(rss.gymRestoreScope), PY ? mb(rss.pyScopeLineStart) : ''),
    row(`restore, ${SCOPE_PCT}% in scope`, m.gymRestoreScope, m.pyScopeDecodeAll, 'Python, every line decoded', '<= 0.3', '', PY ? mb(rss.pyScopeDecodeAll) : ''),
  ],
)
