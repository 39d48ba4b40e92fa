import {isUtf8} from 'node:buffer'
import {readFile} from 'node:fs/promises'

import {ControllerError} from '../coordination/errors.js'
import {EpisodeId, InvalidEpisodeError, SAFE_ID_PATTERN, clipInput, parseEpisodeToken, parseEpisodeValue, quoteInput, rolloutIdProblem} from '../protocol/episode.js'
import {describeFsError} from '../storage/root.js'

export const DEFAULT_TOKEN_ENV = 'NEMO_GYM_CHECKPOINT_CONTROL_TOKEN'

// What an HTTP header value may carry without undici refusing it: visible ASCII.
const TOKEN_CHARS = /^[\x21-\x7e]+$/

/** The token comes from an environment variable or a file; never from argv, never in a message. */
export async function readToken(opts: {tokenEnv?: string; tokenFile?: string}): Promise<string> {
  if (opts.tokenFile) {
    let bytes: Buffer
    try {
      bytes = await readFile(opts.tokenFile)
    } catch (err) {
      throw new ControllerError('input', `cannot read --token-file ${opts.tokenFile}: ${describeFsError(err)}`)
    }
    if (!isUtf8(bytes)) throw new ControllerError('input', `--token-file ${opts.tokenFile} is not UTF-8 text; it must hold only the token`)
    const t = bytes
      .toString('utf8')
      .replace(/^\ufeff/, '')
      .trim()
    if (!t) throw new ControllerError('input', `--token-file ${opts.tokenFile} is empty`)
    if (/\s/.test(t)) throw new ControllerError('input', `--token-file ${opts.tokenFile} holds more than one word; it must hold only the token`)
    if (!TOKEN_CHARS.test(t)) throw new ControllerError('input', `--token-file ${opts.tokenFile} holds a character that cannot be sent in an HTTP header; a token is printable ASCII`)
    return t
  }
  const name = opts.tokenEnv ?? DEFAULT_TOKEN_ENV
  const t = process.env[name]?.trim()
  if (!t) throw new ControllerError('input', `no control token: set ${name} or pass --token-file FILE`)
  if (!TOKEN_CHARS.test(t)) throw new ControllerError('input', `${name} holds a character that cannot be sent in an HTTP header; a token is printable ASCII without spaces`)
  return t
}

interface Source {
  /** How messages name it: the path, or `stdin`. */
  where: string
  text: string
}

/** A file or stdin (`-`) as UTF-8 text; anything else, or a read failure, is an input error. */
async function readSource(source: string, what: string): Promise<Source> {
  const where = source === '-' ? 'stdin' : source
  let bytes: Buffer
  if (source === '-') {
    const chunks: Buffer[] = []
    for await (const c of process.stdin as AsyncIterable<Buffer>) chunks.push(c)
    bytes = Buffer.concat(chunks)
  } else {
    try {
      bytes = await readFile(source)
    } catch (err) {
      throw new ControllerError('input', `cannot read ${what} ${source}: ${describeFsError(err)}`)
    }
  }
  return {where, text: decodeUtf8(bytes, where)}
}

/** Strict UTF-8 (a leading BOM dropped); the error names the first line that is not UTF-8. */
export function decodeUtf8(bytes: Buffer, where: string): string {
  if (!isUtf8(bytes)) {
    let start = 0
    for (let line = 1; ; line++) {
      const nl = bytes.indexOf(0x0a, start)
      const end = nl < 0 ? bytes.length : nl
      const slice = bytes.subarray(start, end)
      if (!isUtf8(slice) || nl < 0) throw new ControllerError('input', `${where}:${line}: not UTF-8 text: ${quoteInput(slice.toString('utf8'))}`)
      start = nl + 1
    }
  }
  return bytes.toString('utf8').replace(/^\ufeff/, '')
}

