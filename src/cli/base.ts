import {Command, Flags, Interfaces} from '@oclif/core'

// Network code (undici, yaml) is imported when a command connects, not at start-up: offline
// commands (verify, prune, help) never load it.
import type {ControlClient} from '../coordination/client.js'
import type {Discovery, FleetSource} from '../coordination/discover.js'
import {ControllerError, CoordinationError, NextStep} from '../coordination/errors.js'
import type {Coordinator} from '../coordination/operations.js'
import {EXIT, ExitName, exitCodesHelp} from './exit-codes.js'
import {reportFailure} from './failure.js'
import {successDocument} from './output.js'
import {seconds} from './flags.js'
import {DEFAULT_TOKEN_ENV, readToken} from './inputs.js'
import {FleetFlagValues, renderNext} from './next.js'
import {JSON_SCHEMA_VERSION} from './json-version.js'
import type {Settings, SettingsInput} from './config.js'

export {JSON_SCHEMA_VERSION}
export {oneLine} from './failure.js'

/** A command's parsed flags: its class's base flags (BaseCommand's, or FleetCommand's with the fleet flags) and its own. */
export type BaseFlags<T extends typeof Command> = Interfaces.InferredFlags<T['baseFlags'] & T['flags']>
export type BaseArgs<T extends typeof Command> = Interfaces.InferredArgs<T['args']>

// The fleet and token flags have no oclif `env`: a flag, else GYMCKPT_*, else the config context
// is resolved in src/cli/config.ts, so a --fleet flag is not refused because GYMCKPT_HEAD is set.
export const fleetFlags = {
  head: Flags.string({summary: 'Gym head server URL; servers are read from its global config (or GYMCKPT_HEAD).', helpGroup: 'FLEET', exclusive: ['server', 'fleet']}),
  server: Flags.string({summary: 'A server as NAME=URL, repeatable (or GYMCKPT_SERVERS, comma-separated).', multiple: true, helpGroup: 'FLEET', exclusive: ['head', 'fleet']}),
  fleet: Flags.string({summary: "Fleet YAML file: 'servers: {NAME: URL}' (or GYMCKPT_FLEET).", helpGroup: 'FLEET', exclusive: ['head', 'server']}),
  'token-env': Flags.string({summary: `Environment variable holding the control token (default ${DEFAULT_TOKEN_ENV}; or GYMCKPT_TOKEN_ENV).`, helpGroup: 'FLEET'}),
  'token-file': Flags.string({summary: 'File holding the control token, instead of the environment (or GYMCKPT_TOKEN_FILE).', helpGroup: 'FLEET'}),
  'probe-timeout': seconds({summary: 'Seconds one server may take to answer discovery.', default: 60, max: 3600, helpGroup: 'FLEET'}),
}

/** A second SIGINT/SIGTERM within this many ms of the last one acted on is the same signal delivered twice. */
export const SIGNAL_REPEAT_MS = 2000

export const timeoutFlag = seconds({summary: 'Seconds the operation may take (sets deadline_ts).', default: 300, max: 86_400})

/**
 * The shared command base: JSON mode, error → exit code mapping, fleet connection, signals.
 * Commands stay thin: parse, call one function, render.
 */
export abstract class BaseCommand<T extends typeof Command> extends Command {
  static override enableJsonFlag = true
  static override baseFlags = {
    // cli/color.ts reads --[no-]color off argv (before flags are parsed, and on verify's fast path);
    // declared so that oclif accepts it and lists it.
    color: Flags.boolean({summary: 'Colour the output (default: on a terminal, unless NO_COLOR is set).', allowNo: true, helpGroup: 'GLOBAL'}),
    config: Flags.string({summary: 'Config file with named contexts (default: config.yaml in the config directory; or GYMCKPT_CONFIG).', helpGroup: 'GLOBAL'}),
    context: Flags.string({summary: 'Context of the config file to use (default: its current-context; or GYMCKPT_CONTEXT).', helpGroup: 'GLOBAL'}),
  }

