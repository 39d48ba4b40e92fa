// The helpers the conformance-mutants test files share: a participant that breaks one rule (the
// real in-process double behind test/helpers/conformance-proxy.ts), a conformance run against it,
// its messages normalized, and the faults the case tables are built from.
import {createHash} from 'node:crypto'
import {appendFileSync} from 'node:fs'
import {mkdtemp, readdir, rm, unlink, writeFile} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {expect} from 'vitest'

import {ParticipantServer} from '../../src/control-plane/server.js'
import {ControlClient} from '../../src/coordination/client.js'
import {ConformanceReport, runConformance, selectChecks} from '../../src/coordination/conformance.js'
import {Discovery, discover} from '../../src/coordination/discover.js'
import {encodeManifest, participantDir} from '../../src/storage/participant-store.js'
import {TOKEN} from './fleet.js'
import {Answer, Fault, Kind, Own, READY, Req, authorized, faulty} from './conformance-proxy.js'

// ---------------------------------------------------------------- a participant that breaks one rule

export const sha = (b: string | Buffer) => createHash('sha256').update(b).digest('hex')

export interface CheckOpts {
  destructive?: boolean
  force?: boolean
  only?: string[]
  keepDir?: boolean
  dir?: string
  signal?: AbortSignal
  concurrency?: number
  timeoutS?: number
  /** The client's reply grace past a call's deadline, in seconds (Gym's 5 by default). */
  grace?: number
}

export async function discoverAll(own: Own, servers: {name: string; url: string}[], grace?: number): Promise<{client: ControlClient; discovery: Discovery}> {
  const client = new ControlClient({token: TOKEN, replyGraceSeconds: grace})
  own(() => client.close())
  return {client, discovery: await discover(client, servers, {tolerant: true, probeTimeoutMs: 5000, tries: 1})}
}

export async function check(own: Own, servers: {name: string; url: string}[], opts: CheckOpts = {}): Promise<ConformanceReport> {
  const {client, discovery} = await discoverAll(own, servers, opts.grace)
  const dir = opts.dir ?? (await scratchDir(own))
  return runConformance({
    client,
    token: TOKEN,
    discovery,
    checks: selectChecks(opts.only),
    destructive: opts.destructive,
    force: opts.force,
    keepDir: opts.keepDir,
    dir,
    timeoutS: opts.timeoutS ?? 10,
    signal: opts.signal,
    concurrency: opts.concurrency,
  })
}

export async function scratchDir(own: Own): Promise<string> {
  const d = await mkdtemp(path.join(os.tmpdir(), 'gymckpt-conformance-mutants-'))
  own(() => rm(d, {recursive: true, force: true}))
  return d
}

