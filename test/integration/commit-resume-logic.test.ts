// What a stateless `commit` and `resume` decide from one tolerant discovery (src/coordination/
// controller.ts preparedForCommit, resumeFleet), against real fleets of the participant double:
// the checkpoint found, the restarts reported, every refusal (and that it sent nothing), the
// close-then-throw path when a holder is down or came back empty, and what resume leaves behind.
import {mkdir, readFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {Fleet, MemberKind} from '../../src/control-plane/fleet.js'
import {ParticipantServer} from '../../src/control-plane/server.js'
import {SimDownstream, SimEnvironment} from '../../src/control-plane/sim.js'
import {ControlClient} from '../../src/coordination/client.js'
import {commitAndPublish, prepareOrAbort, preparedForCommit, resumeFleet} from '../../src/coordination/controller.js'
import {Discovery, discover} from '../../src/coordination/discover.js'
import {ControllerError, CoordinationError, failureMessage, nextStep} from '../../src/coordination/errors.js'
import {Coordinator, prepare, resume} from '../../src/coordination/operations.js'
import {FULL, TOKEN, control, later, soon, startFleet, waitFor} from '../helpers/fleet.js'
import {SCOPE_RECORD, writeScopeRecord} from '../../src/storage/root.js'
import {tempDir} from '../helpers/tmp.js'
import {rejection} from '../helpers/errors.js'

const PARTICIPANTS = ['env', 'policy', 'agent', 'res']

function newClient(): ControlClient {
  const c = new ControlClient({token: TOKEN})
  later(() => c.close())
  return c
}

/** What `commit` and `resume` do first: a tolerant discovery, and a coordinator of whoever answered. */
async function look(fleet: Fleet, client = newClient()): Promise<{c: Coordinator; d: Discovery}> {
  const d = await discover(
    client,
    fleet.servers.map((s) => ({name: s.name, url: s.url})),
    {tolerant: true, tries: 1, probeTimeoutMs: 3000},
  )
  return {c: {client, participants: d.participants}, d}
}

const OPERATIONS = new Set(['prepare', 'commit', 'resume', 'renew', 'restore', 'retire', 'forget'])

/** Control operations (not status, not data) that reached each server, in order: what "nothing was sent" is about. */
function sent(fleet: Fleet): Record<string, string[]> {
  return Object.fromEntries(fleet.servers.map((s) => [s.name, s.journal.filter((j) => OPERATIONS.has(j.route)).map((j) => j.route)]))
}

/** Phase and checkpoint of each named server, as its status route reports them now. */
async function phases(fleet: Fleet, names = PARTICIPANTS): Promise<Record<string, string>> {
  const out: Record<string, string> = {}
  for (const n of names) {
    const st = (await control(fleet.server(n).url, 'status')).json
    out[n] = st.checkpoint_id === null ? st.phase : `${st.phase} ${st.checkpoint_id}`
  }
  return out
}

/** The server crashed and came back on its address as a fresh process: up, but holding nothing ('none': without checkpoint routes). */
async function restartEmpty(fleet: Fleet, name: string, kind: MemberKind): Promise<void> {
  const old = fleet.server(name)
  const port = Number(new URL(old.url).port)
  await old.crash()
  const participant = kind === 'environment' ? new SimEnvironment(name) : kind === 'none' ? null : new SimDownstream(kind, name)
  const s = new ParticipantServer({name, token: TOKEN, participant})
  await s.listen(port)
  later(() => s.close())
}

const caught = (p: Promise<unknown>) => rejection(p, ControllerError)

/** A fleet of FULL with checkpoint `id` prepared everywhere. */
async function preparedFleet(id = 'c1'): Promise<Fleet> {
  const fleet = await startFleet({members: FULL})
  const {c} = await look(fleet)
  await prepareOrAbort(c, id, soon())
  return fleet
}

describe('preparedForCommit: what a stateless commit commits', () => {
  it('finds the one checkpoint every participant is prepared under, reports no restarts, and sends nothing', async () => {
    const fleet = await preparedFleet('c1')
    const before = sent(fleet)
    const {c, d} = await look(fleet)
    expect(await preparedForCommit(c, d, {deadlineTs: soon()})).toEqual({checkpointId: 'c1', restarts: []})
    // An explicit --id naming the open checkpoint is the same answer.
    expect(await preparedForCommit(c, d, {id: 'c1', deadlineTs: soon()})).toEqual({checkpointId: 'c1', restarts: []})
    expect(sent(fleet)).toEqual(before)
    expect(await phases(fleet)).toEqual({env: 'prepared c1', policy: 'prepared c1', agent: 'prepared c1', res: 'prepared c1'})
  })

  it('reports the restarts the prepared participants report, once each, from every server of a kind', async () => {
    const fleet = await startFleet({
      members: [
        {name: 'env1', kind: 'environment'},
        {name: 'env2', kind: 'environment'},
        {name: 'policy', kind: 'model'},
        {name: 'res', kind: 'resources'},
      ],
    })
    const env = (n: string) => fleet.server(n).participant as SimEnvironment
    void fleet.run({rolloutId: 'a', steps: 400, stepMs: 5}, 'env1')
    void fleet.run({rolloutId: 's1', steps: 100_000, stepMs: 5, restart: true}, 'env1')
    void fleet.run({rolloutId: 's2', attempt: 2, steps: 100_000, stepMs: 5, restart: true}, 'env2')
    await waitFor(() => env('env1').report().restarts.includes('s1') && env('env2').report().restarts.includes('s2-a2'), 5000, 'restarts reported')
    await waitFor(() => [...env('env1').episodes.values()].every((e) => e.boundary !== null), 5000, 'episodes at a boundary')
    const {c: c0} = await look(fleet)
    await prepareOrAbort(c0, 'c1', soon())
    const {c, d} = await look(fleet)
    // env1, env2 and res each report theirs (res reports both): each restart comes back once.
    expect(d.participants.find((p) => p.server === 'res')!.status.report.restarts).toEqual(['s1', 's2-a2'])
    const out = await preparedForCommit(c, d, {deadlineTs: soon()})
    expect(out.checkpointId).toBe('c1')
    expect(out.restarts).toEqual([
      {rolloutId: 's1', attempt: 0},
      {rolloutId: 's2', attempt: 2},
    ])
    expect(sent(fleet).res).toEqual(['prepare'])
  })

  it('accepts participants that already committed (a commit retried after one server failed it)', async () => {
    const fleet = await preparedFleet('c1')
    const {c} = await look(fleet)
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const root = await tempDir()
    await expect(commitAndPublish(c, {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon()})).rejects.toThrow(/agent: HTTP 500/)
    const {c: c2, d} = await look(fleet)
    expect(await phases(fleet)).toEqual({env: 'committed c1', policy: 'committed c1', agent: 'prepared c1', res: 'committed c1'})
    expect((await preparedForCommit(c2, d, {deadlineTs: soon()})).checkpointId).toBe('c1')
  })

  it('a retry sends the scope of the first try when the same episodes are given, though a restart ended since', async () => {
    const fleet = await preparedFleet('c1')
    const {c} = await look(fleet)
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const root = await tempDir()
    const q = {rolloutId: 'q', attempt: 0}
    const r = {rolloutId: 'r', attempt: 0}
    const plan = {checkpointId: 'c1', root, episodes: [q, r], deadlineTs: soon(), rememberScope: true}
    // First try: q was a restart, so the scope was [r].
    await expect(commitAndPublish(c, {...plan, restarts: [q]})).rejects.toThrow(/agent: HTTP 500/)
    expect(JSON.parse(await readFile(path.join(root, 'c1', SCOPE_RECORD), 'utf8'))).toEqual({checkpoint_id: 'c1', given: ['q', 'r'], scope: ['r']})
    // Other episodes: refused before sending, naming the resume.
    const before = sent(fleet)
    const other = await caught(commitAndPublish(c, {...plan, episodes: [r, {rolloutId: 's', attempt: 0}], restarts: [], committedOn: ['env', 'policy', 'res']}))
    expect(other.code).toBe('input')
    expect(other.message).toBe(
      "checkpoint 'c1' was first committed (in part) with another list of 2 episode(s); a retry must give the same episodes (participants that committed refuse another scope, and the rest would commit a different one); nothing was sent. Give the first try's episodes, or resume 'c1' and checkpoint again under a new ID",
    )
    expect(other.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(sent(fleet)).toEqual(before)
    // The same episodes, q no longer reported: the first try's scope [r] is sent, and the rest commit.
    const out = await commitAndPublish(c, {...plan, restarts: [], committedOn: ['env', 'policy', 'res']})
    expect(out.published).toBe(true)
    expect([...out.replies.keys()].sort()).toEqual([...PARTICIPANTS].sort())
    for (const [server, reply] of out.replies) expect(reply.episode_ids, server).toEqual([])
    expect(out.continued).toEqual([r])
  })

  it('a retry sends the scope of the first try in the order it was sent, whatever order the episodes are given in now (Gym version A compares an in-flight scope in order)', async () => {
    const fleet = await preparedFleet('c1')
    const {c} = await look(fleet)
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const root = await tempDir()
    const [s, r, q] = ['s', 'r', 'q'].map((id) => ({rolloutId: id, attempt: 0}))
    const plan = {checkpointId: 'c1', root, restarts: [], deadlineTs: soon(), rememberScope: true}
    await expect(commitAndPublish(c, {...plan, episodes: [s, q, r]})).rejects.toThrow(/agent: HTTP 500/)
    expect(JSON.parse(await readFile(path.join(root, 'c1', SCOPE_RECORD), 'utf8'))).toEqual({checkpoint_id: 'c1', given: ['q', 'r', 's'], scope: ['s', 'q', 'r']})
    const scopes = (server: string) =>
      fleet
        .server(server)
        .journal.filter((j) => j.route === 'commit')
        .map((j) => (JSON.parse(j.body) as {episode_ids: {rollout_id: string}[]}).episode_ids.map((e) => e.rollout_id))
    // The same set in another order.
    await commitAndPublish(c, {...plan, episodes: [r, s, q], committedOn: ['env', 'policy', 'res']})
    // env committed on the first try and takes the retry as a replay; agent commits it now.
    expect(scopes('env')).toEqual([
      ['s', 'q', 'r'],
      ['s', 'q', 'r'],
    ])
    expect(scopes('agent')).toEqual([['s', 'q', 'r']])
  })

  it('a retry whose episodes differ from the first try only by a restart reported since: the same scope, in any order of the record, is accepted', async () => {
    const fleet = await preparedFleet('c1')
    const {c} = await look(fleet)
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const root = await tempDir()
    const [s, q, r, t] = ['s', 'q', 'r', 't'].map((id) => ({rolloutId: id, attempt: 0}))
    const plan = {checkpointId: 'c1', root, deadlineTs: soon(), rememberScope: true}
    await expect(commitAndPublish(c, {...plan, episodes: [s, q, r], restarts: []})).rejects.toThrow(/agent: HTTP 500/)
    // The record keeps the scope as sent (not sorted), so only a sorted comparison finds it equal.
    expect(JSON.parse(await readFile(path.join(root, 'c1', SCOPE_RECORD), 'utf8'))).toEqual({checkpoint_id: 'c1', given: ['q', 'r', 's'], scope: ['s', 'q', 'r']})
    // Now t is given too, but it is a restart: the scope is the same set, the given list is not.
    const out = await commitAndPublish(c, {...plan, episodes: [s, q, r, t], restarts: [t], committedOn: ['env', 'policy', 'res']})
    expect(out.published).toBe(true)
    expect(out.continued).toEqual([s, q, r])
  })

  it('a scope record of another checkpoint in the directory is no first try of this one: the commit goes on and records its own', async () => {
    const fleet = await preparedFleet('c1')
    const {c} = await look(fleet)
    const root = await tempDir()
    await mkdir(path.join(root, 'c1'), {recursive: true})
    await writeScopeRecord(path.join(root, 'c1'), {checkpoint_id: 'c0', given: ['x'], scope: ['x']})
    const out = await commitAndPublish(c, {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon(), rememberScope: true})
    expect(out.published).toBe(true)
    expect(JSON.parse(await readFile(path.join(root, 'c1', SCOPE_RECORD), 'utf8'))).toEqual({checkpoint_id: 'c1', given: [], scope: []})
  })

  it('a retry into another directory than the first try (another --root) is refused before sending when some participant committed', async () => {
    const fleet = await preparedFleet('c1')
    const {c} = await look(fleet)
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const plan = {checkpointId: 'c1', episodes: [], restarts: [], deadlineTs: soon(), rememberScope: true}
    await expect(commitAndPublish(c, {...plan, root: await tempDir()})).rejects.toThrow(/agent: HTTP 500/)
    const before = sent(fleet)
    const elsewhere = await tempDir()
    const err = await caught(commitAndPublish(c, {...plan, root: elsewhere, committedOn: ['env', 'policy', 'res']}))
    expect(err.message).toBe(
      `env, policy, res already committed 'c1', but ${path.join(elsewhere, 'c1')} holds no record of that first try: a retry must commit into the first try's directory (the same --root, as an absolute path); nothing was sent`,
    )
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(sent(fleet)).toEqual(before)
  })

  it('an unscoped first try (no policy model): an unscoped retry sends no scope again; a scoped one is refused, and so is an unscoped retry of a scoped try', async () => {
    const fleet = await preparedFleet('c1')
    const {c: full} = await look(fleet)
    const c: Coordinator = {...full, participants: full.participants.filter((p) => p.kind !== 'model')}
    const plan = {checkpointId: 'c1', restarts: [], deadlineTs: soon(), rememberScope: true}
    const root = await tempDir()
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    await expect(commitAndPublish(c, {...plan, root, episodes: null})).rejects.toThrow(/agent: HTTP 500/)
    expect(JSON.parse(await readFile(path.join(root, 'c1', SCOPE_RECORD), 'utf8'))).toEqual({checkpoint_id: 'c1', given: null, scope: null})
    const scoped = await caught(commitAndPublish(c, {...plan, root, episodes: [{rolloutId: 'r', attempt: 0}], committedOn: ['env', 'res']}))
    expect(scoped.message).toMatch(/^checkpoint 'c1' was first committed \(in part\) with no scope; a retry must give the same episodes/)
    const out = await commitAndPublish(c, {...plan, root, episodes: null, committedOn: ['env', 'res']})
    expect(out.published).toBe(true)
    // The other way round, on a fresh checkpoint: a scoped first try, retried without a scope.
    const other = await tempDir()
    await resume(full, 'c1', soon())
    await prepareOrAbort(c, 'c2', soon())
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    await expect(commitAndPublish(c, {...plan, checkpointId: 'c2', root: other, episodes: []})).rejects.toThrow(/agent: HTTP 500/)
    const unscoped = await caught(commitAndPublish(c, {...plan, checkpointId: 'c2', root: other, episodes: null, committedOn: ['env', 'res']}))
    expect(unscoped.message).toMatch(/^checkpoint 'c2' was first committed \(in part\) with another list of 0 episode\(s\)/)
  })

  it('a scope record that cannot be read: invalid_checkpoint naming the directory and the cause; nothing was sent', async () => {
    const fleet = await preparedFleet('c1')
    const {c} = await look(fleet)
    const root = await tempDir()
    await mkdir(path.join(root, 'c1', SCOPE_RECORD), {recursive: true})
    const before = sent(fleet)
    const err = await caught(commitAndPublish(c, {checkpointId: 'c1', root, episodes: [], restarts: [], deadlineTs: soon(), rememberScope: true}))
    expect(err.code).toBe('invalid_checkpoint')
    expect(err.message).toMatch(new RegExp(`^cannot read the scope of an earlier try in ${path.join(root, 'c1')}: .*EISDIR.*; nothing was sent$`))
    expect(sent(fleet)).toEqual(before)
  })

  it('without a record (the one-shot path), a conflicting retry names what it sent', async () => {
    const fleet = await preparedFleet('c1')
    const {c} = await look(fleet)
    fleet.server('agent').faults.add('commit', {type: 'status', status: 500})
    const root = await tempDir()
    const q = {rolloutId: 'q', attempt: 0}
    await expect(commitAndPublish(c, {checkpointId: 'c1', root, episodes: [q], restarts: [q], deadlineTs: soon()})).rejects.toThrow(/agent: HTTP 500/)
    const err = (await commitAndPublish(c, {checkpointId: 'c1', root, episodes: [q], restarts: [], deadlineTs: soon()}).catch((e: unknown) => e)) as CoordinationError
    expect(err.failures.filter((f) => f.code === 'checkpoint_conflict').map((f) => f.server)).toEqual(['env', 'policy', 'res'])
    expect(err.message).toMatch(/\. a retry of a commit must send the directory and scope of the first try: this one sent \S+c1 and 1 episode\(s\)$/)
  })

  it('no checkpoint open: fleet_state, next step prepare (with the root named again), nothing sent', async () => {
    const fleet = await startFleet({members: FULL})
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon(), again: ['--root', '/ckpt']}))
    expect(err.code).toBe('fleet_state')
    expect(err.message).toMatch(/no participant has an open checkpoint/)
    expect(err.message).toMatch(/nothing was sent/)
    expect(err.next).toEqual([nextStep('prepare', ['--root', '/ckpt'])])
    expect(sent(fleet)).toEqual({env: [], policy: [], agent: [], res: [], judge: []})
  })

  it('several checkpoints open: fleet_state naming each, a resume of each as next steps, nothing sent, phases kept', async () => {
    const fleet = await startFleet({members: FULL})
    for (const [n, id] of [
      ['env', 'a'],
      ['policy', 'b'],
      ['agent', 'b'],
    ])
      expect((await control(fleet.server(n!).url, 'prepare', {checkpoint_id: id, deadline_ts: soon()})).json.phase).toBe('prepared')
    const before = sent(fleet)
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err.code).toBe('fleet_state')
    expect(err.message).toMatch(/participants hold different checkpoints \(a, b\)/)
    expect(err.message).toMatch(/nothing was sent/)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'a']), nextStep('resume', ['--id', 'b'])])
    expect(sent(fleet)).toEqual(before)
    expect(await phases(fleet)).toEqual({env: 'prepared a', policy: 'prepared b', agent: 'prepared b', res: 'idle'})
  })

  it('a participant still preparing (one of two of its kind): fleet_state naming only it with its phase; nothing sent, the fleet stays as it was', async () => {
    const fleet = await startFleet({
      members: [
        {name: 'env', kind: 'environment'},
        {name: 'policy', kind: 'model'},
        {name: 'res1', kind: 'resources'},
        {name: 'res2', kind: 'resources'},
      ],
    })
    fleet.server('res1').participant!.stuckBlockers = ['held-1']
    const {c: c0} = await look(fleet)
    // What `prepare --keep-closed` leaves after a missed deadline: every stage reached, one not ready.
    const prep = await prepare(c0, 'c1', Date.now() / 1000 + 0.3)
    expect(prep.prepared).toBe(false)
    const before = sent(fleet)
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err.code).toBe('fleet_state')
    expect(err.message).toMatch(/not prepared under 'c1': res1 \(preparing of 'c1'\); nothing was sent/)
    expect(err.message).not.toMatch(/res2|env|policy/)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(sent(fleet)).toEqual(before)
    expect(await phases(fleet, ['env', 'policy', 'res1', 'res2'])).toEqual({env: 'prepared c1', policy: 'prepared c1', res1: 'preparing c1', res2: 'prepared c1'})
  })

  it('--id naming a checkpoint no one holds: every participant named with its phase (and the checkpoint it does hold); nothing sent', async () => {
    const fleet = await preparedFleet('c1')
    const before = sent(fleet)
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {id: 'c9', deadlineTs: soon()}))
    expect(err.code).toBe('fleet_state')
    for (const n of PARTICIPANTS) expect(err.message).toContain(`${n} (prepared of 'c1')`)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c9'])])
    expect(sent(fleet)).toEqual(before)
    expect(await phases(fleet)).toEqual({env: 'prepared c1', policy: 'prepared c1', agent: 'prepared c1', res: 'prepared c1'})
  })

  it('a member down while no one reachable holds the checkpoint: discovery error naming it, next a commit again with the root; nothing sent', async () => {
    const fleet = await startFleet({members: FULL})
    await fleet.server('agent').crash()
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {id: 'c1', deadlineTs: soon(), again: ['--root', '/ckpt']}))
    expect(err).toBeInstanceOf(CoordinationError)
    expect(err.code).toBe('discovery')
    expect((err as CoordinationError).operation).toBe('discover')
    expect((err as CoordinationError).failures.map((f) => f.server)).toEqual(['agent'])
    expect(err.message).toMatch(/nothing was sent/)
    expect(err.next).toEqual([nextStep('commit', ['--id', 'c1', '--root', '/ckpt'])])
    // The episode flags are repeated after the root's (here none).
    const scoped = await caught(preparedForCommit(c, d, {id: 'c1', deadlineTs: soon(), scopeArgs: ['--episodes', 'a,b']}))
    expect(scoped.next).toEqual([nextStep('commit', ['--id', 'c1', '--episodes', 'a,b'])])
    const after = sent(fleet)
    expect({env: after.env, policy: after.policy, res: after.res}).toEqual({env: [], policy: [], res: []})
  })

  it('a holder down: the checkpoint is closed on every reachable participant, then a discovery error names it; nothing committed', async () => {
    const fleet = await preparedFleet('c1')
    await fleet.server('agent').crash()
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err).not.toBeInstanceOf(CoordinationError)
    expect(err.code).toBe('discovery')
    expect(err.details).toMatchObject({checkpoint_id: 'c1', unreachable: [{server: 'agent'}], lost: []})
    expect((err.details as {unreachable: unknown[]}).unreachable).toHaveLength(1)
    expect(err.message).toMatch(/^checkpoint 'c1' cannot be committed: agent is down/)
    expect(err.message).toMatch(/nothing was committed; every reachable participant was resumed; agent reopen/)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(await phases(fleet, ['env', 'policy', 'res'])).toEqual({env: 'idle', policy: 'idle', res: 'idle'})
    for (const n of ['env', 'policy', 'res']) expect(sent(fleet)[n]).toEqual(['prepare', 'resume'])
    // Closed for good: a late prepare of c1 is refused.
    expect((await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'c1', deadline_ts: soon()})).json.error.code).toBe('stale_checkpoint')
  })

  it('a participant restarted empty while the others hold the checkpoint: closed everywhere, then a participant error naming it', async () => {
    const fleet = await preparedFleet('c1')
    await restartEmpty(fleet, 'res', 'resources')
    const {c, d} = await look(fleet)
    expect(d.failures).toEqual([])
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon(), again: ['--root', '/ckpt']}))
    expect(err.code).toBe('participant')
    expect(err.details).toEqual({checkpoint_id: 'c1', unreachable: [], lost: ['res']})
    expect(err.message).toMatch(/^checkpoint 'c1' cannot be committed: res holds no checkpoint/)
    expect(err.message).toMatch(/nothing was committed; the fleet was resumed \(checkpoint 'c1' is closed for good\)/)
    // Resumed everywhere: nothing is left for the operator to run but a new checkpoint.
    expect(err.next).toEqual([])
    expect(await phases(fleet)).toEqual({env: 'idle', policy: 'idle', agent: 'idle', res: 'idle'})
    expect((await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'c1', deadline_ts: soon()})).json.error.code).toBe('stale_checkpoint')
  })

  it('the policy model restarted without checkpoint routes: the checkpoint cannot be committed without it; closed on the others, a discovery error', async () => {
    const fleet = await preparedFleet('c1')
    await restartEmpty(fleet, 'policy', 'none')
    const {c, d} = await look(fleet)
    expect(d.failures.map((f) => f.code)).toEqual(['no_model'])
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err.code).toBe('discovery')
    expect(err.message).toMatch(/^checkpoint 'c1' cannot be committed: no policy model takes part any more/)
    // Nothing is down to reopen by itself: the fleet was resumed, and nothing is left to run but a new checkpoint.
    expect(err.message).toMatch(/nothing was committed; the fleet was resumed \(checkpoint 'c1' is closed for good\)/)
    expect(err.message).not.toMatch(/reopen/)
    expect(err.next).toEqual([])
    expect(await phases(fleet, ['env', 'agent', 'res'])).toEqual({env: 'idle', agent: 'idle', res: 'idle'})
    for (const n of ['env', 'agent', 'res']) expect(sent(fleet)[n]).toEqual(['prepare', 'resume'])
  })

  it('a prepare left closed for inspection (a stage still preparing, later ones never reached): not prepared, nothing sent, left as it is', async () => {
    const fleet = await startFleet({members: FULL})
    const {c} = await look(fleet)
    fleet.server('policy').participant!.stuckBlockers = ['b']
    await caught(prepareOrAbort(c, 'c1', Date.now() / 1000 + 0.6, {keepClosed: true}))
    const before = await phases(fleet)
    expect(before).toEqual({env: 'prepared c1', policy: 'preparing c1', agent: 'idle', res: 'idle'})
    const sentBefore = sent(fleet)
    const {c: c2, d} = await look(fleet)
    const err = await caught(preparedForCommit(c2, d, {deadlineTs: soon()}))
    expect(err.code).toBe('fleet_state')
    expect(err.message).toMatch(/^not prepared under 'c1': policy \(preparing of 'c1'\), agent \(idle\), res \(idle\); nothing was sent$/)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(sent(fleet)).toEqual(sentBefore)
    expect(await phases(fleet)).toEqual(before)
    fleet.server('policy').participant!.stuckBlockers = []
  })

  it('a participant restarted empty and the close failing on another: the failing server named, next a resume of the checkpoint', async () => {
    const fleet = await preparedFleet('c1')
    await restartEmpty(fleet, 'agent', 'agent')
    fleet.server('policy').faults.add('resume', {type: 'status', status: 500})
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err.code).toBe('participant')
    expect(err.details).toEqual({checkpoint_id: 'c1', unreachable: [], lost: ['agent']})
    expect(err.message).toMatch(/resuming 'c1' failed on policy \(HTTP 500/)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(await phases(fleet)).toEqual({env: 'idle', policy: 'prepared c1', agent: 'idle', res: 'idle'})
  })

  it('a holder down and the close failing on another: both named; next a resume of the checkpoint', async () => {
    const fleet = await preparedFleet('c1')
    await fleet.server('agent').crash()
    fleet.server('env').faults.add('resume', {type: 'status', status: 503})
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err.code).toBe('discovery')
    expect(err.message).toMatch(/agent is down/)
    expect(err.message).toMatch(/resuming 'c1' failed on env \(HTTP 503/)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(await phases(fleet, ['env', 'policy', 'res'])).toEqual({env: 'prepared c1', policy: 'idle', res: 'idle'})
  })

  it('one holder down and another restarted empty: a discovery error with both in its details', async () => {
    const fleet = await preparedFleet('c1')
    await fleet.server('agent').crash()
    await restartEmpty(fleet, 'res', 'resources')
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err.code).toBe('discovery')
    expect(err.details).toMatchObject({checkpoint_id: 'c1', unreachable: [{server: 'agent'}], lost: ['res']})
    expect(err.message).toMatch(/agent is down .*; res holds no checkpoint/)
    expect(await phases(fleet, ['env', 'policy', 'res'])).toEqual({env: 'idle', policy: 'idle', res: 'idle'})
  })
})

