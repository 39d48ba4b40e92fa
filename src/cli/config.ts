import {readFile} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {parse as parseYaml} from 'yaml'
import {z} from 'zod'

import {ControllerError} from '../coordination/errors.js'
import {DEFAULT_TOKEN_ENV} from './inputs.js'

/**
 * Where the fleet, the root and the token source come from: a flag, else an environment
 * variable, else the selected context of the config file (like a kubeconfig), else nothing.
 * The token itself is never in the config file: only the path of a file holding it.
 */
export const ENV = {
  config: 'GYMCKPT_CONFIG',
  context: 'GYMCKPT_CONTEXT',
  head: 'GYMCKPT_HEAD',
  fleet: 'GYMCKPT_FLEET',
  servers: 'GYMCKPT_SERVERS',
  root: 'GYMCKPT_ROOT',
  tokenFile: 'GYMCKPT_TOKEN_FILE',
  tokenEnv: 'GYMCKPT_TOKEN_ENV',
} as const

const Context = z.strictObject({
  head: z.string().min(1).optional(),
  fleet: z.string().min(1).optional(),
  servers: z.array(z.string().min(1)).min(1).optional(),
  root: z.string().min(1).optional(),
  'token-file': z.string().min(1).optional(),
  'token-env': z.string().min(1).optional(),
})
export type Context = z.infer<typeof Context>

const ConfigFile = z.strictObject({
  'current-context': z.string().min(1).optional(),
  contexts: z.record(z.string().min(1), Context).default({}),
})
export type ConfigFile = z.infer<typeof ConfigFile>

export interface LoadedConfig {
  file: string
  config: ConfigFile
}

/** Expands a leading ~ and resolves relative paths against the config file's directory. */
function expand(p: string, base: string): string {
  const home = p === '~' || p.startsWith('~/') ? path.join(os.homedir(), p.slice(1)) : p
  return path.resolve(base, home)
}

/**
 * Reads the config file: `--config`/GYMCKPT_CONFIG (must exist), else `<configDir>/config.yaml`
 * (optional). Errors name the file and the key.
 */
export async function loadConfig(explicit: string | undefined, configDir: string): Promise<LoadedConfig | null> {
  const file = path.resolve(explicit ?? path.join(configDir, 'config.yaml'))
  let text: string
  try {
    text = await readFile(file, 'utf8')
  } catch (err) {
    if (!explicit && (err as NodeJS.ErrnoException).code === 'ENOENT') return null
    throw new ControllerError('input', `cannot read config file ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`)
  }
  let doc: unknown
  try {
    doc = parseYaml(text) ?? {}
  } catch (err) {
    throw new ControllerError('input', `config file ${file} is not YAML: ${(err as Error).message.split('\n')[0]}`)
  }
  if (doc && typeof doc === 'object' && 'contexts' in doc) {
    for (const [name, ctx] of Object.entries((doc as {contexts: Record<string, unknown>}).contexts ?? {})) {
      if (ctx && typeof ctx === 'object' && 'token' in ctx)
        throw new ControllerError('input', `config file ${file}: contexts.${name}.token: the token is never kept in the config file; use token-file (a path) or token-env`)
    }
  }
  const parsed = ConfigFile.safeParse(doc)
  if (!parsed.success) {
    const i = parsed.error.issues[0]
    throw new ControllerError(
      'input',
      `config file ${file}: ${i?.path.join('.') || '(root)'}: ${i?.message}; expected 'current-context: NAME' and 'contexts: {NAME: {head|fleet|servers, root, token-file|token-env}}'`,
    )
  }
  const base = path.dirname(file)
  for (const ctx of Object.values(parsed.data.contexts)) {
    for (const k of ['fleet', 'root', 'token-file'] as const) if (ctx[k]) ctx[k] = expand(ctx[k], base)
  }
  return {file, config: parsed.data}
}

export interface Setting<T> {
  value: T
  /** `--head`, `GYMCKPT_HEAD`, `context staging (~/.config/gymckpt/config.yaml)`, or `default`. */
  from: string
}

