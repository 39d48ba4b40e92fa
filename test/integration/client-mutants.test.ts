// The control client as a participant sees it (requests on the wire) and as the controller sees it
// (results, failures and their messages), against participant doubles on 127.0.0.1 that answer
// whatever a test gives them (tests of StrykerJS's surviving mutants of client.ts).
import {getEventListeners} from 'node:events'
import http from 'node:http'
import {AddressInfo} from 'node:net'

import {errors as undiciErrors} from 'undici'
import {describe, expect, it} from 'vitest'

import {CallResult, ControlClient, describeTransportError, isConnectionFailure, nestedDeeperThan, readCapped} from '../../src/coordination/client.js'
import {Operation} from '../../src/protocol/wire.js'
import {TOKEN, later, waitFor} from '../helpers/fleet.js'
import {freePort} from '../helpers/ports.js'

interface Seen {
  method: string
  url: string
  headers: http.IncomingHttpHeaders
  body: Buffer
  at: number
}

type Act = {status?: number; body: string | Buffer} | 'drop' | 'hang' | ((res: http.ServerResponse) => void)

/** A participant double: `answer(seen, n)` says how to answer its n-th request (0-based); closed after the test. */
async function participant(answer: (seen: Seen, n: number) => Act): Promise<{url: string; seen: Seen[]; connections: () => number}> {
  const seen: Seen[] = []
  let connections = 0
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const s = {method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks), at: Date.now()}
      seen.push(s)
      const act = answer(s, seen.length - 1)
      if (act === 'hang') return
      if (act === 'drop') return void req.socket.destroy()
      if (typeof act === 'function') return act(res)
      res.writeHead(act.status ?? 200, {'content-type': 'application/json'})
      res.end(act.body)
    })
  })
  server.on('connection', () => connections++)
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()))
  later(async () => {
    server.closeAllConnections()
    await new Promise((r) => server.close(r))
  })
  return {url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen, connections: () => connections}
}

function client(opts: {grace?: number; connections?: number} = {}): ControlClient {
  const c = new ControlClient({token: TOKEN, replyGraceSeconds: opts.grace, connections: opts.connections})
  later(() => c.close())
  return c
}

const report = {ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: []}
const STATUS = {kind: 'model', instance: 'p', phase: 'idle', checkpoint_id: null, lease_expires_at: null, retired_rollouts: 0, report}
const manifest = {schema_version: 1, kind: 'model', instance: 'p', checkpoint_id: 'c', records_file: 'r', records_sha256: '0'.repeat(64), record_count: 0}
const REPLIES: Record<Operation, unknown> = {
  prepare: {phase: 'prepared', report},
  renew: {lease_expires_at: 1},
  resume: {phase: 'idle'},
  retire: {retired_count: 0},
  forget: {forgotten_count: 0},
  commit: {phase: 'committed', manifest, episode_ids: []},
  restore: {phase: 'restored', source_checkpoint_id: 'c', restored: []},
}
const ok = (v: unknown): Act => ({body: JSON.stringify(v)})
const later10 = () => Date.now() / 1000 + 10
const body = Buffer.from('{"checkpoint_id":"c","deadline_ts":1}')

