// Rules of list/describe (src/storage/catalog.ts) that no other in-process test holds (issue 12):
// the --json documents field by field, formatting at its boundaries, ordering and ages, and every
// per-participant problem describe reports. Checkpoints are built on disk directly (no fleet).
import {appendFile, mkdir, rm, symlink, utimes, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {catalogJson, describeCheckpoint, descriptionJson, entryJson, formatAge, formatBytes, listCheckpoints, rfc3339} from '../../src/storage/catalog.js'
import {writeCollectionManifest} from '../../src/storage/collector.js'
import {CheckpointStateError} from '../../src/storage/errors.js'
import {writeParticipantState} from '../../src/storage/participant-store.js'
import {RESTORE_LOG, appendRestoreLog} from '../../src/storage/restore-log.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import {tempDir} from '../helpers/tmp.js'

const rec = (r: string, a = 0) => `{"episode_id": {"rollout_id": "${r}", "attempt": ${a}}}`

/** A published gymckpt checkpoint: one participant per [kind, instance, server, rollouts]. */
async function ours(root: string, id: string, createdAt: number, parts: [string, string, string, string[]][], over: {restarted?: string[]} = {}) {
  const dir = path.join(root, id)
  const participants = []
  for (const [kind, instance, server, rollouts] of parts) {
    const manifest = await writeParticipantState(
      {checkpointDir: dir, kind, instance, checkpointId: id},
      rollouts.map((r) => rec(r)),
    )
    participants.push({server, kind, instance, manifest, episode_ids: rollouts.map((r) => `${r}#0`)})
  }
  const continued = [...new Set(parts.flatMap((p) => p[3]))].map((r) => ({rollout_id: r, attempt: 0}))
  await writeControllerManifest(dir, {
    format_version: FORMAT_VERSION,
    checkpoint_id: id,
    created_at: createdAt,
    continued,
    restarted: (over.restarted ?? []).map((r) => ({rollout_id: r, attempt: 0})),
    participants,
  })
  return dir
}

async function stateError(p: Promise<unknown>): Promise<string> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  )
  expect(err).toBeInstanceOf(CheckpointStateError)
  return (err as Error).message
}

describe('formatting at its boundaries', () => {
  it('formatBytes: whole bytes below 1 KiB, one decimal below 10 of a unit, whole numbers above, TiB at most', () => {
    expect(formatBytes(1)).toBe('1 B')
    expect(formatBytes(1024)).toBe('1.0 KiB')
    expect(formatBytes(10 * 1024 - 1)).toBe('10.0 KiB')
    expect(formatBytes(10 * 1024)).toBe('10 KiB')
    expect(formatBytes(1023 * 1024)).toBe('1023 KiB')
    expect(formatBytes(2 ** 20)).toBe('1.0 MiB')
    expect(formatBytes(2 ** 30 * 1.5)).toBe('1.5 GiB')
    expect(formatBytes(2 ** 40)).toBe('1.0 TiB')
    expect(formatBytes(2 ** 50)).toBe('1024 TiB')
    expect(formatBytes(2 ** 60)).toBe('1048576 TiB')
  })

  it('formatAge: seconds, minutes, hours and days, each with its remainder only when there is one', () => {
    expect(formatAge(0)).toBe('0s')
    expect(formatAge(59)).toBe('59s')
    expect(formatAge(61)).toBe('1m1s')
    expect(formatAge(3599)).toBe('59m59s')
    expect(formatAge(3600)).toBe('1h')
    expect(formatAge(3659)).toBe('1h')
    expect(formatAge(7260)).toBe('2h1m')
    expect(formatAge(86_399)).toBe('23h59m')
    expect(formatAge(86_400)).toBe('1d')
    expect(formatAge(86_400 + 3599)).toBe('1d')
    expect(formatAge(3 * 86_400 + 5 * 3600 + 59)).toBe('3d5h')
  })

  it('rfc3339: UTC to the millisecond, rounded to the nearest', () => {
    expect(rfc3339(0)).toBe('1970-01-01T00:00:00.000Z')
    expect(rfc3339(1.5)).toBe('1970-01-01T00:00:01.500Z')
    expect(rfc3339(0.0006)).toBe('1970-01-01T00:00:00.001Z')
    expect(rfc3339(1_800_000_000.25)).toBe('2027-01-15T08:00:00.250Z')
  })
})

