// Rules of offline verification (src/storage/verify.ts) that no other test holds (issue 12).
import {mkdir, readFile, rm, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {assertRestorable} from '../../src/coordination/restore.js'
import {encodeManifest, writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import {verifyCheckpoint} from '../../src/storage/verify.js'
import {tempDir} from '../helpers/tmp.js'

const rec = (r: string, a = 0, pad = 0) => `{"episode_id": {"rollout_id": "${r}", "attempt": ${a}}, "state": {"x": NaN, "p": "${'p'.repeat(pad)}"}}`
type Ep = [string, number]

interface MakeOpts {
  records?: Record<string, string[]>
  continued?: Ep[]
  restarted?: Ep[]
  /** Participants written to disk but left out of gymckpt.json. */
  unnamed?: string[]
  /** Participants named in gymckpt.json whose directory is then removed. */
  removed?: string[]
  id?: string
}

async function make(opts: MakeOpts = {}) {
  const root = await tempDir()
  const id = opts.id ?? 'ckpt-1'
  const dir = path.join(root, id)
  const records = opts.records ?? {'environment/env': [rec('a'), rec('b', 1)], 'model/policy': [rec('a')]}
  const participants = []
  for (const [ki, lines] of Object.entries(records)) {
    const [kind, instance] = ki.split('/') as [string, string]
    const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: id}, lines)
    if (!opts.unnamed?.includes(ki)) participants.push({server: `srv-${instance}`, kind, instance, manifest, episode_ids: []})
  }
  const ep = ([r, a]: Ep) => ({rollout_id: r, attempt: a})
  await mkdir(dir, {recursive: true})
  await writeControllerManifest(dir, {
    format_version: FORMAT_VERSION,
    checkpoint_id: id,
    created_at: 1,
    continued: (
      opts.continued ?? [
        ['a', 0],
        ['b', 1],
      ]
    ).map(ep),
    restarted: (opts.restarted ?? []).map(ep),
    participants,
  })
  for (const ki of opts.removed ?? []) await rm(path.join(dir, 'gym', ki), {recursive: true})
  await publishLatest(root, id)
  return {root, dir}
}

const plan = (verify: Awaited<ReturnType<typeof verifyCheckpoint>>) => ({
  checkpointId: verify.checkpointId,
  checkpointDir: verify.checkpointDir,
  continued: [],
  replacements: [],
  restarted: [],
  participants: [],
  busy: [],
  unreachable: [],
  missing: [],
  verify,
  manifest: verify.manifest,
  controllerState: undefined,
})

describe('warnings and infos next to an OK report', () => {
  it('a directory the controller manifest does not name is a warning: the report stays OK and a restore goes ahead', async () => {
    const {root, dir} = await make({unnamed: ['model/policy']})
    const r = await verifyCheckpoint(root)
    expect(r.problems).toEqual([{severity: 'warning', where: path.join(dir, 'gym', 'model', 'policy'), message: 'directory not named in the controller manifest'}])
    expect(r.ok).toBe(true)
    expect(() => assertRestorable(plan(r))).not.toThrow()
  })

  it('continued episodes no participant holds are a warning; records outside the scope an info; the report is OK', async () => {
    const many: Ep[] = Array.from({length: 12}, (_, i) => [`u${String(i).padStart(2, '0')}`, 0])
    const {root, dir} = await make({records: {'environment/env': [rec('a'), rec('x'), rec('y')]}, continued: [['a', 0], ...many]})
    const r = await verifyCheckpoint(root)
    expect(r.ok).toBe(true)
    expect(r.uncovered).toEqual(many.map(([k]) => k))
    expect(r.problems).toEqual([
      {
        severity: 'info',
        where: path.join(dir, 'gym', 'environment', 'env'),
        message: '2 record(s) outside the commit scope: x, y; a restore skips them and installs only the 1 in scope',
      },
      {
        severity: 'warning',
        where: 'gymckpt.json',
        message: `12 continued episode(s) have no record on any participant and would start over from their input: ${many
          .slice(0, 10)
          .map(([k]) => k)
          .join(', ')}`,
      },
    ])
    expect(() => assertRestorable(plan(r))).not.toThrow()
  })

  it('one error among warnings makes the report not OK', async () => {
    const {root} = await make({unnamed: ['model/policy'], restarted: [['a', 0]]})
    const r = await verifyCheckpoint(root)
    expect(r.problems.map((p) => p.severity).sort()).toEqual(['error', 'warning'])
    expect(r.ok).toBe(false)
    expect(() => assertRestorable(plan(r))).toThrow(/failed verification, nothing was sent: .*episodes both continued and restarted: a$/)
  })

  it('more than ten keys outside the scope are named ten at a time with the rest counted; duplicates count once', async () => {
    const keys = Array.from({length: 13}, (_, i) => `o${String(i).padStart(2, '0')}`)
    const {root} = await make({
      records: {'agent/ag': [rec('in'), rec('in'), ...keys.map((k) => rec(k))]},
      continued: [
        ['in', 0],
        ['gone', 0],
      ],
    })
    const r = await verifyCheckpoint(root)
    const info = r.problems.find((p) => p.severity === 'info')!
    expect(info.message).toBe(`13 record(s) outside the commit scope: ${keys.slice(0, 10).join(', ')} (+3 more); a restore skips them and installs only the 2 in scope`)
    expect(r.participants[0]).toMatchObject({records: 15, inScope: 2, outsideScope: 13, scopeWithoutRecord: 1})
  })

  it('without a controller manifest no scope notes are made, and every record counts as outside', async () => {
    const {dir} = await make()
    await rm(path.join(dir, 'gymckpt.json'))
    const r = await verifyCheckpoint(dir)
    expect(r.problems.map((p) => p.severity)).toEqual(['error'])
    expect(r.participants.map((p) => [p.inScope, p.outsideScope, p.scopeWithoutRecord])).toEqual([
      [0, 2, 0],
      [0, 1, 0],
    ])
    expect(r.uncovered).toEqual([])
  })
})

