import {mkdir, readFile, realpath, rename, rm, symlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import {verifyCheckpoint} from '../../src/storage/verify.js'
import {tempDir} from '../helpers/tmp.js'

const rec = (r: string, a = 0) => `{"episode_id": {"rollout_id": "${r}", "attempt": ${a}}, "state": {"x": NaN}}`

async function make(opts: {records?: Record<string, string[]>; continued?: [string, number][]; restarted?: [string, number][]; gymCollection?: boolean} = {}) {
  const root = await tempDir()
  const id = 'ckpt-1'
  const dir = path.join(root, id)
  const records = opts.records ?? {'environment/env': [rec('a'), rec('b', 1)], 'model/policy': [rec('a')]}
  const participants = []
  for (const [ki, lines] of Object.entries(records)) {
    const [kind, instance] = ki.split('/') as [string, string]
    const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: id}, lines)
    participants.push({server: instance, kind, instance, manifest, episode_ids: []})
  }
  const continued = (
    opts.continued ?? [
      ['a', 0],
      ['b', 1],
    ]
  ).map(([r, a]) => ({rollout_id: r, attempt: a}))
  const restarted = (opts.restarted ?? []).map(([r, a]) => ({rollout_id: r, attempt: a}))
  if (opts.gymCollection) {
    await writeFile(path.join(dir, 'collection.json'), JSON.stringify({checkpoint_id: id, run_id: 'f'.repeat(32), created_at: 1, continued, restarted}))
  } else {
    await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: id, created_at: 1, continued, restarted, participants})
  }
  await publishLatest(root, id)
  return {root, dir}
}

describe('verifyCheckpoint', () => {
  it('accepts a valid root by following LATEST', async () => {
    const {root, dir} = await make()
    const r = await verifyCheckpoint(root)
    expect(r.ok).toBe(true)
    expect(r.checkpointDir).toBe(dir)
    expect(r.problems).toEqual([])
    expect(r.participants.map((p) => [p.kind, p.records])).toEqual([
      ['environment', 2],
      ['model', 1],
    ])
  })

  it("reads a checkpoint made by Gym's own collector (collection.json)", async () => {
    const {root} = await make({gymCollection: true})
    const r = await verifyCheckpoint(root)
    expect(r.ok).toBe(true)
    expect(r.manifest).toBe('collection.json')
  })

  it('flags a corrupted records file, naming the file', async () => {
    const {dir} = await make()
    const envDir = path.join(dir, 'gym', 'environment', 'env')
    const m = JSON.parse(await readFile(path.join(envDir, 'manifest.json'), 'utf8'))
    const file = path.join(envDir, m.records_file)
    const text = await readFile(file, 'utf8')
    await writeFile(file, text.replace('"a"', '"z"'))
    const r = await verifyCheckpoint(dir)
    expect(r.ok).toBe(false)
    expect(r.problems[0]).toMatchObject({severity: 'error', where: envDir, message: expect.stringMatching(/does not match its manifest digest/)})
  })

  it('records outside the commit scope are not an error: counted per participant, and the report says a restore skips them', async () => {
    const {root} = await make({
      continued: [
        ['b', 1],
        ['c', 0],
      ],
    })
    const r = await verifyCheckpoint(root)
    expect(r.problems.filter((p) => p.severity === 'error')).toEqual([])
    expect(r.ok).toBe(true)
    expect(r.participants.map((p) => [p.instance, p.records, p.inScope, p.outsideScope, p.scopeWithoutRecord])).toEqual([
      ['env', 2, 1, 1, 1],
      ['policy', 1, 0, 1, 2],
    ])
    expect(r.problems.filter((p) => p.severity === 'info').map((p) => p.message)).toEqual([
      '1 record(s) outside the commit scope: a; a restore skips them and installs only the 1 in scope',
      '1 record(s) outside the commit scope: a; a restore skips them and installs only the 0 in scope',
    ])
    expect(r.problems.find((p) => p.severity === 'warning')!.message).toMatch(/1 continued episode\(s\) have no record .*: c$/)
    expect(r.uncovered).toEqual(['c'])
  })

  it('an episode both continued and restarted is an error', async () => {
    const {root} = await make({restarted: [['a', 0]]})
    expect((await verifyCheckpoint(root)).problems.map((p) => p.message)).toContain('episodes both continued and restarted: a')
  })

  it('a checkpoint directory without a controller manifest was never published', async () => {
    const {dir} = await make()
    await rm(path.join(dir, 'gymckpt.json'))
    const r = await verifyCheckpoint(dir)
    expect(r.ok).toBe(false)
    expect(r.problems[0]!.message).toMatch(/never published/)
  })

  it('a participant directory whose manifest belongs to another participant is an error', async () => {
    const {dir} = await make()
    await mkdir(path.join(dir, 'gym', 'model', 'other'), {recursive: true})
    const src = path.join(dir, 'gym', 'model', 'policy')
    for (const f of ['manifest.json']) await writeFile(path.join(dir, 'gym', 'model', 'other', f), await readFile(path.join(src, f)))
    const r = await verifyCheckpoint(dir)
    expect(r.problems.some((p) => /belongs to model\/policy, not model\/other/.test(p.message))).toBe(true)
  })

  it('expects the given participants (restore --dry-run)', async () => {
    const {root} = await make()
    const r = await verifyCheckpoint(root, {expect: [{kind: 'agent', instance: 'agent', server: 'agent'}]})
    expect(r.ok).toBe(false)
    expect(r.problems.at(-1)!.message).toMatch(/no state for participant agent/)
  })

  it('names what is wrong with the location itself', async () => {
    const root = await tempDir()
    await expect(verifyCheckpoint(path.join(root, 'nope'))).rejects.toThrow(/does not exist/)
    await expect(verifyCheckpoint(root)).rejects.toThrow(/neither a checkpoint root/)
    await writeFile(path.join(root, 'LATEST'), '../etc')
    await expect(verifyCheckpoint(root)).rejects.toThrow(/names no valid checkpoint ID/)
  })
})