  protected flags!: BaseFlags<T>
  protected args!: BaseArgs<T>
  private resolved: Promise<Settings> | null = null
  /**
   * What the command had learned when it failed (a dry run's plan, the statuses it read): catch()
   * puts it into the error's JSON details next to the error's own, so no command re-wraps an error.
   */
  protected failureContext: Record<string, unknown> = {}
  private readonly abort = new AbortController()
  private signalHandlers: [NodeJS.Signals, () => void][] = []
  private lastSignalAt = -Infinity

  public override async init(): Promise<void> {
    await super.init()
    const {args, flags} = await this.parse({
      flags: this.ctor.flags,
      baseFlags: this.ctor.baseFlags,
      enableJsonFlag: this.ctor.enableJsonFlag,
      args: this.ctor.args,
      strict: this.ctor.strict,
    })
    this.flags = flags as BaseFlags<T>
    this.args = args as BaseArgs<T>
  }

  /**
   * Aborted on the first SIGINT/SIGTERM; a second one exits at once. One press or preemption often
   * arrives twice within milliseconds (the terminal signals the whole process group while npm, a
   * shell wrapper, Slurm or `tini -g` forwards it too): a repeat within SIGNAL_REPEAT_MS of the
   * last one acted on is the same signal, so it never cuts short the cleanup that resumes the fleet.
   */
  protected get signal(): AbortSignal {
    if (this.signalHandlers.length === 0) {
      for (const sig of ['SIGINT', 'SIGTERM'] as const) {
        const h = () => {
          const now = Date.now()
          if (now - this.lastSignalAt < SIGNAL_REPEAT_MS) return
          this.lastSignalAt = now
          if (this.abort.signal.aborted) {
            process.stderr.write(`\n${sig} again: exiting at once; participants may be left closed until their leases expire (gymckpt status shows them, gymckpt resume reopens them)\n`)
            process.exit(EXIT.interrupted)
          }
          if (this.onFirstSignal(sig)) return
          process.stderr.write(`\n${sig}: stopping cleanly (send again, after ${SIGNAL_REPEAT_MS / 1000} s, to exit at once)\n`)
          this.abort.abort(new ControllerError('interrupted', `interrupted by ${sig}`))
        }
        process.on(sig, h)
        this.signalHandlers.push([sig, h])
      }
    }
    return this.abort.signal
  }

  /**
   * A command that turns the first SIGINT/SIGTERM into something gentler than an abort (collect
   * checkpoints, then stops) handles it here and returns true; the next signal aborts.
   */
  protected onFirstSignal(_sig: NodeJS.Signals): boolean {
    return false
  }

  /** Fleet, root and token source with where each came from: flag > environment > config context. */
  protected settings(): Promise<Settings> {
    this.resolved ??= (async () => {
      const {loadConfig, resolveSettings, ENV} = await import('./config.js')
      const f = this.flags as SettingsInput['flags'] & {config?: string}
      const config = await loadConfig(f.config ?? process.env[ENV.config], this.config.configDir)
      return resolveSettings({flags: f, env: process.env, config})
    })()
    return this.resolved
  }

  /** The checkpoint root: the positional or --root (not two different ones), else GYMCKPT_ROOT, else the config context. */
  protected async rootDir(given?: string, flag?: string): Promise<string> {
    if (given !== undefined && flag !== undefined && given !== flag) throw new ControllerError('input', `two checkpoint roots given, ${given} and --root ${flag}: pass one`)
    given ??= flag
    if (given !== undefined) return given
    const root = (await this.settings()).root
    if (!root) throw new ControllerError('input', 'no checkpoint root: pass it (ROOT or --root DIR), set GYMCKPT_ROOT, or set root in the config context')
    return root.value
  }

  /** A next step as a command line that works when pasted: this binary, this command's fleet flags. */
  protected nextLine(step: NextStep): string {
    return renderNext(this.config.bin, step, this.fleetFlagValues())
  }

  /** The fleet flags given, for a next step to repeat: none on a command that takes none. */
  protected fleetFlagValues(): FleetFlagValues {
    return {}
  }

  protected override toSuccessJson(result: unknown): unknown {
    return successDocument(result as object)
  }