/** Meaningful lines with their 1-based numbers: `#` comments and blank lines dropped. */
function lines(text: string): [number, string][] {
  const out: [number, string][] = []
  text.split('\n').forEach((line, i) => {
    const t = line.replace(/#.*$/, '').trim()
    if (t) out.push([i + 1, t])
  })
  return out
}

function episodeError(prefix: string, err: unknown): unknown {
  return err instanceof InvalidEpisodeError ? new ControllerError('input', `${prefix}: ${err.message}`) : err
}

/**
 * The episodes of an episodes file's text: one per line (`r`, `r-a2`, `r@2` or a JSON object),
 * `#` comments; or one JSON array of such strings and objects. Errors name the line or the array
 * index, and quote the bad input clipped.
 */
export function parseEpisodeList(text: string, where: string): EpisodeId[] {
  const trimmed = text.trim()
  if (trimmed.startsWith('[')) {
    let arr: unknown
    try {
      arr = JSON.parse(trimmed)
    } catch (err) {
      throw new ControllerError('input', `${where}: not a JSON array (${clipInput((err as Error).message)}); write one JSON array, or one episode per line`)
    }
    if (!Array.isArray(arr)) throw new ControllerError('input', `${where}: not a JSON array`)
    return arr.map((x, i) => {
      try {
        return parseEpisodeValue(x)
      } catch (err) {
        throw episodeError(`${where}: array index ${i}`, err)
      }
    })
  }
  return lines(text).map(([n, t]) => {
    try {
      return parseEpisodeToken(t)
    } catch (err) {
      throw episodeError(`${where}:${n}`, err)
    }
  })
}

/** Episodes from a file or stdin (`-`); see parseEpisodeList. */
export async function readEpisodes(source: string): Promise<EpisodeId[]> {
  const {where, text} = await readSource(source, 'episodes file')
  return parseEpisodeList(text, where)
}

export function parseEpisodeFlags(values: string[]): EpisodeId[] {
  return values.map((v) => {
    try {
      return parseEpisodeToken(v)
    } catch (err) {
      throw episodeError('--episode', err)
    }
  })
}

function checkRollout(id: string, prefix: string): string {
  const problem = rolloutIdProblem(id)
  if (problem) throw new ControllerError('input', `${prefix}: ${quoteInput(id)}: ${problem}`)
  return id
}

/** `--rollout` values, each checked as a rollout ID. */
export function parseRolloutFlags(values: string[]): string[] {
  return values.map((v) => checkRollout(v, '--rollout'))
}

/** Rollout IDs from a file or stdin (`-`), one per line, `#` comments; errors name the line. */
export async function readRolloutIds(source: string): Promise<string[]> {
  const {where, text} = await readSource(source, 'rollouts file')
  return lines(text).map(([n, t]) => checkRollout(t, `${where}:${n}`))
}

/** An `--id` flag value: a checkpoint ID as Gym checks it, so a bad one is refused before anything is sent. */
export function parseCheckpointIdFlag(id: string): string {
  if (!SAFE_ID_PATTERN.test(id) || id.length > 128) throw new ControllerError('input', `--id ${quoteInput(id)}: a checkpoint ID is 1 to 128 characters matching ^[A-Za-z0-9][A-Za-z0-9._-]*$`)
  return id
}

/** The episodes of `--episode` values and `--episodes-file`, in that order; null when neither was given. */
export async function episodeInputs(f: {episode?: string[]; 'episodes-file'?: string}): Promise<EpisodeId[] | null> {
  if (!f.episode?.length && f['episodes-file'] === undefined) return null
  return [...parseEpisodeFlags(f.episode ?? []), ...(f['episodes-file'] !== undefined ? await readEpisodes(f['episodes-file']) : [])]
}

/** The rollout IDs of `--rollout` values and `--rollouts-file`, in that order. */
export async function rolloutInputs(f: {rollout?: string[]; 'rollouts-file'?: string}): Promise<string[]> {
  return [...parseRolloutFlags(f.rollout ?? []), ...(f['rollouts-file'] !== undefined ? await readRolloutIds(f['rollouts-file']) : [])]
}
