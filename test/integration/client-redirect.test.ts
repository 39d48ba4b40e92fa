// A redirect is never followed: the control token goes only to the address the operator gave
// (curl and browsers drop credentials on a redirect to another host). The failure names where the
// redirect pointed, so an http→https proxy in front of a fleet is fixed by giving that address.
import http from 'node:http'
import type {AddressInfo} from 'node:net'

import {describe, expect, it} from 'vitest'

import {ControlClient} from '../../src/coordination/client.js'
import {failureMessage} from '../../src/coordination/errors.js'
import {encodeBody} from '../../src/coordination/operations.js'
import {TOKEN, later} from '../helpers/fleet.js'

async function listen(handler: http.RequestListener): Promise<string> {
  const server = http.createServer(handler)
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  later(() => new Promise((r) => server.close(r)))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

describe('redirects', () => {
  it('a 308 to another address is not followed, and the failure names the address', async () => {
    const reached: string[] = []
    const target = await listen((req, res) => {
      reached.push(`${req.method} ${req.url} ${req.headers.authorization ?? ''}`)
      res.writeHead(200, {'content-type': 'application/json'}).end('{}')
    })
    const redirecting = await listen((req, res) => res.writeHead(308, {location: `${target}${req.url}`}).end())
    const client = new ControlClient({token: TOKEN})
    const st = await client.status({name: 'p', url: redirecting}, 5000)
    expect(st.ok).toBe(false)
    if (st.ok) return
    expect(st.failure).toEqual({
      server: 'p',
      status: 308,
      code: 'redirect',
      message: `to ${target}/ng-control/v1/checkpoint/status: not followed (the control token is sent only to the address given); give the server's address as the redirect names it`,
    })
    const body = encodeBody({checkpoint_id: 'c1', deadline_ts: Date.now() / 1000 + 5})
    const r = await client.call({name: 'p', url: redirecting}, 'resume', body, Date.now() / 1000 + 5)
    expect(r.ok).toBe(false)
    if (r.ok) return
    expect(failureMessage(r.failure)).toMatch(/^HTTP 308 redirect to http:\/\/127\.0\.0\.1:\d+\/ng-control\/v1\/checkpoint\/resume: not followed \(/)
    expect(reached).toEqual([])
  })

  it('a redirect with no location says so', async () => {
    const url = await listen((_req, res) => res.writeHead(302).end('moved'))
    const st = await new ControlClient({token: TOKEN}).status({name: 'p', url}, 5000)
    expect(st.ok ? null : [st.failure.status, st.failure.code, st.failure.message.split(':')[0]]).toEqual([302, 'redirect', 'with no location'])
  })
})
