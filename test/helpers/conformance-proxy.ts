// A participant that breaks one rule: the real in-process double on 127.0.0.1 behind a small
// proxy that changes exactly one behaviour (conformance.test.ts, conformance-mutants.test.ts).
import http from 'node:http'
import {AddressInfo} from 'node:net'

import {ParticipantServer} from '../../src/control-plane/server.js'
import {SimDownstream, SimEnvironment} from '../../src/control-plane/sim.js'
import {TOKEN} from './fleet.js'

export interface Req {
  method: string
  op: string
  auth: string | undefined
  /** The Content-Type header sent. */
  ctype: string | undefined
  body: string
  /** The parsed body, undefined when it is not JSON. */
  json: any
}
/** `json` a string: sent as the body text. `status` 0: the connection is dropped, no reply. */
export interface Answer {
  status: number
  json: any
}
export interface Fault {
  /** Answer in the participant's place (undefined: let it answer). Sees every request. */
  before?(r: Req, inner: ParticipantServer): Answer | undefined | Promise<Answer | undefined>
  /** The Authorization header forwarded instead. */
  auth?(r: Req): string | undefined
  /** The body forwarded instead (well-authorized requests only). */
  body?(r: Req): string
  /** Change the participant's answer (well-authorized requests only). */
  after?(r: Req, a: Answer, inner: ParticipantServer): Answer | Promise<Answer>
}

export const VALID = `Bearer ${TOKEN}`
export const authorized = (r: Req) => r.auth === VALID
export const err = (status: number, code: string): Answer => ({status, json: {error: {code, detail: `fault: ${code}`}}})
export const READY = {ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: []}

export type Kind = 'environment' | 'model' | 'agent' | 'resources'

/** Cleanups of one table row: rows run concurrently, so each closes only what it started. */
export type Own = (fn: () => Promise<unknown>) => void

export async function faulty(own: Own, fault: Fault, opts: {kind?: Kind; instance?: string; resumedIdsKept?: number} = {}): Promise<{url: string; inner: ParticipantServer; requests: Req[]}> {
  const kind = opts.kind ?? 'model'
  const instance = opts.instance ?? 'p'
  const participant = kind === 'environment' ? new SimEnvironment(instance) : new SimDownstream(kind, instance)
  const inner = new ParticipantServer({name: instance, token: TOKEN, participant, controlPlane: {resumedIdsKept: opts.resumedIdsKept}})
  await inner.listen()
  own(() => inner.close())
  const requests: Req[] = []
  const server = http.createServer((req, res) => {
    void (async () => {
      const chunks: Buffer[] = []
      for await (const c of req as AsyncIterable<Buffer>) chunks.push(c)
      const body = Buffer.concat(chunks).toString('utf8')
      let json: unknown
      try {
        json = JSON.parse(body)
      } catch {}
      const r: Req = {method: req.method!, op: (req.url ?? '').split('/').pop()!, auth: req.headers.authorization, ctype: req.headers['content-type'], body, json}
      requests.push(r)
      let a = await fault.before?.(r, inner)
      if (!a) {
        const auth = fault.auth?.(r) ?? r.auth
        const headers: Record<string, string> = {'content-type': 'application/json'}
        if (auth !== undefined) headers.authorization = auth
        const out = await fetch(inner.url + req.url, {method: r.method, headers, body: r.method === 'POST' ? (authorized(r) && fault.body ? fault.body(r) : body) : undefined})
        const text = await out.text()
        let parsed: unknown = text
        try {
          parsed = JSON.parse(text)
        } catch {}
        a = {status: out.status, json: parsed}
        if (authorized(r) && fault.after) a = await fault.after(r, a, inner)
      }
      if (a.status === 0) return void res.socket?.destroy()
      res.writeHead(a.status, {'content-type': 'application/json'})
      res.end(typeof a.json === 'string' ? a.json : JSON.stringify(a.json))
    })().catch((e: unknown) => {
      res.writeHead(500)
      res.end(String(e))
    })
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  own(() => new Promise((r) => server.close(r)))
  return {url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, inner, requests}
}
