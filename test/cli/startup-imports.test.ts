// Issue 7, item 3: offline commands load no network code. Each command runs as a process under
// a resolve hook (Node's registerHooks) that records every module it loads; --help and --version
// load none of undici, yaml, zod, and verify, list, prune and describe load neither undici nor yaml
// (zod they use: the manifests on disk are read with their schemas). A fleet command does load
// undici, so the trace can tell.
import {spawn} from 'node:child_process'
import {readFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {BIN} from '../helpers/cli.js'
import {FULL, TOKEN, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const HOOK = path.resolve('bench/trace-imports.mjs')

/** A tracer in a fresh temp dir (removed after each test): the packages (of undici, yaml, zod) a command loads, and its exit code. */
async function tracer(): Promise<(args: string[]) => Promise<Traced>> {
  const dir = await tempDir()
  const hook = HOOK
  return (args) => packagesOf(dir, hook, args)
}

interface Traced {
  code: number | null
  packages: string[]
  modules: number
  /** Of node:crypto, node:util and node:worker_threads, those the command's own code imported. */
  builtins: string[]
}

async function packagesOf(dir: string, hook: string, args: string[]): Promise<Traced> {
  const trace = path.join(dir, `trace-${Math.random().toString(16).slice(2)}.txt`)
  // Asynchronously: the fleet a command talks to answers from this process.
  const code = await new Promise<number | null>((resolve, reject) => {
    const p = spawn(process.execPath, ['--import', hook, BIN, ...args], {env: {...process.env, TRACE_FILE: trace, NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: TOKEN, NO_COLOR: '1'}, stdio: 'ignore'})
    p.on('error', reject)
    p.on('close', resolve)
  })
  const urls = (await readFile(trace, 'utf8')).split('\n').filter(Boolean)
  return {
    code,
    packages: ['undici', 'yaml', 'zod'].filter((p) => urls.some((u) => u.includes(`/node_modules/${p}/`))),
    modules: urls.length,
    builtins: ['node:crypto', 'node:util', 'node:worker_threads'].filter((b) => urls.includes(b)),
  }
}

describe('start-up: what each command loads (built CLI under a resolve hook)', {timeout: 120_000}, () => {
  it('--help and --version load none of undici, yaml, zod', async () => {
    const packagesOf = await tracer()
    for (const args of [['--help'], ['--version'], ['verify', '--help'], ['help', 'restore']]) {
      const r = await packagesOf(args)
      expect(r.code, args.join(' ')).toBe(0)
      expect(r.packages, args.join(' ')).toEqual([])
    }
  })

  it('verify, list, prune --dry-run and describe of a real checkpoint load no network code; status does', async () => {
    const packagesOf = await tracer()
    const fleet = await startFleet({members: FULL})
    const root = await tempDir()
    const {cli} = await import('../helpers/cli.js')
    expect((await cli(['checkpoint', '--episodes-file', '/dev/null', ...fleet.serverArgs().flatMap((s) => ['--server', s]), '--root', root, '--json'])).code).toBe(0)
    // A small checkpoint is hashed without node:crypto, coloured without node:util, read without workers.
    expect((await packagesOf(['verify', root])).builtins).toEqual([])
    for (const args of [
      ['verify', root],
      ['list', root],
      ['prune', root, '--dry-run'],
      ['describe', root],
    ]) {
      const r = await packagesOf(args)
      expect(r.code, args.join(' ')).toBe(0)
      expect(
        r.packages.filter((p) => p !== 'zod'),
        args[0],
      ).toEqual([])
    }
    const status = await packagesOf(['status', ...fleet.serverArgs().flatMap((s) => ['--server', s])])
    expect(status.code).toBe(0)
    expect(status.packages).toContain('undici')
  })
})