  protected override async catch(err: Error & {exitCode?: number; oclif?: {exit?: number}}): Promise<void> {
    // oclif's own exit 0 (--help, --version through the parser) is not a failure.
    if (err.oclif?.exit === 0) throw err
    // A fan-out cut short by SIGINT/SIGTERM fails with 'interrupted' per server: that is the
    // interrupt (exit 130), not a fleet that failed (exit 3 or 4). Its message and next steps say
    // what was left as it was.
    if (this.abort.signal.aborted && err instanceof CoordinationError && err.failures.some((f) => f.code === 'interrupted')) {
      const cut = new ControllerError('interrupted', `interrupted: ${err.message}`, {operation: err.operation, failures: err.failures}).withNext(...err.next)
      cut.timings = err.timings
      err = cut
    }
    process.exitCode = reportFailure(err, {json: this.jsonEnabled(), context: this.failureContext, nextLine: (s) => this.nextLine(s)})
  }

  protected override async finally(err: Error | undefined): Promise<void> {
    for (const [sig, h] of this.signalHandlers) process.off(sig, h)
    await super.finally(err)
  }
}

/**
 * A command that talks to a fleet: the fleet and token flags (--head/--server/--fleet, the token
 * source, --probe-timeout) are its base flags, parsed and typed with the rest, and it connects.
 */
export abstract class FleetCommand<T extends typeof Command> extends BaseCommand<T> {
  static override baseFlags = {...BaseCommand.baseFlags, ...fleetFlags}

  // The base flags above are parsed into every FleetCommand's flags: this only tells the compiler.
  declare protected flags: BaseFlags<T> & Interfaces.InferredFlags<typeof fleetFlags>
  private client: ControlClient | null = null

  protected async fleetSource(): Promise<FleetSource> {
    const fleet = (await this.settings()).fleet
    if (!fleet)
      throw new ControllerError('input', 'no fleet given: pass --head URL, --server NAME=URL (repeatable) or --fleet FILE, set GYMCKPT_HEAD / GYMCKPT_FLEET / GYMCKPT_SERVERS, or use a config context')
    const v = fleet.value
    if ('head' in v) return {type: 'head', url: v.head}
    if ('fleet' in v) return {type: 'file', path: v.fleet}
    const {parseServerArg} = await import('../coordination/discover.js')
    return {type: 'servers', servers: v.servers.map(parseServerArg)}
  }

  /** The control token, from the source the settings name. Never printed. (Not `token`: oclif sets that property on the command while it parses arguments.) */
  protected async controlToken(): Promise<string> {
    return readToken((await this.settings()).token.value)
  }

  /** Reads the token, discovers the fleet, and returns a Coordinator over its participants. */
  protected async connect(opts: {tolerant?: boolean} = {}): Promise<{coordinator: Coordinator; discovery: Discovery}> {
    const source = await this.fleetSource()
    const token = await this.controlToken()
    const [{ControlClient}, {discover, resolveSource}] = await Promise.all([import('../coordination/client.js'), import('../coordination/discover.js')])
    this.client = new ControlClient({token})
    const probeTimeoutMs = this.flags['probe-timeout'] * 1000
    const servers = await resolveSource(source, probeTimeoutMs)
    const discovery = await discover(this.client, servers, {probeTimeoutMs, signal: this.signal, tolerant: opts.tolerant})
    return {coordinator: {client: this.client, participants: discovery.participants, signal: this.signal}, discovery}
  }

  protected override fleetFlagValues(): FleetFlagValues {
    return this.flags
  }

  protected override async finally(err: Error | undefined): Promise<void> {
    await this.client?.close()
    await super.finally(err)
  }
}

/** Every code a fleet command can meet on its way: input, discovery, token, interrupt. */
const FLEET_EXITS: ExitName[] = ['input', 'discovery', 'unauthorized', 'interrupted']

/** The exit codes of a command that talks to the fleet, plus its own. */
export function fleetExitCodes(...own: ExitName[]): string {
  return exitCodesHelp(...FLEET_EXITS, ...own)
}

/** Every exit code (commands whose outcome can be any of them). */
export const EXIT_CODES_HELP = exitCodesHelp(...(Object.keys(EXIT) as ExitName[]))