describe('the client', () => {
  it('needs a token, and sends it as a bearer token', async () => {
    expect(() => new ControlClient({token: ''})).toThrow(new Error('a control token is required'))
    const p = await participant(() => ok(STATUS))
    expect((await client().status({name: 'p', url: p.url}, 5000)).ok).toBe(true)
    expect(p.seen[0]!.headers.authorization).toBe(`Bearer ${TOKEN}`)
  })

  it('gives a call the time left to its deadline plus the grace (5 s unless told)', () => {
    expect(client().timeoutMs(0)).toBe(5000)
    const c = client({grace: 2})
    expect(c.timeoutMs(0)).toBe(2000)
    const t = c.timeoutMs(Date.now() / 1000 + 10)
    expect(t).toBeGreaterThan(11_000)
    expect(t).toBeLessThanOrEqual(12_000)
  })

  it('once closed sends nothing more, and can be closed twice', async () => {
    const p = await participant(() => ok(STATUS))
    const c = new ControlClient({token: TOKEN})
    expect((await c.status({name: 'p', url: p.url}, 5000)).ok).toBe(true)
    await c.close()
    const r = await c.status({name: 'p', url: p.url}, 5000)
    expect(r).toMatchObject({ok: false, failure: {server: 'p', status: null, code: 'connection'}})
    expect(p.seen.length).toBe(1)
    await expect(c.close()).resolves.toBeUndefined()
  })

  it('GETs status with no body and POSTs an operation with its exact bytes, under the checkpoint routes', async () => {
    const p = await participant((s) => ok(s.method === 'GET' ? STATUS : REPLIES.prepare))
    const c = client()
    const st = await c.status({name: 'p', url: p.url + '/'}, 5000)
    expect(st).toEqual({ok: true, server: 'p', reply: STATUS})
    const r = await c.call({name: 'p', url: p.url + '/'}, 'prepare', body, later10())
    expect(r).toEqual({ok: true, server: 'p', reply: {phase: 'prepared', report}})
    expect(p.seen.map((s) => [s.method, s.url])).toEqual([
      ['GET', '/ng-control/v1/checkpoint/status'],
      ['POST', '/ng-control/v1/checkpoint/prepare'],
    ])
    expect(p.seen[0]!.headers['content-type']).toBeUndefined()
    expect(p.seen[0]!.body.length).toBe(0)
    expect(p.seen[1]!.headers['content-type']).toBe('application/json')
    expect(p.seen[1]!.headers.authorization).toBe(`Bearer ${TOKEN}`)
    expect(p.seen[1]!.body.equals(body)).toBe(true)
  })

  it('keeps at most `connections` connections to one participant (8 unless told)', async () => {
    for (const [n, want] of [
      [undefined, 8],
      [2, 2],
    ] as const) {
      const held: http.ServerResponse[] = []
      const p = await participant(() => (res) => void held.push(res))
      const c = client({connections: n})
      const calls = Array.from({length: want + 2}, () => c.status({name: 'p', url: p.url}, 20_000))
      await waitFor(() => held.length === want, 10_000, `${want} requests`)
      await new Promise((r) => setTimeout(r, 300))
      expect(held.length).toBe(want)
      expect(p.connections()).toBe(want)
      const release = () => {
        for (const res of held.splice(0)) res.writeHead(200, {'content-type': 'application/json'}).end(JSON.stringify(STATUS))
      }
      release()
      await waitFor(
        () => {
          release()
          return p.seen.length === want + 2
        },
        10_000,
        'the rest',
      )
      release()
      expect((await Promise.all(calls)).every((r) => r.ok)).toBe(true)
    }
  })
})

describe('fan-out', () => {
  it('hands each result to onResult as it settles and returns them in server order', async () => {
    const slow = await participant(() => (res) => void setTimeout(() => res.writeHead(200).end(JSON.stringify(REPLIES.renew)), 1000))
    const fast = await participant(() => ok(REPLIES.renew))
    const heard: string[] = []
    const servers = [
      {name: 'slow', url: slow.url},
      {name: 'fast', url: fast.url},
    ]
    const rs = await client().callAll(servers, 'renew', body, later10(), undefined, (r) => void heard.push(r.ok ? r.server : 'failed'))
    expect(rs.map((r) => (r.ok ? r.server : 'failed'))).toEqual(['slow', 'fast'])
    expect(heard).toEqual(['fast', 'slow'])
    expect(await client().callAll(servers, 'renew', body, later10())).toEqual([
      {ok: true, server: 'slow', reply: {lease_expires_at: 1}},
      {ok: true, server: 'fast', reply: {lease_expires_at: 1}},
    ])
  })

  it('sends resume, renew, retire, forget and commit once more, 200 ms after a dropped connection; never prepare or restore', async () => {
    for (const op of ['resume', 'renew', 'retire', 'forget', 'commit', 'prepare', 'restore'] as const) {
      const p = await participant((_s, n) => (n === 0 ? 'drop' : ok(REPLIES[op])))
      const r = (await client().call({name: 'p', url: p.url}, op, body, later10())) as CallResult<unknown>
      if (op === 'prepare' || op === 'restore') {
        expect(r, op).toEqual({ok: false, failure: {server: 'p', status: null, code: 'connection', message: 'connection closed before a reply'}})
        expect(p.seen.length, op).toBe(1)
      } else {
        expect(r.ok, op).toBe(true)
        expect(p.seen.length, op).toBe(2)
        expect(p.seen[1]!.at - p.seen[0]!.at, op).toBeGreaterThanOrEqual(190)
        expect(p.seen[1]!.body.equals(body), op).toBe(true)
      }
    }
  })

  it('does not send again after an error reply, or twice after two drops', async () => {
    const refusing = await participant(() => ({status: 409, body: '{"error":{"code":"stale_checkpoint","detail":"old"}}'}))
    expect(await client().call({name: 'p', url: refusing.url}, 'resume', body, later10())).toEqual({
      ok: false,
      failure: {server: 'p', status: 409, code: 'stale_checkpoint', message: 'old'},
    })
    expect(refusing.seen.length).toBe(1)
    const dropping = await participant(() => 'drop')
    const r = await client().call({name: 'p', url: dropping.url}, 'commit', body, later10())
    expect(r).toEqual({ok: false, failure: {server: 'p', status: null, code: 'connection', message: 'connection closed before a reply'}})
    expect(dropping.seen.length).toBe(2)
  })

  it('a call sent once more after its stage timed out is not sent: it fails as the timeout', async () => {
    // The stage's timeout (0.1 s, no grace) passes during the 200 ms wait before the second send.
    const p = await participant((_s, n) => (n === 0 ? 'drop' : ok(REPLIES.commit)))
    const r = await client({grace: 0}).call({name: 'p', url: p.url}, 'commit', body, Date.now() / 1000 + 0.1)
    expect(r).toMatchObject({ok: false, failure: {server: 'p', status: null, code: 'timeout'}})
    await new Promise((res) => setTimeout(res, 300))
    expect(p.seen.length).toBeLessThanOrEqual(1)
  })
})

