// Colour for human output, decided the way Node's own util.styleText decides (NO_COLOR,
// FORCE_COLOR, NODE_DISABLE_COLORS and TERM=dumb, asked of the stream written to), without
// importing anything: ansis's import cost ~13 ms and node:util's ~5 ms (it compiles the worker,
// diff and parse_args builtins) of a 40 ms process start, and verify's whole budget is 2x that.

/** SGR codes: [open, close]. */
const CODES = {bold: [1, 22], dim: [2, 22], red: [31, 39], green: [32, 39], yellow: [33, 39]} as const
type Format = keyof typeof CODES

export interface Styler {
  bold(text: string): string
  dim(text: string): string
  red(text: string): string
  green(text: string): string
  yellow(text: string): string
}

/**
 * `--color` / `--no-color` on the command line (the last one wins; nothing after `--`): it beats
 * the environment, as every flag does. Read from argv so that oclif's path and verify's fast path,
 * and output written before the flags are parsed, all decide alike.
 */
export function colorFlag(argv: readonly string[]): boolean | undefined {
  let on: boolean | undefined
  for (const a of argv) {
    if (a === '--') break
    if (a === '--color') on = true
    else if (a === '--no-color') on = false
  }
  return on
}

/**
 * Whether Node would colour `stream`: a terminal whose colour depth (NO_COLOR, FORCE_COLOR,
 * NODE_DISABLE_COLORS, TERM, as tty.WriteStream.hasColors reads them) has 16 colours or more; any
 * other stream only when FORCE_COLOR asks for 16 or more ('', 1, true, 2, 3), as styleText does.
 */
export function platformColors(stream: () => NodeJS.WriteStream | undefined, env: NodeJS.ProcessEnv = process.env): boolean {
  // What the environment alone decides, in getColorDepth's order, is decided without the stream:
  // opening process.stdout on a pipe costs a short command ~7 ms.
  const force = env.FORCE_COLOR
  if (force !== undefined) return force === '' || force === '1' || force === 'true' || force === '2' || force === '3'
  if (env.NO_COLOR || env.NODE_DISABLE_COLORS || env.TERM === 'dumb') return false
  const s = stream()
  return s?.isTTY === true && typeof s.hasColors === 'function' && s.hasColors(16, env)
}

/**
 * `open()` when file descriptor `fd` may be a terminal, else undefined. Only a character device
 * can be one, and asking costs one fstat, where opening process.stdout on a pipe or a file costs
 * a short command ~7 ms (it loads net and the stream modules).
 */
export function terminalStream(fd: number, open: () => NodeJS.WriteStream): NodeJS.WriteStream | undefined {
  try {
    if (!process.getBuiltinModule('node:fs').fstatSync(fd).isCharacterDevice()) return undefined
  } catch {
    return undefined
  }
  return open()
}

/** Styles text bound for `stream`: coloured when the flag says so, else when Node would colour that stream. */
export function styler(stream: () => NodeJS.WriteStream | undefined, flag: boolean | undefined = colorFlag(process.argv.slice(2))): Styler {
  let on: boolean | undefined = flag
  // Decided on first use, not at import: importing this must not touch the streams.
  const paint = (f: Format, text: string) => {
    on ??= platformColors(stream)
    return on ? `\u001b[${CODES[f][0]}m${text}\u001b[${CODES[f][1]}m` : text
  }
  return {
    bold: (t) => paint('bold', t),
    dim: (t) => paint('dim', t),
    red: (t) => paint('red', t),
    green: (t) => paint('green', t),
    yellow: (t) => paint('yellow', t),
  }
}

/** For text written to stdout (tables, verdicts). */
export const color = styler(() => terminalStream(1, () => process.stdout))
/** For text written to stderr (errors, warnings, notes, progress tables). */
export const errColor = styler(() => terminalStream(2, () => process.stderr))