describe('verifyCheckpoint: what only an offline check refuses', () => {
  const agentDir = (dir: string) => path.join(dir, 'gym', 'agent', 'agent')
  const errors = <P extends {severity: string}>(r: {problems: P[]}) => r.problems.filter((p) => p.severity === 'error')
  const manifestOf = async (d: string) => JSON.parse(await readFile(path.join(d, 'manifest.json'), 'utf8')) as {records_file: string; records_sha256: string}

  it('duplicate records of one episode in an environment records file, naming the episodes and the directory', async () => {
    const {dir} = await make({
      records: {'environment/agent': [rec('a'), rec('b', 1), rec('a'), rec('c'), rec('a'), rec('c')]},
      continued: [
        ['a', 0],
        ['b', 1],
        ['c', 0],
      ],
    })
    const envAgentDir = (d: string) => path.join(d, 'gym', 'environment', 'agent')
    const r = await verifyCheckpoint(dir)
    expect(r.ok).toBe(false)
    const m = await manifestOf(envAgentDir(dir))
    expect(errors(r)).toEqual([
      {severity: 'error', where: envAgentDir(dir), message: `${m.records_file} holds more than one record of 2 episodes 'a' (3 records), 'c' (2 records): a restore would install one episode twice`},
    ])
    expect(r.participants[0]).toMatchObject({ok: false, records: 6, inScope: 6, outsideScope: 0, scopeWithoutRecord: 0})
  })

  it('duplicate records of one episode at the model too (one ModelRecord per episode)', async () => {
    const {dir} = await make({records: {'model/policy': [rec('a'), rec('a')]}, continued: [['a', 0]]})
    const modelDir = path.join(dir, 'gym', 'model', 'policy')
    const r = await verifyCheckpoint(dir)
    const m = await manifestOf(modelDir)
    expect(errors(r)).toEqual([{severity: 'error', where: modelDir, message: `${m.records_file} holds more than one record of episode 'a' (2 records): a restore would install one episode twice`}])
    expect(r.ok).toBe(false)
  })

  it('several records of one episode at an agent or a resources server: one per session, as Gym writes them', async () => {
    // Reference 7.6: agent records are keyed by session_key, resources records by session_id; an
    // episode with two sessions has two records, and Gym's restore installs both.
    const {dir} = await make({
      records: {'agent/agent': [rec('a'), rec('a'), rec('b')], 'resources/res': [rec('b'), rec('a'), rec('b')]},
      continued: [
        ['a', 0],
        ['b', 0],
      ],
    })
    const r = await verifyCheckpoint(dir)
    expect(r.problems).toEqual([])
    expect(r.ok).toBe(true)
    expect(r.participants.map((p) => [p.kind, p.ok, p.records, p.inScope])).toEqual([
      ['agent', true, 3, 3],
      ['resources', true, 3, 3],
    ])
  })

  it('a participant directory that is a symlink leaving the checkpoint directory, naming the link and its target', async () => {
    const {dir} = await make({records: {'agent/agent': [rec('a')]}, continued: [['a', 0]]})
    const outside = path.join(await realpath(await tempDir()), 'agent')
    await rename(agentDir(dir), outside)
    await symlink(outside, agentDir(dir))
    const r = await verifyCheckpoint(dir)
    expect(r.ok).toBe(false)
    expect(errors(r)).toEqual([{severity: 'error', where: agentDir(dir), message: `${agentDir(dir)} is a symlink to ${outside}, outside the checkpoint directory ${await realpath(dir)}`}])
    // Nothing outside was read.
    expect(r.participants[0]).toMatchObject({ok: false, records: 0})
  })

  it('a gym/<kind> directory that is a symlink leaving the checkpoint directory is named too', async () => {
    const {dir} = await make({records: {'agent/agent': [rec('a')]}, continued: [['a', 0]]})
    const outside = path.join(await realpath(await tempDir()), 'agent-kind')
    await rename(path.join(dir, 'gym', 'agent'), outside)
    await symlink(outside, path.join(dir, 'gym', 'agent'))
    const r = await verifyCheckpoint(dir)
    expect(errors(r).map((p) => p.message)).toEqual([`${path.join(dir, 'gym', 'agent')} is a symlink to ${outside}, outside the checkpoint directory ${await realpath(dir)}`])
  })

  it('a manifest or records file that is a symlink leaving the checkpoint directory, naming the link and its target', async () => {
    for (const which of ['manifest', 'records'] as const) {
      const {dir} = await make({records: {'agent/agent': [rec('a')]}, continued: [['a', 0]]})
      const m = await manifestOf(agentDir(dir))
      const link = path.join(agentDir(dir), which === 'manifest' ? 'manifest.json' : m.records_file)
      const target = path.join(await realpath(await tempDir()), path.basename(link))
      await rename(link, target)
      await symlink(target, link)
      const r = await verifyCheckpoint(dir)
      expect(errors(r), which).toEqual([{severity: 'error', where: agentDir(dir), message: `${link} is a symlink to ${target}, outside the checkpoint directory ${await realpath(dir)}`}])
    }
  })

  it('symlinks that stay inside the checkpoint directory are accepted', async () => {
    const {dir} = await make({records: {'agent/agent': [rec('a')]}, continued: [['a', 0]]})
    const moved = path.join(dir, 'elsewhere', 'agent')
    await mkdir(path.dirname(moved))
    await rename(agentDir(dir), moved)
    await symlink(moved, agentDir(dir))
    const r = await verifyCheckpoint(dir)
    expect(r.problems).toEqual([])
    expect(r.participants[0]).toMatchObject({ok: true, records: 1, inScope: 1})
  })

  it('a records file whose name disagrees with its sha256 is an error naming the file', async () => {
    const {dir} = await make({records: {'agent/agent': [rec('a')]}, continued: [['a', 0]], gymCollection: true})
    const d = agentDir(dir)
    const m = await manifestOf(d)
    const wrong = `records-${'0'.repeat(64)}.jsonl`
    await rename(path.join(d, m.records_file), path.join(d, wrong))
    // The manifest names the renamed file and still holds the content's digest.
    await writeFile(path.join(d, 'manifest.json'), JSON.stringify({...m, records_file: wrong}))
    const r = await verifyCheckpoint(dir)
    expect(r.ok).toBe(false)
    expect(errors(r)).toEqual([
      {severity: 'error', where: d, message: `${path.join(d, wrong)} is named for sha256 ${'0'.repeat(64)}, but its content and its manifest's records_sha256 are ${m.records_sha256}`},
    ])
  })

  it("a records file named for its manifest's digest but holding other bytes is an error", async () => {
    const {dir} = await make({records: {'agent/agent': [rec('a')]}, continued: [['a', 0]]})
    const d = agentDir(dir)
    const m = await manifestOf(d)
    await writeFile(path.join(d, m.records_file), rec('a', 0).replace('NaN', 'Infinity') + '\n')
    const r = await verifyCheckpoint(dir)
    expect(errors(r).map((p) => p.message)).toEqual([`${path.join(d, m.records_file)} does not match its manifest digest`])
  })
})
