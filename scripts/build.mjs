// Compiles into a fresh directory and swaps it in with two renames, so dist/ is never half
// written and never holds a file whose source was removed; then writes the oclif manifest.
import {execFileSync} from 'node:child_process'
import {rename, rm} from 'node:fs/promises'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const fresh = path.join(root, `.dist-${process.pid}`)
const old = path.join(root, `.dist-old-${process.pid}`)
const tsc = path.join(root, 'node_modules', 'typescript', 'bin', 'tsc')
try {
  execFileSync(process.execPath, [tsc, '-p', path.join(root, 'tsconfig.build.json'), '--outDir', fresh], {stdio: 'inherit'})
  await bundleFastPath(fresh)
} catch (err) {
  if (err.status === undefined) console.error(err)
  await rm(fresh, {recursive: true, force: true})
  process.exit(1)
}
await rename(path.join(root, 'dist'), old).catch((err) => {
  if (err.code !== 'ENOENT') throw err
})
await rename(fresh, path.join(root, 'dist'))
await rm(old, {recursive: true, force: true})
execFileSync(process.execPath, [path.join(root, 'scripts', 'manifest.mjs')], {stdio: 'inherit'})

/**
 * verify's fast path (bin/run.js, before oclif) as a few files instead of ~16 modules: Node spends
 * ~0.4 ms resolving, reading and linking each ES module, ~6 ms of a small verify's ~40 ms over
 * `node -e 0` (bench/startup). What the fast path imports only on demand (the failure path, the
 * manifest schemas) is split into chunks of the same build, so no module is loaded twice (an error
 * class would then fail `instanceof`). The worker is bundled on its own into the same directory
 * (a worker thread has its own modules anyway), where the bundled verify looks for
 * `./verify-worker.js`. Packages stay imports of node_modules.
 */
async function bundleFastPath(dist) {
  const {build} = await import('esbuild')
  // absWorkingDir: the path comments esbuild writes are relative to dist/, the same on every build.
  const common = {absWorkingDir: dist, outdir: path.join(dist, 'fast'), bundle: true, format: 'esm', platform: 'node', target: 'node22', packages: 'external', logLevel: 'warning'}
  await build({...common, entryPoints: [{in: path.join(dist, 'cli', 'fast-verify.js'), out: 'fast-verify'}], splitting: true})
  await build({...common, entryPoints: [{in: path.join(dist, 'storage', 'verify-worker.js'), out: 'verify-worker'}]})
}