describe('listCheckpoints', () => {
  it('orders equal creation times by ID, newest-ID first, and lists more directories than it reads at once', async () => {
    const root = await tempDir()
    const ids = Array.from({length: 40}, (_, i) => `c${String(i).padStart(2, '0')}`)
    for (const id of ids) {
      await mkdir(path.join(root, id))
      await writeCollectionManifest(path.join(root, id), {checkpoint_id: id, run_id: 'r', created_at: 1000, continued: [], restarted: []})
    }
    const cat = await listCheckpoints(root, {now: 1_999_000})
    expect(cat.checkpoints.map((c) => c.id)).toEqual([...ids].reverse())
    expect(cat.checkpoints.every((c) => c.ageSeconds === 999)).toBe(true)
    expect(cat.warnings).toEqual([])
  })

  it('an age is never negative, and whole seconds', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, 'future'))
    await writeCollectionManifest(path.join(root, 'future'), {checkpoint_id: 'future', run_id: 'r', created_at: 5000, continued: [], restarted: []})
    await mkdir(path.join(root, 'past'))
    await writeCollectionManifest(path.join(root, 'past'), {checkpoint_id: 'past', run_id: 'r', created_at: 3998.2, continued: [], restarted: []})
    const cat = await listCheckpoints(root, {now: 4_000_000})
    expect(cat.checkpoints.map((c) => [c.id, c.ageSeconds])).toEqual([
      ['future', 0],
      ['past', 1],
    ])
  })

  it('counts participants only at gym/<kind>/<instance>, and sizes every file under the checkpoint', async () => {
    const root = await tempDir()
    const dir = path.join(root, 'c1')
    await mkdir(path.join(dir, 'gym', 'model', 'm1', 'deeper', 'x'), {recursive: true})
    await mkdir(path.join(dir, 'gym', 'model', 'm2'), {recursive: true})
    await mkdir(path.join(dir, 'other', 'kind', 'inst'), {recursive: true})
    await writeFile(path.join(dir, 'gym', 'model', 'm1', 'deeper', 'x', 'f'), 'abc')
    await writeFile(path.join(dir, 'other', 'kind', 'inst', 'g'), 'abcde')
    await writeFile(path.join(dir, 'top'), 'ab')
    // A symbolic link is neither followed nor counted.
    await symlink(path.join(dir, 'top'), path.join(dir, 'gym', 'model', 'link'))
    const [e] = (await listCheckpoints(root)).checkpoints
    expect(e).toMatchObject({id: 'c1', state: 'partial', participants: 2, sizeBytes: 10, manifest: null, continued: null, restarted: null, error: null, latest: false})
  })

  it('a missing root and a root that is a file are errors naming it', async () => {
    const root = await tempDir()
    expect(await stateError(listCheckpoints(path.join(root, 'none')))).toBe(`checkpoint root ${path.join(root, 'none')}: it does not exist (ENOENT)`)
    await writeFile(path.join(root, 'f'), 'x')
    expect(await stateError(listCheckpoints(path.join(root, 'f')))).toBe(`checkpoint root ${path.join(root, 'f')} is not a directory`)
  })

  it('an unreadable LATEST is a warning naming the problem; the listing goes on', async () => {
    const root = await tempDir()
    await ours(root, 'c1', 10, [['model', 'm', 'pol', ['a']]])
    await writeFile(path.join(root, 'LATEST'), '\n')
    const cat = await listCheckpoints(root)
    expect(cat.latest).toBeNull()
    expect(cat.warnings).toEqual([`${path.join(root, 'LATEST')} is empty: it names no checkpoint; no checkpoint is marked LATEST`])
    expect(cat.checkpoints.map((c) => [c.id, c.state, c.latest])).toEqual([['c1', 'published', false]])
  })

  it('a subdirectory listed only when it holds gym/, gymckpt.json or collection.json', async () => {
    const root = await tempDir()
    for (const [name, marker] of [
      ['a', 'gym'],
      ['b', 'gymckpt.json'],
      ['c', 'collection.json'],
      ['d', 'manifest.json'],
      ['e', 'LATEST'],
    ] as const) {
      await mkdir(path.join(root, name))
      if (marker === 'gym') await mkdir(path.join(root, name, marker))
      else await writeFile(path.join(root, name, marker), '{')
    }
    const cat = await listCheckpoints(root, {now: 0})
    expect(cat.checkpoints.map((c) => c.id).sort()).toEqual(['a', 'b', 'c'])
    expect(cat.checkpoints.find((c) => c.id === 'a')!.state).toBe('partial')
    expect(cat.checkpoints.find((c) => c.id === 'b')!.state).toBe('unreadable')
    expect(cat.checkpoints.find((c) => c.id === 'c')!.error).toMatch(/collection\.json is not JSON/)
    expect(cat.warnings).toEqual([])
  })
})

