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
    const n = times === undefined ? 1 : times === 'inf' ? Infinity : Number(times)
    let fault: Fault
    if (type === 'status') fault = {type, status: Number(arg ?? 500)}
    else if (type === 'delay') fault = {type, ms: Number(arg ?? 1000)}
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
