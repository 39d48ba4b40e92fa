// Rules of the checkpoint root (src/storage/root.ts) that no other test holds (issue 12).
import {chmod, mkdir, readFile, readdir, symlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'
import {z} from 'zod'

import {CheckpointStateError} from '../../src/storage/errors.js'
import {describeIssue} from '../../src/storage/manifest-schemas.js'
import {
  CONTROLLER_MANIFEST,
  ControllerManifest,
  FORMAT_VERSION,
  GYM_COLLECTION_MANIFEST,
  LATEST_FILE,
  describeFsError,
  listParticipantDirs,
  publishLatest,
  readCheckpointSummary,
  readLatest,
  resolveCheckpoint,
  setAsideControllerManifests,
  syncParticipantDirs,
  writeControllerManifest,
} from '../../src/storage/root.js'
import {tempDir} from '../helpers/tmp.js'

async function stateError(p: Promise<unknown>): Promise<string> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  )
  expect(err).toBeInstanceOf(CheckpointStateError)
  return (err as Error).message
}

const manifest = (over: Partial<ControllerManifest> = {}): ControllerManifest => ({
  format_version: FORMAT_VERSION,
  checkpoint_id: 'c1',
  created_at: 1.5,
  continued: [{rollout_id: 'r', attempt: 1}],
  restarted: [{rollout_id: 's', attempt: 0}],
  participants: [],
  ...over,
})

describe('LATEST', () => {
  it('is written as the bare ID (no newline), replaced atomically, no temporary file left', async () => {
    const root = await tempDir()
    await publishLatest(root, 'c1')
    expect(await readFile(path.join(root, LATEST_FILE), 'utf8')).toBe('c1')
    await publishLatest(root, 'c2')
    expect(await readFile(path.join(root, LATEST_FILE), 'utf8')).toBe('c2')
    expect(await readdir(root)).toEqual([LATEST_FILE])
  })

  it('written with a trailing newline (echo, Python writers) or surrounding blanks, names the same checkpoint', async () => {
    const root = await tempDir()
    for (const text of ['c1\n', 'c1\r\n', '  c1\t\n', '\nc1']) {
      await writeFile(path.join(root, LATEST_FILE), text)
      expect(await readLatest(root), JSON.stringify(text)).toBe('c1')
      const r = await resolveCheckpoint(root)
      expect(r).toEqual({root, checkpointDir: path.join(root, 'c1'), checkpointId: 'c1'})
    }
  })

  it('missing is null; empty, blank, an unsafe ID or bytes that are not UTF-8 are errors naming the file', async () => {
    const root = await tempDir()
    const file = path.join(root, LATEST_FILE)
    expect(await readLatest(root)).toBeNull()
    for (const text of ['', '\n', '   ']) {
      await writeFile(file, text)
      expect(await stateError(readLatest(root))).toBe(`${file} is empty: it names no checkpoint`)
    }
    for (const [text, shown] of [
      ['../etc', "'../etc'"],
      ['a b', "'a b'"],
      ['.hidden', "'.hidden'"],
      ['-x', "'-x'"],
      ['c1\nc2', "'c1\\nc2'"],
    ]) {
      await writeFile(file, text!)
      expect(await stateError(readLatest(root))).toBe(`${file} names no valid checkpoint ID: ${shown}`)
    }
    await writeFile(file, Buffer.from([0x63, 0xff, 0x31]))
    expect(await stateError(readLatest(root))).toBe(`${file} is not UTF-8 text`)
  })

  it('a LATEST that cannot be read is an error with the real cause, not "no LATEST"', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, LATEST_FILE))
    expect(await stateError(readLatest(root))).toBe(`cannot read ${path.join(root, LATEST_FILE)}: it is a directory, not a file (EISDIR)`)
  })
})