describe('resumeFleet', () => {
  it('resumes the one active checkpoint everywhere by default, reverse order, and says how many reopened', async () => {
    const fleet = await preparedFleet('c1')
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out.error).toBeNull()
    expect(out.checkpointId).toBe('c1')
    expect(out.active).toEqual(['c1'])
    expect(out.reopened).toBe(4)
    expect(out.failures).toEqual([])
    expect(out.unreachable).toEqual([])
    expect([...out.replies.keys()].sort()).toEqual([...PARTICIPANTS].sort())
    const at = (n: string) => fleet.server(n).journal.find((j) => j.route === 'resume')!.at
    expect(['env', 'policy', 'agent', 'res'].sort((x, y) => at(x) - at(y))).toEqual(['res', 'agent', 'policy', 'env'])
    expect(await phases(fleet)).toEqual({env: 'idle', policy: 'idle', agent: 'idle', res: 'idle'})
  })

  it('no active checkpoint and no --id: checkpointId null, nothing sent, no error', async () => {
    const fleet = await startFleet({members: FULL})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out).toMatchObject({checkpointId: null, reopened: 0, active: [], unreachable: [], failures: [], error: null})
    expect(out.replies.size).toBe(0)
    expect(sent(fleet)).toEqual({env: [], policy: [], agent: [], res: [], judge: []})
  })

  it('--id that no one had open: every participant answers, none reopened, and the ID is fenced', async () => {
    const fleet = await startFleet({members: FULL})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {id: 'old', deadlineTs: soon()})
    expect(out.error).toBeNull()
    expect(out.checkpointId).toBe('old')
    expect(out.reopened).toBe(0)
    expect(out.replies.size).toBe(4)
    expect([...out.replies.values()].every((r) => r.idempotent)).toBe(true)
    expect((await control(fleet.server('policy').url, 'prepare', {checkpoint_id: 'old', deadline_ts: soon()})).json.error.code).toBe('stale_checkpoint')
  })

  it('several active and no --id: input error with a resume of each as next steps; nothing sent', async () => {
    const fleet = await startFleet({members: FULL})
    await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'b', deadline_ts: soon()})
    const before = sent(fleet)
    const {c, d} = await look(fleet)
    const err = await caught(resumeFleet(c, d, {deadlineTs: soon()}))
    expect(err.code).toBe('input')
    expect(err.message).toMatch(/several active checkpoints \(a, b\)/)
    expect(err.next).toEqual([nextStep('resume', ['--id', 'a']), nextStep('resume', ['--id', 'b'])])
    expect(sent(fleet)).toEqual(before)
    expect(await phases(fleet)).toEqual({env: 'prepared a', policy: 'idle', agent: 'idle', res: 'prepared b'})
  })

  it('--id of one of several: the others refuse with checkpoint_conflict, and the error points at the checkpoint they hold', async () => {
    const fleet = await startFleet({members: FULL})
    await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'b', deadline_ts: soon()})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {id: 'a', deadlineTs: soon()})
    expect(out.checkpointId).toBe('a')
    expect(out.reopened).toBe(1)
    expect(out.failures).toEqual([expect.objectContaining({server: 'res', status: 409, code: 'checkpoint_conflict'})])
    expect(out.error).toBeInstanceOf(CoordinationError)
    expect(out.error!.code).toBe('participant')
    expect(out.error!.operation).toBe('resume')
    expect(out.error!.message).toMatch(/res: HTTP 409 checkpoint_conflict/)
    expect(out.error!.message).toMatch(/hold another checkpoint \(b\)/)
    expect(out.error!.next).toEqual([nextStep('resume', ['--id', 'b'])])
    expect(await phases(fleet)).toEqual({env: 'idle', policy: 'idle', agent: 'idle', res: 'prepared b'})
  })

  it('a conflict with a checkpoint opened after discovery (none other active then): next is a resume of the same ID', async () => {
    const fleet = await startFleet({members: FULL})
    await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    const {c, d} = await look(fleet)
    // Another controller gets in between the discovery and the resume.
    await control(fleet.server('policy').url, 'prepare', {checkpoint_id: 'b', deadline_ts: soon()})
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out.checkpointId).toBe('a')
    expect(out.failures.map((f) => [f.server, f.code])).toEqual([['policy', 'checkpoint_conflict']])
    expect(out.error!.message).not.toMatch(/hold another checkpoint/)
    expect(out.error!.next).toEqual([nextStep('resume', ['--id', 'a'])])
  })

  it('a failure that is no conflict, with another checkpoint open at discovery: the advice is to resume the same ID again', async () => {
    const fleet = await startFleet({members: FULL})
    await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'b', deadline_ts: soon()})
    const {c, d} = await look(fleet)
    // Another controller closes b in between; env then fails for its own reason.
    await control(fleet.server('res').url, 'resume', {checkpoint_id: 'b', deadline_ts: soon()})
    fleet.server('env').faults.add('resume', {type: 'status', status: 500})
    const out = await resumeFleet(c, d, {id: 'a', deadlineTs: soon()})
    expect(out.active).toEqual(['a', 'b'])
    expect(out.failures.map((f) => [f.server, f.status])).toEqual([['env', 500]])
    expect(out.error!.message).not.toMatch(/hold another checkpoint/)
    expect(out.error!.message).toMatch(/resume 'a' again/)
    expect(out.error!.next).toEqual([nextStep('resume', ['--id', 'a'])])
  })

  it('a participant failing its resume: the others are resumed (past it, in every stage), the error names it, and resuming again finishes', async () => {
    const fleet = await preparedFleet('c1')
    fleet.server('agent').faults.add('resume', {type: 'status', status: 500})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out.checkpointId).toBe('c1')
    expect(out.reopened).toBe(3)
    expect(out.failures).toEqual([expect.objectContaining({server: 'agent', status: 500})])
    expect(out.error).toBeInstanceOf(CoordinationError)
    expect(out.error!.code).toBe('participant')
    expect(out.error!.message).toMatch(/^checkpoint resume failed on 1 participant\(s\): agent: HTTP 500/)
    expect(out.error!.message).toMatch(/resume 'c1' again/)
    expect(out.error!.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(await phases(fleet)).toEqual({env: 'idle', policy: 'idle', agent: 'prepared c1', res: 'idle'})
    const {c: c2, d: d2} = await look(fleet)
    const again = await resumeFleet(c2, d2, {deadlineTs: soon()})
    expect(again).toMatchObject({checkpointId: 'c1', reopened: 1, error: null})
    expect(await phases(fleet)).toEqual({env: 'idle', policy: 'idle', agent: 'idle', res: 'idle'})
  })

  it('a resume whose reply was lost and that was sent again (answered idempotent) still counts as reopened', async () => {
    const fleet = await preparedFleet('c1')
    // The first resume lands, then its connection drops: the client sends it once more.
    fleet.server('agent').faults.add('resume', {type: 'drop-after'})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(fleet.server('agent').journal.filter((j) => j.route === 'resume')).toHaveLength(2)
    expect(out.replies.get('agent')).toMatchObject({phase: 'idle', idempotent: true})
    expect(out).toMatchObject({checkpointId: 'c1', reopened: 4, error: null})
    // A participant that had nothing open under the ID is still not counted.
    await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'c2', deadline_ts: soon()})
    const {c: c2, d: d2} = await look(fleet)
    expect(await resumeFleet(c2, d2, {deadlineTs: soon()})).toMatchObject({checkpointId: 'c2', reopened: 1, error: null})
  })

  it('a member down: every reachable one resumed, the error names the one down and when the lease runs out', async () => {
    const fleet = await preparedFleet('c1')
    await fleet.server('policy').crash()
    const {c, d} = await look(fleet)
    const lease = Math.max(...d.participants.map((p) => p.status.lease_expires_at ?? 0))
    expect(lease).toBeGreaterThan(Date.now() / 1000)
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out.checkpointId).toBe('c1')
    expect(out.reopened).toBe(3)
    expect(out.failures).toEqual([])
    expect(out.unreachable.map((f) => f.server)).toEqual(['policy'])
    expect(out.error).toBeInstanceOf(CoordinationError)
    expect(out.error!.code).toBe('discovery')
    expect(out.error!.failures.map((f) => f.server)).toEqual(['policy'])
    expect(out.error!.message).toContain(`every reachable participant was resumed under 'c1'`)
    expect(out.error!.message).toContain(new Date(lease * 1000).toISOString())
    expect(out.error!.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(await phases(fleet, ['env', 'agent', 'res'])).toEqual({env: 'idle', agent: 'idle', res: 'idle'})
  })

  it('the policy model gone from the checkpoint (its server restarted without checkpoint routes): not a member down; the others are resumed, no error', async () => {
    const fleet = await preparedFleet('c1')
    await restartEmpty(fleet, 'policy', 'none')
    const {c, d} = await look(fleet)
    expect(d.failures.map((f) => f.code)).toEqual(['no_model'])
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out).toMatchObject({checkpointId: 'c1', reopened: 3, unreachable: [], failures: [], error: null})
    expect(await phases(fleet, ['env', 'agent', 'res'])).toEqual({env: 'idle', agent: 'idle', res: 'idle'})
  })

  it('a member down and another failing its resume: the one error names both, and the others are resumed', async () => {
    const fleet = await preparedFleet('c1')
    await fleet.server('res').crash()
    fleet.server('agent').faults.add('resume', {type: 'status', status: 500})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out.failures.map((f) => f.server)).toEqual(['agent'])
    expect(out.unreachable.map((f) => f.server)).toEqual(['res'])
    expect(out.error!.failures.map((f) => f.server)).toEqual(['agent', 'res'])
    expect(out.error!.message).toMatch(/down, reopening when their lease expires: res \(/)
    expect(out.error!.next).toEqual([nextStep('resume', ['--id', 'c1'])])
    expect(await phases(fleet, ['env', 'policy', 'agent'])).toEqual({env: 'idle', policy: 'idle', agent: 'prepared c1'})
  })

  it('a member down and nothing active: nothing sent, the error names it with no resume to suggest', async () => {
    const fleet = await startFleet({members: FULL})
    await fleet.server('res').crash()
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out.checkpointId).toBeNull()
    expect(out.replies.size).toBe(0)
    expect(out.error!.code).toBe('discovery')
    expect(out.error!.failures.map((f) => f.server)).toEqual(['res'])
    expect(out.error!.next).toEqual([])
    expect(out.error!.message).toMatch(/\. every reachable participant was resumed; the ones down reopen by themselves when their lease expires, or resume again once they are back$/)
    expect(sent(fleet)).toMatchObject({env: [], policy: [], agent: []})
  })
})

