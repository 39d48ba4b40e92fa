// Issue 7, item 3: verify reads a checkpoint without loading zod. The hand-written checks that let
// it (controllerManifestFast, gymCollectionManifestFast in root.ts; wireEpisode, rolloutIdIssue in
// episode.ts) are held here to the zod schemas, which stay the authority: on valid and mutated
// inputs, a manifest check that answers gives exactly zod's output (key order too), and the
// episode checks give zod's answer on every input.
import {mkdir, writeFile} from 'node:fs/promises'
import path from 'node:path'
import {inspect} from 'node:util'

import fc from 'fast-check'
import {describe, expect, it} from 'vitest'
import type {z} from 'zod'

import {rolloutIdIssue, wireEpisode} from '../../src/protocol/episode.js'
import {EpisodeIdWire, RolloutIdSchema} from '../../src/protocol/episode-schema.js'
import {ControllerManifest, GymCollectionManifest} from '../../src/storage/manifest-schemas.js'
import {CONTROLLER_MANIFEST, FORMAT_VERSION, GYM_COLLECTION_MANIFEST, controllerManifestFast, gymCollectionManifestFast, readCheckpointSummary} from '../../src/storage/root.js'
import {tempDir} from '../helpers/tmp.js'

const RUNS = 1500

// ---- generators: valid values ----

const validId = fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._-]{0,12}$/).filter((s) => !/-a[1-9][0-9]*$/.test(s))
const rolloutId = fc.oneof(
  {weight: 4, arbitrary: validId},
  validId.chain((id) => fc.integer({min: 0, max: 30}).map((n) => `${id}-a${n}`)),
  fc.constantFrom('', ' ', 'a b', '-r', '.r', '_', 'r/1', 'r\n', 'é', 'r-a0', 'r-a01', 'r-a1', 'r-a12', 'r-a', '__proto__', 'constructor'),
  fc.string({maxLength: 8}),
)
const attempt = fc.oneof(
  {weight: 4, arbitrary: fc.nat()},
  fc.constantFrom(0, -0, 1, Number.MAX_SAFE_INTEGER, 2 ** 53, 2 ** 53 + 2, -1, 1.5, 0.1, -0.5, 1e300, NaN, Infinity, -Infinity, '1', null, true, 1n, [], {}, undefined),
  fc.integer(),
  fc.double(),
)
const episodeWire = fc.record({rollout_id: validId, attempt: fc.oneof(fc.nat(), fc.constant(Number.MAX_SAFE_INTEGER))}, {requiredKeys: ['rollout_id']})
const extras = fc.dictionary(fc.oneof(fc.string({maxLength: 6}), fc.constantFrom('x', 'extra', 'toString', 'constructor')), fc.jsonValue({maxDepth: 2}), {maxKeys: 3})
const participantManifest = fc
  .tuple(
    extras,
    fc.record({
      schema_version: fc.oneof(fc.nat(3), fc.double({noNaN: true, noDefaultInfinity: true})),
      kind: fc.string({maxLength: 8}),
      instance: fc.string({maxLength: 8}),
      checkpoint_id: fc.string({maxLength: 8}),
      records_file: fc.string({maxLength: 8}),
      records_sha256: fc.string({maxLength: 8}),
      record_count: fc.oneof(fc.nat(), fc.constant(Number.MAX_SAFE_INTEGER), fc.integer()),
    }),
    fc.boolean(),
  )
  .map(([x, fields, extrasFirst]) => (extrasFirst ? {...x, ...fields} : {...fields, ...x}))