describe('the controller manifest', () => {
  it('is created as indented JSON with a final newline, and never rewritten', async () => {
    const dir = await tempDir()
    const m = manifest()
    await writeControllerManifest(dir, m)
    const text = await readFile(path.join(dir, CONTROLLER_MANIFEST), 'utf8')
    expect(text).toBe(JSON.stringify(m, null, 1) + '\n')
    const err = await stateError(writeControllerManifest(dir, manifest({checkpoint_id: 'c2'})))
    expect(err).toBe(`${path.join(dir, CONTROLLER_MANIFEST)} already exists (${text.length} bytes); a published checkpoint is never rewritten`)
    expect(await readFile(path.join(dir, CONTROLLER_MANIFEST), 'utf8')).toBe(text)
    expect(await readdir(dir)).toEqual([CONTROLLER_MANIFEST])
  })

  it("reads back every field, ours before Gym's", async () => {
    const dir = await tempDir()
    await writeFile(path.join(dir, GYM_COLLECTION_MANIFEST), JSON.stringify({checkpoint_id: 'gym', created_at: 2, continued: []}))
    await writeControllerManifest(dir, manifest({controller_state: {done: [1]}}))
    expect(await readCheckpointSummary(dir)).toEqual({
      source: CONTROLLER_MANIFEST,
      checkpointId: 'c1',
      createdAt: 1.5,
      continued: [{rollout_id: 'r', attempt: 1}],
      restarted: [{rollout_id: 's', attempt: 0}],
      participants: [],
      controllerState: {done: [1]},
    })
  })

  it("reads Gym's collection.json: extra fields allowed, restarted optional, no participants", async () => {
    const dir = await tempDir()
    await writeFile(path.join(dir, GYM_COLLECTION_MANIFEST), JSON.stringify({checkpoint_id: 'gym', run_id: 'x', created_at: 2, continued: [{rollout_id: 'a'}], rows: 7}))
    expect(await readCheckpointSummary(dir)).toEqual({
      source: GYM_COLLECTION_MANIFEST,
      checkpointId: 'gym',
      createdAt: 2,
      continued: [{rollout_id: 'a', attempt: 0}],
      restarted: [],
      participants: null,
      controllerState: undefined,
    })
  })

  it('none is null; a broken one names the file and the first problem', async () => {
    const dir = await tempDir()
    expect(await readCheckpointSummary(dir)).toBeNull()
    const ours = path.join(dir, CONTROLLER_MANIFEST)
    await writeFile(ours, '{"format_version": 1,')
    expect(await stateError(readCheckpointSummary(dir))).toMatch(new RegExp(`^${escape(ours)} is not JSON \\(.+\\)$`))
    await writeFile(ours, JSON.stringify({...manifest(), format_version: 2}))
    expect(await stateError(readCheckpointSummary(dir))).toMatch(new RegExp(`^${escape(ours)} is not a gymckpt manifest: format_version: `))
    await writeFile(
      ours,
      JSON.stringify({
        ...manifest(),
        continued: [
          {rollout_id: 'r', attempt: 0},
          {rollout_id: '../x', attempt: 0},
        ],
      }),
    )
    expect(await stateError(readCheckpointSummary(dir))).toMatch(new RegExp(`^${escape(ours)} is not a gymckpt manifest: continued\\.1\\.rollout_id: `))
    await writeFile(ours, '[]')
    expect(await stateError(readCheckpointSummary(dir))).toMatch(new RegExp(`^${escape(ours)} is not a gymckpt manifest: \\(root\\): `))

    const dir2 = await tempDir()
    const gym = path.join(dir2, GYM_COLLECTION_MANIFEST)
    await writeFile(gym, JSON.stringify({checkpoint_id: 'g', continued: []}))
    expect(await stateError(readCheckpointSummary(dir2))).toMatch(new RegExp(`^${escape(gym)} is not a Gym collection manifest: created_at: `))
    await writeFile(gym, 'nope')
    expect(await stateError(readCheckpointSummary(dir2))).toMatch(new RegExp(`^${escape(gym)} is not JSON \\(`))
  })

  it('describeIssue names the path of the first issue, (root) for the value itself', () => {
    const r = z.object({a: z.array(z.object({b: z.string()}))}).safeParse({a: [{b: 1}]})
    expect(describeIssue(r.error!)).toMatch(/^a\.0\.b: /)
    expect(describeIssue(z.string().safeParse(1).error!)).toMatch(/^\(root\): /)
    expect(describeIssue(new z.ZodError([]))).toBe('invalid')
  })
})

describe('describeFsError', () => {
  it('says the cause in words with its code, and clips anything else', () => {
    const e = (code: string) => Object.assign(new Error('raw'), {code})
    expect(describeFsError(e('ENOENT'))).toBe('it does not exist (ENOENT)')
    expect(describeFsError(e('EACCES'))).toBe('permission denied (EACCES)')
    expect(describeFsError(e('EROFS'))).toBe('the file system is read-only (EROFS)')
    expect(describeFsError(e('ENOSPC'))).toBe('no space left on the device (ENOSPC)')
    expect(describeFsError(e('EEXIST'))).toBe('it exists and is not a directory (EEXIST)')
    expect(describeFsError(e('EPERM'))).toBe('operation not permitted (EPERM)')
    expect(describeFsError(e('ENAMETOOLONG'))).toBe('the name is too long (ENAMETOOLONG)')
    expect(describeFsError(e('EMFILE'))).toBe('too many open files (EMFILE)')
    expect(describeFsError(e('EIO'))).toBe('an I/O error (EIO)')
    expect(describeFsError(e('EDQUOT'))).toBe('the disk quota is exceeded (EDQUOT)')
    expect(describeFsError(e('EWHATEVER'))).toBe('raw')
    expect(describeFsError(new Error('line\nbreak'))).toBe('line\\nbreak')
    expect(describeFsError('x'.repeat(300))).toBe('x'.repeat(200) + '… (300 characters in all)')
    expect(describeFsError(undefined)).toBe('undefined')
  })
})

