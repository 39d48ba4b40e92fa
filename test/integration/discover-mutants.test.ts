// Discovery's inputs and rules as an operator sees them: the --server and fleet-file parsers, the
// head-server reader against a head double on 127.0.0.1 that answers whatever a test gives it, and
// discover() itself, driven through a scripted control client so that every reply, retry and
// timeout is chosen by the test (tests of StrykerJS's surviving mutants of discover.ts).
import http from 'node:http'
import {AddressInfo} from 'node:net'
import {writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it, vi} from 'vitest'
import {parse as parseYaml, stringify} from 'yaml'

import {CallResult, ControlClient, ServerRef} from '../../src/coordination/client.js'
import {discover, isSafeComponent, parseServerArg, readFleetFile, readHeadServer, resolveSource, sortParticipants} from '../../src/coordination/discover.js'
import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {StatusReply} from '../../src/protocol/wire.js'
import {later, waitFor} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'
import {freePort} from '../helpers/ports.js'
import {rejection, thrown} from '../helpers/errors.js'

type Route = {status?: number; body: string} | 'hang'

/** A head-server double: each path answers as `routes` says (404 for any other); closed after the test. */
async function head(routes: Record<string, Route>): Promise<{url: string; hits: string[]}> {
  const hits: string[] = []
  const server = http.createServer((req, res) => {
    const p = new URL(req.url ?? '/', 'http://x').pathname
    hits.push(p)
    const r = routes[p]
    if (r === 'hang') return
    res.writeHead(r?.status ?? (r ? 200 : 404), {'content-type': 'application/json'})
    res.end(r ? r.body : '{"detail":"Not Found"}')
  })
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()))
  later(async () => {
    server.closeAllConnections()
    await new Promise((r) => server.close(r))
  })
  return {url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, hits}
}

/** The global config as Gym's head server sends it: the YAML text, as a JSON string. */
const gymConfig = (cfg: unknown): Route => ({body: JSON.stringify(stringify(cfg))})
const json = (v: unknown): Route => ({body: JSON.stringify(v)})

/** The first line of the yaml library's error for `text`, whose message has more lines (they show where). */
function yamlFirstLine(text: string): string {
  try {
    parseYaml(text)
  } catch (err) {
    const lines = (err as Error).message.split('\n')
    expect(lines.length).toBeGreaterThan(1)
    expect(lines[0]!.length).toBeGreaterThan(10)
    return lines[0]!
  }
  throw new Error('expected the YAML to be refused')
}

/** The ControllerError a call fails with (anything else, or success, fails the test). */
describe('--server NAME=URL', () => {
  it('splits at the first =, keeps the URL whole and drops one trailing slash only', () => {
    expect(parseServerArg('policy_model=http://10.0.0.5:8000')).toEqual({name: 'policy_model', url: 'http://10.0.0.5:8000'})
    expect(parseServerArg('a=https://h:1/base/')).toEqual({name: 'a', url: 'https://h:1/base'})
    expect(parseServerArg('a=http://h:1/x?q=1')).toEqual({name: 'a', url: 'http://h:1/x?q=1'})
    expect(parseServerArg('n=http://h/')).toEqual({name: 'n', url: 'http://h'})
  })

  it('refuses a missing or empty name, a non-URL and a URL that is not http(s), naming the flag', () => {
    for (const bad of ['policy', '=http://h:1', '']) {
      const e = thrown(() => parseServerArg(bad), ControllerError)
      expect(e.code).toBe('input')
      expect(e.message).toBe(`--server '${bad}': expected NAME=URL, e.g. policy_model=http://10.0.0.5:8000`)
    }
    const e = thrown(() => parseServerArg('x=nope'), ControllerError)
    expect(e.code).toBe('input')
    expect(e.message).toBe("--server x: 'nope' is not a URL")
    const e2 = thrown(() => parseServerArg('x=ftp://h/'), ControllerError)
    expect(e2.code).toBe('input')
    expect(e2.message).toBe("--server x: 'ftp://h/' is not an http(s) URL")
    expect(thrown(() => parseServerArg('x=file:///etc'), ControllerError).message).toBe("--server x: 'file:///etc' is not an http(s) URL")
  })
})