describe('the --json documents', () => {
  it('entryJson and catalogJson: every field in snake_case, times in RFC 3339', async () => {
    const root = await tempDir()
    const dir = await ours(root, 'c1', 1_800_000_000.5, [['model', 'm', 'pol', ['a', 'b']]], {restarted: ['z']})
    await publishLatest(root, 'c1')
    const cat = await listCheckpoints(root, {now: 1_800_000_100_000})
    const e = cat.checkpoints[0]!
    expect(entryJson(e)).toEqual({
      id: 'c1',
      dir,
      state: 'published',
      latest: true,
      manifest: 'gymckpt.json',
      created: '2027-01-15T08:00:00.500Z',
      age_seconds: 99,
      size_bytes: e.sizeBytes,
      participants: 1,
      continued_count: 2,
      restarted_count: 1,
      error: null,
    })
    expect(e.sizeBytes).toBeGreaterThan(0)
    expect(catalogJson(cat)).toEqual({root, latest: 'c1', checkpoints: [entryJson(e)], warnings: []})
    const withWarning = {...cat, warnings: ['w']}
    expect(catalogJson(withWarning).warnings).toEqual(['w'])
  })

  it('descriptionJson: the manifest, each participant, restores and warnings; no verify fields without --verify', async () => {
    const root = await tempDir()
    await ours(root, 'c1', 1_800_000_000, [
      ['environment', 'env', 'env-srv', ['a', 'b']],
      ['model', 'm', 'pol', ['a']],
    ])
    await appendRestoreLog(root, {
      restore_id: 'restore-1',
      time: '2027-01-15T08:00:00.000Z',
      checkpoint_id: 'c1',
      checkpoint_dir: path.join(root, 'c1'),
      outcome: 'restored',
      error: null,
      participants: 2,
    })
    const d = await describeCheckpoint(root, 'c1', {now: 1_800_000_060_000})
    const j = descriptionJson(d)
    const env = d.participants[0]!
    expect(j).toEqual({
      root,
      checkpoint: entryJson(d.entry),
      manifest: {
        file: 'gymckpt.json',
        created: '2027-01-15T08:00:00.000Z',
        run_id: null,
        continued: [
          {rollout_id: 'a', attempt: 0},
          {rollout_id: 'b', attempt: 0},
        ],
        restarted: [],
      },
      participants: [
        {kind: 'environment', instance: 'env', server: 'env-srv', records: 2, bytes: env.bytes, records_file: env.recordsFile, records_sha256: env.recordsSha256, error: null},
        {
          kind: 'model',
          instance: 'm',
          server: 'pol',
          records: 1,
          bytes: d.participants[1]!.bytes,
          records_file: d.participants[1]!.recordsFile,
          records_sha256: d.participants[1]!.recordsSha256,
          error: null,
        },
      ],
      restores: d.restores,
      verify: null,
      warnings: [],
    })
    expect(j.checkpoint.age_seconds).toBe(60)
    expect(d.restores.map((r) => r.restore_id)).toEqual(['restore-1'])
    expect(env.bytes).toBe(Buffer.byteLength(rec('a') + '\n' + rec('b') + '\n'))
    expect(env.recordsFile).toBe(`records-${env.recordsSha256}.jsonl`)
  })

  it('descriptionJson with --verify: per-participant ok and scope counts, and the report; a participant verify did not read has none', async () => {
    const root = await tempDir()
    const dir = await ours(root, 'c1', 1000, [
      ['model', 'm', 'pol', ['a', 'b']],
      ['agent', 'x', 'ag', ['a']],
    ])
    await rm(path.join(dir, 'gym', 'agent'), {recursive: true})
    const d = await describeCheckpoint(root, 'c1', {verify: true})
    const j = descriptionJson(d)
    expect(d.verify!.ok).toBe(false)
    expect(j.verify).toEqual({valid: false, uncovered: d.verify!.uncovered, problems: d.verify!.problems})
    expect(j.verify!.problems.length).toBeGreaterThan(0)
    expect(j.participants).toEqual([
      {
        kind: 'model',
        instance: 'm',
        server: 'pol',
        records: 2,
        bytes: d.participants[0]!.bytes,
        records_file: d.participants[0]!.recordsFile,
        records_sha256: d.participants[0]!.recordsSha256,
        error: null,
        ok: true,
        in_scope: 2,
        outside_scope: 0,
        scope_without_record: 0,
      },
      {
        kind: 'agent',
        instance: 'x',
        server: 'ag',
        records: null,
        bytes: null,
        records_file: null,
        records_sha256: null,
        error: 'no directory gym/agent/x',
        ok: false,
        in_scope: null,
        outside_scope: null,
        scope_without_record: null,
      },
    ])
  })

  it('descriptionJson of a partial checkpoint: no manifest, no verify', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, 'p', 'gym'), {recursive: true})
    const d = await describeCheckpoint(root, 'p')
    expect(d.manifest).toBeNull()
    expect(descriptionJson(d)).toMatchObject({manifest: null, verify: null, participants: [], restores: []})
    expect(d.entry.state).toBe('partial')
  })
})