describe('timeouts and interrupts', () => {
  it('a stage that timed out stays timed out when the caller aborts afterwards', async () => {
    // The stage times out (0.1 s, no grace) while a dropped commit waits 200 ms to be sent again;
    // the caller's abort after that does not turn the timeout into an interrupt.
    const p = await participant(() => 'drop')
    const ac = new AbortController()
    const t = setTimeout(() => ac.abort(), 150)
    const r = await client({grace: 0}).call({name: 'p', url: p.url}, 'commit', body, Date.now() / 1000 + 0.1, ac.signal)
    clearTimeout(t)
    expect(r).toMatchObject({ok: false, failure: {server: 'p', status: null, code: 'timeout'}})
  })

  it('a silent participant fails at the timeout, named in seconds; the timer is at least 1 ms', async () => {
    const p = await participant(() => 'hang')
    expect(await client().status({name: 'p', url: p.url}, 1049.5)).toEqual({ok: false, failure: {server: 'p', status: null, code: 'timeout', message: 'no reply within 1.1 seconds'}})
    expect(await client().status({name: 'p', url: p.url}, -5)).toEqual({ok: false, failure: {server: 'p', status: null, code: 'timeout', message: 'no reply within 0.0 seconds'}})
  })

  it('a signal already aborted sends nothing; one aborted mid-call ends it as interrupted', async () => {
    const p = await participant(() => 'hang')
    const gone = AbortSignal.abort()
    expect(await client().status({name: 'p', url: p.url}, 10_000, gone)).toEqual({ok: false, failure: {server: 'p', status: null, code: 'interrupted', message: 'interrupted'}})
    const answering = await participant(() => ok(STATUS))
    expect(await client().status({name: 'p', url: answering.url}, 10_000, gone)).toEqual({
      ok: false,
      failure: {server: 'p', status: null, code: 'interrupted', message: 'interrupted'},
    })
    expect(answering.seen.length).toBe(0)

    const ac = new AbortController()
    const pending = client().callAll(
      [
        {name: 'a', url: p.url},
        {name: 'b', url: p.url},
        {name: 'c', url: p.url},
      ],
      'prepare',
      body,
      later10(),
      ac.signal,
    )
    await waitFor(() => p.seen.length === 3, 10_000, 'three requests')
    // One listener on the caller's signal for the whole stage, whatever the number of calls.
    expect(getEventListeners(ac.signal, 'abort').length).toBe(1)
    ac.abort()
    expect((await pending).map((r) => (r.ok ? 'ok' : r.failure.code))).toEqual(['interrupted', 'interrupted', 'interrupted'])
  })

  it('a stage leaves no listener on the caller signal and no timer behind', async () => {
    const p = await participant(() => ok(STATUS))
    const c = client()
    const ac = new AbortController()
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length
    // A first call, so that undici's own timers (keep-alive) are running before the count.
    expect((await c.status({name: 'p', url: p.url}, 5000)).ok).toBe(true)
    const before = timers()
    expect((await c.status({name: 'p', url: p.url}, 600_000, ac.signal)).ok).toBe(true)
    expect((await c.callAll([{name: 'p', url: p.url}], 'renew', body, Date.now() / 1000 + 600, ac.signal)).length).toBe(1)
    expect(getEventListeners(ac.signal, 'abort').length).toBe(0)
    expect(timers()).toBeLessThanOrEqual(before)
  })
})

