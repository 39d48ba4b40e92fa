import {appendFile, mkdir, open, readFile, readdir, stat, symlink, utimes, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {restoreCheckpoint} from '../../src/coordination/restore.js'
import {describeCheckpoint, formatAge, formatBytes, listCheckpoints} from '../../src/storage/catalog.js'
import {writeCollectionManifest} from '../../src/storage/collector.js'
import {CheckpointStateError} from '../../src/storage/errors.js'
import {writeParticipantState} from '../../src/storage/participant-store.js'
import {planPrune} from '../../src/storage/prune.js'
import {RESTORE_LOG, RestoreLogEntry, appendRestoreLog, readRestoreLog} from '../../src/storage/restore-log.js'
import {publishLatest} from '../../src/storage/root.js'
import {FULL, coordinatorFor, startFleet, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

const rec = (r: string) => `{"episode_id": {"rollout_id": "${r}", "attempt": 0}, "x": 1}`

/** Sum of every regular file's size under dir, computed independently of the catalog. */
async function sizeOf(dir: string): Promise<number> {
  let n = 0
  for (const e of await readdir(dir, {withFileTypes: true, recursive: true})) if (e.isFile()) n += (await stat(path.join(e.parentPath, e.name))).size
  return n
}

/** A real checkpoint made by the controller against the built-in fleet: `live` continued, `restart` restarted. */
async function controllerCheckpoint(root: string, live: string[], restart?: string): Promise<string> {
  const fleet = await startFleet({members: FULL})
  const c = await coordinatorFor(fleet)
  const env = fleet.server('env').participant as SimEnvironment
  for (const r of live) void fleet.run({rolloutId: r, steps: 200, stepMs: 5})
  if (restart) void fleet.run({rolloutId: restart, steps: 200, stepMs: 5, restart: true})
  const n = live.length + (restart ? 1 : 0)
  await waitFor(() => env.episodes.size === n && [...env.episodes.values()].every((e) => e.boundary !== null))
  const episodes = [...live, ...(restart ? [restart] : [])].map((r) => ({rolloutId: r, attempt: 0}))
  const out = await checkpoint(c, {root, timeoutS: 10, episodes})
  await fleet.crash()
  return out.checkpointId
}

/** Gym's collector's layout: participant state and collection.json only. */
async function gymCheckpoint(root: string, id: string, createdAt: number): Promise<void> {
  const dir = path.join(root, id)
  await writeParticipantState({checkpointDir: dir, kind: 'environment', instance: 'env', checkpointId: id}, [rec('g1'), rec('g2')])
  await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'policy', checkpointId: id}, [rec('g1')])
  await writeCollectionManifest(dir, {
    checkpoint_id: id,
    run_id: 'run-abc',
    created_at: createdAt,
    continued: [
      {rollout_id: 'g1', attempt: 0},
      {rollout_id: 'g2', attempt: 0},
    ],
    restarted: [],
  })
}

