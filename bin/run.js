#!/usr/bin/env node
// Checked before anything is imported: on an older Node the dependencies fail with errors that
// name neither the cause nor the fix.
const [major, minor] = process.versions.node.split('.').map(Number)
if (major < 22 || (major === 22 && minor < 19)) {
  process.stderr.write(`error: gymckpt needs Node.js >= 22.19; this is ${process.version} (${process.execPath}).\n` +
    'From a clone, run it through npm (npm run gymckpt -- ARGS) or put node_modules/.bin first on PATH: the project pins its own Node.\n')
  process.exit(2)
}
const {execute} = await import('@oclif/core')
await execute({dir: import.meta.url})
