#!/usr/bin/env node
// Checked before anything is imported: on an older Node the dependencies fail with errors that
// name neither the cause nor the fix.
const [major, minor] = process.versions.node.split('.').map(Number)
if (major < 22 || (major === 22 && minor < 19)) {
  process.stderr.write(
    `error: gymckpt needs Node.js >= 22.19; this is ${process.version} (${process.execPath}).\n` +
      'From a clone, run it through npm (npm run gymckpt -- ARGS) or put node_modules/.bin first on PATH: the project pins its own Node.\n',
  )
  process.exit(2)
}
// `--version` alone answers without loading oclif (a third of a second on a small machine), in
// oclif's own format, so scripts that probe the version stay fast.
const argv = process.argv.slice(2)
if (argv.length === 1 && (argv[0] === '--version' || argv[0] === '-v')) {
  const {readFileSync} = await import('node:fs')
  const {version} = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'))
  process.stdout.write(`gymckpt/${version} ${process.platform}-${process.arch} node-${process.version}\n`)
  process.exit(0)
}
// Node's on-disk compile cache (22.1+; what tsc and npm use): every later start skips compiling
// oclif, zod and the commands. Best effort: a cache that cannot be written changes nothing else.
// NODE_DISABLE_COMPILE_CACHE=1 turns it off; NODE_COMPILE_CACHE names another directory.
const {enableCompileCache} = await import('node:module')
try {
  enableCompileCache?.()
} catch {}
// A fully specified `verify` (the checkpoint named, nothing from the config file) answers without
// loading oclif, with the same output and exit codes; anything else falls through to oclif.
// GYMCKPT_NO_FAST_PATH=1 always takes oclif's path (the tests compare the two).
let code = null
if (argv[0] === 'verify' && !process.env.GYMCKPT_NO_FAST_PATH) {
  // dist/fast/ is that path bundled by scripts/build.mjs (fewer modules to load).
  const {fastVerify} = await import('../dist/fast/fast-verify.js')
  code = await fastVerify(argv.slice(1))
}
if (code === null) {
  const {execute} = await import('@oclif/core')
  await execute({dir: import.meta.url})
} else process.exitCode = code