describe('a manifest replaced after commit', () => {
  it('a participant manifest that differs from the one its participant returned at commit is an error', async () => {
    const {root, dir} = await make()
    const env = path.join(dir, 'gym', 'environment', 'env')
    // Another valid commit of the same checkpoint ID put in its place: it reads, but it is not what was committed.
    const other = await tempDir()
    const m2 = await writeParticipantState({checkpointDir: other, kind: 'environment', instance: 'env', checkpointId: 'ckpt-1'}, [rec('a'), rec('b', 1), rec('c')])
    const from = path.join(other, 'gym', 'environment', 'env')
    await writeFile(path.join(env, m2.records_file), await readFile(path.join(from, m2.records_file)))
    await writeFile(path.join(env, 'manifest.json'), encodeManifest(m2))
    const r = await verifyCheckpoint(root)
    expect(r.problems.filter((p) => p.severity === 'error')).toEqual([{severity: 'error', where: env, message: 'manifest differs from the one its participant returned at commit'}])
    expect(r.ok).toBe(false)
    expect(r.participants[0]).toMatchObject({ok: false, records: 3})
    expect(r.participants[1]).toMatchObject({ok: true})
  })

  it('the same manifest with its keys in another order or another indentation is the same manifest', async () => {
    const {root, dir} = await make()
    const env = path.join(dir, 'gym', 'environment', 'env')
    const m = JSON.parse(await readFile(path.join(env, 'manifest.json'), 'utf8')) as Record<string, unknown>
    const reversed = Object.fromEntries(Object.entries(m).reverse())
    await writeFile(path.join(env, 'manifest.json'), JSON.stringify(reversed))
    const r = await verifyCheckpoint(root)
    expect(r.problems).toEqual([])
    expect(r.ok).toBe(true)
  })

  it('a participant manifest of another checkpoint is an error naming both IDs', async () => {
    const {root, dir} = await make({unnamed: ['model/policy']})
    const model = path.join(dir, 'gym', 'model', 'policy')
    await rm(model, {recursive: true})
    await writeParticipantState({checkpointDir: dir, kind: 'model', instance: 'policy', checkpointId: 'ckpt-0'}, [rec('a')])
    const r = await verifyCheckpoint(root)
    expect(r.problems.filter((p) => p.severity === 'error')).toEqual([{severity: 'error', where: model, message: "manifest is of checkpoint 'ckpt-0', not 'ckpt-1'"}])
    expect(r.participants[1]!.ok).toBe(false)
  })
})