/** Tags, temporary paths and clock readings replaced, so that messages compare exactly. */
export function norm(s: string): string {
  return s
    .replace(/conformance-[0-9a-f]{8}/g, 'conformance-TAG')
    .replace(/\/[^\s,'"]*gymckpt-conformance-[A-Za-z0-9]+/g, 'SCRATCH')
    .replace(/\b1[78]\d{8}(\.\d+)?/g, 'T')
}

/** check id → normalized message (the first result of that check), and its outcome. */
export function msgs(r: ConformanceReport): Record<string, string> {
  const out: Record<string, string> = {}
  for (const x of r.results) out[x.id] ??= `${x.result}: ${norm(x.message)}`
  return out
}

/** Runs fn with its own cleanups (tests run side by side: each closes only what it started). */
export async function withCleanup<T>(fn: (own: Own) => Promise<T>): Promise<T> {
  const mine: (() => Promise<unknown>)[] = []
  try {
    return await fn((f) => void mine.push(f))
  } finally {
    for (const f of mine.reverse()) await f().catch(() => {})
  }
}

const DUMP = process.env.CONFORMANCE_DUMP === '1'

export interface Case {
  name: string
  fault: Fault
  opts?: CheckOpts
  kind?: Kind
  /** Messages expected (normalized), by check ID; every other selected check must pass or skip as listed. */
  want: Record<string, string>
  /** The participant is left idle with no retire mark (default: checked). */
  idle?: boolean
  /** Resumed IDs the participant remembers (the protocol's 64 by default). */
  kept?: number
  /** Further assertions on the requests the participant saw. */
  sent?: (requests: Req[]) => void
}

export async function runCase(c: Case): Promise<void> {
  await withCleanup(async (own) => {
    const {url, inner, requests} = await faulty(own, c.fault, {kind: c.kind, resumedIdsKept: c.kept})
    const report = await check(own, [{name: 'p', url}], c.opts)
    const got = msgs(report)
    if (DUMP) appendFileSync('/tmp/conf-dump.jsonl', JSON.stringify({name: c.name, got}) + '\n')
    for (const [id, m] of Object.entries(c.want)) expect(got[id], id).toBe(m)
    c.sent?.(requests)
    if (c.idle !== false) {
      expect(inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null, retired_rollouts: 0})
    }
  })
}

// ---------------------------------------------------------------- the cases

export const statusOnly = (fn: (json: any, r: Req) => any): Fault => ({after: (r, a) => (r.op === 'status' && a.status === 200 ? {...a, json: fn(a.json, r)} : a)})
/** Status as discovery sees it unchanged; the session's own reads (the 2nd status request on) changed. */
export function laterStatus(fn: (a: Answer) => Answer): Fault {
  let n = 0
  return {after: (r, a) => (r.op === 'status' && ++n > 1 ? fn(a) : a)}
}

/** A participant that accepts exactly the refusal probe `pick` matches (200 with `reply`), and refuses the rest as the double does. */
export const acceptOnly = (pick: (r: Req) => boolean, reply: unknown = {phase: 'idle', idempotent: true}): Fault => ({
  before: (r) => (authorized(r) && r.method === 'POST' && pick(r) ? {status: 200, json: reply} : undefined),
})
export const PREPARED = {phase: 'prepared', report: READY}
export const cid = (r: Req) => r.json?.checkpoint_id
export const ep0 = (r: Req) => r.json?.episode_ids?.[0]
export const EXTRA = 'conformance_unknown_field'

// ---------------------------------------------------------------- destructive checks

/** A hook on the participant's first successful commit of each checkpoint; later commits replay its answer. */
export function onFirstCommit(fn: (r: Req, a: Answer, pdir: string) => Promise<Answer | void>): Fault {
  const done = new Map<string, Answer>()
  return {
    async after(r, a, inner) {
      if (r.op !== 'commit' || a.status !== 200) return a
      const id = r.json.checkpoint_id as string
      if (done.has(id)) return done.get(id)!.json === null ? a : done.get(id)!
      const pdir = participantDir(r.json.checkpoint_dir, inner.participant!.kind, inner.participant!.instance)
      const out = (await fn(r, a, pdir)) ?? null
      done.set(id, out ?? {status: 0, json: null})
      return out ?? a
    },
  }
}

/** The first commit's records file replaced by `text` (named for its digest, manifest and reply to match). */
export const recordsAre = (text: string, episodeIds: string[], count = text.split('\n').length - 1) =>
  onFirstCommit(async (_r, a, pdir) => {
    for (const f of await readdir(pdir)) await unlink(path.join(pdir, f))
    const digest = sha(text)
    const manifest = {...a.json.manifest, records_file: `records-${digest}.jsonl`, records_sha256: digest, record_count: count}
    await writeFile(path.join(pdir, manifest.records_file), text, 'latin1')
    await writeFile(path.join(pdir, 'manifest.json'), encodeManifest(manifest))
    return {status: 200, json: {...a.json, manifest, episode_ids: episodeIds}}
  })

/** The first commit's manifest.json replaced by `text` (the reply unchanged unless `reply` says). */
export const manifestIs = (text: (m: Record<string, unknown>) => string | Buffer) =>
  onFirstCommit(async (_r, a, pdir) => {
    await unlink(path.join(pdir, 'manifest.json'))
    await writeFile(path.join(pdir, 'manifest.json'), text(a.json.manifest))
  })

/** Answers the n-th (1-based) well-authorized request of `op` itself. */
export function nth(op: string, n: number, answer: (r: Req, inner: ParticipantServer) => Answer | undefined): Fault {
  let seen = 0
  return {before: (r, inner) => (authorized(r) && r.op === op && ++seen === n ? answer(r, inner) : undefined)}
}

/** Reports `restarts` in the prepare reply (and in status when `inStatus`), and answers a commit naming `ghost` with `answer`. */
export const restarts = (list: unknown[], answer: Answer | null, inStatus = false): Fault => ({
  before: (r) => (authorized(r) && r.op === 'commit' && answer && r.json?.episode_ids?.some((e: any) => e.rollout_id === 'ghost') ? answer : undefined),
  after: (r, a) => ((r.op === 'prepare' || (inStatus && r.op === 'status')) && a.status === 200 && a.json.report ? {...a, json: {...a.json, report: {...a.json.report, restarts: list}}} : a),
})

export const D = (only?: string[]): CheckOpts => ({destructive: true, only})
export const AFTER = ['store.manifest', 'store.records', 'store.lines', 'store.manifest-last', 'commit.replay', 'commit.conflict', 'commit.export-once']
export const LINE = (k: string) => `{"episode_id": {"rollout_id": "${k}", "attempt": 0}}\n`

/** Answers prepare of an ID other than the open one (while one is open) with `a`. */
export const otherPrepare = (a: Answer): Fault => ({
  before: (r, inner) => (authorized(r) && r.op === 'prepare' && inner.controlPlane!.checkpointId !== null && inner.controlPlane!.checkpointId !== cid(r) ? a : undefined),
})
export const whileOpen = (op: string, a: Answer): Fault => ({before: (r, inner) => (authorized(r) && r.op === op && inner.controlPlane!.checkpointId !== null ? a : undefined)})

/** Resume of the open ID, answered by the participant and then by `change`. */
export const resumeOfOpen = (change: (a: Answer) => Answer): Fault => {
  let open: string | null = null
  return {
    before: (r, inner) => {
      if (authorized(r) && r.op === 'resume') open = inner.controlPlane!.checkpointId === cid(r) ? cid(r) : null
      return undefined
    },
    after: (r, a) => (r.op === 'resume' && open !== null && cid(r) === open ? change(a) : a),
  }
}
