import {mkdir, symlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {afterEach, describe, expect, it} from 'vitest'

import {MAX_SECONDS, seconds} from '../../src/cli/flags.js'
import {decodeUtf8, parseCheckpointIdFlag, parseEpisodeFlags, parseEpisodeList, parseRolloutFlags, readEpisodes, readRolloutIds, readToken} from '../../src/cli/inputs.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {MAX_ATTEMPT, QUOTE_MAX, quoteInput} from '../../src/protocol/episode.js'
import {CheckpointStateError} from '../../src/storage/errors.js'
import {planPrune} from '../../src/storage/prune.js'
import {describeFsError, listParticipantDirs, readLatest, resolveCheckpoint} from '../../src/storage/root.js'
import {tempDir} from '../helpers/tmp.js'
import {rejection} from '../helpers/errors.js'

/** The error a function throws (it must throw), as a ControllerError of code 'input'. */
function inputError(fn: () => unknown): ControllerError {
  let caught: unknown
  try {
    fn()
  } catch (err) {
    caught = err
  }
  expect(caught).toBeInstanceOf(ControllerError)
  expect((caught as ControllerError).code).toBe('input')
  return caught as ControllerError
}

describe('quoteInput', () => {
  it('quotes short input whole', () => {
    expect(quoteInput('r@x')).toBe("'r@x'")
  })

  it('cuts long input to about QUOTE_MAX characters and names the full length', () => {
    const q = quoteInput('x'.repeat(24_000_000))
    expect(q).toBe(`'${'x'.repeat(QUOTE_MAX)}…' (24000000 characters in all)`)
  })

  it('escapes control characters and never splits a surrogate pair', () => {
    expect(quoteInput('a\u001b[31mb\n\u202e')).toBe("'a\\x1b[31mb\\n\\u202e'")
    const q = quoteInput('a' + '😀'.repeat(300), 4)
    expect(q).toBe("'a😀😀…' (601 characters in all)")
  })
})

describe('episode lists: every rejected shape names the line or index and quotes the input', () => {
  // [file text, where the error must point, the quoted input, what it must say]
  const lineForm: [string, string, string, RegExp][] = [
    ['a\nb@x\n', 'eps:2', "'b@x'", /attempt 'x' is not a non-negative integer/],
    ['r@-1', 'eps:1', "'r@-1'", /attempt '-1' is not a non-negative integer/],
    ['r@1.5', 'eps:1', "'r@1.5'", /attempt '1.5' is not a non-negative integer/],
    ['r@01', 'eps:1', "'r@01'", /attempt '01' has a leading zero/],
    ['r@', 'eps:1', "'r@'", /attempt '' is not a non-negative integer/],
    [`r@${MAX_ATTEMPT + 1}`, 'eps:1', `'r@2147483648'`, /attempt 2147483648 is beyond the largest attempt, 2147483647/],
    ['# c\n\nr-a99999999999', 'eps:3', "'r-a99999999999'", /attempt 99999999999 is beyond the largest attempt/],
    ['@2', 'eps:1', "'@2'", /the rollout ID is empty/],
    ['a b', 'eps:1', "'a b'", /must match \^\[A-Za-z0-9\]/],
    ['.x', 'eps:1', "'.x'", /must match/],
    ['"r"', 'eps:1', `'"r"'`, /must match/],
    ['r-a1@2', 'eps:1', "'r-a1@2'", /rollout ID 'r-a1': a rollout ID must not end with the reserved attempt suffix -a<N>/],
    ['x-a1-a3', 'eps:1', "'x-a1-a3'", /rollout ID 'x-a1': .*reserved attempt suffix/],
    ['a\u001b[2Jb', 'eps:1', "'a\\x1b[2Jb'", /must match/],
    ['{"rollout_id": "r"', 'eps:1', `'{"rollout_id": "r"'`, /not valid JSON \(.*\); an episode object must fit on one line/],
    ['{"rollout_id": "r", "extra": 1}', 'eps:1', `'{"rollout_id": "r", "extra": 1}'`, /not an episode: unknown key 'extra'/],
    ['{}', 'eps:1', "'{}'", /"rollout_id" is missing/],
    ['{"rollout_id": 7}', 'eps:1', `'{"rollout_id": 7}'`, /"rollout_id" must be a string, not a number/],
    ['{"rollout_id": null}', 'eps:1', `'{"rollout_id": null}'`, /"rollout_id" must be a string, not null/],
    ['{"rollout_id": ""}', 'eps:1', `'{"rollout_id": ""}'`, /rollout_id '': the rollout ID is empty/],
    ['{"rollout_id": "a/b"}', 'eps:1', `'{"rollout_id": "a/b"}'`, /rollout_id 'a\/b': a rollout ID must match/],
    ['{"rollout_id": "r-a1"}', 'eps:1', `'{"rollout_id": "r-a1"}'`, /reserved attempt suffix/],
    ['{"rollout_id": "r", "attempt": -1}', 'eps:1', `'{"rollout_id": "r", "attempt": -1}'`, /"attempt" must be a non-negative integer, not -1/],
    ['{"rollout_id": "r", "attempt": 1.5}', 'eps:1', `'{"rollout_id": "r", "attempt": 1.5}'`, /not 1\.5/],
    ['{"rollout_id": "r", "attempt": "2"}', 'eps:1', `'{"rollout_id": "r", "attempt": "2"}'`, /not a string/],
    ['{"rollout_id": "r", "attempt": null}', 'eps:1', `'{"rollout_id": "r", "attempt": null}'`, /not null/],
    ['{"rollout_id": "r", "attempt": true}', 'eps:1', `'{"rollout_id": "r", "attempt": true}'`, /not a boolean/],
    ['{"rollout_id": "r", "attempt": 2147483648}', 'eps:1', `'{"rollout_id": "r", "attempt": 2147483648}'`, /beyond the largest attempt/],
    ['{"rollout_id": "r", "attempt": 1e400}', 'eps:1', `'{"rollout_id": "r", "attempt": 1e400}'`, /not Infinity/],
  ]

  it.each(lineForm)('line form %j', (text, where, quoted, why) => {
    const err = inputError(() => parseEpisodeList(text, 'eps'))
    expect(err.message.startsWith(`${where}: ${quoted}`), err.message).toBe(true)
    expect(err.message).toMatch(why)
  })

  const arrayForm: [string, number, string, RegExp][] = [
    ['[null]', 0, "'null'", /expected a string \(r, r-a2 or r@2\) or an object \{"rollout_id", "attempt"\}, not null/],
    ['[1, 2]', 0, "'1'", /not a number/],
    ['["r", true]', 1, "'true'", /not a boolean/],
    ['["r", ["s"]]', 1, `'["s"]'`, /not an array/],
    ['[""]', 0, "''", /an empty episode/],
    ['["ok", "r@x"]', 1, "'r@x'", /attempt 'x' is not a non-negative integer/],
    ['["r-a2147483648"]', 0, "'r-a2147483648'", /beyond the largest attempt/],
    ['["{\\"rollout_id\\": \\"r\\"}"]', 0, `'{"rollout_id": "r"}'`, /a JSON object inside a string/],
    ['[{"rollout_id": "r", "x": 1}]', 0, `'{"rollout_id":"r","x":1}'`, /unknown key 'x'/],
    ['[{"rollout_id": "r", "attempt": -1}]', 0, `'{"rollout_id":"r","attempt":-1}'`, /not -1/],
    ['[{"rollout_id": "r", "attempt": 2.5}]', 0, `'{"rollout_id":"r","attempt":2.5}'`, /not 2\.5/],
    ['[{"rollout_id": "r", "attempt": 4294967296}]', 0, `'{"rollout_id":"r","attempt":4294967296}'`, /beyond the largest attempt/],
    ['[{"rollout_id": "bad id"}]', 0, `'{"rollout_id":"bad id"}'`, /must match/],
    ['[{"rollout_id": "r-a3"}]', 0, `'{"rollout_id":"r-a3"}'`, /reserved attempt suffix/],
    ['[{"attempt": 1}]', 0, `'{"attempt":1}'`, /"rollout_id" is missing/],
  ]

  it.each(arrayForm)('JSON array %s', (text, index, quoted, why) => {
    const err = inputError(() => parseEpisodeList(text, 'stdin'))
    expect(err.message.startsWith(`stdin: array index ${index}: ${quoted}`), err.message).toBe(true)
    expect(err.message).toMatch(why)
  })

  it('a JSON array that does not parse is named as such', () => {
    expect(inputError(() => parseEpisodeList('[{"rollout_id": "r"},', 'f')).message).toMatch(/^f: not a JSON array \(.+\); write one JSON array, or one episode per line$/)
  })

  it('a 24 MB line or array item is never echoed whole', () => {
    const huge = 'r'.repeat(24 << 20) + '!'
    const line = inputError(() => parseEpisodeList(`ok\n${huge}\n`, 'eps')).message
    expect(line.length).toBeLessThan(2 * QUOTE_MAX + 200)
    expect(line).toContain(`eps:2: '${'r'.repeat(QUOTE_MAX)}…' (${huge.length} characters in all)`)
    const item = inputError(() => parseEpisodeList(JSON.stringify([{rollout_id: huge}]), 'eps')).message
    expect(item.length).toBeLessThan(3 * QUOTE_MAX + 200)
    expect(item).toMatch(/^eps: array index 0: '\{"rollout_id":"r{150,}…' \(\d+ characters in all\): not an episode: rollout_id 'r+…' \(25165825 characters in all\): a rollout ID must match/)
  })

  it('accepts every documented spelling, in both forms', () => {
    const want = [
      {rolloutId: 'r', attempt: 0},
      {rolloutId: 'r', attempt: 2},
      {rolloutId: 's', attempt: 3},
      {rolloutId: 't', attempt: 4},
      {rolloutId: 'u', attempt: MAX_ATTEMPT},
      {rolloutId: 'null', attempt: 0},
    ]
    expect(parseEpisodeList('r  # first\nr-a2\r\ns@3\n{"rollout_id": "t", "attempt": 4}\nu@2147483647\nnull\n', 'f')).toEqual(want)
    expect(parseEpisodeList('\n [ "r", "r-a2", "s@3", {"rollout_id": "t", "attempt": 4}, {"rollout_id": "u", "attempt": 2147483647}, "null" ]\n', 'f')).toEqual(want)
  })

  it('--episode values name the flag', () => {
    expect(inputError(() => parseEpisodeFlags(['r', 'r@x'])).message).toBe("--episode: 'r@x': attempt 'x' is not a non-negative integer")
    expect(inputError(() => parseEpisodeFlags([''])).message).toBe("--episode: '': an empty episode")
  })
})

describe('episode and rollout files', () => {
  it('a file that is not UTF-8 names the first bad line', async () => {
    const dir = await tempDir()
    const f = path.join(dir, 'eps')
    await writeFile(f, Buffer.concat([Buffer.from('a\nb\n'), Buffer.from([0x63, 0xff, 0xfe, 0x0a]), Buffer.from('d\n')]))
    expect((await rejection(readEpisodes(f))).message).toBe(`${f}:3: not UTF-8 text: 'c\ufffd\ufffd'`)
    // A byte-order mark is not an error.
    await writeFile(f, '\ufeffa\n')
    expect(await readEpisodes(f)).toEqual([{rolloutId: 'a', attempt: 0}])
  })

  it('decodeUtf8 finds a bad byte on the last line without a newline', () => {
    expect(inputError(() => decodeUtf8(Buffer.from([0x61, 0x0a, 0x80]), 'stdin')).message).toBe("stdin:2: not UTF-8 text: '\ufffd'")
  })

  it('a path that is a directory, or missing, is named with the cause', async () => {
    const dir = await tempDir()
    const err = await rejection(readEpisodes(dir))
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.message).toBe(`cannot read episodes file ${dir}: it is a directory, not a file (EISDIR)`)
    expect((await rejection(readRolloutIds(path.join(dir, 'nope')))).message).toBe(`cannot read rollouts file ${path.join(dir, 'nope')}: it does not exist (ENOENT)`)
  })

  it('rollout IDs get the episode ID check, naming the line or the flag', async () => {
    const dir = await tempDir()
    const f = path.join(dir, 'rollouts')
    await writeFile(f, '# done\nr7\nr9-a1\n')
    expect((await rejection(readRolloutIds(f))).message).toBe(`${f}:3: 'r9-a1': a rollout ID must not end with the reserved attempt suffix -a<N>`)
    await writeFile(f, 'r7\n\nr9\n')
    expect(await readRolloutIds(f)).toEqual(['r7', 'r9'])
    expect(inputError(() => parseRolloutFlags(['r7', 'r9@1'])).message).toBe("--rollout: 'r9@1': a rollout ID must match ^[A-Za-z0-9][A-Za-z0-9._-]*$")
    expect(inputError(() => parseRolloutFlags([''])).message).toBe("--rollout: '': the rollout ID is empty")
  })

  it('--id must be a checkpoint ID Gym accepts', () => {
    expect(parseCheckpointIdFlag('restore-3f2a')).toBe('restore-3f2a')
    expect(inputError(() => parseCheckpointIdFlag('../x')).message).toMatch(/^--id '\.\.\/x': a checkpoint ID is 1 to 128 characters/)
    expect(inputError(() => parseCheckpointIdFlag('a'.repeat(129))).message).toContain('1 to 128 characters')
  })
})