describe('listCheckpoints', () => {
  it('lists controller, Gym-style, partial and unreadable checkpoints newest first, with sizes, counts and LATEST; skips the rest', async () => {
    const root = await tempDir()
    const now = Math.floor(Date.now() / 1000)
    await gymCheckpoint(root, 'gym-old', now - 7200)
    // A commit that never finished: participant state, no manifest. Its time is its directory's.
    const partial = path.join(root, 'ckpt-partial')
    await mkdir(path.join(partial, 'gym', 'environment', 'env'), {recursive: true})
    await writeFile(path.join(partial, 'gym', 'environment', 'env', 'records-x.jsonl'), 'a'.repeat(100))
    await writeFile(path.join(partial, 'gym', 'environment', 'env', '.manifest.json.tmp'), 'b'.repeat(23))
    await utimes(partial, now - 86_400, now - 86_400)
    const broken = path.join(root, 'ckpt-broken')
    await mkdir(broken)
    await writeFile(path.join(broken, 'gymckpt.json'), '{not json')
    await utimes(broken, now - 3 * 86_400, now - 3 * 86_400)
    const first = await controllerCheckpoint(root, ['a', 'b'], 'r')
    const second = await controllerCheckpoint(root, ['c'])
    // Not checkpoints: left out of the listing.
    await mkdir(path.join(root, 'notes'))
    await writeFile(path.join(root, 'README'), 'x')
    await symlink(path.join(root, second), path.join(root, 'alias'))

    const cat = await listCheckpoints(root, {now: now * 1000 + 60_000})
    expect(cat.root).toBe(root)
    expect(cat.latest).toBe(second)
    expect(cat.warnings).toEqual([])
    expect(cat.checkpoints.map((c) => [c.id, c.state, c.manifest, c.latest])).toEqual([
      [second, 'published', 'gymckpt.json', true],
      [first, 'published', 'gymckpt.json', false],
      ['gym-old', 'published', 'collection.json', false],
      ['ckpt-partial', 'partial', null, false],
      ['ckpt-broken', 'unreadable', null, false],
    ])
    const [s, f, g, p, b] = cat.checkpoints
    expect([f!.continued, f!.restarted, s!.continued, s!.restarted, g!.continued, g!.restarted, p!.continued, p!.restarted]).toEqual([2, 1, 1, 0, 2, 0, null, null])
    expect([s!.participants, f!.participants, g!.participants, p!.participants, b!.participants]).toEqual([4, 4, 2, 1, 0])
    for (const c of cat.checkpoints) expect(c.sizeBytes, c.id).toBe(await sizeOf(c.dir))
    expect(p!.sizeBytes).toBe(123)
    expect(g!.createdAt).toBeCloseTo(now - 7200, 3)
    expect(g!.ageSeconds).toBe(7260)
    expect(p!.createdAt).toBeCloseTo(now - 86_400, 0)
    expect(b!.error).toMatch(/gymckpt\.json is not JSON/)
    expect(s!.error).toBeNull()
  })

  it('reads no records file: a 64 GiB sparse records file is listed and described by its stat size at once', async () => {
    const root = await tempDir()
    const id = 'ckpt-huge'
    await gymCheckpoint(root, id, Date.now() / 1000)
    await publishLatest(root, id)
    const envDir = path.join(root, id, 'gym', 'environment', 'env')
    const manifest = JSON.parse(await readFile(path.join(envDir, 'manifest.json'), 'utf8'))
    const fh = await open(path.join(envDir, manifest.records_file), 'r+')
    await fh.truncate(64 * 2 ** 30)
    await fh.close()
    const t0 = performance.now()
    const cat = await listCheckpoints(root)
    const d = await describeCheckpoint(root)
    expect(performance.now() - t0).toBeLessThan(2000)
    expect(cat.checkpoints[0]!.sizeBytes).toBeGreaterThan(64 * 2 ** 30)
    expect(d.participants.find((p) => p.kind === 'environment')!.bytes).toBe(64 * 2 ** 30)
  })

  it('a LATEST that is garbage or names nothing is a warning, not a failure; a root that is a file is an error', async () => {
    const root = await tempDir()
    await gymCheckpoint(root, 'g', 1000)
    await writeFile(path.join(root, 'LATEST'), '../../etc\n')
    let cat = await listCheckpoints(root)
    expect(cat.latest).toBeNull()
    expect(cat.checkpoints.map((c) => c.id)).toEqual(['g'])
    expect(cat.warnings).toEqual([expect.stringMatching(/names no valid checkpoint ID.*no checkpoint is marked LATEST/)])
    await publishLatest(root, 'gone')
    cat = await listCheckpoints(root)
    expect(cat.warnings).toEqual([expect.stringMatching(/names 'gone', which is not a checkpoint directory/)])
    await expect(listCheckpoints(path.join(root, 'LATEST'))).rejects.toThrow(CheckpointStateError)
    await writeFile(path.join(root, 'LATEST'), '')
    await expect(describeCheckpoint(root)).rejects.toThrow(/LATEST is empty: it names no checkpoint; no checkpoint is marked LATEST: name a checkpoint ID/)
    // A checkpoint directory given as the root lists nothing, and says what to run instead.
    expect(await listCheckpoints(path.join(root, 'g'))).toMatchObject({
      checkpoints: [],
      warnings: [expect.stringMatching(/looks like a checkpoint directory, not a checkpoint root: gymckpt describe/)],
    })
  })
})