// Rules the first Stryker run over the whole of controller.ts (2026-12-05) found untested.
describe('resumeFleet and preparedForCommit: the details of their errors', () => {
  it('a conflict and another failure in one resume: the error points at the checkpoint held elsewhere and at resuming this one again', async () => {
    const fleet = await startFleet({members: FULL})
    await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    await control(fleet.server('agent').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'b', deadline_ts: soon()})
    fleet.server('agent').faults.add('resume', {type: 'status', status: 503})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {id: 'a', deadlineTs: soon()})
    expect(out.failures.map((f) => [f.server, f.code ?? f.status])).toEqual([
      ['res', 'checkpoint_conflict'],
      ['agent', 503],
    ])
    expect(out.error!.message).toMatch(/those refusing with checkpoint_conflict hold another checkpoint \(b\); resume that one .*; the other participants were resumed; resume 'a' again$/)
    // Both are needed: res stays closed under b, agent under a.
    expect(out.error!.next).toEqual([nextStep('resume', ['--id', 'b']), nextStep('resume', ['--id', 'a'])])
    expect(await phases(fleet)).toEqual({env: 'idle', policy: 'idle', agent: 'prepared a', res: 'prepared b'})
  })

  it('conflicts with two other checkpoints: both named, a resume of each', async () => {
    const fleet = await startFleet({members: FULL})
    await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    await control(fleet.server('agent').url, 'prepare', {checkpoint_id: 'c', deadline_ts: soon()})
    await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'b', deadline_ts: soon()})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {id: 'a', deadlineTs: soon()})
    // In the fleet's order of their holders (agent, then res).
    expect(out.error!.message).toMatch(/hold another checkpoint \(c, b\); resume that one if no controller is still working on it$/)
    expect(out.error!.next).toEqual([nextStep('resume', ['--id', 'c']), nextStep('resume', ['--id', 'b'])])
  })

  it('two members down next to a failure: each named with its reason, separated by commas', async () => {
    const fleet = await preparedFleet('c1')
    await fleet.server('agent').crash()
    await fleet.server('res').crash()
    fleet.server('env').faults.add('resume', {type: 'status', status: 500})
    const {c, d} = await look(fleet)
    const out = await resumeFleet(c, d, {deadlineTs: soon()})
    expect(out.error!.message).toMatch(
      /\. the other participants were resumed; resume 'c1' again; down, reopening when their lease expires: agent \(connection refused .+\), res \(connection refused .+\)$/,
    )
  })

  it('the lease a member down runs to is that of the checkpoint resumed, not of one another participant held at discovery', async () => {
    const fleet = await startFleet({members: FULL})
    await control(fleet.server('env').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    await control(fleet.server('agent').url, 'prepare', {checkpoint_id: 'a', deadline_ts: soon()})
    await control(fleet.server('res').url, 'prepare', {checkpoint_id: 'b', deadline_ts: soon(3600)})
    await fleet.server('agent').crash()
    const {c, d} = await look(fleet)
    const leaseA = d.participants.find((p) => p.server === 'env')!.status.lease_expires_at!
    const leaseB = d.participants.find((p) => p.server === 'res')!.status.lease_expires_at!
    expect(leaseB).toBeGreaterThan(leaseA + 3000)
    // Another controller closes b in between: res then answers the resume of a (idempotent).
    await control(fleet.server('res').url, 'resume', {checkpoint_id: 'b', deadline_ts: soon()})
    const out = await resumeFleet(c, d, {id: 'a', deadlineTs: soon()})
    expect(out.failures).toEqual([])
    expect(out.replies.get('res')).toMatchObject({idempotent: true})
    // Only env had a open: res held b, and its idempotent answer reopened nothing.
    expect(out.reopened).toBe(1)
    expect(out.error!.message).toBe(
      `checkpoint discover failed on 1 participant(s): agent: ${failureMessage(out.error!.failures[0]!)}. every reachable participant was resumed under 'a'; the ones down reopen by themselves when their lease expires (the others' lease ran to ${new Date(leaseA * 1000).toISOString()}), or resume again once they are back`,
    )
  })

  it('a commit with no checkpoint open anywhere and no root arguments: the suggested prepare has no arguments', async () => {
    const fleet = await startFleet({members: FULL})
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err.code).toBe('fleet_state')
    expect(err.next).toEqual([nextStep('prepare', [])])
  })

  it('two holders down while the others are prepared: the reachable ones are resumed and both down are named in one list', async () => {
    const fleet = await preparedFleet('c1')
    await fleet.server('agent').crash()
    await fleet.server('res').crash()
    const {c, d} = await look(fleet)
    const err = await caught(preparedForCommit(c, d, {deadlineTs: soon()}))
    expect(err.message).toMatch(/; every reachable participant was resumed; agent, res reopen\(s\) by itself when its lease expires, or resume again once it is back\. /)
  })
})