describe('fleet file', () => {
  async function fleetFile(text: string): Promise<string> {
    const f = path.join(await tempDir(), 'fleet.yaml')
    await writeFile(f, text)
    return f
  }

  it('reads NAME: URL and NAME: {url: URL}, in file order, without a trailing slash', async () => {
    const f = await fleetFile('servers:\n  policy: http://127.0.0.1:8000/\n  env:\n    url: https://e.example:9/x\n')
    const want = [
      {name: 'policy', url: 'http://127.0.0.1:8000'},
      {name: 'env', url: 'https://e.example:9/x'},
    ]
    expect(await readFleetFile(f)).toEqual(want)
    expect(await resolveSource({type: 'file', path: f}, 1000)).toEqual(want)
  })

  it('a file that cannot be read, is not YAML, or has the wrong shape is an input error that says where', async () => {
    const dir = await tempDir()
    const missing = path.join(dir, 'missing.yaml')
    const e1 = await rejection(readFleetFile(missing), ControllerError)
    expect(e1.code).toBe('input')
    expect(e1.message.startsWith(`cannot read fleet file ${missing}: ENOENT`)).toBe(true)

    const notYaml = await fleetFile('servers: [a,\n  b: {\nc: "')
    const e2 = await rejection(readFleetFile(notYaml), ControllerError)
    expect(e2.code).toBe('input')
    expect(e2.message).toBe(`fleet file ${notYaml} is not YAML: ${yamlFirstLine('servers: [a,\n  b: {\nc: "')}`)

    const scalar = await fleetFile('just text\n')
    const e3 = await rejection(readFleetFile(scalar), ControllerError)
    expect(e3.code).toBe('input')
    expect(e3.message.startsWith(`fleet file ${scalar}: (root): `)).toBe(true)
    expect(e3.message.endsWith("; expected 'servers: {NAME: URL}'")).toBe(true)
    expect(e3.message).not.toContain('undefined')

    const wrong = await fleetFile('servers:\n  a: 5\n')
    const e4 = await rejection(readFleetFile(wrong), ControllerError)
    expect(e4.message.startsWith(`fleet file ${wrong}: servers.a: `)).toBe(true)
    expect(e4.message.endsWith("; expected 'servers: {NAME: URL}'")).toBe(true)
    expect(e4.message).not.toContain('undefined')

    const badUrl = await fleetFile('servers:\n  a: http://ok\n  b: {url: "ftp://x"}\n')
    const e5 = await rejection(readFleetFile(badUrl), ControllerError)
    expect(e5.code).toBe('input')
    expect(e5.message).toBe(`fleet file ${badUrl}: servers.b: 'ftp://x' is not an http(s) URL`)
  })
})

describe('where the candidates come from', () => {
  it('a list of servers is used as given; a head URL is read from the head server', async () => {
    const servers: ServerRef[] = [{name: 'a', url: 'http://x:1'}]
    expect(await resolveSource({type: 'servers', servers}, 1000)).toBe(servers)
    const h = await head({
      '/global_config_dict_yaml': gymConfig({a: {resources_servers: {impl: {host: '127.0.0.9', port: 7}}}}),
      '/server_instances': json([]),
    })
    expect(await resolveSource({type: 'head', url: h.url}, 5000)).toEqual([{name: 'a', url: 'http://127.0.0.9:7'}])
  })
})