describe('describeCheckpoint', () => {
  it('shows the manifest, each participant from its manifest.json and stat, and defaults to LATEST', async () => {
    const root = await tempDir()
    const id = await controllerCheckpoint(root, ['a', 'b'], 'r')
    const d = await describeCheckpoint(root)
    expect(d.entry.id).toBe(id)
    expect(d.entry.latest).toBe(true)
    expect(d.manifest).toMatchObject({
      file: 'gymckpt.json',
      runId: null,
      continued: [
        {rollout_id: 'a', attempt: 0},
        {rollout_id: 'b', attempt: 0},
      ],
      restarted: [{rollout_id: 'r', attempt: 0}],
    })
    expect(d.participants.map((p) => [p.kind, p.instance, p.server])).toEqual([
      ['agent', 'agent', 'agent'],
      ['environment', 'env', 'env'],
      ['model', 'policy', 'policy'],
      ['resources', 'res', 'res'],
    ])
    const ckDoc = JSON.parse(await readFile(path.join(root, id, 'gymckpt.json'), 'utf8'))
    for (const p of d.participants) {
      const m = ckDoc.participants.find((x: {kind: string}) => x.kind === p.kind).manifest
      expect([p.records, p.recordsSha256, p.recordsFile, p.error]).toEqual([m.record_count, m.records_sha256, m.records_file, null])
      expect(p.bytes).toBe((await stat(path.join(root, id, 'gym', p.kind, p.instance, m.records_file))).size)
      expect(p.verify).toBeNull()
    }
    expect(d.participants.find((p) => p.kind === 'environment')!.records).toBe(2)
    expect(d.restores).toEqual([])
    expect(d.verify).toBeNull()
  })

  it('--verify adds the per-participant scope counts; a Gym-style checkpoint shows its run_id', async () => {
    const root = await tempDir()
    await gymCheckpoint(root, 'g', 1000)
    const d = await describeCheckpoint(root, 'g', {verify: true})
    expect(d.entry.latest).toBe(false)
    expect(d.manifest).toMatchObject({file: 'collection.json', runId: 'run-abc', createdAt: 1000})
    expect(d.verify?.ok).toBe(true)
    expect(d.participants.map((p) => [p.kind, p.records, p.server, p.verify])).toEqual([
      ['environment', 2, null, {ok: true, inScope: 2, outsideScope: 0, scopeWithoutRecord: 0}],
      ['model', 1, null, {ok: true, inScope: 1, outsideScope: 0, scopeWithoutRecord: 1}],
    ])
  })

  it('names a participant whose directory is gone or whose manifest is not JSON, and refuses a missing or bad ID', async () => {
    const root = await tempDir()
    const id = await controllerCheckpoint(root, ['a'])
    await writeFile(path.join(root, id, 'gym', 'agent', 'agent', 'manifest.json'), '{')
    const {rm} = await import('node:fs/promises')
    await rm(path.join(root, id, 'gym', 'resources'), {recursive: true})
    const d = await describeCheckpoint(root, id)
    expect(d.participants.map((p) => [p.kind, p.error])).toEqual([
      ['agent', expect.stringMatching(/manifest\.json is not JSON/)],
      ['environment', null],
      ['model', null],
      ['resources', 'no directory gym/resources/res'],
    ])
    expect(d.entry.participants).toBe(3)
    await expect(describeCheckpoint(root, 'nope')).rejects.toThrow(/no checkpoint directory .*nope: gymckpt list/)
    await expect(describeCheckpoint(root, '../x')).rejects.toThrow(/is not a valid checkpoint ID/)
    const empty = await tempDir()
    await mkdir(path.join(empty, 'ckpt-partial', 'gym'), {recursive: true})
    await expect(describeCheckpoint(empty)).rejects.toThrow(/has no LATEST .*name a checkpoint ID/)
  })

  it('a checkpoint directory given itself is described, with the restores its parent root recorded', async () => {
    const root = await tempDir()
    await gymCheckpoint(root, 'g', 1000)
    await appendRestoreLog(root, entry({checkpoint_id: 'g', checkpoint_dir: path.join(root, 'g')}))
    await appendRestoreLog(root, entry({checkpoint_id: 'other', restore_id: 'restore-2'}))
    const d = await describeCheckpoint(path.join(root, 'g'))
    expect(d.root).toBe(root)
    expect(d.entry.id).toBe('g')
    expect(d.restores.map((r) => r.restore_id)).toEqual(['restore-1'])
  })
})

