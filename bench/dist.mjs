// Where the benchmarks load gymckpt from: the built dist/ of this clone, or GYMCKPT_DIST (another
// build of it, e.g. one made before a change, to compare the two on the same data).
import path from 'node:path'
import {pathToFileURL} from 'node:url'

export const DIST = process.env.GYMCKPT_DIST ? pathToFileURL(path.resolve(process.env.GYMCKPT_DIST) + path.sep) : new URL('../dist/', import.meta.url)

/** Imports a module of the build, e.g. load('storage/pyjson.js'). */
export const load = (p) => import(new URL(p, DIST).href)

/** The CLI entry point that goes with the build (bin/run.js next to its dist/). */
export const RUN_JS = new URL('../bin/run.js', DIST)

export const {PyFloat} = await load('storage/pyjson.js')
