// Mutation-testing follow-up for src/coordination/conformance.ts, the run around the checks
// (discovery, order, cleanup, interrupts); see conformance-mutants.test.ts for how the cases work.
// Split from it so that the file whose test killed the last mutant runs first for the next one
// (vitest runs the files that failed last time first), not after 200 other cases.
import {readdir, utimes, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {CHECKS, checkManifestLast, conformanceJson, selectChecks} from '../../src/coordination/conformance.js'
import {ControllerError, CoordinationError} from '../../src/coordination/errors.js'
import {TOKEN, startFleet} from '../helpers/fleet.js'
import {Fault, Req, VALID, authorized, faulty} from '../helpers/conformance-proxy.js'
import {tempDir} from '../helpers/tmp.js'
import {rejection, thrown} from '../helpers/errors.js'
import {check, scratchDir, norm, msgs, withCleanup, statusOnly, cid} from '../helpers/conformance-cases.js'

// ---------------------------------------------------------------- the run

describe('the run around the checks', () => {
  it('servers discovery could judge become results; one without the routes is skipped; none at all is an error', async () => {
    await withCleanup(async (own) => {
      const judge = await faulty(
        own,
        statusOnly((j) => ({...j, kind: 'judge'})),
      )
      const unsafe = await faulty(
        own,
        statusOnly((j) => ({...j, instance: '../p'})),
      )
      const broken = await faulty(own, {before: (r) => (r.op === 'status' && authorized(r) ? {status: 500, json: 'boom'} : undefined)})
      const none = await startFleet({members: [{name: 'nothing', kind: 'none'}]})
      const report = await check(own, [
        {name: 'z-judge', url: judge.url},
        {name: 'a-unsafe', url: unsafe.url},
        {name: 'm-broken', url: broken.url},
        {name: 'nothing', url: none.servers[0]!.url},
      ])
      expect(report.participants).toEqual([])
      expect(report.results.map((r) => [r.id, r.server, r.result, r.message])).toEqual([
        ['status.reply', 'm-broken', 'fail', 'HTTP 500 boom'],
        ['status.kind', 'z-judge', 'fail', "unknown participant kind 'judge'"],
        ['status.instance', 'a-unsafe', 'fail', "instance '../p' is not a safe path component (^[A-Za-z0-9][A-Za-z0-9._-]*$, at most 128 characters)"],
        ...CHECKS.filter((d) => d.destructive).map((d) => [d.id, null, 'skip', 'changes participant state: run with --destructive on a staging fleet']),
      ])
      expect(report).toMatchObject({passed: false, destructive: false, interrupted: false, counts: {pass: 0, fail: 3, skip: 21}})

      // Destructive over no participant at all: nothing to prepare, no directory made.
      const dir = await scratchDir(own)
      const d = await check(own, [{name: 'z-judge', url: judge.url}], {destructive: true, dir})
      expect(d.destructive).toBe(false)
      expect(d.results.map((r) => r.id)).toEqual(['status.kind'])
      expect(await readdir(dir)).toEqual([])

      const e = await rejection(check(own, [{name: 'nothing', url: none.servers[0]!.url}]), ControllerError)
      expect(e.code).toBe('discovery')
      expect(e.message).toBe('no checkpoint participant among the servers: every one answered 404 on GET …/checkpoint/status')
    })
  })

  it('a server that refuses the token or does not answer stops the run before anything is sent', async () => {
    await withCleanup(async (own) => {
      const ok = await faulty(own, {})
      const refusing = await faulty(own, {auth: () => 'Bearer nope'})
      const e = await rejection(
        check(own, [
          {name: 'ok', url: ok.url},
          {name: 'refusing', url: refusing.url},
        ]),
        CoordinationError,
      )
      expect(e.message).toBe(
        'checkpoint discover failed on 1 participant(s): refusing: HTTP 401 unauthorized missing or invalid checkpoint control bearer token. conformance needs an answer to GET status from every server it checks',
      )
      const down = await faulty(own, {before: (r) => (r.op === 'status' ? {status: 0, json: null} : undefined)})
      const e2 = await rejection(
        check(own, [
          {name: 'ok', url: ok.url},
          {name: 'down', url: down.url},
        ]),
        CoordinationError,
      )
      expect(e2.message).toMatch(/^checkpoint discover failed on 1 participant\(s\): down: connection closed before a reply after 1 tries\. conformance needs/)
      expect(ok.requests.filter((r) => r.method === 'POST')).toEqual([])
    })
  })

  it('two participants reporting one directory: status.instance fails on the second, naming it', async () => {
    await withCleanup(async (own) => {
      const a = await faulty(own, {})
      const b = await faulty(own, {})
      const report = await check(
        own,
        [
          {name: 'a', url: a.url},
          {name: 'b', url: b.url},
        ],
        {only: ['status.instance', 'status.reply']},
      )
      // The status itself is fine: only status.instance fails.
      expect(report.results.map((r) => [r.id, r.server, r.result, r.message])).toEqual([
        ['status.reply', 'a', 'pass', 'model/p idle'],
        ['status.reply', 'b', 'pass', 'model/p idle'],
        ['status.instance', 'a', 'pass', 'p'],
        ['status.instance', 'b', 'fail', 'another participant also reports model/p: both would write gym/model/p'],
      ])
    })
  })

  it('results are in check order, then server order; the run-level skips come first', async () => {
    await withCleanup(async (own) => {
      const fleet = await startFleet({
        members: [
          {name: 'z', kind: 'model'},
          {name: 'b', kind: 'agent'},
          {name: 'a', kind: 'environment'},
        ],
      })
      const report = await check(
        own,
        fleet.servers.map((s) => ({name: s.name, url: s.url})),
        {only: ['status.kind', 'retire.forget', 'auth.missing-bearer'], concurrency: 1},
      )
      expect(report.participants.map((p) => p.server)).toEqual(['a', 'z', 'b'])
      expect(report.results.map((r) => `${r.id} ${r.server}`)).toEqual([
        'auth.missing-bearer a',
        'auth.missing-bearer z',
        'auth.missing-bearer b',
        'status.kind a',
        'status.kind z',
        'status.kind b',
        'retire.forget null',
      ])
      expect(report.counts).toEqual({pass: 6, fail: 0, skip: 1})
      expect(report.passed).toBe(true)
      const json = conformanceJson(report)
      expect(json).toEqual({
        passed: true,
        destructive: false,
        interrupted: false,
        checkpoint_dir: null,
        participants: [
          {server: 'a', kind: 'environment', instance: 'a'},
          {server: 'z', kind: 'model', instance: 'z'},
          {server: 'b', kind: 'agent', instance: 'b'},
        ],
        counts: {pass: 6, fail: 0, skip: 1},
        checks: report.results.map((r) => ({id: r.id, section: r.section, rule: r.rule, server: r.server, result: r.result, message: r.message})),
      })
      expect(json.checks[0]).toEqual({id: 'auth.missing-bearer', section: '§1', rule: CHECKS[0]!.rule, server: 'a', result: 'pass', message: '401 unauthorized'})
    })
  })

  it('--destructive on a fleet with live work names each busy server; a retire mark alone is not live work', async () => {
    await withCleanup(async (own) => {
      const busy = await faulty(
        own,
        statusOnly((j) => ({...j, report: {...j.report, ready: false, blockers: ['r1'], blocker_count: 1}})),
      )
      const marked = await faulty(own, {}, {instance: 'q'})
      await marked.inner.controlPlane!.retire({checkpoint_id: 'retire', deadline_ts: Date.now() / 1000 + 10, episode_ids: [{rollout_id: 'old', attempt: 0}]})
      const e = await rejection(
        check(
          own,
          [
            {name: 'busy', url: busy.url},
            {name: 'marked', url: marked.url},
          ],
          {destructive: true},
        ),
        ControllerError,
      )
      expect(e.code).toBe('fleet_state')
      expect(e.message).toBe(
        'conformance --destructive prepares, commits and resumes every participant, and 1 hold(s) live work: busy reports 1 blocker(s) (work in flight). Run it on a staging fleet, or add --force; nothing was sent',
      )
      expect(marked.requests.filter((r) => r.method === 'POST')).toEqual([])

      // Several busy servers, one with several reasons: each named with all of its reasons.
      const prepared = await faulty(
        own,
        statusOnly((j) => ({...j, report: {...j.report, ready: false, blockers: ['r2'], blocker_count: 1}})),
        {instance: 'r'},
      )
      await prepared.inner.controlPlane!.prepare({checkpoint_id: 'theirs', deadline_ts: Date.now() / 1000 + 10})
      const e2 = await rejection(
        check(
          own,
          [
            {name: 'busy', url: busy.url},
            {name: 'prepared', url: prepared.url},
          ],
          {destructive: true},
        ),
        ControllerError,
      )
      expect(e2.message).toBe(
        "conformance --destructive prepares, commits and resumes every participant, and 2 hold(s) live work: busy reports 1 blocker(s) (work in flight); prepared is in phase prepared of 'theirs', reports 1 blocker(s) (work in flight). Run it on a staging fleet, or add --force; nothing was sent",
      )
      expect(e2.details).toEqual({
        busy: [
          {server: 'busy', reasons: ['reports 1 blocker(s) (work in flight)']},
          {server: 'prepared', reasons: ["is in phase prepared of 'theirs'", 'reports 1 blocker(s) (work in flight)']},
        ],
      })
      await prepared.inner.controlPlane!.resume({checkpoint_id: 'theirs', deadline_ts: Date.now() / 1000 + 10})

      // --destructive with no destructive check selected: nothing destructive runs, so live work is
      // no reason to refuse.
      const safeOnly = await check(own, [{name: 'busy', url: busy.url}], {destructive: true, only: ['auth.missing-bearer']})
      expect(msgs(safeOnly)).toEqual({'auth.missing-bearer': 'pass: 401 unauthorized'})

      const report = await check(own, [{name: 'marked', url: marked.url}], {destructive: true, only: ['retire.forget']})
      expect(msgs(report)).toEqual({'retire.forget': 'pass: retired_rollouts 1 → 2 → 1'})
      expect(marked.inner.controlPlane!.status().retired_rollouts).toBe(1)
    })
  })

  it('the temporary checkpoint directory: kept with --keep-dir, and an unusable --dir is an input error', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      const dir = await scratchDir(own)
      const kept = await check(own, [{name: 'p', url: p.url}], {destructive: true, keepDir: true, dir, only: ['commit.reply']})
      expect(kept.checkpointDir).toMatch(new RegExp(`^${dir}/gymckpt-conformance-[A-Za-z0-9]{6}$`))
      expect(await readdir(kept.checkpointDir!)).toHaveLength(1)
      expect(conformanceJson(kept).checkpoint_dir).toBe(kept.checkpointDir)

      const file = path.join(dir, 'a-file')
      await writeFile(file, '')
      const e = await rejection(check(own, [{name: 'p', url: p.url}], {destructive: true, dir: file}), ControllerError)
      expect(e.code).toBe('input')
      expect(e.message).toBe(`cannot create a temporary checkpoint directory under ${file}: a part of the path is not a directory (ENOTDIR)`)
    })
  })

  it('a checkpoint directory that cannot be made fails the run with the file system error, after the cleanup', async () => {
    await withCleanup(async (own) => {
      const dir = await scratchDir(own)
      // A file where the checkpoint's directory goes, put there while its prepare is answered.
      const p = await faulty(own, {
        before: async (r) => {
          if (authorized(r) && r.op === 'prepare') {
            const [scratch] = (await readdir(dir)).filter((n) => n.startsWith('gymckpt-conformance-'))
            await writeFile(path.join(dir, scratch!, cid(r)), '')
          }
          return undefined
        },
      })
      const e = await rejection(check(own, [{name: 'p', url: p.url}], {destructive: true, dir, only: ['phase.prepare', 'commit.reply']}))
      expect(e.message).toMatch(/^ENOTDIR: not a directory, mkdir '/)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
      expect(await readdir(dir)).toEqual([])
    })
  })

  it('an interrupt stops the run, which says so and resumes what it opened', async () => {
    await withCleanup(async (own) => {
      const ac = new AbortController()
      const p = await faulty(own, {
        after: (r, a) => {
          if (r.op === 'renew') ac.abort()
          return a
        },
      })
      const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, signal: ac.signal})
      expect(report.interrupted).toBe(true)
      expect(report.passed).toBe(false)
      expect(report.results.filter((r) => r.server).map((r) => r.id)).toEqual([...CHECKS.filter((d) => !d.destructive).map((d) => d.id), 'retire.forget', 'phase.prepare', 'phase.prepare-replay'])
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})

      const before = new AbortController()
      before.abort()
      const q = await faulty(own, {})
      const none = await check(own, [{name: 'q', url: q.url}], {signal: before.signal})
      expect(none).toMatchObject({interrupted: true, passed: false, counts: {pass: 0, fail: 0, skip: 21}})
      expect(none.results.filter((r) => r.server !== null)).toEqual([])
      expect(q.requests.filter((r) => r.method === 'POST')).toEqual([])
    })
  })

  for (const [what, held] of [
    ['a raw probe', (r: Req) => r.method === 'GET' && r.auth === undefined],
    ['a call', (r: Req) => authorized(r) && r.op === 'retire' && r.json?.episode_ids?.length > 0],
    ['a status read', (r: Req, renewed: boolean) => authorized(r) && r.op === 'status' && renewed],
  ] as const) {
    it(`an interrupt while ${what} waits for its reply ends the run at once, and the cleanup still resumes`, async () => {
      await withCleanup(async (own) => {
        const ac = new AbortController()
        let renewed = false
        const hold = new Set<Req>()
        const p = await faulty(own, {
          before: (r) => {
            if (authorized(r) && r.op === 'renew') renewed = true
            if (!ac.signal.aborted && held(r, renewed)) {
              hold.add(r)
              ac.abort()
            }
            return undefined
          },
          // The reply is held back well past the run's end unless the interrupt cuts the wait.
          after: async (r, a) => (hold.has(r) ? new Promise((res) => setTimeout(() => res(a), 4000)) : a),
        })
        const started = Date.now()
        const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, timeoutS: 10, signal: ac.signal})
        expect(Date.now() - started).toBeLessThan(3000)
        expect(report.interrupted).toBe(true)
        // The check the interrupt cut short records nothing, neither a failure nor a skip.
        expect(report.results.filter((r) => r.result !== 'pass')).toEqual([])
        expect(hold.size).toBe(1)
        expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null, retired_rollouts: 0})
      })
    })
  }

  it('interrupted while prepared, status unreadable: the cleanup resumes every ID it sent', async () => {
    await withCleanup(async (own) => {
      const ac = new AbortController()
      const p = await faulty(own, {
        before: (r) => (ac.signal.aborted && authorized(r) && r.op === 'status' ? {status: 503, json: 'down'} : undefined),
        after: (r, a) => {
          if (r.op === 'renew') ac.abort()
          return a
        },
      })
      const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, signal: ac.signal})
      expect(report.interrupted).toBe(true)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
      // Every ID it sent in a prepare or commit, and nothing else: the probes' IDs and the open one.
      const cut = p.requests.findIndex((r) => r.op === 'renew')
      // (Some deadline probes are no JSON: their ID is read from the text.)
      const idOf = (r: Req) => (r.json ? String(r.json.checkpoint_id) : /"checkpoint_id": "([^"]+)"/.exec(r.body)![1]!)
      const opened = new Set(
        p.requests
          .slice(0, cut)
          .filter((r) => authorized(r) && (r.op === 'prepare' || r.op === 'commit'))
          .map(idOf),
      )
      const resumed = p.requests
        .slice(cut)
        .filter((r) => authorized(r) && r.op === 'resume')
        .map((r) => String(cid(r)))
      expect(new Set(resumed)).toEqual(opened)
      expect(opened.size).toBeGreaterThan(10)
    })
  })

  it('the cleanup gives its resume until the run bound, not just the reply grace', async () => {
    await withCleanup(async (own) => {
      const ac = new AbortController()
      const p = await faulty(own, {
        before: async (r) => {
          // The cleanup's resume of the open checkpoint is slow: 1.5 s, past the 0.5 s grace.
          if (ac.signal.aborted && authorized(r) && r.op === 'resume') await new Promise((res) => setTimeout(res, 1500))
          return undefined
        },
        after: (r, a) => {
          if (r.op === 'renew') ac.abort()
          return a
        },
      })
      const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, signal: ac.signal, grace: 0.5})
      expect(report.interrupted).toBe(true)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
      // One resume, answered in time: not given up after the grace and sent again.
      expect(p.requests.slice(p.requests.findIndex((r) => r.op === 'renew')).filter((r) => r.op === 'resume')).toHaveLength(1)
    })
  })

  it('interrupted while fence.window holds its own prepared ID, status unreadable: the cleanup resumes it too', async () => {
    await withCleanup(async (own) => {
      const ac = new AbortController()
      let prepared = 0
      const p = await faulty(own, {
        before: (r) => (ac.signal.aborted && authorized(r) && r.op === 'status' ? {status: 503, json: 'down'} : undefined),
        after: (r, a) => {
          if (r.op === 'prepare' && a.json?.phase === 'prepared' && ++prepared === 2) ac.abort()
          return a
        },
      })
      const report = await check(own, [{name: 'p', url: p.url}], {destructive: true, signal: ac.signal, only: ['fence.window']})
      expect(report.interrupted).toBe(true)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'idle', checkpoint_id: null})
    })
  })

  it('a participant prepared by someone else: status.phase names its checkpoint, and the run leaves it open', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      await p.inner.controlPlane!.prepare({checkpoint_id: 'theirs', deadline_ts: Date.now() / 1000 + 10})
      const report = await check(own, [{name: 'p', url: p.url}], {only: ['status.phase', 'refuse']})
      expect(msgs(report)['status.phase']).toBe('pass: prepared under theirs')
      expect(report.results.every((r) => r.result === 'pass')).toBe(true)
      expect(p.inner.controlPlane!.status()).toMatchObject({phase: 'prepared', checkpoint_id: 'theirs'})
      await p.inner.controlPlane!.resume({checkpoint_id: 'theirs', deadline_ts: Date.now() / 1000 + 10})
    })
  })

  it('a conforming fleet: every check passes with a message saying what it saw', async () => {
    await withCleanup(async (own) => {
      const fleet = await startFleet({
        members: [
          {name: 'env', kind: 'environment'},
          {name: 'policy', kind: 'model'},
        ],
      })
      const report = await check(
        own,
        fleet.servers.map((s) => ({name: s.name, url: s.url})),
        {destructive: true},
      )
      const by = new Map<string, string[]>()
      for (const r of report.results) by.set(r.id, [...(by.get(r.id) ?? []), `${r.server} ${r.result}: ${norm(r.message)}`])
      const same = (m: string) => [`env ${m}`, `policy ${m}`]
      expect(Object.fromEntries(by)).toEqual({
        'auth.missing-bearer': same('pass: 401 unauthorized'),
        'auth.wrong-bearer': same('pass: 401 unauthorized'),
        'auth.exact-bearer': same('pass: 401 for "bearer <token>" and "Bearer  <token>"'),
        'auth.post-bearer': same('pass: 401 unauthorized'),
        'status.reply': ['env pass: environment/env idle', 'policy pass: model/policy idle'],
        'status.kind': ['env pass: environment', 'policy pass: model'],
        'status.instance': ['env pass: env', 'policy pass: policy'],
        'status.phase': same('pass: idle'),
        'report.schema': same('pass: status report'),
        'report.blockers': same('pass: 0 listed, blocker_count 0'),
        'report.restarts': same('pass: 0 restart(s)'),
        'refuse.unknown-field': same('pass: 4 bodies refused with 422'),
        'refuse.checkpoint-id': same('pass: 14 bodies refused with 422'),
        'refuse.deadline': same('pass: 7 bodies refused with 422'),
        'refuse.episode-id': same('pass: 6 bodies refused with 422'),
        'refuse.empty-lists': same('pass: 2 bodies refused with 422'),
        'retire.forget': same('pass: retired_rollouts 0 → 1 → 0'),
        'phase.prepare': same('pass: prepared under conformance-TAG-26, lease 600 s past the deadline'),
        'phase.prepare-replay': same('pass: 200 prepared, still prepared'),
        'lease.renew': same('pass: lease 600 s past the deadline; never moved back'),
        'fence.conflict': same('pass: 409 checkpoint_conflict'),
        'outside.retire-open': same('pass: 409 invalid_phase'),
        'outside.forget-open': same('pass: 409 invalid_phase'),
        'commit.restart-in-scope': same('skip: this participant reports no restart (report.restarts is empty); it can be checked only while it runs a restart-only episode, with --force'),
        'commit.reply': same('pass: committed 0 record(s) into SCRATCH/conformance-TAG-26'),
        'store.manifest': [
          "env pass: 319 bytes, sorted keys, indent 1, no trailing newline; equal to the commit reply's",
          "policy pass: 316 bytes, sorted keys, indent 1, no trailing newline; equal to the commit reply's",
        ],
        'store.records': same('pass: 0 record(s), 0 bytes; name = content sha256 = records_sha256; record_count matches'),
        'store.lines': same('skip: no record was exported (nothing live on this participant), so the line format was not exercised'),
        'store.manifest-last': same('pass: the records file appeared before manifest.json, and was last written before it'),
        'commit.replay': same('pass: the same reply'),
        'commit.conflict': same('pass: 409 checkpoint_conflict'),
        'commit.export-once': same('pass: 2 file(s) unchanged'),
        'phase.resume': same('pass: idle, idempotent false; checkpoint_id and lease null'),
        'phase.resume-again': same('pass: idle, idempotent true'),
        'fence.stale-prepare': same('pass: 409 stale_checkpoint'),
        'fence.resume-unknown': same('pass: idempotent resume fenced it: prepare → 409 stale_checkpoint'),
        'fence.window': same('pass: still 409 stale_checkpoint after 63 newer resumed IDs'),
      })
      expect(report).toMatchObject({passed: true, destructive: true, interrupted: false, checkpointDir: null, counts: {pass: 70, fail: 0, skip: 4}})
    })
  })

  it('the safe checks send exactly their probes, and a refused probe is not followed by a resume', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      await check(own, [{name: 'p', url: p.url}])
      const count = (pick: (r: Req) => boolean) => p.requests.filter(pick).length
      const ops = ['status', 'prepare', 'resume', 'commit', 'retire', 'forget', 'renew']
      expect(Object.fromEntries(ops.map((op) => [op, count((r) => r.op === op && authorized(r))]))).toEqual({status: 3, prepare: 15, resume: 8, commit: 8, retire: 1, forget: 1, renew: 0})
      expect(p.requests.filter((r) => !authorized(r)).map((r) => `${r.method} ${r.op} ${r.auth === undefined ? 'none' : r.auth.replace(/[0-9a-f]{32}$/, 'X').replace(TOKEN, 'TOKEN')}`)).toEqual([
        'GET status none',
        'GET status Bearer X',
        'GET status bearer TOKEN',
        'GET status Bearer  TOKEN',
        'POST resume Bearer X',
      ])
      // Every body is sent as JSON, as the controller's own client sends it.
      expect(new Set(p.requests.filter((r) => r.method === 'POST').map((r) => r.ctype))).toEqual(new Set(['application/json']))
      // Probes of a checkpoint directory name one that is not there.
      const dirs = p.requests.filter((r) => r.op === 'commit').map((r) => r.json?.checkpoint_dir)
      expect(new Set(dirs).size).toBe(1)
      expect(dirs[0]).toMatch(/^\/.*gymckpt-conformance-nowhere-[0-9a-f]{8}$/)
    })
  })

  it('participants are checked one at a time with concurrency 1, side by side by default', async () => {
    await withCleanup(async (own) => {
      const log: string[] = []
      const logged = (name: string): Fault => ({
        before: (r) => {
          if (r.method === 'POST') log.push(name)
          return undefined
        },
      })
      const a = await faulty(own, logged('a'), {instance: 'a'})
      const b = await faulty(own, logged('b'), {instance: 'b'})
      const servers = [
        {name: 'a', url: a.url},
        {name: 'b', url: b.url},
      ]
      await check(own, servers, {only: ['refuse'], concurrency: 1})
      expect(log.join('').replace(/(.)\1+/g, '$1')).toBe('ab')
      log.length = 0
      await check(own, servers, {only: ['refuse']})
      expect(log.join('').replace(/(.)\1+/g, '$1').length).toBeGreaterThan(2)
    })
  })

  it('no directory watcher outlives the run', async () => {
    await withCleanup(async (own) => {
      const watchers = () => process.getActiveResourcesInfo().filter((x) => x === 'FSEventWrap').length
      const before = watchers()
      const p = await faulty(own, {})
      await check(own, [{name: 'p', url: p.url}], {destructive: true, only: ['store.manifest-last']})
      expect(watchers()).toBe(before)
    })
  })

  it('store.manifest-last: directory events that miss one of the files say nothing; the times decide', async () => {
    const dir = await tempDir()
    await writeFile(path.join(dir, 'records-x.jsonl'), '')
    await writeFile(path.join(dir, 'manifest.json'), '{}')
    await utimes(path.join(dir, 'records-x.jsonl'), 1_700_000_000, 1_700_000_000)
    await utimes(path.join(dir, 'manifest.json'), 1_700_000_001, 1_700_000_001)
    const byTime = {result: 'pass', message: 'the records file was last written before manifest.json (by modification time)'}
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['records-x.jsonl'])).toEqual(byTime)
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['manifest.json'])).toEqual(byTime)
    expect(await checkManifestLast(dir, 'records-x.jsonl', [])).toEqual(byTime)
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['manifest.json', 'records-x.jsonl'])).toEqual({result: 'fail', message: 'manifest.json appeared in the directory before records-x.jsonl'})
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['records-x.jsonl', 'manifest.json'])).toEqual({
      result: 'pass',
      message: 'the records file appeared before manifest.json, and was last written before it',
    })
    // The same modification time is no sign of the wrong order, and says nothing of the slack.
    await utimes(path.join(dir, 'manifest.json'), 1_700_000_000, 1_700_000_000)
    expect(await checkManifestLast(dir, 'records-x.jsonl', null)).toEqual(byTime)
    expect(await checkManifestLast(dir, 'records-x.jsonl', ['manifest.json', 'records-x.jsonl', 'manifest.json'])).toEqual({
      result: 'pass',
      message: 'the records file appeared before manifest.json, and was last written before it',
    })
  })

  it('only the probes of the selected checks are sent', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      const report = await check(own, [{name: 'p', url: p.url}], {only: ['auth.missing-bearer', 'status.kind']})
      expect(report.results.map((r) => `${r.id} ${r.result}`)).toEqual(['auth.missing-bearer pass', 'status.kind pass'])
      // Discovery's status, the probe without a token, the session's status and the cleanup's.
      expect(p.requests.map((r) => `${r.method} ${r.op} ${r.auth === VALID ? 'token' : (r.auth ?? 'none')}`)).toEqual(['GET status token', 'GET status none', 'GET status token', 'GET status token'])
    })
  })

  it('a server URL with a trailing slash is probed at the same routes', async () => {
    await withCleanup(async (own) => {
      const p = await faulty(own, {})
      const report = await check(own, [{name: 'p', url: `${p.url}/`}], {only: ['auth', 'status.reply']})
      expect(report.results.every((r) => r.result === 'pass')).toBe(true)
      expect(report.results).toHaveLength(5)
    })
  })

  it('--only: an empty list is every check; a name must be a whole check ID or group', () => {
    expect(selectChecks([])).toEqual([...CHECKS])
    expect(selectChecks()).toEqual([...CHECKS])
    expect(thrown(() => selectChecks(['fenc']), ControllerError).message).toBe(
      '--only fenc: no such check; give a check ID (see --list or the README) or a group: auth, status, report, refuse, retire, phase, lease, fence, outside, commit, store',
    )
    expect(thrown(() => selectChecks(['auth.missing-bearer', 'nope']), ControllerError).code).toBe('input')
    expect(selectChecks(['store', 'auth.wrong-bearer']).map((d) => d.id)).toEqual(['auth.wrong-bearer', 'store.manifest', 'store.records', 'store.lines', 'store.manifest-last'])
  })
})