describe('token sources', () => {
  const saved = process.env.GYMCKPT_TEST_TOKEN
  afterEach(() => {
    if (saved === undefined) delete process.env.GYMCKPT_TEST_TOKEN
    else process.env.GYMCKPT_TEST_TOKEN = saved
  })

  it('a token file that is not UTF-8, holds a non-ASCII character or is a directory is refused, never echoed', async () => {
    const dir = await tempDir()
    const f = path.join(dir, 'tok')
    await writeFile(f, Buffer.from([0x73, 0x65, 0x63, 0xff, 0x0a]))
    const bad = await rejection(readToken({tokenEnv: 'UNUSED', tokenFile: f}))
    expect(bad.message).toBe(`--token-file ${f} is not UTF-8 text; it must hold only the token`)
    await writeFile(f, 'séc\n')
    const wide = await rejection(readToken({tokenEnv: 'UNUSED', tokenFile: f}))
    expect(wide.message).toMatch(/cannot be sent in an HTTP header/)
    expect(wide.message).not.toContain('séc')
    expect((await rejection(readToken({tokenEnv: 'UNUSED', tokenFile: dir}))).message).toBe(`cannot read --token-file ${dir}: it is a directory, not a file (EISDIR)`)
    await writeFile(f, 'secret\n')
    expect(await readToken({tokenEnv: 'UNUSED', tokenFile: f})).toBe('secret')
  })

  it('a token variable with a character HTTP cannot carry is refused without echoing it', async () => {
    process.env.GYMCKPT_TEST_TOKEN = 'sé'
    const err = await rejection(readToken({tokenEnv: 'GYMCKPT_TEST_TOKEN'}))
    expect(err.message).toBe('GYMCKPT_TEST_TOKEN holds a character that cannot be sent in an HTTP header; a token is printable ASCII without spaces')
  })
})