function entry(over: Partial<RestoreLogEntry> = {}): RestoreLogEntry {
  return {restore_id: 'restore-1', time: '2026-12-02T17:19:23.000Z', checkpoint_id: 'ck', checkpoint_dir: '/r/ck', outcome: 'restored', error: null, participants: 4, ...over}
}

describe('restore log', () => {
  it('appends whole lines and reads them back in order; a missing log is empty', async () => {
    const root = await tempDir()
    expect(await readRestoreLog(root)).toEqual({file: path.join(root, RESTORE_LOG), entries: [], skipped: 0})
    await appendRestoreLog(root, entry())
    await appendRestoreLog(root, entry({restore_id: 'restore-2', outcome: 'refused', error: 'busy'}))
    const text = await readFile(path.join(root, RESTORE_LOG), 'utf8')
    expect(text.split('\n')).toEqual([JSON.stringify(entry()), JSON.stringify(entry({restore_id: 'restore-2', outcome: 'refused', error: 'busy'})), ''])
    expect((await readRestoreLog(root)).entries.map((e) => [e.restore_id, e.outcome, e.error])).toEqual([
      ['restore-1', 'restored', null],
      ['restore-2', 'refused', 'busy'],
    ])
  })

  it('ignores a torn last line; the next append starts on its own line and the torn one is counted as skipped', async () => {
    const root = await tempDir()
    await appendRestoreLog(root, entry())
    await appendFile(path.join(root, RESTORE_LOG), JSON.stringify(entry({restore_id: 'restore-torn'})).slice(0, 40))
    expect(await readRestoreLog(root)).toMatchObject({entries: [{restore_id: 'restore-1'}], skipped: 0})
    await appendRestoreLog(root, entry({restore_id: 'restore-3'}))
    expect(await readRestoreLog(root)).toMatchObject({entries: [{restore_id: 'restore-1'}, {restore_id: 'restore-3'}], skipped: 1})
  })

  it('refuses an invalid entry, and a restores.jsonl that is a symbolic link (never followed)', async () => {
    const root = await tempDir()
    await expect(appendRestoreLog(root, entry({time: 'yesterday'}))).rejects.toThrow()
    const elsewhere = path.join(await tempDir(), 'target')
    await writeFile(elsewhere, '')
    await symlink(elsewhere, path.join(root, RESTORE_LOG))
    await expect(appendRestoreLog(root, entry())).rejects.toThrow(CheckpointStateError)
    expect(await readFile(elsewhere, 'utf8')).toBe('')
    await expect(readRestoreLog(root)).rejects.toThrow(/cannot read the restore log/)
  })
})