const participant = fc.record(
  {
    server: fc.string({maxLength: 8}),
    kind: fc.string({maxLength: 8}),
    instance: fc.string({maxLength: 8}),
    manifest: participantManifest,
    episode_ids: fc.array(fc.string({maxLength: 6}), {maxLength: 4}),
    // The model's (the mutations below also make it something zod refuses).
    staging_keys: fc.array(fc.string({maxLength: 6}), {maxLength: 4}),
  },
  {requiredKeys: ['server', 'kind', 'instance', 'manifest', 'episode_ids']},
)
const controllerManifest = fc.record(
  {
    format_version: fc.constant(FORMAT_VERSION),
    checkpoint_id: validId,
    created_at: fc.oneof(fc.nat(), fc.double({noNaN: true, noDefaultInfinity: true})),
    continued: fc.array(episodeWire, {maxLength: 5}),
    restarted: fc.array(episodeWire, {maxLength: 5}),
    participants: fc.array(participant, {maxLength: 3}),
    controller_state: fc.jsonValue({maxDepth: 2}),
  },
  {requiredKeys: ['format_version', 'checkpoint_id', 'created_at', 'continued', 'restarted', 'participants']},
)
const gymCollectionManifest = fc
  .tuple(
    extras,
    fc.record(
      {
        checkpoint_id: fc.string({maxLength: 8}),
        run_id: fc.string({maxLength: 8}),
        created_at: fc.oneof(fc.nat(), fc.double({noNaN: true, noDefaultInfinity: true})),
        continued: fc.array(episodeWire, {maxLength: 5}),
        restarted: fc.array(episodeWire, {maxLength: 5}),
      },
      {requiredKeys: ['checkpoint_id', 'created_at', 'continued']},
    ),
  )
  .map(([x, fields]) => ({...x, ...fields}))

// ---- mutations: at any level of a value, a wrong type, a missing key, an extra key ----

const wrong = fc.oneof(
  {weight: 4, arbitrary: fc.constantFrom(null, undefined, true, 0, -0, -1, 1.5, 2 ** 53, NaN, Infinity, '', 'x', 'a b', 'r-a1', [], {}, [{}], {rollout_id: 'r'})},
  fc.string({maxLength: 4}),
  fc.integer(),
  fc.double(),
  fc.jsonValue({maxDepth: 2}),
)
const extraKey = fc.oneof(fc.constantFrom('x', 'extra', '__proto__', 'constructor', 'rollout_id', 'attempt', 'run_id', 'controller_state', 'restarted', 'manifest'), fc.string({maxLength: 5}))

type Path = (string | number)[]
interface Mutation {
  at: number
  /** Only the value itself and its own keys: the top level, mutated as often as all the rest. */
  shallow: boolean
  how: 'replace' | 'delete' | 'add'
  key: string
  value: unknown
}
const mutation: fc.Arbitrary<Mutation> = fc.record({at: fc.nat(), shallow: fc.boolean(), how: fc.constantFrom('replace', 'delete', 'add'), key: extraKey, value: wrong})

/** Every path in `v`: the value itself, each object's keys, each array's elements. */
function paths(v: unknown, at: Path = [], out: Path[] = []): Path[] {
  out.push(at)
  if (Array.isArray(v)) v.forEach((x, i) => paths(x, [...at, i], out))
  else if (v !== null && typeof v === 'object') for (const k of Object.keys(v)) paths((v as Record<string, unknown>)[k], [...at, k], out)
  return out
}

/** A copy of an object with own keys only (an own __proto__ stays a key, not the prototype). */
function ownCopy(o: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const k of Object.keys(o)) Object.defineProperty(out, k, {value: o[k], enumerable: true, writable: true, configurable: true})
  return out
}

/** `v` with `f` applied to the value at `at`, every container on the way copied. */
function update(v: unknown, at: Path, f: (x: unknown) => unknown): unknown {
  if (at.length === 0) return f(v)
  const [head, ...rest] = at
  if (Array.isArray(v)) return v.map((x, i) => (i === head ? update(x, rest, f) : x))
  const o = ownCopy(v as Record<string, unknown>)
  Object.defineProperty(o, head as string, {value: update(o[head as string], rest, f), enumerable: true, writable: true, configurable: true})
  return o
}

const isPlainObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v)

function valueAt(v: unknown, at: Path): unknown {
  return at.reduce<unknown>((x, k) => (x as Record<string | number, unknown>)[k], v)
}

