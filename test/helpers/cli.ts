import {spawn} from 'node:child_process'
import path from 'node:path'
import {fileURLToPath} from 'node:url'

import {ErrorJson} from '../../src/cli/json-schemas.js'
import {TOKEN} from './fleet.js'

export const BIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../bin/run.js')

export interface CliResult {
  code: number | null
  stdout: string
  stderr: string
  json: any
}

/** Runs the built CLI as a process. */
export function cli(args: string[], opts: {env?: Record<string, string | undefined>; input?: string; onSpawn?: (p: ReturnType<typeof spawn>) => void; timeoutMs?: number} = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const env: Record<string, string | undefined> = {...process.env, NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: TOKEN, NO_COLOR: '1', FORCE_COLOR: '0', ...opts.env}
    for (const k of Object.keys(env)) if (env[k] === undefined) delete env[k]
    const p = spawn(process.execPath, [BIN, ...args], {env: env as NodeJS.ProcessEnv, stdio: ['pipe', 'pipe', 'pipe']})
    let stdout = ''
    let stderr = ''
    p.stdout.on('data', (d) => (stdout += d))
    p.stderr.on('data', (d) => (stderr += d))
    const t = setTimeout(() => p.kill('SIGKILL'), opts.timeoutMs ?? 30_000)
    p.on('error', reject)
    p.on('close', (code) => {
      clearTimeout(t)
      let json: unknown
      try {
        json = JSON.parse(stdout)
      } catch {}
      // Every failure document any CLI test sees must match the documented contract, details too.
      if ((json as {ok?: unknown} | undefined)?.ok === false) {
        const p = ErrorJson.safeParse(json)
        if (!p.success)
          return reject(new Error(`${args.join(' ')}: its error document breaks the JSON contract (src/cli/json-schemas.ts): ${JSON.stringify(p.error.issues.slice(0, 3))}\n${stdout.slice(0, 2000)}`))
      }
      resolve({code, stdout, stderr, json})
    })
    p.stdin.end(opts.input ?? '')
    opts.onSpawn?.(p)
  })
}
