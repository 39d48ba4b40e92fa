// A control call is bounded by its deadline plus the grace and by nothing else (reference 9.2:
// per-call timeout = time left + 5 s). undici cuts a reply short after 300 s of waiting for
// headers or between body chunks unless told otherwise, so a prepare running to a deadline past
// that, or a long commit or restore, would fail as a lost connection. The dispatcher is replaced
// here by one whose limits are 200 ms (undici's timers fire them after ~1 s): a call must still wait
// for a reply 2.5 s late.
import http from 'node:http'
import type {AddressInfo} from 'node:net'

import {Agent} from 'undici'
import {describe, expect, it} from 'vitest'

import {ControlClient} from '../../src/coordination/client.js'
import {TOKEN, later} from '../helpers/fleet.js'

const STATUS = {
  kind: 'model',
  instance: 'slow',
  phase: 'idle',
  checkpoint_id: null,
  lease_expires_at: null,
  retired_rollouts: 0,
  report: {ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: []},
}

/** A participant whose status reply is `late` ms late: before its headers, or between two halves of its body. */
async function slowParticipant(where: 'headers' | 'body', late: number): Promise<string> {
  const server = http.createServer((_req, res) => {
    const text = JSON.stringify(STATUS)
    if (where === 'headers') setTimeout(() => res.writeHead(200, {'content-type': 'application/json'}).end(text), late)
    else {
      res.writeHead(200, {'content-type': 'application/json'})
      res.write(text.slice(0, 10))
      setTimeout(() => res.end(text.slice(10)), late)
    }
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  later(() => new Promise((r) => server.close(r)))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

function clientWithShortTransportLimits(): ControlClient {
  const client = new ControlClient({token: TOKEN})
  const strict = new Agent({headersTimeout: 200, bodyTimeout: 200})
  ;(client as unknown as {dispatcher: Agent}).dispatcher = strict
  later(() => strict.close())
  return client
}

describe('control calls and transport timeouts', () => {
  for (const where of ['headers', 'body'] as const) {
    it(`waits for ${where} that come later than the dispatcher's own limit, within the call's timeout`, {timeout: 15_000}, async () => {
      const url = await slowParticipant(where, 2500)
      const r = await clientWithShortTransportLimits().status({name: 'slow', url}, 8000)
      expect(r).toMatchObject({ok: true, reply: {instance: 'slow', phase: 'idle'}})
    })
  }

  it('still fails a call at its own timeout, named as one', async () => {
    const url = await slowParticipant('headers', 1500)
    const r = await clientWithShortTransportLimits().status({name: 'slow', url}, 300)
    expect(r).toMatchObject({ok: false, failure: {server: 'slow', status: null, code: 'timeout'}})
  })
})

describe('a reply larger than any control reply', () => {
  it('is refused unread past 64 MiB (status) as a bad reply, not buffered whole', async () => {
    let sent = 0
    const server = http.createServer((_req, res) => {
      res.writeHead(200, {'content-type': 'application/json'})
      const chunk = Buffer.alloc(1 << 20, 0x20)
      // Up to 80 MiB of spaces, written as the reader takes them; stops when the client goes.
      const more = () => {
        while (sent < 80) {
          sent++
          if (!res.write(chunk)) return void res.once('drain', more)
        }
        res.end()
      }
      res.on('close', () => (sent = Infinity))
      more()
    })
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
    later(() => new Promise((r) => server.close(r)))
    const client = new ControlClient({token: TOKEN})
    later(() => client.close())
    const r = await client.status({name: 'big', url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`}, 30_000)
    expect(r).toEqual({ok: false, failure: {server: 'big', status: 200, code: 'bad_reply', message: 'status reply is larger than 64 MiB; it was not read'}})
  })
})