function mutate(v: unknown, m: Mutation): unknown {
  const all = m.shallow ? paths(v).filter((p) => p.length <= 1) : paths(v)
  // An extra key goes on an object (every level of the manifest, the stripping ones included).
  const objects = all.filter((p) => isPlainObject(valueAt(v, p)))
  const at = m.how === 'add' && objects.length ? objects[m.at % objects.length]! : all[m.at % all.length]!
  if (m.how === 'replace') return update(v, at, () => m.value)
  if (m.how === 'delete') {
    if (at.length === 0) return m.value
    const parent = at.slice(0, -1)
    const last = at[at.length - 1]!
    return update(v, parent, (p) => {
      if (Array.isArray(p)) return p.filter((_, i) => i !== last)
      const o = ownCopy(p as Record<string, unknown>)
      delete o[last as string]
      return o
    })
  }
  return update(v, at, (x) => {
    if (x === null || typeof x !== 'object') return m.value
    if (Array.isArray(x)) return [...x, m.value]
    const o = ownCopy(x as Record<string, unknown>)
    Object.defineProperty(o, m.key, {value: m.value, enumerable: true, writable: true, configurable: true})
    return o
  })
}

/** Valid values, valid values as read back from JSON, and the same with one to three mutations. */
function validAndMutated(valid: fc.Arbitrary<unknown>): fc.Arbitrary<unknown> {
  return fc.oneof(
    valid,
    valid.map((v) => JSON.parse(JSON.stringify(v))),
    fc.tuple(valid, fc.array(mutation, {minLength: 1, maxLength: 3})).map(([v, ms]) => ms.reduce(mutate, v)),
    fc.tuple(valid, fc.array(mutation, {minLength: 1, maxLength: 3})).map(([v, ms]) => JSON.parse(JSON.stringify(ms.reduce(mutate, v)) ?? 'null')),
  )
}

/** Whenever the fast check answers, zod accepts the input and gives the same output, key order included. */
function agrees(fast: (v: unknown) => unknown, schema: z.ZodType, v: unknown): boolean {
  const got = fast(v)
  if (got === null) return false
  const parsed = schema.safeParse(v)
  expect(parsed.success, `zod refuses what the fast check took: ${parsed.error?.message}`).toBe(true)
  expectSame(got, parsed.data)
  return true
}

/**
 * Deep equality stricter than toStrictEqual: Object.is at the leaves (-0 is not 0), the same
 * prototypes and the same own keys in the same order at every level. (toStrictEqual also trips
 * on an own "constructor": NaN, which a manifest's opaque parts may hold.)
 */
function expectSame(a: unknown, b: unknown, where = '(root)'): void {
  if (Object.is(a, b)) return
  if (a === null || typeof a !== 'object' || b === null || typeof b !== 'object') expect.fail(`${where}: ${inspect(a)} is not ${inspect(b)}`)
  expect(Object.getPrototypeOf(a), where).toBe(Object.getPrototypeOf(b))
  expect(Reflect.ownKeys(a as object), where).toEqual(Reflect.ownKeys(b as object))
  for (const k of Object.keys(a as object)) expectSame((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k], `${where}.${k}`)
}

const hasProtoKey = (v: unknown): boolean => paths(v).some((p) => p[p.length - 1] === '__proto__')

