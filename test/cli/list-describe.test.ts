import {appendFile, mkdir, mkdtemp, readFile, rm, utimes, writeFile} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {SimEnvironment} from '../../src/control-plane/sim.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {restoreCheckpoint} from '../../src/coordination/restore.js'
import {writeCollectionManifest} from '../../src/storage/collector.js'
import {writeParticipantState} from '../../src/storage/participant-store.js'
import {RESTORE_LOG} from '../../src/storage/restore-log.js'
import {cli} from '../helpers/cli.js'
import {FULL, coordinatorFor, startFleet, waitFor} from '../helpers/fleet.js'

const RFC3339 = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/
const LIST_FIELDS = ['age_seconds', 'checkpoint_dir', 'checkpoint_id', 'continued_count', 'created', 'error', 'latest', 'manifest', 'participant_count', 'restarted_count', 'size_bytes', 'state']

/** One root for every test (made once: fleets and checkpoints take a while); removed at the end. */
let root: string
let first: string
let second: string
let restoreId: string
let refusal: string

async function controllerCheckpoint(live: string[], restart?: string): Promise<string> {
  const fleet = await startFleet({members: FULL})
  const c = await coordinatorFor(fleet)
  const env = fleet.server('env').participant as SimEnvironment
  for (const r of live) void fleet.run({rolloutId: r, steps: 200, stepMs: 5})
  if (restart) void fleet.run({rolloutId: restart, steps: 200, stepMs: 5, restart: true})
  await waitFor(() => env.episodes.size === live.length + (restart ? 1 : 0) && [...env.episodes.values()].every((e) => e.boundary !== null))
  const episodes = [...live, ...(restart ? [restart] : [])].map((r) => ({rolloutId: r, attempt: 0}))
  const out = await checkpoint(c, {root, timeoutS: 10, episodes})
  await fleet.crash()
  return out.checkpointId
}

beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-list-'))
  const now = Math.floor(Date.now() / 1000)
  // Gym's collector's layout: participant state and collection.json only, an hour old.
  const gym = path.join(root, 'gym-run')
  await writeParticipantState({checkpointDir: gym, kind: 'environment', instance: 'env', checkpointId: 'gym-run'}, ['{"episode_id": {"rollout_id": "g", "attempt": 0}}'])
  await writeCollectionManifest(gym, {checkpoint_id: 'gym-run', run_id: 'run-7f3a', created_at: now - 3600, continued: [{rollout_id: 'g', attempt: 0}], restarted: []})
  // A commit that never finished, a day old.
  const partial = path.join(root, 'ckpt-unfinished')
  await mkdir(path.join(partial, 'gym', 'model', 'policy'), {recursive: true})
  await writeFile(path.join(partial, 'gym', 'model', 'policy', 'records-x.jsonl'), 'x'.repeat(50))
  await utimes(partial, now - 86_400, now - 86_400)
  first = await controllerCheckpoint(['a', 'b'], 'r')
  second = await controllerCheckpoint(['c'])
  // A restore of LATEST into fresh servers, then a second one into the same (no longer fresh) servers.
  const c = await coordinatorFor(await startFleet({members: FULL}))
  restoreId = (await restoreCheckpoint(c, {location: root, timeoutS: 10})).restoreId
  const err = (await restoreCheckpoint(c, {location: root, timeoutS: 10}).catch((e: unknown) => e)) as ControllerError
  expect(err.code).toBe('fleet_state')
  refusal = err.message
}, 30_000)

afterAll(async () => {
  await rm(root, {recursive: true, force: true})
})