describe('replies', () => {
  it('an error reply keeps its status, the envelope code and detail; a 401 without it is still unauthorized', async () => {
    const cases: [number, string, {code: string | null; message: string}][] = [
      [409, '{"error":{"code":"stale_checkpoint","detail":"old"}}', {code: 'stale_checkpoint', message: 'old'}],
      [401, '{"detail":"Not authenticated"}', {code: 'unauthorized', message: '{"detail":"Not authenticated"}'}],
      [401, '{"error":{"code":"bad_token","detail":"no"}}', {code: 'bad_token', message: 'no'}],
      [403, '{"detail":"Forbidden"}', {code: null, message: '{"detail":"Forbidden"}'}],
    ]
    for (const [status, text, want] of cases) {
      const p = await participant(() => ({status, body: text}))
      expect(await client().status({name: 'p', url: p.url}, 5000)).toEqual({ok: false, failure: {server: 'p', status, ...want}})
    }
  })

  it('a redirect is any status from 300 to 399: 300 and 399 are not followed, 299 and 400 are error replies', async () => {
    const envelope = '{"error":{"code":"bad_request","detail":"no"}}'
    const cases: [number, {code: string | null; message: string}][] = [
      [300, {code: 'redirect', message: "with no location: not followed (the control token is sent only to the address given); give the server's address as the redirect names it"}],
      [399, {code: 'redirect', message: "with no location: not followed (the control token is sent only to the address given); give the server's address as the redirect names it"}],
      [299, {code: 'bad_request', message: 'no'}],
      [400, {code: 'bad_request', message: 'no'}],
    ]
    for (const [status, want] of cases) {
      const p = await participant(() => ({status, body: envelope}))
      expect(await client().status({name: 'p', url: p.url}, 5000), String(status)).toEqual({ok: false, failure: {server: 'p', status, ...want}})
    }
  })

  it('a 200 that is not JSON, too deep, or not the reply the route expects is a bad reply that says why', async () => {
    const junk = await participant(() => ({body: 'x'.repeat(300)}))
    expect(await client().status({name: 'p', url: junk.url}, 5000)).toEqual({ok: false, failure: {server: 'p', status: 200, code: 'bad_reply', message: `reply is not JSON: ${'x'.repeat(200)}`}})

    const nest = (levels: number): unknown => {
      let v: unknown = []
      for (let i = 1; i < levels; i++) v = [v]
      return v
    }
    // The reply object is one level, `extra` and what it holds the rest.
    const deep = await participant((_s, n) => ok({...STATUS, extra: nest(n === 0 ? 255 : 256)}))
    const c = client()
    expect((await c.status({name: 'p', url: deep.url}, 5000)).ok).toBe(true)
    expect(await c.status({name: 'p', url: deep.url}, 5000)).toEqual({ok: false, failure: {server: 'p', status: 200, code: 'bad_reply', message: 'status reply is nested deeper than 256 levels'}})

    const noKind = await participant(() => ok({...STATUS, kind: undefined}))
    const r1 = await client().status({name: 'p', url: noKind.url}, 5000)
    expect(r1.ok).toBe(false)
    expect(!r1.ok && r1.failure).toMatchObject({server: 'p', status: 200, code: 'bad_reply'})
    expect(!r1.ok && r1.failure.message).toMatch(/^unexpected status reply: kind: \S/)
    const nested = await participant(() => ok({...STATUS, report: {...report, ready: 'yes'}}))
    const r3 = await client().status({name: 'p', url: nested.url}, 5000)
    expect(!r3.ok && r3.failure.message).toMatch(/^unexpected status reply: report\.ready: \S/)
    const list = await participant(() => ok([]))
    const r2 = await client().call({name: 'p', url: list.url}, 'renew', body, later10())
    expect(!r2.ok && r2.failure.message).toMatch(/^unexpected renew reply: \(root\): \S/)
  })

  it('a reply past 64 MiB is refused unread with its status; commit and restore replies may be larger', async () => {
    const pad = Buffer.alloc((64 << 20) + 16, 0x20)
    const big = await participant(() => ({status: 500, body: pad}))
    expect(await client().status({name: 'p', url: big.url}, 30_000)).toEqual({
      ok: false,
      failure: {server: 'p', status: 500, code: 'bad_reply', message: 'status reply is larger than 64 MiB; it was not read'},
    })
    for (const op of ['commit', 'restore'] as const) {
      const text = JSON.stringify(REPLIES[op])
      const padded = Buffer.concat([Buffer.from(text.slice(0, -1) + ','), pad, Buffer.from('"pad": 1}')])
      const p = await participant(() => ({body: padded}))
      const r = await client().call({name: 'p', url: p.url}, op, body, Date.now() / 1000 + 30)
      expect(r.ok, op).toBe(true)
    }
  })
})

