// Loaded with `node --import bench/trace-imports.mjs ...`: records the URL of every module the
// process resolves, written to $TRACE_FILE (one per line) when it exits. Used by bench/startup.mjs
// and test/cli/startup-imports.test.ts to see which packages a command loads.
import {writeFileSync} from 'node:fs'
import {registerHooks} from 'node:module'

const seen = new Set()
registerHooks({
  resolve(specifier, context, nextResolve) {
    const r = nextResolve(specifier, context)
    seen.add(r.url)
    return r
  },
})
process.on('exit', () => writeFileSync(process.env.TRACE_FILE, [...seen].join('\n')))