describe('gymckpt list', () => {
  it('--json: every checkpoint newest first, LATEST marked, snake_case fields and RFC 3339 times', async () => {
    const r = await cli(['list', root, '--json'])
    expect(r.code, r.stderr).toBe(0)
    expect(r.json.ok).toBe(true)
    expect(r.json.root).toBe(root)
    expect(r.json.latest).toBe(second)
    expect(r.json.warnings).toEqual([])
    const cks = r.json.checkpoints as Record<string, any>[]
    expect(cks.map((c) => [c.checkpoint_id, c.state, c.manifest, c.latest, c.participant_count, c.continued_count, c.restarted_count])).toEqual([
      [second, 'published', 'gymckpt.json', true, 4, 1, 0],
      [first, 'published', 'gymckpt.json', false, 4, 2, 1],
      ['gym-run', 'published', 'collection.json', false, 1, 1, 0],
      ['ckpt-unfinished', 'partial', null, false, 1, null, null],
    ])
    for (const c of cks) {
      expect(Object.keys(c).sort()).toEqual(LIST_FIELDS)
      expect(c.created).toMatch(RFC3339)
      expect(c.checkpoint_dir).toBe(path.join(root, c.checkpoint_id))
      expect(c.size_bytes).toBeGreaterThan(0)
    }
    expect(cks[3]!.size_bytes).toBe(50)
    expect(cks[2]!.age_seconds).toBeGreaterThanOrEqual(3600)
    expect(cks[2]!.age_seconds).toBeLessThan(3700)
    expect(Date.parse(cks[0]!.created)).toBeGreaterThan(Date.parse(cks[1]!.created))
  })

  it('human output: a table with LATEST marked *; the restore log and other files are not checkpoints', async () => {
    const r = await cli(['list', root])
    expect(r.code, r.stderr).toBe(0)
    const lines = r.stdout.trimEnd().split('\n')
    expect(lines[0]).toMatch(/^LATEST\s+ID\s+STATE\s+CREATED\s+AGE\s+SIZE\s+PARTICIPANTS\s+CONTINUED\s+RESTARTED$/)
    expect(lines).toHaveLength(5)
    expect(lines[1]).toMatch(new RegExp(`^\\*\\s+${second}\\s+published\\s+\\S+Z\\s+\\d+s\\s+[\\d.]+ (B|KiB)\\s+4\\s+1\\s+0$`))
    expect(lines[2]).toMatch(new RegExp(`^\\s+${first}\\s+published`))
    expect(lines[4]).toMatch(/^\s+ckpt-unfinished\s+partial\s+\S+\s+1d\s+50 B\s+1\s+-\s+-$/)
    expect(r.stdout).not.toContain(RESTORE_LOG)
  })

  it('a root that does not exist exits 6 with the cause', async () => {
    const missing = await cli(['list', path.join(root, 'nope'), '--json'])
    expect(missing.code).toBe(6)
    expect(missing.json.error).toMatchObject({code: 'invalid_checkpoint', message: expect.stringMatching(/nope: it does not exist \(ENOENT\)/)})
  })
})