describe('head server', () => {
  it('takes each server group, skips keys that hold none, and prefers the instance list to the config', async () => {
    const h = await head({
      '/global_config_dict_yaml': gymConfig({
        policy_base_url: 'http://127.0.0.1:0/v1',
        nothing: null,
        checkpoint: {enabled: true},
        count: 3,
        env: {environment_servers: {env_impl: {host: '10.0.0.1', port: 1}}},
        policy: {responses_api_models: {m: {host: '10.0.0.2', port: 2}}},
        agent: {responses_api_agents: {a: {host: '10.0.0.3', port: 3}}},
        res: {resources_servers: {r: {host: '10.0.0.4', port: 4}}},
      }),
      '/server_instances': json([
        // The top-level key as process_name; a url wins over host and port.
        {name: 'm', process_name: 'policy', url: 'http://10.9.0.2:20/', host: '10.8.0.2', port: 21},
        // Only config_path: it names the key; host and port make the URL.
        {name: 'a', config_path: 'agent', host: '10.9.0.3', port: 30},
        // process_name wins over config_path.
        {name: 'r', process_name: 'res', config_path: 'other', host: '10.9.0.4', port: 40},
        {name: 'r', process_name: 'other', config_path: 'res', host: '10.9.0.5', port: 50},
      ]),
    })
    expect(await readHeadServer(h.url + '/', 5000)).toEqual([
      {name: 'env', url: 'http://10.0.0.1:1'},
      {name: 'policy', url: 'http://10.9.0.2:20'},
      {name: 'agent', url: 'http://10.9.0.3:30'},
      {name: 'res', url: 'http://10.9.0.4:40'},
    ])
    // The trailing slash of --head is not doubled into the paths it asks for.
    expect(h.hits).toEqual(['/global_config_dict_yaml', '/server_instances'])
  })

  it('an instance entry with only a name is matched on it; host without port falls back to the config', async () => {
    const h = await head({
      '/global_config_dict_yaml': gymConfig({
        one: {resources_servers: {impl: {host: '10.0.0.1', port: 1}}},
        two: {resources_servers: {impl: {host: '10.0.0.2', port: 2}}},
      }),
      '/server_instances': json([
        {name: 'one', host: '10.9.0.1', port: 10},
        {process_name: 'two', host: '10.9.0.2'},
      ]),
    })
    expect(await readHeadServer(h.url, 5000)).toEqual([
      {name: 'one', url: 'http://10.9.0.1:10'},
      {name: 'two', url: 'http://10.0.0.2:2'},
    ])
  })

  it('reads a config sent as plain YAML or as a JSON object too', async () => {
    const cfg = {a: {resources_servers: {impl: {host: '10.0.0.1', port: 1}}}}
    for (const body of [stringify(cfg), JSON.stringify(cfg)]) {
      const h = await head({'/global_config_dict_yaml': {body}, '/server_instances': json([])})
      expect(await readHeadServer(h.url, 5000)).toEqual([{name: 'a', url: 'http://10.0.0.1:1'}])
    }
  })

  it('without /server_instances the config addresses are used while every server has one', async () => {
    const cfg = {a: {resources_servers: {impl: {host: '10.0.0.1', port: 1}}}, b: {responses_api_models: {m: {host: '10.0.0.2', port: 2}}}}
    const want = [
      {name: 'a', url: 'http://10.0.0.1:1'},
      {name: 'b', url: 'http://10.0.0.2:2'},
    ]
    const h = await head({'/global_config_dict_yaml': gymConfig(cfg)})
    expect(await readHeadServer(h.url, 5000)).toEqual(want)
    // A list that is not an array (or not JSON) is no list.
    for (const body of ['{"a": {"url": "http://10.7.0.1:1"}}', 'not json']) {
      const h2 = await head({'/global_config_dict_yaml': gymConfig(cfg), '/server_instances': {body}})
      expect(await readHeadServer(h2.url, 5000)).toEqual(want)
    }
  })

  it('without /server_instances, a server the config gives no host and port for fails with the list error', async () => {
    for (const inner of [{host: '10.0.0.2'}, {port: 2}, null]) {
      const h = await head({
        '/global_config_dict_yaml': gymConfig({a: {resources_servers: {impl: {host: '10.0.0.1', port: 1}}}, b: {responses_api_models: inner === null ? null : {m: inner}}}),
      })
      const e = await rejection(readHeadServer(h.url, 5000), ControllerError)
      expect(e.code).toBe('discovery')
      expect(e.message).toBe(`head server ${h.url}/server_instances answered HTTP 404`)
    }
    // A config naming no server at all cannot be checked against a list that failed either.
    const empty = await head({'/global_config_dict_yaml': gymConfig({policy_base_url: 'http://x/v1'})})
    expect((await rejection(readHeadServer(empty.url, 5000), ControllerError)).message).toBe(`head server ${empty.url}/server_instances answered HTTP 404`)
    // With a list, a config naming no server gives no candidates.
    const none = await head({'/global_config_dict_yaml': gymConfig({policy_base_url: 'http://x/v1'}), '/server_instances': json([])})
    expect(await readHeadServer(none.url, 5000)).toEqual([])
  })

  it('an instance list that is not JSON, needed for a server the config gives no address, is a discovery error', async () => {
    const h = await head({
      '/global_config_dict_yaml': gymConfig({a: {resources_servers: {impl: {host: '10.0.0.1'}}}}),
      '/server_instances': {body: '<html>proxy error</html>'},
    })
    const e = await rejection(readHeadServer(h.url, 5000), ControllerError)
    expect(e.code).toBe('discovery')
    expect(e.message).toBe(
      `head server ${h.url}/server_instances answered something that is not JSON, and the global config gives no host and port for a: fix the head server, or name each server with --server NAME=URL (or --fleet FILE)`,
    )
  })

  it('an instance list that is not JSON names at most five servers without an address, or says the config gives none', async () => {
    const seven = Object.fromEntries(['a', 'b', 'c', 'd', 'e', 'f', 'g'].map((n) => [n, {resources_servers: {impl: {host: '10.0.0.1'}}}]))
    const h = await head({'/global_config_dict_yaml': gymConfig(seven), '/server_instances': {body: 'not json'}})
    expect((await rejection(readHeadServer(h.url, 5000), ControllerError)).message).toBe(
      `head server ${h.url}/server_instances answered something that is not JSON, and the global config gives no host and port for a, b, c, d, e, …: fix the head server, or name each server with --server NAME=URL (or --fleet FILE)`,
    )
    const five = Object.fromEntries(['a', 'b', 'c', 'd', 'e'].map((n) => [n, {resources_servers: {impl: {host: '10.0.0.1'}}}]))
    const h5 = await head({'/global_config_dict_yaml': gymConfig(five), '/server_instances': {body: 'not json'}})
    expect((await rejection(readHeadServer(h5.url, 5000), ControllerError)).message).toBe(
      `head server ${h5.url}/server_instances answered something that is not JSON, and the global config gives no host and port for a, b, c, d, e: fix the head server, or name each server with --server NAME=URL (or --fleet FILE)`,
    )
    const empty = await head({'/global_config_dict_yaml': gymConfig({policy_base_url: 'http://x/v1'}), '/server_instances': {body: 'not json'}})
    expect((await rejection(readHeadServer(empty.url, 5000), ControllerError)).message).toBe(
      `head server ${empty.url}/server_instances answered something that is not JSON, and the global config gives no server: fix the head server, or name each server with --server NAME=URL (or --fleet FILE)`,
    )
  })

  it('a server with no address anywhere, or a bad one, is named', async () => {
    const h = await head({
      '/global_config_dict_yaml': gymConfig({a: {resources_servers: {impl: {host: '10.0.0.1'}}}}),
      '/server_instances': json([{process_name: 'a', port: 5}]),
    })
    const e = await rejection(readHeadServer(h.url, 5000), ControllerError)
    expect(e.code).toBe('discovery')
    expect(e.message).toBe("head server names 'a' but gives no address for it")

    const bad = await head({
      '/global_config_dict_yaml': gymConfig({a: {resources_servers: {impl: {host: '10.0.0.1', port: 1}}}}),
      '/server_instances': json([{process_name: 'a', url: 'ftp://10.0.0.1/'}]),
    })
    const e2 = await rejection(readHeadServer(bad.url, 5000), ControllerError)
    expect(e2.code).toBe('input')
    expect(e2.message).toBe("head server entry a: 'ftp://10.0.0.1/' is not an http(s) URL")
  })

  it('a config that is not YAML or not a mapping is a discovery error', async () => {
    const notYaml = await head({'/global_config_dict_yaml': json('a: [b,\n  c: {\nd: "')})
    const e1 = await rejection(readHeadServer(notYaml.url, 5000), ControllerError)
    expect(e1.code).toBe('discovery')
    expect(e1.message).toBe(`head server global config is not YAML: ${yamlFirstLine('a: [b,\n  c: {\nd: "')}`)
    for (const body of [JSON.stringify('42'), JSON.stringify(''), JSON.stringify('just text')]) {
      const h = await head({'/global_config_dict_yaml': {body}, '/server_instances': json([])})
      const e = await rejection(readHeadServer(h.url, 5000), ControllerError)
      expect(e.code).toBe('discovery')
      expect(e.message).toBe('head server global config is not a mapping')
    }
  })

  it('a head URL that is not http(s), a refused connection, an error status and a silent head are named', async () => {
    const e0 = await rejection(readHeadServer('ftp://h', 1000), ControllerError)
    expect(e0.code).toBe('input')
    expect(e0.message).toBe("--head: 'ftp://h' is not an http(s) URL")

    const status = await head({'/global_config_dict_yaml': {status: 500, body: 'oops'}})
    const e1 = await rejection(readHeadServer(status.url, 5000), ControllerError)
    expect(e1.code).toBe('discovery')
    expect(e1.message).toBe(`head server ${status.url}/global_config_dict_yaml answered HTTP 500`)

    const port = await freePort()
    const e2 = await rejection(readHeadServer(`http://127.0.0.1:${port}`, 5000), ControllerError)
    expect(e2.code).toBe('discovery')
    expect(e2.message).toBe(`head server http://127.0.0.1:${port}/global_config_dict_yaml: connection refused (is the server running?)`)

    const silent = await head({'/global_config_dict_yaml': 'hang'})
    const e3 = await rejection(readHeadServer(silent.url, 300), ControllerError)
    expect(e3.code).toBe('discovery')
    expect(e3.message.startsWith(`head server ${silent.url}/global_config_dict_yaml: `)).toBe(true)
    expect(e3.message).toMatch(/timeout|abort/i)
  })

  it('closes its connections to the head server once it has read it', async () => {
    const cfg = JSON.stringify(stringify({a: {resources_servers: {impl: {host: '10.0.0.1', port: 1}}}}))
    const server = http.createServer((req, res) => {
      res.writeHead(200, {'content-type': 'application/json'})
      res.end(req.url === '/server_instances' ? '[]' : cfg)
    })
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()))
    later(async () => {
      server.closeAllConnections()
      await new Promise((r) => server.close(r))
    })
    const open = () => new Promise<number>((r, j) => server.getConnections((err, n) => (err ? j(err) : r(n))))
    expect(await readHeadServer(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, 5000)).toEqual([{name: 'a', url: 'http://10.0.0.1:1'}])
    // Kept alive, they would stay open for undici's 4 s keep-alive.
    await waitFor(async () => (await open()) === 0, 2000, 'the head connections to close')
  })

  it('a reply past the size cap is refused unread', async () => {
    const cap = 64 << 20
    const server = http.createServer((_req, res) => {
      res.writeHead(200, {'content-type': 'application/json'})
      const chunk = Buffer.alloc(1 << 20, 0x20)
      let sent = 0
      const more = (): void => {
        while (sent <= cap) {
          sent += chunk.length
          if (!res.write(chunk)) return void res.once('drain', more)
        }
        res.end()
      }
      res.on('error', () => {})
      more()
    })
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()))
    later(async () => {
      server.closeAllConnections()
      await new Promise((r) => server.close(r))
    })
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    const e = await rejection(readHeadServer(url, 20_000), ControllerError)
    expect(e.code).toBe('discovery')
    expect(e.message).toBe(`head server ${url}/global_config_dict_yaml answered more than 64 MiB; it was not read`)
  })
})