describe('rollout IDs and EpisodeIdWire without zod', () => {
  it('rolloutIdIssue gives the message of the first issue RolloutIdSchema reports, null when it accepts', () => {
    fc.assert(
      fc.property(fc.oneof(rolloutId, fc.string()), (id) => {
        expect(rolloutIdIssue(id)).toBe(RolloutIdSchema.safeParse(id).error?.issues[0]?.message ?? null)
      }),
      {numRuns: RUNS},
    )
  })

  const episodeValue = fc.oneof(
    fc.record({rollout_id: rolloutId, attempt}, {requiredKeys: []}),
    fc.record({rollout_id: fc.oneof(rolloutId, wrong), attempt: fc.oneof(attempt, wrong)}, {requiredKeys: []}),
    fc.tuple(fc.record({rollout_id: rolloutId, attempt}, {requiredKeys: ['rollout_id']}), mutation).map(([v, m]) => mutate(v, m)),
    fc.tuple(validId, fc.nat(), extraKey).map(([id, a, k]) => JSON.parse(`{"rollout_id": ${JSON.stringify(id)}, "attempt": ${a}, ${JSON.stringify(k)}: 1}`)),
    fc.tuple(validId, fc.nat()).map(
      ([id, a]) =>
        new Map<string, unknown>([
          ['rollout_id', id],
          ['attempt', a],
        ]),
    ),
    wrong,
    fc.anything(),
  )

  it('wireEpisode(v) is EpisodeIdWire.safeParse(v)’s output, or null when it fails, on every input', () => {
    fc.assert(
      fc.property(episodeValue, (v) => {
        const parsed = EpisodeIdWire.safeParse(v)
        const got = wireEpisode(v)
        expect(got).toStrictEqual(parsed.success ? parsed.data : null)
        if (got !== null) expect(Object.is(got.attempt, parsed.data!.attempt)).toBe(true)
      }),
      {numRuns: RUNS * 2},
    )
  })

  it('the edges: attempt absent or undefined is 0; 2**53, -1, 1.5, NaN, strings are refused; -0 kept', () => {
    expect(wireEpisode({rollout_id: 'r'})).toEqual({rollout_id: 'r', attempt: 0})
    expect(wireEpisode({rollout_id: 'r', attempt: undefined})).toEqual({rollout_id: 'r', attempt: 0})
    expect(wireEpisode({rollout_id: 'r', attempt: Number.MAX_SAFE_INTEGER})).toEqual({rollout_id: 'r', attempt: Number.MAX_SAFE_INTEGER})
    expect(Object.is(wireEpisode({rollout_id: 'r', attempt: -0})!.attempt, -0)).toBe(true)
    for (const bad of [2 ** 53, -1, 1.5, NaN, Infinity, '1', null]) expect(wireEpisode({rollout_id: 'r', attempt: bad}), String(bad)).toBeNull()
    for (const bad of [{}, {rollout_id: ''}, {rollout_id: 'r-a1'}, {rollout_id: 'r', x: 1}, JSON.parse('{"rollout_id": "r", "__proto__": 1}'), [], 'r', null]) {
      expect(wireEpisode(bad), JSON.stringify(bad)).toBeNull()
      expect(EpisodeIdWire.safeParse(bad).success).toBe(false)
    }
  })
})

