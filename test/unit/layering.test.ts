import {readFile, readdir} from 'node:fs/promises'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

import {describe, expect, it} from 'vitest'

/**
 * The layering of ../shared/DESIGN.md as a test: commands → cli → coordination / storage →
 * protocol; control-plane → storage / protocol. Only the shell (commands, cli) imports oclif or
 * listr2 (and colours output: cli/color.ts); coordination never imports the test double; protocol
 * imports no other layer.
 */
const SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src')

const LAYERS = ['commands', 'cli', 'coordination', 'storage', 'protocol', 'control-plane', 'demo'] as const
type Layer = (typeof LAYERS)[number]

/** Which layers each layer may import. */
const ALLOWED: Record<Layer, Layer[]> = {
  commands: ['cli', 'coordination', 'storage', 'protocol', 'control-plane', 'demo'],
  cli: ['coordination', 'storage', 'protocol'],
  coordination: ['storage', 'protocol'],
  storage: ['protocol'],
  protocol: [],
  'control-plane': ['storage', 'protocol'],
  demo: ['coordination', 'storage', 'protocol', 'control-plane'],
}
const SHELL_ONLY = ['@oclif/core', 'listr2']

async function sources(): Promise<{file: string; layer: Layer; imports: string[]}[]> {
  const out: {file: string; layer: Layer; imports: string[]}[] = []
  const walk = async (dir: string): Promise<void> => {
    for (const e of await readdir(dir, {withFileTypes: true})) {
      const p = path.join(dir, e.name)
      if (e.isDirectory()) await walk(p)
      else if (e.name.endsWith('.ts')) {
        const rel = path.relative(SRC, p)
        const layer = rel.split(path.sep)[0] as Layer
        const text = await readFile(p, 'utf8')
        // Static imports, re-exports and dynamic imports alike.
        const imports = [...text.matchAll(/(?:from\s+|import\s*\(\s*|import\s+)'([^']+)'/g)].map((m) => m[1]!)
        out.push({file: rel, layer, imports})
      }
    }
  }
  await walk(SRC)
  return out
}

function layerOf(fromFile: string, spec: string): Layer | null {
  if (!spec.startsWith('.')) return null
  const target = path.relative(SRC, path.resolve(SRC, path.dirname(fromFile), spec))
  return target.split(path.sep)[0] as Layer
}

describe('layering (DESIGN.md)', () => {
  it('every source file lives in a known layer', async () => {
    const files = await sources()
    expect(files.length).toBeGreaterThan(30)
    expect(files.filter((f) => !(LAYERS as readonly string[]).includes(f.layer) && !f.file.endsWith('index.ts')).map((f) => f.file)).toEqual([])
  })

  it('each layer imports only the layers below it', async () => {
    const bad: string[] = []
    for (const f of await sources()) {
      if (!(LAYERS as readonly string[]).includes(f.layer)) continue
      for (const spec of f.imports) {
        const to = layerOf(f.file, spec)
        if (to && to !== f.layer && !ALLOWED[f.layer].includes(to)) bad.push(`${f.file} imports ${spec} (${f.layer} → ${to})`)
      }
    }
    expect(bad).toEqual([])
  })

  it('only commands and cli import oclif or listr2', async () => {
    const bad = (await sources()).flatMap((f) =>
      f.layer === 'commands' || f.layer === 'cli' ? [] : f.imports.filter((i) => SHELL_ONLY.some((s) => i === s || i.startsWith(`${s}/`))).map((i) => `${f.file} imports ${i}`),
    )
    expect(bad).toEqual([])
  })

  it("verify's fast path (bin/run.js, before oclif) reaches no oclif, listr2, undici, yaml, zod, node:crypto, node:util or node:worker_threads module through its static imports", async () => {
    const files = new Map((await sources()).map((f) => [f.file, f]))
    // The Node builtins cost a small verify ~10 ms (crypto), ~5 ms (util) and ~2 ms (worker_threads)
    // to load: crypto and worker_threads are imported when a checkpoint is big enough to need them.
    const heavy = ['@oclif/core', 'listr2', 'undici', 'yaml', 'zod', 'node:crypto', 'node:util', 'node:worker_threads']
    const bad: string[] = []
    const seen = new Set<string>()
    // Static imports only: a dynamic import() runs only when its code does.
    const statics = async (file: string): Promise<string[]> =>
      [...(await readFile(path.join(SRC, file), 'utf8')).matchAll(/^(?:import|export)\s+(?!type\b)[^'"]*?from\s+'([^']+)'/gm)].map((m) => m[1]!)
    const walk = async (file: string, dynamicRoot: boolean): Promise<void> => {
      if (seen.has(file)) return
      seen.add(file)
      const specs = dynamicRoot ? files.get(file)!.imports : await statics(file)
      for (const spec of specs) {
        if (!spec.startsWith('.')) {
          if (heavy.some((h) => spec === h || spec.startsWith(`${h}/`))) bad.push(`${file} imports ${spec}`)
          continue
        }
        await walk(path.relative(SRC, path.resolve(SRC, path.dirname(file), spec)).replace(/\.js$/, '.ts'), false)
      }
    }
    // All of fast-verify.ts's imports, its dynamic ones (the failure path) included.
    await walk('cli/fast-verify.ts', true)
    expect(seen.has('storage/verify.ts')).toBe(true)
    // A builtin taken with process.getBuiltinModule loads as an import would.
    for (const file of seen) {
      for (const m of (await readFile(path.join(SRC, file), 'utf8')).matchAll(/getBuiltinModule\('([^']+)'\)/g)) {
        if (heavy.includes(m[1]!)) bad.push(`${file} takes ${m[1]}`)
      }
    }
    expect(bad).toEqual([])
  })

  it("verify's fast path imports neither node:fs nor node:fs/promises as an ES module on the way to a valid checkpoint's report", async () => {
    // Importing either builds a facade that reads every export, which runs fs's lazy getters
    // (ReadStream, ...) and loads Node's stream modules: ~5 ms of a small verify's start. The
    // modules take them with process.getBuiltinModule instead (src/storage/fsutil.ts).
    const bad: string[] = []
    const seen = new Set<string>()
    const walk = async (file: string): Promise<void> => {
      if (seen.has(file)) return
      seen.add(file)
      const text = await readFile(path.join(SRC, file), 'utf8')
      for (const m of text.matchAll(/^(?:import|export)\s+(?!type\b)[^'"]*?from\s+'([^']+)'/gm)) {
        const spec = m[1]!
        if (spec === 'node:fs' || spec === 'node:fs/promises') bad.push(`${file} imports ${spec}`)
        else if (spec.startsWith('.')) await walk(path.relative(SRC, path.resolve(SRC, path.dirname(file), spec)).replace(/\.js$/, '.ts'))
      }
    }
    await walk('cli/fast-verify.ts')
    expect([...seen]).toEqual(expect.arrayContaining(['storage/verify.ts', 'storage/participant-store.ts', 'storage/root.ts', 'cli/output.ts']))
    expect(bad).toEqual([])
  })

  it('the rule can fail: a coordination file importing the double is caught', () => {
    expect(layerOf('coordination/x.ts', '../control-plane/fleet.js')).toBe('control-plane')
    expect(ALLOWED.coordination).not.toContain('control-plane')
  })
})
