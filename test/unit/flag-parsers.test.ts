// The parsers behind `fleet --member` and `fleet --fault`, and checked(), which turns a parser's
// refusal into an input error (exit 2) where the flag is declared, before any command runs.
import {Flags, Parser} from '@oclif/core'
import {describe, expect, it} from 'vitest'

import {checked, parseDuration} from '../../src/cli/flags.js'
import {parseCheckpointIdFlag} from '../../src/cli/inputs.js'
import {parseServerFault} from '../../src/control-plane/faults.js'
import {MEMBER_KINDS, parseMember} from '../../src/control-plane/fleet.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {thrown} from '../helpers/errors.js'

describe('parseMember (--member NAME=KIND)', () => {
  it('reads NAME=KIND for every kind, "none" included', () => {
    for (const kind of MEMBER_KINDS) expect(parseMember(`srv_${kind}=${kind}`)).toEqual({name: `srv_${kind}`, kind})
    expect(MEMBER_KINDS).toEqual(['environment', 'model', 'agent', 'resources', 'none'])
    expect(parseMember('weather_env=environment')).toEqual({name: 'weather_env', kind: 'environment'})
    expect(parseMember('judge-model.v2=none')).toEqual({name: 'judge-model.v2', kind: 'none'})
  })

  it.each([
    ['no =', 'policy'],
    ['an empty name', '=model'],
    ['an empty kind', 'policy='],
    ['an unknown kind', 'policy=planner'],
    ['a kind in another case', 'policy=Model'],
    ['a kind with spaces', 'policy= model'],
    ['a second =', 'policy=model=x'],
    ['a name with = in it', 'a=b=model'],
  ])('refuses %s, naming the value and the kinds it takes', (_what, spec) => {
    const err = thrown(() => parseMember(spec))
    expect(err.message).toContain(spec)
    expect(err.message).toContain('expected NAME=KIND')
    for (const k of MEMBER_KINDS) expect(err.message).toContain(k)
  })

  it('refuses an empty value', () => {
    expect(() => parseMember('')).toThrow(/expected NAME=KIND/)
  })
})

describe('parseServerFault (--fault SERVER:ROUTE:TYPE[:ARG][xN])', () => {
  it('reads the examples of the fleet help', () => {
    expect(parseServerFault('policy_model:commit:status:500')).toEqual({server: 'policy_model', rule: {route: 'commit', fault: {type: 'status', status: 500}, times: 1}})
    expect(parseServerFault('weather_env:prepare:hang')).toEqual({server: 'weather_env', rule: {route: 'prepare', fault: {type: 'hang'}, times: 1}})
  })

  it('reads every fault type, its argument and its default, and the repeat count', () => {
    const rule = (spec: string) => parseServerFault(spec).rule
    expect(rule('env:commit:status')).toEqual({route: 'commit', fault: {type: 'status', status: 500}, times: 1})
    expect(rule('env:resume:status:503x2')).toEqual({route: 'resume', fault: {type: 'status', status: 503}, times: 2})
    expect(rule('env:status:delay:200x3')).toEqual({route: 'status', fault: {type: 'delay', ms: 200}, times: 3})
    expect(rule('env:run:delay')).toEqual({route: 'run', fault: {type: 'delay', ms: 1000}, times: 1})
    expect(rule('env:prepare:hangx2')).toEqual({route: 'prepare', fault: {type: 'hang'}, times: 2})
    expect(rule('env:*:dropxinf')).toEqual({route: '*', fault: {type: 'drop'}, times: Infinity})
    expect(rule('env:commit:drop-after')).toEqual({route: 'commit', fault: {type: 'drop-after'}, times: 1})
  })

  it('the server is everything before the first colon', () => {
    expect(parseServerFault('res:commit:status:409').server).toBe('res')
    expect(parseServerFault('a.b-c:renew:hang').server).toBe('a.b-c')
  })

  it.each([
    ['no colon', 'policy'],
    ['an empty server', ':commit:status:500'],
  ])('refuses %s, naming the value and the expected shape', (_what, spec) => {
    const err = thrown(() => parseServerFault(spec))
    expect(err.message).toContain(spec)
    expect(err.message).toContain('expected SERVER:ROUTE:TYPE[:ARG][xN]')
  })

  it.each([
    ['no fault', 'env:', ''],
    ['a route without a type', 'env:commit', 'commit'],
    ['an unknown type', 'env:commit:explode', 'commit:explode'],
    ['a route in capitals', 'env:Commit:status', 'Commit:status'],
    ['an argument that is no number', 'env:commit:status:abc', 'commit:status:abc'],
    ['a repeat without a count', 'env:commit:statusx', 'commit:statusx'],
    ['a negative repeat', 'env:commit:status:500x-1', 'commit:status:500x-1'],
  ])('refuses %s, naming the fault it could not read', (_what, spec, fault) => {
    const err = thrown(() => parseServerFault(spec))
    expect(err.message).toContain(`invalid fault '${fault}'`)
    expect(err.message).toContain('expected ROUTE:TYPE[:ARG][xN]')
  })
})