describe('helpers', () => {
  async function* chunks(...parts: Buffer[]): AsyncIterable<Buffer> {
    for (const p of parts) yield p
  }

  it('readCapped reads up to the cap exactly, and decodes characters split across chunks', async () => {
    const euro = Buffer.from('€') // 3 bytes
    expect(await readCapped(chunks(Buffer.from('ab'), euro.subarray(0, 1), euro.subarray(1)), 5)).toBe('ab€')
    expect(await readCapped(chunks(Buffer.from('ab'), euro), 4)).toBeNull()
    expect(await readCapped(chunks(), 0)).toBe('')
    expect(await readCapped(chunks(Buffer.from('x')), 0)).toBeNull()
  })

  it('nestedDeeperThan counts nested arrays and objects, not values', () => {
    expect(nestedDeeperThan(5, 0)).toBe(false)
    expect(nestedDeeperThan(null, 0)).toBe(false)
    expect(nestedDeeperThan('s', 0)).toBe(false)
    expect(nestedDeeperThan({}, 0)).toBe(true)
    expect(nestedDeeperThan({}, 1)).toBe(false)
    expect(nestedDeeperThan({a: {b: [1, null, 'x']}}, 3)).toBe(false)
    expect(nestedDeeperThan({a: {b: [1, null, 'x']}}, 2)).toBe(true)
    expect(nestedDeeperThan([1, [2, [3]]], 3)).toBe(false)
    expect(nestedDeeperThan([1, [2, [3]]], 2)).toBe(true)
    expect(nestedDeeperThan({a: null, b: 1, c: {d: {}}}, 2)).toBe(true)
    expect(nestedDeeperThan({a: null, b: 1, c: {d: 1}}, 2)).toBe(false)
    // The deep branch may come first or last.
    expect(nestedDeeperThan([[[[]]], 1], 3)).toBe(true)
    expect(nestedDeeperThan([1, [[[]]]], 3)).toBe(true)
    // Iterative: a depth far past the call stack is answered, not thrown.
    let v: unknown = []
    for (let i = 0; i < 200_000; i++) v = [v]
    expect(nestedDeeperThan(v, 256)).toBe(true)
  })

  it('describeTransportError names refused, reset and unknown hosts, else the cause, cut to 200 characters', () => {
    const refused = 'connection refused (is the server running?)'
    expect(describeTransportError(Object.assign(new Error('x'), {code: 'ECONNREFUSED'}))).toBe(refused)
    expect(describeTransportError(new Error('x', {cause: Object.assign(new Error('y'), {code: 'ECONNREFUSED'})}))).toBe(refused)
    expect(describeTransportError(Object.assign(new Error('x'), {code: 'ECONNRESET'}))).toBe('connection closed before a reply')
    expect(describeTransportError(new undiciErrors.SocketError('other side closed'))).toBe('connection closed before a reply')
    expect(describeTransportError(new Error('x', {cause: Object.assign(new Error('y'), {code: 'ENOTFOUND'})}))).toBe('host not found')
    // The cause's code wins over the error's own.
    expect(describeTransportError(Object.assign(new Error('outer', {cause: Object.assign(new Error('inner'), {code: 'EHOSTUNREACH'})}), {code: 'ECONNREFUSED'}))).toBe('inner')
    expect(describeTransportError(new Error('outer', {cause: new Error('inner')}))).toBe('inner')
    expect(describeTransportError(new Error('m'.repeat(300)))).toBe('m'.repeat(200))
    expect(describeTransportError('plain')).toBe('plain')
  })

  it('a refused connection is a connection failure; a reply with a status never is', async () => {
    const port = await freePort()
    const r = await client().status({name: 'p', url: `http://127.0.0.1:${port}`}, 5000)
    expect(r).toEqual({ok: false, failure: {server: 'p', status: null, code: 'connection', message: 'connection refused (is the server running?)'}})
    expect(!r.ok && isConnectionFailure(r.failure)).toBe(true)
    expect(isConnectionFailure({server: 'p', status: 502, code: 'connection', message: ''})).toBe(false)
    expect(isConnectionFailure({server: 'p', status: null, code: 'timeout', message: ''})).toBe(false)
    expect(isConnectionFailure({server: 'p', status: 200, code: 'bad_reply', message: ''})).toBe(false)
  })
})
