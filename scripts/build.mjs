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
} catch {
  await rm(fresh, {recursive: true, force: true})
  process.exit(1)
}
await rename(path.join(root, 'dist'), old).catch((err) => {
  if (err.code !== 'ENOENT') throw err
})
await rename(fresh, path.join(root, 'dist'))
await rm(old, {recursive: true, force: true})
execFileSync(process.execPath, [path.join(root, 'scripts', 'manifest.mjs')], {stdio: 'inherit'})