describe('describeCheckpoint: what is wrong with each participant', () => {
  it('names a manifest that is missing, not JSON, not a manifest, naming a bad records file, or whose records file is gone', async () => {
    const root = await tempDir()
    const dir = await ours(root, 'c1', 1000, [
      ['agent', 'a1', 's1', ['a']],
      ['agent', 'a2', 's2', ['a']],
      ['agent', 'a3', 's3', ['a']],
      ['agent', 'a4', 's4', ['a']],
      ['agent', 'a5', 's5', ['a']],
      ['agent', 'a6', 's6', ['a']],
    ])
    const p = (i: string) => path.join(dir, 'gym', 'agent', i)
    await rm(path.join(p('a1'), 'manifest.json'))
    await writeFile(path.join(p('a2'), 'manifest.json'), '{"schema_version": 1,')
    await writeFile(path.join(p('a3'), 'manifest.json'), JSON.stringify({schema_version: 1, kind: 'agent'}))
    const m = {schema_version: 1, kind: 'agent', instance: 'a4', checkpoint_id: 'c1', records_sha256: 'x', record_count: 3}
    await writeFile(path.join(p('a4'), 'manifest.json'), JSON.stringify({...m, records_file: '../../../records.jsonl'}))
    await writeFile(path.join(p('a5'), 'manifest.json'), JSON.stringify({...m, instance: 'a5', records_file: 'records.jsonl'}))
    // A stray file among the instances is not a participant.
    await writeFile(path.join(dir, 'gym', 'agent', 'notes'), 'x')
    const d = await describeCheckpoint(root, 'c1')
    expect(d.participants.map((x) => [x.instance, x.server, x.records, x.recordsSha256, x.recordsFile, x.error])).toEqual([
      ['a1', 's1', null, null, null, `cannot read ${path.join(p('a1'), 'manifest.json')}: it does not exist (ENOENT)`],
      ['a2', 's2', null, null, null, `${path.join(p('a2'), 'manifest.json')} is not JSON`],
      ['a3', 's3', null, null, null, `${path.join(p('a3'), 'manifest.json')} is not a participant manifest`],
      ['a4', 's4', 3, 'x', null, `${path.join(p('a4'), 'manifest.json')} names an invalid records file '../../../records.jsonl'`],
      ['a5', 's5', 3, 'x', 'records.jsonl', `records file ${path.join(p('a5'), 'records.jsonl')}: it does not exist (ENOENT)`],
      ['a6', 's6', 1, d.participants[5]!.recordsSha256, d.participants[5]!.recordsFile, null],
    ])
    expect(d.participants.map((x) => x.bytes)).toEqual([null, null, null, null, null, Buffer.byteLength(rec('a') + '\n')])
  })

  it('lists kinds and instances sorted, after them the ones the manifest names that are gone', async () => {
    const root = await tempDir()
    const dir = await ours(root, 'c1', 1000, [
      ['resources', 'r', 'rs', []],
      ['model', 'zz', 'm2', []],
      ['model', 'aa', 'm1', []],
      ['agent', 'x', 'ag', []],
    ])
    await rm(path.join(dir, 'gym', 'model', 'zz'), {recursive: true})
    await rm(path.join(dir, 'gym', 'agent'), {recursive: true})
    const d = await describeCheckpoint(root, 'c1')
    expect(d.participants.map((p) => [p.kind, p.instance, p.server, p.error])).toEqual([
      ['model', 'aa', 'm1', null],
      ['resources', 'r', 'rs', null],
      ['model', 'zz', 'm2', 'no directory gym/model/zz'],
      ['agent', 'x', 'ag', 'no directory gym/agent/x'],
    ])
    expect(d.participants[2]).toEqual({
      kind: 'model',
      instance: 'zz',
      server: 'm2',
      records: null,
      bytes: null,
      recordsFile: null,
      recordsSha256: null,
      error: 'no directory gym/model/zz',
      verify: null,
    })
  })

  it('a Gym collection.json without a run_id shows none (null, not undefined)', async () => {
    const root = await tempDir()
    await mkdir(path.join(root, 'g'))
    await writeFile(path.join(root, 'g', 'collection.json'), JSON.stringify({checkpoint_id: 'g', created_at: 1, continued: []}))
    const m = (await describeCheckpoint(root, 'g')).manifest!
    expect(m).toEqual({file: 'collection.json', createdAt: 1, continued: [], restarted: [], runId: null})
    expect(m.runId).toBeNull()
  })
})

