import {readFile} from 'node:fs/promises'

import {ControllerError} from '../coordination/errors.js'
import {EpisodeId, InvalidEpisodeError, parseEpisodeToken} from '../protocol/episode.js'

export const DEFAULT_TOKEN_ENV = 'NEMO_GYM_CHECKPOINT_CONTROL_TOKEN'

/** The token comes from an environment variable or a file; never from argv. */
export async function readToken(opts: {tokenEnv: string; tokenFile?: string}): Promise<string> {
  if (opts.tokenFile) {
    let text: string
    try {
      text = await readFile(opts.tokenFile, 'utf8')
    } catch (err) {
      throw new ControllerError('input', `cannot read --token-file ${opts.tokenFile}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`)
    }
    const t = text.trim()
    if (!t) throw new ControllerError('input', `--token-file ${opts.tokenFile} is empty`)
    if (/\s/.test(t)) throw new ControllerError('input', `--token-file ${opts.tokenFile} holds more than one word; it must hold only the token`)
    return t
  }
  const t = process.env[opts.tokenEnv]?.trim()
  if (!t) throw new ControllerError('input', `no control token: set ${opts.tokenEnv} or pass --token-file FILE`)
  return t
}

async function readSource(source: string, what: string): Promise<string> {
  if (source === '-') {
    const chunks: Buffer[] = []
    for await (const c of process.stdin as AsyncIterable<Buffer>) chunks.push(c)
    return Buffer.concat(chunks).toString('utf8')
  }
  try {
    return await readFile(source, 'utf8')
  } catch (err) {
    throw new ControllerError('input', `cannot read ${what} ${source}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`)
  }
}

/**
 * Episodes from a file or stdin: one per line (`r`, `r-a2`, `r@2` or a JSON object), `#` comments,
 * or one JSON array of `{"rollout_id", "attempt"}` objects. Errors name the line.
 */
export async function readEpisodes(source: string): Promise<EpisodeId[]> {
  const where = source === '-' ? 'stdin' : source
  const text = await readSource(source, 'episodes file')
  const trimmed = text.trim()
  if (trimmed.startsWith('[')) {
    let arr: unknown
    try {
      arr = JSON.parse(trimmed)
    } catch (err) {
      throw new ControllerError('input', `${where}: not a JSON array: ${(err as Error).message}`)
    }
    return (arr as unknown[]).map((x, i) => {
      try {
        return parseEpisodeToken(JSON.stringify(x))
      } catch (err) {
        throw new ControllerError('input', `${where}: item ${i}: ${(err as Error).message}`)
      }
    })
  }
  const out: EpisodeId[] = []
  text.split('\n').forEach((line, i) => {
    const t = line.replace(/#.*$/, '').trim()
    if (!t) return
    try {
      out.push(parseEpisodeToken(t))
    } catch (err) {
      if (err instanceof InvalidEpisodeError) throw new ControllerError('input', `${where}:${i + 1}: ${err.message}`)
      throw err
    }
  })
  return out
}

export function parseEpisodeFlags(values: string[]): EpisodeId[] {
  return values.map((v) => {
    try {
      return parseEpisodeToken(v)
    } catch (err) {
      throw new ControllerError('input', `--episode ${v}: ${(err as Error).message}`)
    }
  })
}

export async function readLines(source: string, what: string): Promise<string[]> {
  const text = await readSource(source, what)
  return text
    .split('\n')
    .map((l) => l.replace(/#.*$/, '').trim())
    .filter(Boolean)
}