describe('restoreCheckpoint records every attempt in ROOT/restores.jsonl', () => {
  it("'restored', then 'refused' for a second restore into the same fleet, then 'failed' when a participant fails", async () => {
    const root = await tempDir()
    const id = await controllerCheckpoint(root, ['a', 'b'])
    const fresh = await startFleet({members: FULL})
    const c = await coordinatorFor(fresh)
    const ok = await restoreCheckpoint(c, {location: root, timeoutS: 10})
    const refused = (await restoreCheckpoint(c, {location: root, timeoutS: 10}).catch((e: unknown) => e)) as ControllerError
    expect(refused.code).toBe('fleet_state')
    const other = await startFleet({members: FULL})
    other.server('policy').faults.add('restore', {type: 'status', status: 500})
    const failed = (await restoreCheckpoint(await coordinatorFor(other), {location: root, timeoutS: 10}).catch((e: unknown) => e)) as Error
    expect(failed).toBeInstanceOf(ControllerError)
    expect(failed.message).toMatch(/policy/)
    const log = await readRestoreLog(root)
    expect(log.entries.map((e) => [e.checkpoint_id, e.checkpoint_dir, e.outcome, e.participants])).toEqual([
      [id, path.join(root, id), 'restored', 4],
      [id, path.join(root, id), 'refused', 4],
      [id, path.join(root, id), 'failed', 4],
    ])
    expect(log.entries[0]).toMatchObject({restore_id: ok.restoreId, error: null})
    expect(log.entries[1]!.error).toBe(refused.message)
    expect(log.entries[2]!.error).toBe(failed.message)
    expect(new Set(log.entries.map((e) => e.restore_id)).size).toBe(3)
    expect(Date.parse(log.entries[0]!.time)).toBeLessThanOrEqual(Date.parse(log.entries[1]!.time))
    expect((await describeCheckpoint(root)).restores.map((r) => r.outcome)).toEqual(['restored', 'refused', 'failed'])
    // prune leaves the log alone, whatever it removes.
    const plan = await planPrune(root, 1)
    expect(plan.keep).toContainEqual({name: RESTORE_LOG, path: path.join(root, RESTORE_LOG), reason: 'not a checkpoint'})
    expect(plan.remove.map((e) => e.name)).not.toContain(RESTORE_LOG)
  })

  it('a log that cannot be written is a warning through opts.log; the restore still succeeds. A checkpoint directory given itself is not logged', async () => {
    const root = await tempDir()
    const id = await controllerCheckpoint(root, ['a'])
    await mkdir(path.join(root, RESTORE_LOG))
    const notes: string[] = []
    const r = await restoreCheckpoint(await coordinatorFor(await startFleet({members: FULL})), {location: root, timeoutS: 10, log: (m) => notes.push(m)})
    expect(r.resumed).toBe(true)
    expect(notes).toContainEqual(expect.stringMatching(new RegExp(`^warning: restore '${r.restoreId}' restored, but it was not recorded: cannot append to the restore log .*restores\\.jsonl`)))

    const root2 = await tempDir()
    const id2 = await controllerCheckpoint(root2, ['a'])
    await restoreCheckpoint(await coordinatorFor(await startFleet({members: FULL})), {location: path.join(root2, id2), timeoutS: 10})
    expect(await readdir(root2)).not.toContain(RESTORE_LOG)
    expect(id).not.toBe(id2)
  })
})

describe('formatting', () => {
  it('sizes and ages read as kubectl and restic show them', () => {
    expect([formatBytes(0), formatBytes(1023), formatBytes(1536), formatBytes(25 * 2 ** 20), formatBytes(3 * 2 ** 40)]).toEqual(['0 B', '1023 B', '1.5 KiB', '25 MiB', '3.0 TiB'])
    expect([formatAge(5), formatAge(60), formatAge(125), formatAge(3700), formatAge(90_000)]).toEqual(['5s', '1m', '2m5s', '1h1m', '1d1h'])
  })
})