describe('resolveCheckpoint', () => {
  it('a root follows LATEST; --id wins over LATEST; a checkpoint directory is itself', async () => {
    const root = await tempDir()
    await publishLatest(root, 'c1')
    expect(await resolveCheckpoint(root, 'c0')).toEqual({root, checkpointDir: path.join(root, 'c0'), checkpointId: 'c0'})
    const dir = path.join(root, 'c1')
    for (const marker of ['gym', CONTROLLER_MANIFEST, GYM_COLLECTION_MANIFEST]) {
      const d = path.join(dir, marker === 'gym' ? 'g' : marker.replace('.json', ''))
      await mkdir(d, {recursive: true})
      if (marker === 'gym') await mkdir(path.join(d, 'gym'))
      else await writeFile(path.join(d, marker), '{}')
      expect(await resolveCheckpoint(d), marker).toEqual({root: null, checkpointDir: d, checkpointId: path.basename(d)})
    }
  })

  it('a relative location is made absolute', async () => {
    const root = await tempDir()
    await publishLatest(root, 'c1')
    const rel = path.relative(process.cwd(), root)
    expect((await resolveCheckpoint(rel)).checkpointDir).toBe(path.join(root, 'c1'))
  })

  it('every wrong location is an error saying what is wrong', async () => {
    const root = await tempDir()
    expect(await stateError(resolveCheckpoint(path.join(root, 'none')))).toBe(`${path.join(root, 'none')}: it does not exist (ENOENT)`)
    await writeFile(path.join(root, 'file'), 'x')
    expect(await stateError(resolveCheckpoint(path.join(root, 'file')))).toBe(
      `${path.join(root, 'file')} is not a directory: give a checkpoint root (the directory holding LATEST) or a checkpoint directory`,
    )
    expect(await stateError(resolveCheckpoint(root, '../up'))).toBe(`'../up' is not a valid checkpoint ID`)
    const empty = path.join(root, 'empty')
    await mkdir(empty)
    await writeFile(path.join(empty, 'other.json'), '{}')
    expect(await stateError(resolveCheckpoint(empty))).toBe(`${empty} is neither a checkpoint root (no LATEST) nor a checkpoint directory (no gym/ or manifest)`)
  })

  it.skipIf(process.getuid?.() === 0)('an unreadable directory is an error with its cause', async () => {
    const root = await tempDir()
    const d = path.join(root, 'locked')
    await mkdir(d)
    await chmod(d, 0o300)
    try {
      expect(await stateError(resolveCheckpoint(d))).toBe(`cannot list checkpoint directory ${d}: permission denied (EACCES)`)
    } finally {
      await chmod(d, 0o700)
    }
  })
})

describe('listParticipantDirs', () => {
  it('lists gym/<kind>/<instance> in sorted order even where the file system lists them in another order', async () => {
    const dir = await tempDir()
    // libuv lists a directory in byte (UTF-8) order; JavaScript sorts UTF-16 code units. The two
    // disagree for an astral character against one at U+E000..U+FFFF: a listing that is not sorted.
    const names = ['\uff5a', '\u{1d4b6}', 'b', 'a']
    for (const k of names) for (const i of names) await mkdir(path.join(dir, 'gym', k, i), {recursive: true})
    const listed = await readdir(path.join(dir, 'gym'))
    const sorted = [...names].sort()
    expect(listed).not.toEqual(sorted)
    const out = await listParticipantDirs(dir)
    expect(out.map((d) => `${d.kind}/${d.instance}`)).toEqual(sorted.flatMap((k) => sorted.map((i) => `${k}/${i}`)))
    expect(out[0]).toEqual({kind: 'a', instance: 'a', dir: path.join(dir, 'gym', 'a', 'a')})
  })

  it('skips stray files among kinds and instances; no gym/ is no participants', async () => {
    const dir = await tempDir()
    expect(await listParticipantDirs(dir)).toEqual([])
    await mkdir(path.join(dir, 'gym', 'model', 'm'), {recursive: true})
    await writeFile(path.join(dir, 'gym', 'README'), 'x')
    await writeFile(path.join(dir, 'gym', 'model', 'notes.txt'), 'x')
    await mkdir(path.join(dir, 'gym', 'agent'))
    expect(await listParticipantDirs(dir)).toEqual([{kind: 'model', instance: 'm', dir: path.join(dir, 'gym', 'model', 'm')}])
  })

  it('a gym/ that is a file, or a checkpoint directory that is a file, is an error', async () => {
    const dir = await tempDir()
    await writeFile(path.join(dir, 'gym'), 'x')
    expect(await stateError(listParticipantDirs(dir))).toBe(`${path.join(dir, 'gym')} is not a directory: it must hold one directory per participant kind`)
    const file = path.join(dir, 'f')
    await writeFile(file, 'x')
    expect(await stateError(listParticipantDirs(file))).toBe(`checkpoint directory ${file} is not a directory`)
  })

  it('a dangling symlink among the participants is named as one', async () => {
    const dir = await tempDir()
    await mkdir(path.join(dir, 'gym', 'model'), {recursive: true})
    const link = path.join(dir, 'gym', 'model', 'gone')
    await symlink(path.join(dir, 'nowhere'), link)
    expect(await stateError(listParticipantDirs(dir))).toBe(`${link} is a symbolic link to a path that does not exist`)
  })

  it('a kind directory that is a symlink loop is an error with its cause', async () => {
    const dir = await tempDir()
    await mkdir(path.join(dir, 'gym'), {recursive: true})
    const loop = path.join(dir, 'gym', 'loop')
    await symlink(loop, loop)
    expect(await stateError(listParticipantDirs(dir))).toBe(`cannot read ${loop}: too many levels of symbolic links (ELOOP)`)
  })
})

