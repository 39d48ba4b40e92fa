import {execFileSync} from 'node:child_process'
import {mkdir, readFile, readdir, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {ControlClient} from '../../src/coordination/client.js'
import {checkRoot, checkpoint, prepareOrAbort, preparedForCommit} from '../../src/coordination/controller.js'
import {prepare, resume} from '../../src/coordination/operations.js'
import {discover} from '../../src/coordination/discover.js'
import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {FULL, TOKEN, coordinatorFor, fakeParticipant, later, soon, startFleet, startServer} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'
import {listCheckpoints} from '../../src/storage/catalog.js'
import {planPrune} from '../../src/storage/prune.js'

/** Nothing from outside is trusted as a path: names from participants, the root, the ID. */

describe('names a participant reports', () => {
  it('an instance that is not a safe path component fails discovery for that server, naming it', async () => {
    const bad = await startServer('../../escape', 'environment')
    const slash = await startServer('a/b', 'agent')
    const model = await startServer('policy', 'model')
    const client = new ControlClient({token: TOKEN})
    later(() => client.close())
    const err = await discover(client, [
      {name: 'env', url: bad.url},
      {name: 'agent', url: slash.url},
      {name: 'policy', url: model.url},
    ]).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(CoordinationError)
    expect((err as CoordinationError).code).toBe('discovery')
    expect((err as CoordinationError).failures.map((f) => [f.server, f.code])).toEqual([
      ['agent', 'unsafe_instance'],
      ['env', 'unsafe_instance'],
    ])
    expect((err as Error).message).toContain("env: HTTP 200 unsafe_instance instance '../../escape' is not a safe path component")
  })

  it('two participants of one kind reporting one instance fail discovery: both would write one directory', async () => {
    const a = await startServer('shared', 'agent')
    const b = await startServer('shared', 'agent')
    const model = await startServer('policy', 'model')
    const client = new ControlClient({token: TOKEN})
    later(() => client.close())
    const err = await discover(client, [
      {name: 'agent1', url: a.url},
      {name: 'agent2', url: b.url},
      {name: 'policy', url: model.url},
    ]).catch((e: unknown) => e)
    expect((err as CoordinationError).failures).toEqual([
      expect.objectContaining({server: 'agent2', code: 'duplicate_instance', message: 'reports agent/shared, as agent1 does: both would write gym/agent/shared'}),
    ])
  })
})

describe('the checkpoint root is checked before anything is sent', () => {
  it('refuses an empty root, a root that is a file, and a path under a file, with the real cause', async () => {
    const dir = await tempDir()
    const file = path.join(dir, 'file')
    await writeFile(file, 'x')
    const why = async (root: string) => (await checkRoot(root).catch((e: unknown) => e)) as ControllerError
    expect((await why('')).message).toBe('the checkpoint root is empty: pass --root DIR; nothing was sent')
    expect((await why(file)).message).toBe(`checkpoint root ${file} cannot hold checkpoints: it exists and is not a directory (EEXIST); nothing was sent`)
    expect((await why(path.join(file, 'sub'))).code).toBe('input')
    expect((await why(path.join(file, 'sub'))).message).toMatch(/not a directory \(ENOTDIR\)/)
    // A missing root is created; nothing is left behind by the probe.
    const fresh = path.join(dir, 'new', 'root')
    expect(await checkRoot(fresh)).toBe(fresh)
    expect(await readdir(fresh)).toEqual([])
  })

  it('a read-only root fails a checkpoint with exit code input and EROFS, before any prepare', async () => {
    const ro = path.join(await tempDir(), 'ro')
    await mkdir(ro)
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k,ro', 'tmpfs', ro])
    let err: ControllerError
    try {
      err = (await checkpoint(c, {root: ro, timeoutS: 5, episodes: []}).catch((e: unknown) => e)) as ControllerError
    } finally {
      execFileSync('umount', [ro])
    }
    expect(err.code).toBe('input')
    expect(err.message).toBe(`checkpoint root ${ro} cannot hold checkpoints: the file system is read-only (EROFS); nothing was sent`)
    expect(fleet.servers.flatMap((s) => s.journal.map((j) => j.route)).filter((r) => r !== 'status')).toEqual([])
  })
})

describe('the publish gate', () => {
  it('a checkpoint that does not verify is not published: LATEST keeps its value, the error names the directory', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    const root = await tempDir()
    const good = await checkpoint(c, {root, timeoutS: 5, episodes: []})
    expect((await readFile(path.join(root, 'LATEST'), 'utf8')).trim()).toBe(good.checkpointId)
    // A participant that replies to commit with a manifest it never wrote.
    const liar = await fakeParticipant('resources', 'liar', (dir) => ({
      phase: 'committed',
      manifest: {
        schema_version: 1,
        kind: 'resources',
        instance: 'liar',
        checkpoint_id: path.basename(dir),
        records_file: `records-${'0'.repeat(64)}.jsonl`,
        records_sha256: '0'.repeat(64),
        record_count: 0,
      },
      episode_ids: [],
    }))
    const withLiar = {...c, participants: [...c.participants, {server: 'liar', url: liar, kind: 'resources' as const, instance: 'liar'}]}
    const err = (await checkpoint(withLiar, {root, timeoutS: 5, episodes: []}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toMatch(/was committed but does not verify, so it was not published \(LATEST is unchanged\)/)
    expect(err.message).toContain('participant liar committed but its directory is missing')
    expect((await readFile(path.join(root, 'LATEST'), 'utf8')).trim()).toBe(good.checkpointId)
    // Set aside, so that list and prune do not count it among the published checkpoints.
    const refused = (err.details as {checkpoint_dir: string}).checkpoint_dir
    expect(err.message).toContain('its controller manifest was set aside as gymckpt.refused.json, so it is not listed as published')
    expect((await readdir(refused)).sort()).toEqual(['gym', 'gymckpt.refused.json'])
    expect(JSON.parse(await readFile(path.join(refused, 'gymckpt.refused.json'), 'utf8'))).toMatchObject({checkpoint_id: path.basename(refused)})
    const listed = await listCheckpoints(root)
    expect(listed.checkpoints.map((x) => [x.id, x.state])).toEqual(
      expect.arrayContaining([
        [good.checkpointId, 'published'],
        [path.basename(refused), 'partial'],
      ]),
    )
    // Prune now keeps it as possibly in progress (it is newer than LATEST). After two more good
    // checkpoints it keeps those two: the first good one goes as an older published checkpoint,
    // the refused one as never published (had it still looked published, it would have been
    // kept among the two newest and the second good one removed).
    expect((await planPrune(root, 2)).keep.map((e) => e.name)).toEqual(expect.arrayContaining([good.checkpointId, path.basename(refused)]))
    const second = await checkpoint(c, {root, timeoutS: 5, episodes: []})
    const third = await checkpoint(c, {root, timeoutS: 5, episodes: []})
    const plan = await planPrune(root, 2)
    expect(plan.remove.map((e) => e.name).sort()).toEqual([good.checkpointId, path.basename(refused)].sort())
    expect(plan.keep.map((e) => e.name)).toEqual(expect.arrayContaining([second.checkpointId, third.checkpointId]))
  })
})

/** A participant that answers every control call, and commit with `commitReply(checkpointDir)`. */

describe('a restart a participant reports that is no capture key', () => {
  /** A fleet whose environment reports `key` as a restart in every report. */
  async function reporting(key: string) {
    const fleet = await startFleet({members: FULL})
    const env = fleet.server('env').participant!
    const report = env.report.bind(env)
    env.report = () => ({...report(), restarts: [key]})
    return {fleet, c: await coordinatorFor(fleet)}
  }

  it('prepare (and checkpoint) closes the prepared checkpoint again and names the server and the key', async () => {
    const {fleet, c} = await reporting('-a1')
    const err = (await prepareOrAbort(c, 'ck-bad', soon()).catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.code).toBe('participant')
    expect(err.message).toMatch(
      /^env reported a restart '-a1' that is not a valid capture key: .+; checkpoint 'ck-bad' cannot be committed; the fleet was resumed \(checkpoint 'ck-bad' is closed for good\)$/,
    )
    for (const s of fleet.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.phase, s.name).toBe('idle')
    const root = await tempDir()
    const ck = (await checkpoint(c, {root, episodes: []}).catch((e: unknown) => e)) as ControllerError
    expect(ck.message).toMatch(/^env reported a restart '-a1' that is not a valid capture key/)
    for (const s of fleet.servers.filter((x) => x.controlPlane)) expect(s.controlPlane!.phase, s.name).toBe('idle')
    expect(await readdir(root)).toEqual([])
  })

  it('a stateless commit refuses before sending and names the resume that reopens the fleet', async () => {
    const {fleet, c} = await reporting('.x')
    // Prepared while the report was still good.
    const env = fleet.server('env').participant!
    const bad = env.report
    env.report = () => ({...bad(), restarts: []})
    await prepare(c, 'ck-open', soon())
    env.report = bad
    const discovery = await discover(
      c.client,
      fleet.servers.map((s) => ({name: s.name, url: s.url})),
      {tolerant: true},
    )
    const err = (await preparedForCommit(c, discovery, {deadlineTs: soon()}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('participant')
    expect(err.message).toMatch(/^env reported a restart '\.x' that is not a valid capture key/)
    expect(err.next).toEqual([{command: 'resume', args: ['--id', 'ck-open'], fleet: true}])
    expect(fleet.servers.flatMap((s) => s.journal.filter((j) => j.route === 'commit'))).toEqual([])
    await resume(c, 'ck-open', soon())
  })
})
