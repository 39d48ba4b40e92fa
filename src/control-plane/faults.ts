import {OPERATIONS} from '../protocol/wire.js'

/**
 * Fault injection for the participant double. A fault applies to one route (`status`, an
 * operation name, `run`, or `*` for every route) for a number of requests.
 */
export type Fault =
  | {type: 'status'; status: number; body?: string}
  | {type: 'hang'}
  | {type: 'delay'; ms: number}
  /** Close the connection before handling the request. */
  | {type: 'drop'}
  /** Handle the request (its effects happen), then close the connection instead of replying. */
  | {type: 'drop-after'}

export interface FaultRule {
  route: string
  fault: Fault
  /** How many requests it applies to; Infinity for all. */
  times: number
}

/** The routes a fault can aim at: the control routes, the data plane's /run and step calls, or all. */
export const FAULT_ROUTES: readonly string[] = ['status', ...OPERATIONS, 'run', 'data', '*']

export class Faults {
  private rules: FaultRule[] = []

  add(route: string, fault: Fault, times = 1): this {
    this.rules.push({route, fault, times})
    return this
  }

  clear(): void {
    this.rules = []
  }

  take(route: string): Fault | undefined {
    const rule = this.rules.find((r) => r.times > 0 && (r.route === route || r.route === '*'))
    if (!rule) return undefined
    rule.times--
    return rule.fault
  }

  /** Parses `route:type[:arg][xN]`, e.g. `commit:status:500`, `prepare:hang`, `status:delay:200x3`. */
  static parse(spec: string): FaultRule {
    const m = /^([a-z*]+):(status|hang|delay|drop|drop-after)(?::(\d+))?(?:x(\d+|inf))?$/.exec(spec)
    if (!m) throw new Error(`invalid fault '${spec}': expected ROUTE:TYPE[:ARG][xN], e.g. commit:status:500 or prepare:hangx2`)
    const [, route, type, arg, times] = m
    if (!FAULT_ROUTES.includes(route!)) throw new Error(`invalid fault '${spec}': no route '${route}'; one of ${FAULT_ROUTES.join(', ')}`)
    const n = times === undefined ? 1 : times === 'inf' ? Infinity : Number(times)
    let fault: Fault
    if (type === 'status') {
      const status = Number(arg ?? 500)
      // What node:http can send; anything else would throw inside the server on the first request.
      if (status < 100 || status > 599) throw new Error(`invalid fault '${spec}': HTTP status ${status} is not 100 to 599`)
      fault = {type, status}
    } else if (type === 'delay') fault = {type, ms: Number(arg ?? 1000)}
    else fault = {type: type as 'hang' | 'drop' | 'drop-after'}
    return {route: route!, fault, times: n}
  }
}

/** A fault aimed at one member of a fleet: `SERVER:ROUTE:TYPE[:ARG][xN]`, as the fleet command takes it. */
export interface ServerFault {
  server: string
  rule: FaultRule
}

export function parseServerFault(spec: string): ServerFault {
  const i = spec.indexOf(':')
  if (i <= 0) throw new Error(`${spec}: expected SERVER:ROUTE:TYPE[:ARG][xN]`)
  return {server: spec.slice(0, i), rule: Faults.parse(spec.slice(i + 1))}
}