describe('listParticipantDirs when gym/ cannot be listed', () => {
  it('a gym/ that is a symlink loop is an error with its cause, not "not a directory"', async () => {
    const dir = await tempDir()
    const gym = path.join(dir, 'gym')
    await symlink(gym, gym)
    expect(await stateError(listParticipantDirs(dir))).toBe(`cannot list ${gym}: too many levels of symbolic links (ELOOP)`)
  })
})

function escape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
}

describe('setAsideControllerManifests (a checkpoint the publish gate refused)', () => {
  it('renames gymckpt.json and collection.json, keeps their bytes, and names what it moved', async () => {
    const dir = await tempDir()
    await writeFile(path.join(dir, 'gymckpt.json'), '{"a": 1}\n')
    await writeFile(path.join(dir, 'collection.json'), '{"b": 2}\n')
    expect(await setAsideControllerManifests(dir)).toEqual(['gymckpt.refused.json', 'collection.refused.json'])
    expect((await readdir(dir)).sort()).toEqual(['collection.refused.json', 'gymckpt.refused.json'])
    expect(await readFile(path.join(dir, 'gymckpt.refused.json'), 'utf8')).toBe('{"a": 1}\n')
    expect(await readFile(path.join(dir, 'collection.refused.json'), 'utf8')).toBe('{"b": 2}\n')
    // Nothing (left) to move is no error.
    expect(await setAsideControllerManifests(dir)).toEqual([])
  })

  it('a failure other than a missing file is raised', async () => {
    const dir = await tempDir()
    // A directory in the way of the new name: rename(2) refuses to replace it with a file.
    await writeFile(path.join(dir, 'gymckpt.json'), '{}')
    await mkdir(path.join(dir, 'gymckpt.refused.json', 'x'), {recursive: true})
    await expect(setAsideControllerManifests(dir)).rejects.toMatchObject({code: 'EISDIR'})
  })
})

describe('syncParticipantDirs (before the controller manifest is written)', () => {
  it('goes through every participant and kind directory and gym/, skipping missing ones (the publish gate names those)', async () => {
    const dir = await tempDir()
    await mkdir(path.join(dir, 'gym', 'agent', 'a'), {recursive: true})
    await mkdir(path.join(dir, 'gym', 'model', 'm'), {recursive: true})
    await expect(
      syncParticipantDirs(dir, [
        {kind: 'agent', instance: 'a'},
        {kind: 'model', instance: 'm'},
        {kind: 'model', instance: 'gone'},
        {kind: 'resources', instance: 'r'},
      ]),
    ).resolves.toBeUndefined()
    await expect(syncParticipantDirs(await tempDir(), [{kind: 'agent', instance: 'a'}])).resolves.toBeUndefined()
  })

  it('a failure other than a missing directory is raised', async () => {
    const dir = await tempDir()
    await mkdir(path.join(dir, 'gym'), {recursive: true})
    // A file where the kind directory should be: the participant directory under it cannot be opened.
    await writeFile(path.join(dir, 'gym', 'model'), 'x')
    await expect(syncParticipantDirs(dir, [{kind: 'model', instance: 'm'}])).rejects.toMatchObject({code: 'ENOTDIR'})
  })
})
