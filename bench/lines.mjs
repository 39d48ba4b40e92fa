// Runs benchmarks under every Node line the package supports (package.json engines: >=22.19):
// the pinned Node 24 of this clone (the devDependency), and Node 22 fetched from the npm registry
// into .bench-tmp/node22 on first use (the same `node` package, so no other download source).
// Each benchmark runs once per line, one line after the other, with the same arguments; their
// tables are printed under a heading naming the line.
// Usage: npm run bench:lines -- verify commit gate [-- --runs 3]
//   (names: fanout verify commit gate scale collect startup; default: verify commit gate)
import {execFileSync, spawnSync} from 'node:child_process'
import {existsSync, mkdirSync} from 'node:fs'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const HERE = path.dirname(fileURLToPath(import.meta.url))
const ROOT = path.resolve(HERE, '..')
const SCRIPTS = {
  fanout: 'fanout.mjs',
  verify: 'verify.mjs',
  commit: 'commit-restore.mjs',
  gate: 'publish-gate.mjs',
  scale: 'scale.mjs',
  collect: 'collect.mjs',
  startup: 'startup.mjs',
}

const argv = process.argv.slice(2)
const cut = argv.indexOf('--')
const names = (cut < 0 ? argv : argv.slice(0, cut)).filter((a) => !a.startsWith('-'))
const passOn = cut < 0 ? argv.filter((a) => a.startsWith('-')) : argv.slice(cut + 1)
for (const n of names) {
  if (!SCRIPTS[n]) {
    console.error(`unknown benchmark '${n}'; one of: ${Object.keys(SCRIPTS).join(', ')}`)
    process.exit(2)
  }
}
const chosen = names.length ? names : ['verify', 'commit', 'gate']

/** A Node 22 binary: installed once from the npm registry into .bench-tmp/node22. */
function node22() {
  const prefix = path.join(ROOT, '.bench-tmp', 'node22')
  const bin = path.join(prefix, 'node_modules', '.bin', 'node')
  if (!existsSync(bin)) {
    mkdirSync(prefix, {recursive: true})
    console.error(`installing node@22 into ${prefix} (from the npm registry) ...`)
    execFileSync('npm', ['install', '--prefix', prefix, '--no-audit', '--no-fund', '--no-save', 'node@22'], {stdio: ['ignore', 'inherit', 'inherit']})
  }
  return bin
}

const lines = [
  ['Node 24 (the pinned development runtime)', process.execPath],
  ['Node 22 (the oldest supported line)', node22()],
]
let failed = 0
for (const [label, bin] of lines) {
  const version = execFileSync(bin, ['-v'], {encoding: 'utf8'}).trim()
  for (const n of chosen) {
    console.log(`\n## ${n} on ${label}: ${version}\n`)
    const r = spawnSync(bin, [path.join(HERE, SCRIPTS[n]), ...passOn], {stdio: 'inherit', cwd: ROOT})
    if (r.status !== 0) {
      failed++
      console.error(`${n} on ${version} failed (exit ${r.status ?? r.signal})`)
    }
  }
}
process.exit(failed ? 1 : 0)
