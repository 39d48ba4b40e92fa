import http from 'node:http'
import {AddressInfo} from 'node:net'
import {stringify} from 'yaml'

export const KIND_GROUP: Record<string, string> = {
  environment: 'environment_servers',
  model: 'responses_api_models',
  agent: 'responses_api_agents',
  resources: 'resources_servers',
  none: 'responses_api_models',
}

export interface HeadEntry {
  name: string
  kind: string
  url: string
}

/**
 * The implementation key (the config's second level) of a server of `kind`: shared by every server
 * of that kind here, as two servers running one implementation share it in Gym.
 */
export function implementationOf(kind: string): string {
  return `${kind === 'none' ? 'judge' : kind}_impl`
}

/** Gym's global config as a head server holds it: one top-level key per server. */
export function globalConfig(entries: HeadEntry[]): Record<string, unknown> {
  const cfg: Record<string, unknown> = {
    // Non-server keys a real config carries; discovery must skip them.
    policy_base_url: 'http://127.0.0.1:0/v1',
    checkpoint: {enabled: true, lease_grace_seconds: 600},
  }
  for (const e of entries) {
    const u = new URL(e.url)
    cfg[e.name] = {[KIND_GROUP[e.kind] ?? 'responses_api_models']: {[implementationOf(e.kind)]: {entrypoint: 'app.py', host: u.hostname, port: Number(u.port)}}}
  }
  return cfg
}

/** A double of Gym's head server: `/global_config_dict_yaml` and `/server_instances`. */
export class HeadServer {
  private readonly server: http.Server
  url = ''

  constructor(private readonly entries: HeadEntry[]) {
    this.server = http.createServer((req, res) => {
      const path = new URL(req.url ?? '/', 'http://x').pathname
      if (path === '/global_config_dict_yaml') {
        res.writeHead(200, {'content-type': 'application/json'})
        return res.end(JSON.stringify(stringify(globalConfig(this.entries))))
      }
      if (path === '/server_instances') {
        res.writeHead(200, {'content-type': 'application/json'})
        return res.end(
          JSON.stringify(
            this.entries.map((e) => {
              const u = new URL(e.url)
              // As Gym's RunHelper fills them: process_name and config_path are the top-level key,
              // name the implementation key.
              return {name: implementationOf(e.kind), process_name: e.name, config_path: e.name, server_type: KIND_GROUP[e.kind], host: u.hostname, port: Number(u.port), url: e.url}
            }),
          ),
        )
      }
      res.writeHead(404, {'content-type': 'application/json'})
      res.end('{"detail":"Not Found"}')
    })
  }

  async listen(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', () => r()))
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`
    return this.url
  }

  async close(): Promise<void> {
    this.server.closeAllConnections()
    await new Promise<void>((r) => this.server.close(() => r()))
  }
}