describe('Faults.parse: only faults the double can carry out', () => {
  it.each([
    ['an HTTP status node:http cannot send (the fleet would crash on the first request)', 'env:status:status:99', /HTTP status 99 is not 100 to 599/],
    ['an HTTP status above 599', 'env:commit:status:600', /HTTP status 600 is not 100 to 599/],
    ['a route that does not exist (the fault would never fire)', 'env:comit:status:500', /no route 'comit'; one of status, prepare, .*run, data, \*/],
  ])('refuses %s', (_what, spec, message) => {
    expect(() => parseServerFault(spec)).toThrow(message)
  })

  it('takes the bounds themselves, every control route, run, data and *', () => {
    expect(parseServerFault('a:commit:status:100').rule.fault).toEqual({type: 'status', status: 100})
    expect(parseServerFault('a:commit:status:599').rule.fault).toEqual({type: 'status', status: 599})
    for (const route of ['status', 'prepare', 'renew', 'retire', 'forget', 'commit', 'restore', 'resume', 'run', 'data', '*']) expect(parseServerFault(`a:${route}:hang`).rule.route).toBe(route)
  })
})

describe('checked(): a parser for Flags.custom', () => {
  it('resolves to what the parser returns, calling it once with the value as given', async () => {
    const seen: string[] = []
    const parse = checked((v) => {
      seen.push(v)
      return {upper: v.toUpperCase()}
    })
    const p = parse(' a=b ')
    expect(p).toBeInstanceOf(Promise)
    expect(await p).toEqual({upper: ' A=B '})
    expect(seen).toEqual([' a=b '])
    expect(await checked(parseMember)('policy=model')).toEqual({name: 'policy', kind: 'model'})
  })

  it('a plain Error from the parser becomes an input error with the same message (a rejection, never a synchronous throw)', async () => {
    const parse = checked(parseMember)
    let p: Promise<unknown> | undefined
    expect(() => (p = parse('policy=planner'))).not.toThrow()
    const err = await p!.catch((e: unknown) => e)
    expect(err).toBeInstanceOf(ControllerError)
    expect((err as ControllerError).code).toBe('input')
    expect((err as Error).message).toBe(thrown(() => parseMember('policy=planner')).message)

    const fault = (await checked(parseServerFault)('env:commit:explode').catch((e: unknown) => e)) as ControllerError
    expect(fault.code).toBe('input')
    expect(fault.message).toContain("invalid fault 'commit:explode'")

    const dur = (await checked((v) => parseDuration(v, '--checkpoint-every', 86_400))('soon').catch((e: unknown) => e)) as ControllerError
    expect(dur.code).toBe('input')
    expect(dur.message).toContain('--checkpoint-every "soon"')
  })

  it('any Error subclass is an input error too', async () => {
    const err = (await checked((v) => JSON.parse(v) as unknown)('{').catch((e: unknown) => e)) as ControllerError
    expect(err).toBeInstanceOf(ControllerError)
    expect(err.code).toBe('input')
  })

  it('a ControllerError passes through as it is: same object, same code, same next steps', async () => {
    const own = new ControllerError('fleet_state', 'held elsewhere').withNext({command: 'status', args: [], fleet: true})
    const err = await checked(() => {
      throw own
    })('x').catch((e: unknown) => e)
    expect(err).toBe(own)
    expect((err as ControllerError).code).toBe('fleet_state')
    const id = (await checked(parseCheckpointIdFlag)('../x').catch((e: unknown) => e)) as ControllerError
    expect(id.code).toBe('input')
    expect(id.message).toContain("'../x'")
  })

  it('through oclif: good values arrive parsed; a bad one reaches the command base as an input error naming it', async () => {
    const flags = {
      member: Flags.custom({parse: checked(parseMember)})({multiple: true}),
      fault: Flags.custom({parse: checked(parseServerFault)})({multiple: true}),
    }
    const ok = await Parser.parse(['--member', 'env=environment', '--member', 'judge=none', '--fault', 'env:commit:status:500x2'], {flags})
    expect(ok.flags.member).toEqual([
      {name: 'env', kind: 'environment'},
      {name: 'judge', kind: 'none'},
    ])
    expect(ok.flags.fault).toEqual([{server: 'env', rule: {route: 'commit', fault: {type: 'status', status: 500}, times: 2}}])
    for (const [argv, named] of [
      [['--member', 'env=planner'], 'env=planner'],
      [['--fault', 'env:commit:explode'], "invalid fault 'commit:explode'"],
    ] as const) {
      const err = (await Parser.parse([...argv], {flags}).catch((e: unknown) => e)) as ControllerError
      expect(err, argv.join(' ')).toBeInstanceOf(ControllerError)
      expect(err.code).toBe('input')
      expect(err.message).toContain(named)
    }
  })
})