describe('names and order', () => {
  it('a safe component is at most 128 characters of the ID alphabet', () => {
    expect(isSafeComponent('a'.repeat(128))).toBe(true)
    expect(isSafeComponent('a'.repeat(129))).toBe(false)
    expect(isSafeComponent('a/b')).toBe(false)
    expect(isSafeComponent('..')).toBe(false)
    expect(isSafeComponent('policy-1.x_y')).toBe(true)
  })

  it('sorts by kind (environment, model, agent, resources), then by server name, without changing the input', () => {
    const ps = [
      {kind: 'resources' as const, server: 'r'},
      {kind: 'agent' as const, server: 'b'},
      {kind: 'agent' as const, server: 'a'},
      {kind: 'model' as const, server: 'z'},
      {kind: 'environment' as const, server: 'y'},
    ]
    const copy = [...ps]
    expect(sortParticipants(ps).map((p) => p.server)).toEqual(['y', 'z', 'a', 'b', 'r'])
    expect(ps).toEqual(copy)
  })
})

/** Scripted answers to status calls, per server, in turn (the last one repeats). */
type Answer = {kind: string; instance: string} | {status: number | null; code: string | null; message: string}
interface Call {
  server: string
  timeoutMs: number
  signal?: AbortSignal
  at: number
}