describe('manifests without zod: an answer is always zod’s answer', () => {
  it('controller manifests (gymckpt.json), valid and mutated at every level', () => {
    let answered = 0
    fc.assert(
      fc.property(validAndMutated(controllerManifest), (v) => {
        if (agrees(controllerManifestFast, ControllerManifest, v)) answered++
      }),
      {numRuns: RUNS},
    )
    // The fast path is the common path, not a check that never answers.
    expect(answered).toBeGreaterThan(RUNS / 4)
  })

  it('Gym collection manifests (collection.json), valid and mutated at every level', () => {
    let answered = 0
    fc.assert(
      fc.property(validAndMutated(gymCollectionManifest), (v) => {
        if (agrees(gymCollectionManifestFast, GymCollectionManifest, v)) answered++
      }),
      {numRuns: RUNS},
    )
    expect(answered).toBeGreaterThan(RUNS / 4)
  })

  it('a valid manifest, as JSON.parse gives it, is answered by the fast check (zod is not loaded for it)', () => {
    fc.assert(
      fc.property(controllerManifest, gymCollectionManifest, (c, g) => {
        fc.pre(!hasProtoKey(c) && !hasProtoKey(g))
        expect(controllerManifestFast(JSON.parse(JSON.stringify(c)))).not.toBeNull()
        expect(gymCollectionManifestFast(JSON.parse(JSON.stringify(g)))).not.toBeNull()
      }),
      {numRuns: 300},
    )
  })

  // What the random inputs above reach only by chance, as JSON.parse gives it: 1e400 parses to
  // Infinity, and a "__proto__" key is an own key of the parsed object.
  it('the edges of the numbers and of a participant manifest: refused or left to zod, never taken', () => {
    const pm = '{"schema_version": 1, "kind": "agent", "instance": "a", "checkpoint_id": "c", "records_file": "records.jsonl", "records_sha256": "0", "record_count": 0}'
    const controller = (manifest: string, createdAt = '1') =>
      `{"format_version": ${FORMAT_VERSION}, "checkpoint_id": "c", "created_at": ${createdAt}, "continued": [], "restarted": [], "participants": [{"server": "a", "kind": "agent", "instance": "a", "manifest": ${manifest}, "episode_ids": []}]}`
    expect(agrees(controllerManifestFast, ControllerManifest, JSON.parse(controller(pm)))).toBe(true)
    const cases = {
      'record_count 1.5': controller(pm.replace('"record_count": 0', '"record_count": 1.5')),
      'record_count "3"': controller(pm.replace('"record_count": 0', '"record_count": "3"')),
      'record_count 2**53': controller(pm.replace('"record_count": 0', '"record_count": 9007199254740992')),
      'schema_version 1e400': controller(pm.replace('"schema_version": 1', '"schema_version": 1e400')),
      'schema_version "1"': controller(pm.replace('"schema_version": 1', '"schema_version": "1"')),
      'created_at 1e400': controller(pm, '1e400'),
      'created_at -1e400': controller(pm, '-1e400'),
      'created_at "1"': controller(pm, '"1"'),
      // zod drops "__proto__" and keeps the extra key after it.
      'a participant manifest with "__proto__"': controller(pm.replace('{', '{"__proto__": {"polluted": 1}, "gym_extra": 1, ')),
    }
    for (const [what, text] of Object.entries(cases)) {
      const v: unknown = JSON.parse(text)
      expect(controllerManifestFast(v), what).toBeNull()
      // Where zod takes it (it drops "__proto__"), its answer is the one a reader gets.
      if (what.includes('__proto__')) expect(ControllerManifest.safeParse(v).success, what).toBe(true)
      else expect(ControllerManifest.safeParse(v).success, what).toBe(false)
    }
    for (const createdAt of ['1e400', '"1"']) {
      const v: unknown = JSON.parse(`{"checkpoint_id": "g", "created_at": ${createdAt}, "continued": []}`)
      expect(gymCollectionManifestFast(v), createdAt).toBeNull()
    }
  })

  it('what the fast check leaves to zod still reads as zod says: stripped keys, defaults, zod’s own words', async () => {
    const dir = await tempDir()
    const ours = path.join(dir, 'ours')
    const gym = path.join(dir, 'gym')
    await mkdir(ours)
    await mkdir(gym)
    const manifest = {schema_version: 1, kind: 'agent', instance: 'a', checkpoint_id: 'c', records_file: 'records.jsonl', records_sha256: '0', record_count: 0, gym_extra: [1]}
    const p = {server: 'a', kind: 'agent', instance: 'a', manifest, episode_ids: []}
    const base = {format_version: FORMAT_VERSION, checkpoint_id: 'c', created_at: 1, continued: [{rollout_id: 'r'}], restarted: [], participants: [p]}
    expect(controllerManifestFast(base)).toEqual({...base, continued: [{rollout_id: 'r', attempt: 0}]})
    // A key that z.object would strip, at either level, is left to zod.
    expect(controllerManifestFast({...base, participants: [{...p, unknown: 1}]})).toBeNull()
    const m = {...base, unknown: 1}
    expect(controllerManifestFast(m)).toBeNull()
    await writeFile(path.join(ours, CONTROLLER_MANIFEST), JSON.stringify(m))
    const s = await readCheckpointSummary(ours)
    expect(s).toMatchObject({source: CONTROLLER_MANIFEST, checkpointId: 'c', continued: [{rollout_id: 'r', attempt: 0}], restarted: [], participants: [p]})
    await writeFile(path.join(ours, CONTROLLER_MANIFEST), JSON.stringify({...m, created_at: 'now'}), {flag: 'w'})
    await expect(readCheckpointSummary(ours)).rejects.toThrow(/gymckpt\.json is not a gymckpt manifest: created_at: Invalid input: expected number, received string$/)
    await writeFile(path.join(gym, GYM_COLLECTION_MANIFEST), JSON.stringify({checkpoint_id: 'g', created_at: 2, continued: [{rollout_id: 'r', attempt: -1}]}))
    await expect(readCheckpointSummary(gym)).rejects.toThrow(/collection\.json is not a Gym collection manifest: continued\.0\.attempt: Too small/)
  })
})