describe('what is missing', () => {
  it('a participant that committed but whose directory is missing is an error naming its server', async () => {
    const {root} = await make({removed: ['model/policy']})
    const r = await verifyCheckpoint(root)
    expect(r.problems).toEqual([{severity: 'error', where: 'gym/model/policy', message: 'participant srv-policy committed but its directory is missing'}])
    expect(r.ok).toBe(false)
  })

  it('an expected participant without state is named by server, else by instance; one that has state passes', async () => {
    const {root} = await make()
    const r = await verifyCheckpoint(root, {
      expect: [
        {kind: 'environment', instance: 'env', server: 'e'},
        {kind: 'agent', instance: 'ag', server: 'agent-srv'},
        {kind: 'resources', instance: 'res'},
        {kind: 'model', instance: 'env'},
      ],
    })
    expect(r.problems).toEqual([
      {severity: 'error', where: 'gym/agent/ag', message: 'no state for participant agent-srv (agent/ag): a restore would fail there'},
      {severity: 'error', where: 'gym/resources/res', message: 'no state for participant res (resources/res): a restore would fail there'},
      {severity: 'error', where: 'gym/model/env', message: 'no state for participant env (model/env): a restore would fail there'},
    ])
  })

  it('no participant state at all is an error', async () => {
    const {root, dir} = await make({records: {}, continued: []})
    const r = await verifyCheckpoint(root)
    expect(r.problems).toEqual([{severity: 'error', where: dir, message: 'no participant state under gym/'}])
    expect(r.ok).toBe(false)
  })

  it('a controller manifest that is broken is an error, and the participants are still verified', async () => {
    const {root, dir} = await make()
    await writeFile(path.join(dir, 'gymckpt.json'), '{"format_version": 1}')
    const r = await verifyCheckpoint(root)
    expect(r.manifest).toBeNull()
    expect(r.problems).toEqual([{severity: 'error', where: dir, message: expect.stringMatching(/gymckpt\.json is not a gymckpt manifest: /)}])
    expect(r.participants.map((p) => [p.ok, p.records])).toEqual([
      [true, 2],
      [true, 1],
    ])
  })

  it("the report carries the manifest's ID, scope and restarts as capture keys", async () => {
    const {root} = await make({
      id: 'ckpt-9',
      continued: [
        ['a', 0],
        ['b', 1],
      ],
      restarted: [['z', 3]],
    })
    const r = await verifyCheckpoint(root)
    expect(r).toMatchObject({ok: true, checkpointId: 'ckpt-9', manifest: 'gymckpt.json', continued: ['a', 'b-a1'], restarted: ['z-a3'], uncovered: []})
    expect(r.participants.map((p) => [p.kind, p.instance, p.episodes, p.bytes > 0, p.recordsSha256?.length])).toEqual([
      ['environment', 'env', ['a', 'b-a1'], true, 64],
      ['model', 'policy', ['a'], true, 64],
    ])
  })
})

describe('duplicates', () => {
  it('one duplicated episode is named in the singular; more than ten are counted', async () => {
    const one = await make({records: {'environment/en': [rec('a'), rec('a')]}, continued: [['a', 0]]})
    const r1 = await verifyCheckpoint(one.root)
    expect(r1.problems[0]!.message).toMatch(/^records-[0-9a-f]{64}\.jsonl holds more than one record of episode 'a' \(2 records\): a restore would install one episode twice$/)
    const keys = Array.from({length: 12}, (_, i) => `d${String(i).padStart(2, '0')}`)
    const many = await make({records: {'model/po': keys.flatMap((k) => [rec(k), rec(k)])}, continued: keys.map((k): Ep => [k, 0])})
    const r2 = await verifyCheckpoint(many.root)
    const named = keys
      .slice(0, 10)
      .map((k) => `'${k}' (2 records)`)
      .join(', ')
    expect(r2.problems[0]!.message).toMatch(new RegExp(`holds more than one record of 12 episodes ${named.replace(/[()]/g, '\\$&')} \\(\\+2 more episodes\\): a restore`))
    expect(r2.participants[0]!.ok).toBe(false)
  })
})

describe('problems come in directory order whichever read finishes first', () => {
  it('with several directories read at once, a slow first directory is still reported first', async () => {
    // The first directory holds much more to read than the second, so the second finishes first.
    const {root} = await make({
      records: {'agent/a': Array.from({length: 400}, (_, i) => rec(`s${i}`, 0, 20_000)), 'model/m': [rec('q')]},
      continued: [],
    })
    const dir = path.join(root, 'ckpt-1')
    for (const ki of ['agent/a', 'model/m']) {
      const d = path.join(dir, 'gym', ki)
      const m = JSON.parse(await readFile(path.join(d, 'manifest.json'), 'utf8')) as {record_count: number}
      await writeFile(path.join(d, 'manifest.json'), JSON.stringify({...m, record_count: m.record_count + 1}))
    }
    const r = await verifyCheckpoint(root, {concurrency: 2})
    expect(r.problems.map((p) => [p.severity, p.where.split(path.sep).slice(-2).join('/')])).toEqual([
      ['error', 'agent/a'],
      ['error', 'model/m'],
    ])
  })

  it('errors come first in directory order, then the notes on records outside the scope, in directory order', async () => {
    const {root} = await make({
      records: {'agent/a': Array.from({length: 400}, (_, i) => rec(`s${i}`, 0, 20_000)), 'model/m': [rec('q'), rec('q')], 'resources/r': [rec('t')]},
      continued: [['s0', 0]],
    })
    const r = await verifyCheckpoint(root, {concurrency: 3})
    expect(r.problems.map((p) => [p.severity, p.where.split(path.sep).slice(-2).join('/')])).toEqual([
      ['error', 'model/m'],
      ['info', 'agent/a'],
      ['info', 'model/m'],
      ['info', 'resources/r'],
    ])
  })
})