describe('describeCheckpoint: which checkpoint, and the warnings', () => {
  it('an ID naming a file, or nothing, is an error saying so and how to list', async () => {
    const root = await tempDir()
    await writeFile(path.join(root, 'f'), 'x')
    expect(await stateError(describeCheckpoint(root, 'f'))).toBe(`no checkpoint directory ${path.join(root, 'f')} (it is not a directory): gymckpt list ${root} shows the checkpoints there`)
    expect(await stateError(describeCheckpoint(root, 'g'))).toBe(`no checkpoint directory ${path.join(root, 'g')}: gymckpt list ${root} shows the checkpoints there`)
  })

  it('a root without LATEST that is no checkpoint directory says so', async () => {
    const root = await tempDir()
    expect(await stateError(describeCheckpoint(root))).toBe(`${root} has no LATEST (nothing is published) and is not a checkpoint directory: name a checkpoint ID (gymckpt list ${root} shows them)`)
  })

  it('a checkpoint directory given itself: LATEST of its parent marks it, verify reads it as a directory', async () => {
    const root = await tempDir()
    const dir = await ours(root, 'c1', 1000, [['model', 'm', 'pol', ['a']]])
    await publishLatest(root, 'c1')
    // Its own LATEST is not read: it is not a root.
    const d = await describeCheckpoint(dir, undefined, {verify: true})
    expect(d.root).toBe(root)
    expect(d.entry).toMatchObject({id: 'c1', latest: true, dir})
    expect(d.verify!.ok).toBe(true)
    expect(d.participants[0]!.verify).toEqual({ok: true, inScope: 1, outsideScope: 0, scopeWithoutRecord: 0})
    expect(d.warnings).toEqual([])
    await publishLatest(root, 'other')
    expect((await describeCheckpoint(dir)).entry.latest).toBe(false)
  })

  it('a restore log with foreign lines is a warning; one that cannot be read is a warning and no restores', async () => {
    const root = await tempDir()
    await ours(root, 'c1', 1000, [['model', 'm', 'pol', ['a']]])
    await publishLatest(root, 'c1')
    const log = path.join(root, RESTORE_LOG)
    await appendRestoreLog(root, {restore_id: 'r1', time: '2027-01-15T08:00:00.000Z', checkpoint_id: 'c1', checkpoint_dir: path.join(root, 'c1'), outcome: 'failed', error: 'x', participants: 1})
    await appendFile(log, 'not an entry\n{"also": "not"}\n')
    await appendRestoreLog(root, {restore_id: 'r2', time: '2027-01-15T08:00:01.000Z', checkpoint_id: 'c2', checkpoint_dir: path.join(root, 'c2'), outcome: 'restored', error: null, participants: 1})
    let d = await describeCheckpoint(root)
    expect(d.restores.map((r) => r.restore_id)).toEqual(['r1'])
    expect(d.warnings).toEqual([`${log}: 2 line(s) that are not restore entries were skipped (a torn append, or text written by something else)`])
    await rm(log)
    await symlink(log, log)
    d = await describeCheckpoint(root)
    expect(d.restores).toEqual([])
    expect(d.warnings).toEqual([expect.stringMatching(new RegExp(`^cannot read the restore log ${log.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: .+; restores not shown$`))])
  })

  it('a checkpoint with an old directory time and no manifest is aged from its directory', async () => {
    const root = await tempDir()
    const dir = path.join(root, 'p')
    await mkdir(path.join(dir, 'gym'), {recursive: true})
    await utimes(dir, 2000, 2000)
    const d = await describeCheckpoint(root, 'p', {now: 2_100_000})
    expect(d.entry.createdAt).toBe(2000)
    expect(d.entry.ageSeconds).toBe(100)
  })
})