describe('gymckpt describe', () => {
  it('--json of LATEST: manifest, participants with records and digests, and both recorded restores', async () => {
    const r = await cli(['describe', root, '--json'])
    expect(r.code, r.stderr).toBe(0)
    const d = r.json
    expect(d.checkpoint).toMatchObject({checkpoint_id: second, latest: true, state: 'published'})
    expect(d.manifest).toEqual({file: 'gymckpt.json', created: expect.stringMatching(RFC3339), run_id: null, continued: [{rollout_id: 'c', attempt: 0}], restarted: []})
    const ckDoc = JSON.parse(await readFile(path.join(root, second, 'gymckpt.json'), 'utf8'))
    expect(d.participants).toHaveLength(4)
    for (const p of d.participants) {
      const m = ckDoc.participants.find((x: {kind: string}) => x.kind === p.kind)
      expect(p).toEqual({
        kind: m.kind,
        instance: m.instance,
        server: m.server,
        records: m.manifest.record_count,
        bytes: expect.any(Number),
        records_file: m.manifest.records_file,
        records_sha256: m.manifest.records_sha256,
        error: null,
      })
    }
    expect(d.restores).toEqual([
      {restore_id: restoreId, time: expect.stringMatching(RFC3339), checkpoint_id: second, checkpoint_dir: path.join(root, second), outcome: 'restored', error: null, participant_count: 4},
      {
        restore_id: expect.stringMatching(/^restore-[0-9a-f]+$/),
        time: expect.stringMatching(RFC3339),
        checkpoint_id: second,
        checkpoint_dir: path.join(root, second),
        outcome: 'refused',
        error: refusal,
        participant_count: 4,
      },
    ])
    expect(d.verify).toBeNull()
    expect(d.warnings).toEqual([])
  })

  it('a torn last line of the restore log is ignored; an older checkpoint shows no restores of LATEST', async () => {
    await appendFile(path.join(root, RESTORE_LOG), '{"restore_id": "restore-torn", "time": "2026-')
    const [latest, older] = await Promise.all([cli(['describe', root, '--json']), cli(['describe', root, first, '--json'])])
    expect(latest.code, latest.stderr).toBe(0)
    expect(latest.json.restores.map((x: {outcome: string}) => x.outcome)).toEqual(['restored', 'refused'])
    expect(latest.json.warnings).toEqual([])
    expect(older.json.checkpoint).toMatchObject({checkpoint_id: first, latest: false})
    expect(older.json.restores).toEqual([])
    expect(older.json.manifest.restarted).toEqual([{rollout_id: 'r', attempt: 0}])
  })

  it('human output names the manifest, the participants and the restores; --verify adds the scope counts', async () => {
    const r = await cli(['describe', root, '--verify'])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toMatch(new RegExp(`^checkpoint\\s+${second} \\(LATEST\\)$`, 'm'))
    expect(r.stdout).toMatch(/^state\s+published \(gymckpt\.json\)$/m)
    expect(r.stdout).toMatch(/^continued\s+1: c$/m)
    expect(r.stdout).toMatch(/KIND\s+INSTANCE\s+SERVER\s+RECORDS\s+BYTES\s+RECORDS_SHA256\s+OK\s+IN_SCOPE\s+OUTSIDE_SCOPE\s+SCOPE_WITHOUT_RECORD/)
    expect(r.stdout).toMatch(/^environment\s+env\s+env\s+1\s+\d+\s+[0-9a-f]{64}\s+yes\s+1\s+0\s+0$/m)
    expect(r.stdout).toMatch(/^RESTORES \(2\)$/m)
    expect(r.stdout).toMatch(new RegExp(`^${restoreId}\\s+\\S+\\s+restored\\s+4$`, 'm'))
    expect(r.stdout).toMatch(/^restore-[0-9a-f]+\s+\S+\s+refused\s+4$/m)
    expect(r.stdout).toMatch(/^valid$/m)
  })

  it("--verify --json of Gym's checkpoint: run_id and in_scope; a corrupted one exits 6 with the description in details", async () => {
    const ok = await cli(['describe', root, 'gym-run', '--verify', '--json'])
    expect(ok.code, ok.stderr).toBe(0)
    expect(ok.json.manifest).toMatchObject({file: 'collection.json', run_id: 'run-7f3a'})
    expect(ok.json.verify).toEqual({valid: true, uncovered: [], problems: []})
    expect(ok.json.participants).toEqual([expect.objectContaining({kind: 'environment', records: 1, ok: true, in_scope: 1, outside_scope: 0, scope_without_record: 0})])
    const human = await cli(['describe', root, 'gym-run'])
    expect(human.stdout).toMatch(/^run_id\s+run-7f3a$/m)

    const dir = path.join(root, 'gym-run', 'gym', 'environment', 'env')
    const m = JSON.parse(await readFile(path.join(dir, 'manifest.json'), 'utf8'))
    await writeFile(path.join(dir, m.records_file), '{"episode_id": {"rollout_id": "h", "attempt": 0}}\n')
    const bad = await cli(['describe', root, 'gym-run', '--verify', '--json'])
    expect(bad.code).toBe(6)
    expect(bad.json.error.code).toBe('invalid_checkpoint')
    expect(bad.json.error.details.checkpoint.checkpoint_id).toBe('gym-run')
    expect(bad.json.error.details.verify.valid).toBe(false)
  })

  it('a bad ID exits 2 and a missing one 6; a partial checkpoint is described without a manifest', async () => {
    const [bad, missing, partial] = await Promise.all([
      cli(['describe', root, '../etc', '--json']),
      cli(['describe', root, 'ckpt-nope', '--json']),
      cli(['describe', root, 'ckpt-unfinished', '--json']),
    ])
    expect(bad.code).toBe(2)
    expect(bad.json.error.message).toMatch(/a checkpoint ID is 1 to 128 characters/)
    expect(missing.code).toBe(6)
    expect(missing.json.error.message).toMatch(/no checkpoint directory .*ckpt-nope: gymckpt list/)
    expect(partial.code, partial.stderr).toBe(0)
    expect(partial.json.checkpoint).toMatchObject({state: 'partial', manifest: null, continued_count: null})
    expect(partial.json.manifest).toBeNull()
    expect(partial.json.participants).toEqual([expect.objectContaining({kind: 'model', instance: 'policy', error: expect.stringMatching(/manifest\.json: it does not exist/)})])
  })
})
