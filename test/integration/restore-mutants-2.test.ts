// More rules of the restore preflight and restore (src/coordination/restore.ts) that no other test
// holds (issue 12): each participant is matched to its own directory by kind AND instance, the
// second look at the fleet right before sending, and every failure named in one message.
import {appendFile, readFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {ParticipantServer} from '../../src/control-plane/server.js'
import {ControlClient} from '../../src/coordination/client.js'
import {discover} from '../../src/coordination/discover.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {Coordinator} from '../../src/coordination/operations.js'
import {planRestore, restoreCheckpoint} from '../../src/coordination/restore.js'
import {FleetMember} from '../../src/control-plane/fleet.js'
import {publishLatest} from '../../src/storage/root.js'
import {TOKEN, control, later, soon, startServer} from '../helpers/fleet.js'
import {writeCheckpoint} from '../helpers/store.js'
import {tempDir} from '../helpers/tmp.js'

const rec = (r: string, pad = 0) => `{"episode_id": {"rollout_id": "${r}", "attempt": 0}, "state": {"p": "${'p'.repeat(pad)}"}}`

/**
 * Fresh participants, each started under its instance name and discovered under `label`. Two of
 * them share the instance name `x` under different kinds: the directory layout gym/<kind>/<instance>
 * keeps them apart, and so must the controller.
 */
async function freshFleet(members: {label: string; instance: string; kind: FleetMember['kind']}[]) {
  const servers = new Map<string, ParticipantServer>()
  for (const m of members) servers.set(m.label, await startServer(m.instance, m.kind))
  const client = new ControlClient({token: TOKEN})
  later(() => client.close())
  const d = await discover(
    client,
    members.map((m) => ({name: m.label, url: servers.get(m.label)!.url})),
    {probeTimeoutMs: 5000},
  )
  const c: Coordinator = {client, participants: d.participants}
  return {c, servers, server: (label: string) => servers.get(label)!}
}

/** The routes a server was sent from journal entry `from` on. */
const routesSince = (s: ParticipantServer, from: number) => s.journal.slice(from).map((j) => j.route)

/**
 * A published checkpoint written by hand: `records` per `kind/instance`, the scope `continued`
 * (attempt 0), every directory named in the controller manifest under the label `server`.
 */
async function handMade(records: Record<string, {server: string; lines: string[]}>, continued: string[]) {
  const root = await tempDir()
  const id = 'ck-h'
  const dir = path.join(root, id)
  const parts = Object.entries(records).map(([ki, {server, lines}]) => {
    const [kind, instance] = ki.split('/') as [string, string]
    return {kind, instance, lines, server}
  })
  await writeCheckpoint(dir, id, parts, continued)
  await publishLatest(root, id)
  return {root, dir}
}

/** environment/x and model/x share an instance name; model/x and model/y share a kind. Sizes all differ. */
const MEMBERS = [
  {label: 'env-x', instance: 'x', kind: 'environment'},
  {label: 'model-x', instance: 'x', kind: 'model'},
  {label: 'model-y', instance: 'y', kind: 'model'},
] as const
const RECORDS = {
  'environment/x': {server: 'env-x', lines: [rec('a'), rec('b')]},
  'model/x': {server: 'model-x', lines: [rec('a', 10)]},
  'model/y': {server: 'model-y', lines: [rec('a', 300), rec('b', 300), rec('c', 300)]},
}

describe('each participant is matched to its own directory, gym/<kind>/<instance>', () => {
  it('the plan counts records, installs and skips of the directory of the same kind and instance', async () => {
    const {root} = await handMade(RECORDS, ['a', 'b'])
    const {c} = await freshFleet([...MEMBERS])
    const p = await planRestore(c, {location: root})
    expect(p.verify!.ok).toBe(true)
    expect(p.participants.map((x) => [x.server, x.kind, x.instance, x.records, x.install, x.skip])).toEqual([
      ['env-x', 'environment', 'x', 2, 2, 0],
      ['model-x', 'model', 'x', 1, 1, 0],
      ['model-y', 'model', 'y', 3, 2, 1],
    ])
  })

  it("a restore's timing row gives the bytes of the participant's own records file", async () => {
    // An empty scope: every record is verified and skipped, nothing is installed.
    const {root} = await handMade(RECORDS, [])
    const {c} = await freshFleet([...MEMBERS])
    const r = await restoreCheckpoint(c, {location: root})
    const own = (kind: string, instance: string) => r.verify!.participants.find((v) => v.kind === kind && v.instance === instance)!.bytes
    const bytes = [own('environment', 'x'), own('model', 'x'), own('model', 'y')]
    expect(new Set(bytes).size).toBe(3)
    expect(r.timings.map((t) => [t.server, t.records, t.bytes])).toEqual([
      ['env-x', 0, bytes[0]],
      ['model-x', 0, bytes[1]],
      ['model-y', 0, bytes[2]],
    ])
  })
})

describe('the preflight', () => {
  it('a participant that does not answer is unreachable, not busy, and the restore is refused', async () => {
    const {root} = await handMade(RECORDS, ['a'])
    const {c, server} = await freshFleet([...MEMBERS])
    await server('model-y').close()
    const p = await planRestore(c, {location: root})
    expect(p.unreachable.map((f) => f.server)).toEqual(['model-y'])
    expect(p.busy).toEqual([])
    await expect(restoreCheckpoint(c, {location: root})).rejects.toMatchObject({code: 'discovery'})
  })

  it('a fleet participant the checkpoint holds no state for fails the verification, and nothing is sent', async () => {
    const {root} = await handMade({'environment/x': RECORDS['environment/x'], 'model/x': RECORDS['model/x']}, ['a'])
    const {c, servers} = await freshFleet([...MEMBERS])
    const p = await planRestore(c, {location: root})
    expect(p.verify!.ok).toBe(false)
    expect(p.verify!.problems.filter((x) => x.severity === 'error')).toEqual([
      {severity: 'error', where: 'gym/model/y', message: 'no state for participant model-y (model/y): a restore would fail there'},
    ])
    const marks = [...servers.values()].map((s) => s.journal.length)
    const err = (await restoreCheckpoint(c, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toMatch(/failed verification, nothing was sent: gym\/model\/y: no state for participant model-y/)
    ;[...servers.values()].forEach((s, i) => expect(routesSince(s, marks[i]!).filter((r) => r !== 'status')).toEqual([]))
  })

  it('a checkpoint failing verification in several places is refused naming every error, with the problems as details', async () => {
    const {root, dir} = await handMade(RECORDS, ['a'])
    const {c} = await freshFleet([...MEMBERS])
    for (const ki of ['environment/x', 'model/y']) {
      const d = path.join(dir, 'gym', ki)
      const m = JSON.parse(await readFile(path.join(d, 'manifest.json'), 'utf8')) as {records_file: string}
      await appendFile(path.join(d, m.records_file), rec('z') + '\n')
    }
    const p = await planRestore(c, {location: root})
    const errors = p.verify!.problems.filter((x) => x.severity === 'error')
    expect(errors).toHaveLength(2)
    const err = (await restoreCheckpoint(c, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toBe(`checkpoint ${dir} failed verification, nothing was sent: ${errors.map((x) => `${x.where}: ${x.message}`).join('; ')}`)
    expect(err.message).toContain(`does not match its manifest digest; ${errors[1]!.where}: `)
    expect(err.details).toEqual({checkpoint_dir: dir, problems: p.verify!.problems})
  })

  it('a fleet found busy is refused after one status probe per participant and nothing else', async () => {
    const {root} = await handMade(RECORDS, ['a'])
    const {c, servers, server} = await freshFleet([...MEMBERS])
    const retired = await control(server('model-x').url, 'retire', {checkpoint_id: 'old', deadline_ts: soon(), episode_ids: [{rollout_id: 'q', attempt: 0}]})
    expect(retired.status).toBe(200)
    const marks = [...servers.values()].map((s) => s.journal.length)
    const err = (await restoreCheckpoint(c, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('fleet_state')
    ;[...servers.values()].forEach((s, i) => expect(routesSince(s, marks[i]!)).toEqual(['status']))
  })

  it('with verification the fleet is probed again right before sending; without it, once', async () => {
    const {root} = await handMade(RECORDS, [])
    const verified = await freshFleet([...MEMBERS])
    let marks = [...verified.servers.values()].map((s) => s.journal.length)
    await restoreCheckpoint(verified.c, {location: root})
    ;[...verified.servers.values()].forEach((s, i) => expect(routesSince(s, marks[i]!)).toEqual(['status', 'status', 'restore', 'resume']))
    const unverified = await freshFleet([...MEMBERS])
    marks = [...unverified.servers.values()].map((s) => s.journal.length)
    await restoreCheckpoint(unverified.c, {location: root, skipVerify: true})
    ;[...unverified.servers.values()].forEach((s, i) => expect(routesSince(s, marks[i]!)).toEqual(['status', 'restore', 'resume']))
  })

  it('a participant that stops being fresh while the checkpoint is verified is refused before anything is sent', async () => {
    const {root} = await handMade(RECORDS, ['a'])
    const {c, servers, server} = await freshFleet([...MEMBERS])
    // The real client, except that once the first round of status probes has answered, model-x
    // takes a retire (a mark that refuses replacements) before the restore looks again.
    let answered = 0
    const status: ControlClient['status'] = async (...args) => {
      const r = await c.client.status(...args)
      if (++answered === c.participants.length) {
        const retired = await control(server('model-x').url, 'retire', {checkpoint_id: 'old', deadline_ts: soon(), episode_ids: [{rollout_id: 'q', attempt: 0}]})
        expect(retired.status).toBe(200)
      }
      return r
    }
    const client = new Proxy(c.client, {
      get: (t, k) => {
        if (k === 'status') return status
        const v = Reflect.get(t, k, t) as unknown
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v
      },
    })
    const marks = [...servers.values()].map((s) => s.journal.length)
    const err = (await restoreCheckpoint({...c, client}, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(answered).toBe(2 * c.participants.length)
    expect(err.code).toBe('fleet_state')
    expect(err.details).toEqual({busy: [{server: 'model-x', reasons: [expect.stringMatching(/^holds 1 retired-rollout mark/)]}]})
    ;[...servers.values()].forEach((s, i) => expect(routesSince(s, marks[i]!).filter((r) => r !== 'status' && r !== 'retire')).toEqual([]))
  })
})

describe('a resume that fails after the restore', () => {
  it('names every participant whose resume failed, one after the other', async () => {
    const {root} = await handMade(RECORDS, [])
    const {c, server} = await freshFleet([...MEMBERS])
    server('env-x').faults.add('resume', {type: 'status', status: 500})
    server('model-y').faults.add('resume', {type: 'status', status: 503})
    const err = (await restoreCheckpoint(c, {location: root}).catch((e: unknown) => e)) as ControllerError
    expect(err.code).toBe('participant')
    expect(err.message).toMatch(/succeeded everywhere, but resuming it failed: env-x: HTTP 500 [^;]*; model-y: HTTP 503 [^;]*\. Resume it again with its restore ID\.$/)
  })
})