function scripted(answers: Record<string, Answer[]>): {client: ControlClient; calls: Call[]} {
  const calls: Call[] = []
  const client = {
    status: (s: ServerRef, timeoutMs: number, signal?: AbortSignal): Promise<CallResult<StatusReply>> => {
      const n = calls.filter((c) => c.server === s.name).length
      calls.push({server: s.name, timeoutMs, signal, at: Date.now()})
      const list = answers[s.name]!
      const a = list[Math.min(n, list.length - 1)]!
      if ('kind' in a) return Promise.resolve({ok: true, server: s.name, reply: {kind: a.kind, instance: a.instance, phase: 'idle'} as StatusReply})
      return Promise.resolve({ok: false, failure: {server: s.name, ...a}})
    },
  } as unknown as ControlClient
  return {client, calls}
}

const refs = (...names: string[]): ServerRef[] => names.map((name) => ({name, url: `http://127.0.0.1:1/${name}`}))
const refused = {status: null, code: 'connection', message: 'connection refused (is the server running?)'}
const model = {kind: 'model', instance: 'policy'}

describe('discover', () => {
  it('refuses a name given twice and an empty list before probing anything', async () => {
    const {client, calls} = scripted({a: [model], b: [model]})
    const e = await rejection(discover(client, refs('a', 'b', 'a')), ControllerError)
    expect(e.code).toBe('input')
    expect(e.message).toBe("server 'a' is named twice")
    const e2 = await rejection(discover(client, []), ControllerError)
    expect(e2.code).toBe('input')
    expect(e2.message).toBe('no servers to discover: give --head, --server NAME=URL or --fleet FILE')
    expect(calls).toEqual([])
    // Distinct names pass.
    const d = await discover(client, refs('a'))
    expect(d.participants.map((p) => p.server)).toEqual(['a'])
  })

  it('keeps url, kind, instance and the status reply of each participant, and passes the signal on', async () => {
    const {client, calls} = scripted({p: [model], e: [{kind: 'environment', instance: 'env-1'}], j: [{status: 404, code: null, message: 'Not Found'}]})
    const ac = new AbortController()
    const d = await discover(client, refs('p', 'e', 'j'), {signal: ac.signal, probeTimeoutMs: 5000})
    expect(d).toEqual({
      participants: [
        {server: 'e', url: 'http://127.0.0.1:1/e', kind: 'environment', instance: 'env-1', status: {kind: 'environment', instance: 'env-1', phase: 'idle'}},
        {server: 'p', url: 'http://127.0.0.1:1/p', kind: 'model', instance: 'policy', status: {kind: 'model', instance: 'policy', phase: 'idle'}},
      ],
      skipped: [{name: 'j', url: 'http://127.0.0.1:1/j'}],
      failures: [],
    })
    expect(calls.length).toBe(3)
    // Each probe is given what is left of its bound, and the caller's signal.
    for (const c of calls) {
      expect(c.signal).toBe(ac.signal)
      expect(c.timeoutMs).toBeGreaterThan(0)
      expect(c.timeoutMs).toBeLessThanOrEqual(5000)
    }
  })

  it('without a bound given, a probe may take 60 seconds', async () => {
    const {client, calls} = scripted({p: [model]})
    await discover(client, refs('p'))
    expect(calls[0]!.timeoutMs).toBeGreaterThan(50_000)
    expect(calls[0]!.timeoutMs).toBeLessThanOrEqual(60_000)
  })

  it('a refused connection is tried 3 times by default, 200 ms then 400 ms apart, and the count is named', async () => {
    const {client, calls} = scripted({p: [model], down: [refused]})
    const e = (await rejection(discover(client, refs('p', 'down'), {probeTimeoutMs: 10_000}), ControllerError)) as CoordinationError
    const tries = calls.filter((c) => c.server === 'down')
    expect(tries.length).toBe(3)
    expect(tries[1]!.at - tries[0]!.at).toBeGreaterThanOrEqual(190)
    expect(tries[2]!.at - tries[1]!.at).toBeGreaterThanOrEqual(390)
    expect(e.failures).toEqual([{server: 'down', status: null, code: 'connection', message: 'connection refused (is the server running?) after 3 tries'}])
    expect(e.message).toBe('checkpoint discover failed on 1 participant(s): down: connection refused (is the server running?) after 3 tries. every participant must answer before a checkpoint is safe')
  })

  it('the waits between tries are 200 ms, then 400 ms, on the clock (not only at least that long)', async () => {
    // Timed on a fake clock: a loaded machine can only make real waits longer, so a real-time test
    // cannot see a wait that is too short but runs late.
    vi.useFakeTimers()
    try {
      const {client, calls} = scripted({down: [refused]})
      const tries = () => calls.filter((c) => c.server === 'down').length
      const failed = rejection(discover(client, refs('down'), {tries: 3, probeTimeoutMs: 10_000}), ControllerError)
      await vi.advanceTimersByTimeAsync(0)
      expect(tries()).toBe(1)
      await vi.advanceTimersByTimeAsync(199)
      expect(tries()).toBe(1)
      await vi.advanceTimersByTimeAsync(1)
      expect(tries()).toBe(2)
      await vi.advanceTimersByTimeAsync(399)
      expect(tries()).toBe(2)
      await vi.advanceTimersByTimeAsync(1)
      expect(tries()).toBe(3)
      expect((await failed).message).toMatch(/after 3 tries/)
    } finally {
      vi.useRealTimers()
    }
  })

  it('tries as often as told; a connection that comes back is a participant', async () => {
    const one = scripted({p: [model], down: [refused]})
    const e = (await rejection(discover(one.client, refs('p', 'down'), {tries: 1}), ControllerError)) as CoordinationError
    expect(one.calls.filter((c) => c.server === 'down').length).toBe(1)
    expect(e.failures[0]!.message).toBe('connection refused (is the server running?) after 1 tries')
    const back = scripted({down: [refused, model]})
    const d = await discover(back.client, refs('down'), {tries: 2})
    expect(d.participants.map((p) => p.server)).toEqual(['down'])
    expect(back.calls.length).toBe(2)
  })

  it('a failure with a status, or one that is no dropped connection, is not retried and keeps its message', async () => {
    const {client, calls} = scripted({
      p: [model],
      err: [{status: 500, code: 'internal', message: 'boom'}],
      odd: [{status: 502, code: 'connection', message: 'bad gateway'}],
      junk: [{status: null, code: 'bad_reply', message: 'reply is not JSON: x'}],
    })
    const e = (await rejection(discover(client, refs('p', 'err', 'odd', 'junk'), {tries: 5}), ControllerError)) as CoordinationError
    expect(calls.length).toBe(4)
    expect(e.failures).toEqual([
      {server: 'err', status: 500, code: 'internal', message: 'boom'},
      {server: 'junk', status: null, code: 'bad_reply', message: 'reply is not JSON: x'},
      {server: 'odd', status: 502, code: 'connection', message: 'bad gateway'},
    ])
  })

  it('the wait between tries never passes the probe bound, which then ends the probe as a timeout', async () => {
    const {client, calls} = scripted({p: [model], down: [refused]})
    const e = (await rejection(discover(client, refs('p', 'down'), {probeTimeoutMs: 100, tries: 50}), ControllerError)) as CoordinationError
    expect(e.failures).toEqual([{server: 'down', status: null, code: 'timeout', message: 'no status reply within 0.1 seconds'}])
    expect(calls.filter((c) => c.server === 'down').length).toBeLessThan(50)
  })

  it('the last wait is cut to the probe bound, and the probe ends there', async () => {
    vi.useFakeTimers()
    try {
      const {client, calls} = scripted({p: [model], down: [refused]})
      let settled: unknown = null
      void discover(client, refs('p', 'down'), {probeTimeoutMs: 250, tries: 50}).then(
        () => (settled = 'resolved'),
        (e: unknown) => (settled = e),
      )
      // Tries at 0 and 200 ms; the next wait would be 400 ms, cut to the 50 ms left.
      await vi.advanceTimersByTimeAsync(199)
      expect(calls.filter((c) => c.server === 'down').length).toBe(1)
      await vi.advanceTimersByTimeAsync(1)
      expect(calls.filter((c) => c.server === 'down').length).toBe(2)
      expect(settled).toBeNull()
      await vi.advanceTimersByTimeAsync(50)
      expect(settled).toBeInstanceOf(CoordinationError)
      expect((settled as CoordinationError).failures).toEqual([{server: 'down', status: null, code: 'timeout', message: 'no status reply within 0.25 seconds'}])
      expect(calls.filter((c) => c.server === 'down').length).toBe(2)
    } finally {
      vi.useRealTimers()
    }
  })

  it('a timeout reply is reported with the probe bound, never retried', async () => {
    const {client, calls} = scripted({p: [model], slow: [{status: null, code: 'timeout', message: 'no reply within 1.5 seconds'}]})
    const e = (await rejection(discover(client, refs('p', 'slow'), {probeTimeoutMs: 2500}), ControllerError)) as CoordinationError
    expect(calls.length).toBe(2)
    expect(e.failures).toEqual([{server: 'slow', status: null, code: 'timeout', message: 'no status reply within 2.5 seconds'}])
  })

  it('an unknown kind and an unsafe instance are named with the rule', async () => {
    const long = 'x'.repeat(129)
    const {client} = scripted({p: [model], k: [{kind: 'planner\n', instance: 'p'}], u: [{kind: 'agent', instance: long}]})
    const d = await discover(client, refs('p', 'k', 'u'), {tolerant: true})
    expect(d.failures).toEqual([
      {server: 'k', status: 200, code: 'unknown_kind', message: "unknown participant kind 'planner\\n'"},
      {server: 'u', status: 200, code: 'unsafe_instance', message: `instance '${long}' is not a safe path component (^[A-Za-z0-9][A-Za-z0-9._-]*$, at most 128 characters)`},
    ])
    expect(d.participants.map((p) => p.server)).toEqual(['p'])
  })

  it('two servers reporting one kind and instance: the second by name is refused, naming the first', async () => {
    const {client} = scripted({p: [model], b: [{kind: 'agent', instance: 'same'}], a: [{kind: 'agent', instance: 'same'}], c: [{kind: 'resources', instance: 'same'}]})
    const d = await discover(client, refs('p', 'b', 'a', 'c'), {tolerant: true})
    expect(d.failures).toEqual([{server: 'b', status: 200, code: 'duplicate_instance', message: 'reports agent/same, as a does: both would write gym/agent/same'}])
    expect(d.participants.map((p) => p.server)).toEqual(['p', 'a', 'b', 'c'])
  })

  it('no model is a failure of its own unless another server already failed for a reason other than its kind', async () => {
    const onlyKinds = scripted({e: [{kind: 'environment', instance: 'e'}], k: [{kind: 'planner', instance: 'p'}]})
    const d1 = await discover(onlyKinds.client, refs('e', 'k'), {tolerant: true})
    expect(d1.failures).toEqual([
      {server: 'deployment', status: null, code: 'no_model', message: 'no policy model takes part in checkpoints'},
      {server: 'k', status: 200, code: 'unknown_kind', message: "unknown participant kind 'planner'"},
    ])
    const down = scripted({e: [{kind: 'environment', instance: 'e'}], d: [refused]})
    const d2 = await discover(down.client, refs('e', 'd'), {tolerant: true, tries: 1})
    expect(d2.failures.map((f) => f.code)).toEqual(['connection'])
    const withModel = scripted({p: [model], k: [{kind: 'planner', instance: 'p'}]})
    const d3 = await discover(withModel.client, refs('p', 'k'), {tolerant: true})
    expect(d3.failures.map((f) => f.code)).toEqual(['unknown_kind'])
    // Only servers that are no participants: no model.
    const none = scripted({j: [{status: 404, code: null, message: 'Not Found'}]})
    const e = (await rejection(discover(none.client, refs('j')), ControllerError)) as CoordinationError
    expect(e.failures.map((f) => f.code)).toEqual(['no_model'])
    expect(e.code).toBe('discovery')
  })

  it('tolerant lists failures by server name; without it they fail discovery', async () => {
    const {client} = scripted({p: [model], zz: [{status: 500, code: null, message: 'z'}], aa: [{status: 500, code: null, message: 'a'}], mm: [{status: 503, code: null, message: 'm'}]})
    const d = await discover(client, refs('p', 'zz', 'mm', 'aa'), {tolerant: true})
    expect(d.failures.map((f) => f.server)).toEqual(['aa', 'mm', 'zz'])
    const e = (await rejection(discover(client, refs('p', 'zz', 'mm', 'aa'), {tolerant: false}), ControllerError)) as CoordinationError
    expect(e.failures.map((f) => f.server)).toEqual(['aa', 'mm', 'zz'])
    const ok = await discover(scripted({p: [model]}).client, refs('p'), {tolerant: false})
    expect(ok.failures).toEqual([])
  })
})