export type FleetSetting = Setting<{head: string} | {fleet: string} | {servers: string[]}>

export interface Settings {
  context: string | null
  configFile: string | null
  fleet: FleetSetting | null
  root: Setting<string> | null
  token: Setting<{tokenFile: string} | {tokenEnv: string}>
}

export interface SettingsInput {
  flags: {head?: string; fleet?: string; server?: string[]; root?: string; 'token-file'?: string; 'token-env'?: string; context?: string}
  env: NodeJS.ProcessEnv
  config: LoadedConfig | null
}

/** Resolves every setting with its source: flag > environment > config context. */
export function resolveSettings({flags, env, config}: SettingsInput): Settings {
  const contextName = flags.context ?? env[ENV.context] ?? config?.config['current-context'] ?? null
  let ctx: Context | null = null
  if (contextName !== null) {
    if (!config) throw new ControllerError('input', `context '${contextName}' was asked for, but there is no config file (pass --config FILE or create one in the config directory)`)
    ctx = config.config.contexts[contextName] ?? null
    if (!ctx) throw new ControllerError('input', `config file ${config.file} has no context '${contextName}' (it has: ${Object.keys(config.config.contexts).join(', ') || 'none'})`)
  }
  const fromCtx = `context ${contextName} (${config?.file})`

  let fleet: FleetSetting | null = null
  if (flags.head) fleet = {value: {head: flags.head}, from: '--head'}
  else if (flags.fleet) fleet = {value: {fleet: flags.fleet}, from: '--fleet'}
  else if (flags.server?.length) fleet = {value: {servers: flags.server}, from: '--server'}
  else {
    const set = ([ENV.head, ENV.fleet, ENV.servers] as const).filter((k) => env[k])
    if (set.length > 1) throw new ControllerError('input', `${set.join(' and ')} are all set: keep one, or pass --head, --fleet or --server`)
    if (env[ENV.head]) fleet = {value: {head: env[ENV.head]!}, from: ENV.head}
    else if (env[ENV.fleet]) fleet = {value: {fleet: env[ENV.fleet]!}, from: ENV.fleet}
    else if (env[ENV.servers]) fleet = {value: {servers: env[ENV.servers]!.split(/[\s,]+/).filter(Boolean)}, from: ENV.servers}
    else if (ctx) {
      const n = [ctx.head, ctx.fleet, ctx.servers].filter(Boolean).length
      if (n > 1) throw new ControllerError('input', `${fromCtx} names more than one of head, fleet and servers`)
      if (ctx.head) fleet = {value: {head: ctx.head}, from: fromCtx}
      else if (ctx.fleet) fleet = {value: {fleet: ctx.fleet}, from: fromCtx}
      else if (ctx.servers) fleet = {value: {servers: ctx.servers}, from: fromCtx}
    }
  }

  const root: Setting<string> | null =
    flags.root !== undefined ? {value: flags.root, from: '--root'} : env[ENV.root] ? {value: env[ENV.root]!, from: ENV.root} : ctx?.root ? {value: ctx.root, from: fromCtx} : null

  let token: Settings['token']
  if (flags['token-file']) token = {value: {tokenFile: flags['token-file']}, from: '--token-file'}
  else if (flags['token-env']) token = {value: {tokenEnv: flags['token-env']}, from: '--token-env'}
  else if (env[ENV.tokenFile]) token = {value: {tokenFile: env[ENV.tokenFile]!}, from: ENV.tokenFile}
  else if (env[ENV.tokenEnv]) token = {value: {tokenEnv: env[ENV.tokenEnv]!}, from: ENV.tokenEnv}
  else if (ctx?.['token-file']) token = {value: {tokenFile: ctx['token-file']}, from: fromCtx}
  else if (ctx?.['token-env']) token = {value: {tokenEnv: ctx['token-env']}, from: fromCtx}
  else token = {value: {tokenEnv: DEFAULT_TOKEN_ENV}, from: 'default'}

  return {context: contextName, configFile: config?.file ?? null, fleet, root, token}
}