describe('seconds flags', () => {
  it('state their bounds and refuse values outside them', async () => {
    const f = seconds({summary: 'Seconds the operation may take.', default: 300, max: 86_400})
    expect(f.summary).toBe('Seconds the operation may take; 1 to 86400 (1 day).')
    expect(f).toMatchObject({min: 1, max: 86_400, default: 300})
    const parse = (v: string) => f.parse(v, {} as never, f as never)
    expect(await parse('86400')).toBe(86_400)
    expect((await rejection(parse('99999999999'))).message).toMatch(/less than or equal to 86400/)
    expect((await rejection(parse('0'))).message).toMatch(/greater than or equal to 1/)
    expect((await rejection(parse('1.5'))).message).toMatch(/Expected an integer/)
  })

  it('cannot be built with a bound a timer would overflow', () => {
    expect(() => seconds({summary: 'x', default: 1, max: MAX_SECONDS + 1})).toThrow(/bounds/)
    expect(MAX_SECONDS * 1000 + 5000).toBeLessThan(2 ** 31 - 1)
  })
})

describe('checkpoint roots: every file system problem is a CheckpointStateError naming the path and cause', () => {
  it('describeFsError names the cause in words', () => {
    expect(describeFsError(Object.assign(new Error('x'), {code: 'EACCES'}))).toBe('permission denied (EACCES)')
    expect(describeFsError(Object.assign(new Error('odd'), {code: 'EWHAT'}))).toBe('odd')
  })

  it('LATEST with a trailing newline or CRLF still works; garbage, non-UTF-8, empty or a directory is refused', async () => {
    const root = await tempDir()
    const latest = path.join(root, 'LATEST')
    await writeFile(latest, 'ckpt-1\n')
    expect(await readLatest(root)).toBe('ckpt-1')
    await writeFile(latest, 'ckpt-1\r\n')
    expect(await readLatest(root)).toBe('ckpt-1')
    await writeFile(latest, 'two words\n')
    expect((await rejection(readLatest(root))).message).toBe(`${latest} names no valid checkpoint ID: 'two words'`)
    await writeFile(latest, 'x/'.repeat(500))
    expect((await rejection(readLatest(root))).message).toContain("…' (1000 characters in all)")
    await writeFile(latest, Buffer.from([0x63, 0xff]))
    expect((await rejection(readLatest(root))).message).toBe(`${latest} is not UTF-8 text`)
    await writeFile(latest, '\n')
    expect((await rejection(readLatest(root))).message).toBe(`${latest} is empty: it names no checkpoint`)
    await writeFile(latest, '')
    expect((await rejection(readLatest(root))).message).toBe(`${latest} is empty: it names no checkpoint`)
    const rootWithDir = await tempDir()
    await mkdir(path.join(rootWithDir, 'LATEST'))
    const err = await rejection(readLatest(rootWithDir))
    expect(err).toBeInstanceOf(CheckpointStateError)
    expect(err.message).toBe(`cannot read ${path.join(rootWithDir, 'LATEST')}: it is a directory, not a file (EISDIR)`)
  })

  it('a location that is a file, or missing, is named', async () => {
    const dir = await tempDir()
    const file = path.join(dir, 'file')
    await writeFile(file, 'hi')
    const err = await rejection(resolveCheckpoint(file))
    expect(err).toBeInstanceOf(CheckpointStateError)
    expect(err.message).toMatch(new RegExp(`^${file} is not a directory`))
    expect((await rejection(resolveCheckpoint(path.join(dir, 'nope')))).message).toBe(`${path.join(dir, 'nope')}: it does not exist (ENOENT)`)
  })

  it('a gym/ that is a file, or a dangling link in it, is an error; a missing gym/ is no participants', async () => {
    const ck = await tempDir()
    expect(await listParticipantDirs(ck)).toEqual([])
    await writeFile(path.join(ck, 'gym'), 'x')
    const err = await rejection(listParticipantDirs(ck))
    expect(err).toBeInstanceOf(CheckpointStateError)
    expect(err.message).toBe(`${path.join(ck, 'gym')} is not a directory: it must hold one directory per participant kind`)
    const ck2 = await tempDir()
    await mkdir(path.join(ck2, 'gym'))
    await symlink(path.join(ck2, 'nowhere'), path.join(ck2, 'gym', 'agent'))
    expect((await rejection(listParticipantDirs(ck2))).message).toBe(`${path.join(ck2, 'gym', 'agent')} is a symbolic link to a path that does not exist`)
  })

  it('prune refuses a root that is a file and a LATEST that is a directory', async () => {
    const dir = await tempDir()
    await writeFile(path.join(dir, 'file'), 'x')
    const notDir = await rejection(planPrune(path.join(dir, 'file'), 1))
    expect(notDir).toBeInstanceOf(CheckpointStateError)
    expect(notDir.message).toBe(`checkpoint root ${path.join(dir, 'file')} is not a directory`)
    await mkdir(path.join(dir, 'LATEST'))
    expect((await rejection(planPrune(dir, 1))).message).toBe(`cannot read ${path.join(dir, 'LATEST')}: it is a directory, not a file (EISDIR)`)
  })
})
