// Mutation-testing follow-up for src/coordination/conformance.ts, the store and replay checks; see
// conformance-mutants.test.ts for how the cases work. Split from it so that the file whose test
// killed the last mutant runs first for the next one (vitest runs the files that failed last time
// first), not after 200 other cases.
import {readdir, rm, unlink, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {encodeManifest, participantDir} from '../../src/storage/participant-store.js'
import {Answer, authorized, err} from '../helpers/conformance-proxy.js'
import {sha, type Case, runCase, statusOnly, cid, onFirstCommit, recordsAre, nth, restarts, D, LINE} from '../helpers/conformance-cases.js'

const STORE: Case[] = [
  {
    name: 'records_file not named for a digest',
    fault: onFirstCommit(async (_r, a) => ({...a, json: {...a.json, manifest: {...a.json.manifest, records_file: 'records.jsonl'}}})),
    opts: D(['store.records']),
    want: {'store.records': 'fail: records_file "records.jsonl" is not records-<sha256 hex>.jsonl'},
  },
  {
    name: 'the records file named by the manifest is missing',
    fault: onFirstCommit(async (_r, a, pdir) => unlink(path.join(pdir, a.json.manifest.records_file))),
    opts: D(['store.records', 'store.lines']),
    want: {
      'store.records': 'fail: records-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.jsonl, named by the manifest, is missing',
      'store.lines': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
    },
  },
  {
    name: 'the participant directory removed after the commit',
    fault: onFirstCommit(async (_r, _a, pdir) => rm(pdir, {recursive: true, force: true})),
    opts: D(['store.manifest', 'store.records', 'store.lines', 'store.manifest-last', 'commit.export-once']),
    want: {
      'store.manifest': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'store.records': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'store.lines': 'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'store.manifest-last':
        'fail: cannot read SCRATCH/conformance-TAG-1/gym/model/p: it does not exist (ENOENT) (is the checkpoint directory visible to this participant at the same path? see --dir)',
      'commit.export-once': 'skip: cannot list SCRATCH/conformance-TAG-1/gym/model/p',
    },
  },
  {
    name: 'a record appended after the digest was taken',
    fault: onFirstCommit(async (_r, a, pdir) => writeFile(path.join(pdir, a.json.manifest.records_file), LINE('zz'))),
    opts: D(['store.records']),
    want: {'store.records': 'fail: SCRATCH/conformance-TAG-1/gym/model/p/records-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.jsonl does not match its manifest digest'},
  },
  {
    name: 'a commit answered 500 with a commit reply: nothing on disk is judged',
    fault: {after: (r, a) => (r.op === 'commit' && a.status === 200 ? {...a, status: 500} : a)},
    opts: D(['commit.reply', 'store.manifest']),
    want: {
      'commit.reply': 'fail: commit: HTTP 500 {"phase":"committed","manifest":{"checkpoint_id":"conformance-TAG-1","instance":"p","kind":"model","record_count":0… (356 characters in all)',
      'store.manifest': 'skip: needs a commit reply with a manifest (see commit.reply)',
    },
  },
  {
    name: 'a restart reported, commit.restart-in-scope not selected: no commit names it',
    fault: restarts(['ghost'], null),
    opts: D(['commit.reply', 'commit.replay']),
    sent: (requests) => expect(requests.filter((r) => r.op === 'commit' && JSON.stringify(r.json?.episode_ids).includes('ghost'))).toEqual([]),
    want: {'commit.reply': 'pass: committed 0 record(s) into SCRATCH/conformance-TAG-1', 'commit.replay': 'pass: the same reply'},
  },
  {
    name: 'status after commit committed under another ID',
    fault: statusOnly((j) => (j.phase === 'committed' ? {...j, checkpoint_id: 'other'} : j)),
    opts: D(['commit.reply']),
    want: {'commit.reply': 'fail: after commit, status is committed under other, not committed under conformance-TAG-1'},
  },
  {
    name: 'a records file named for another digest than its content, the manifest naming its content',
    fault: onFirstCommit(async (_r, a, pdir) => {
      for (const f of await readdir(pdir)) await unlink(path.join(pdir, f))
      const text = LINE('zz')
      const manifest = {...a.json.manifest, records_file: `records-${sha('other')}.jsonl`, records_sha256: sha(text), record_count: 1}
      await writeFile(path.join(pdir, manifest.records_file), text)
      await writeFile(path.join(pdir, 'manifest.json'), encodeManifest(manifest))
      return {status: 200, json: {...a.json, manifest, episode_ids: ['zz']}}
    }),
    opts: D(['store.records']),
    want: {
      'store.records':
        "fail: SCRATCH/conformance-TAG-1/gym/model/p/records-d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa.jsonl is named for sha256 d9298a10d1b0735837dc4bd85dac641b0f3cef27a47e5d53a54f2f3f5b2fcffa, but its content and its manifest's records_sha256 are d82d49a8bc66429db195dd277bb8fdb3938b8205bc1650ec09baeb1797821664",
    },
  },
  {
    name: 'two temporary files left beside the records',
    fault: onFirstCommit(async (_r, _a, pdir) => {
      await writeFile(path.join(pdir, '.records.jsonl.b'), '')
      await writeFile(path.join(pdir, '.records.jsonl.a'), '')
    }),
    opts: D(['store.records']),
    want: {'store.records': 'fail: other files left in SCRATCH/conformance-TAG-1/gym/model/p: .records.jsonl.a, .records.jsonl.b (temporary files are removed; one records file per commit)'},
  },
  {
    name: 'a records file that starts with an empty line',
    fault: recordsAre('\n' + LINE('a'), ['a'], 2),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1 is not JSON: unexpected end of input at character 0'},
  },
  {
    name: 'a record without its newline',
    fault: recordsAre(LINE('zz').trimEnd(), ['zz'], 1),
    opts: D(['store.records', 'store.lines']),
    want: {
      'store.records': 'fail: records-18b039c862c20499a44af77ca6747c9dbcd2197e16abc2db0480485dda26921b.jsonl does not end with a newline: every record line ends with \\n',
      'store.lines': 'pass: 1 line(s) re-encode byte for byte',
    },
  },
  {
    name: 'reply episode_ids not the records keys',
    fault: recordsAre(LINE('zz'), ['yy']),
    opts: D(['store.records']),
    want: {'store.records': 'fail: the commit reply\'s episode_ids ["yy"] are not the sorted capture keys of the records ["zz"]'},
  },
  {
    name: 'reply episode_ids unsorted',
    fault: recordsAre(LINE('b') + LINE('a'), ['b', 'a']),
    opts: D(['store.records']),
    want: {'store.records': 'fail: the commit reply\'s episode_ids ["b","a"] are not the sorted capture keys of the records ["a","b"]'},
  },
  {
    name: 'reply episode_ids sorted, records in another order',
    fault: recordsAre(LINE('b') + LINE('a'), ['a', 'b']),
    opts: D(['store.records', 'store.lines']),
    want: {'store.records': 'pass: 2 record(s), 100 bytes; name = content sha256 = records_sha256; record_count matches', 'store.lines': 'pass: 2 line(s) re-encode byte for byte'},
  },
  {
    name: 'a temporary file left beside the records',
    fault: onFirstCommit(async (_r, _a, pdir) => writeFile(path.join(pdir, '.records.jsonl.tmp'), '')),
    opts: D(['store.records']),
    want: {'store.records': 'fail: other files left in SCRATCH/conformance-TAG-1/gym/model/p: .records.jsonl.tmp (temporary files are removed; one records file per commit)'},
  },
  {
    name: 'a line with a non-ASCII byte',
    fault: recordsAre(LINE('a') + '{"episode_id": {"rollout_id": "b", "attempt": 0}, "x": "\xe9"}\n', ['a', 'b']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 2 holds non-ASCII bytes (json.dumps escapes them as \\uXXXX)'},
  },
  {
    name: 'a line that is not JSON',
    fault: recordsAre(LINE('a') + '{"episode_id": \n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 2 is not JSON: unexpected end of input at character 15'},
  },
  {name: 'a line that is a list', fault: recordsAre('[1, 2]\n', []), opts: D(['store.lines']), want: {'store.lines': 'fail: line 1 is not a JSON object'}},
  {
    name: 'episode_id not the first key',
    fault: recordsAre('{"x": 1, "episode_id": {"rollout_id": "a", "attempt": 0}}\n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1: the first key is "x", not "episode_id"'},
  },
  {
    name: 'episode_id keys in the other order',
    fault: recordsAre('{"episode_id": {"attempt": 0, "rollout_id": "a"}}\n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1: episode_id is not {"rollout_id": <rollout ID>, "attempt": <int ≥ 0>}'},
  },
  {
    name: 'episode_id with a negative attempt',
    fault: recordsAre('{"episode_id": {"rollout_id": "a", "attempt": -1}}\n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1: episode_id is not {"rollout_id": <rollout ID>, "attempt": <int ≥ 0>}'},
  },
  {
    name: 'episode_id a string',
    fault: recordsAre('{"episode_id": "a"}\n', ['a']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 1: episode_id is not {"rollout_id": <rollout ID>, "attempt": <int ≥ 0>}'},
  },
  {
    name: 'two good lines',
    fault: recordsAre(LINE('a') + LINE('b'), ['a', 'b']),
    opts: D(['store.lines', 'store.records']),
    want: {'store.records': 'pass: 2 record(s), 100 bytes; name = content sha256 = records_sha256; record_count matches', 'store.lines': 'pass: 2 line(s) re-encode byte for byte'},
  },
  {
    name: 'a line longer than a read chunk',
    fault: recordsAre(LINE('a') + `{"episode_id": {"rollout_id": "b", "attempt": 0}, "x": "${'y'.repeat(1_500_000)}"}\n` + LINE('c'), ['a', 'b', 'c']),
    opts: D(['store.lines']),
    want: {'store.lines': 'pass: 3 line(s) re-encode byte for byte'},
  },
  {
    name: 'the second line not json.dumps output',
    fault: recordsAre(LINE('a') + '{"episode_id": {"rollout_id": "b", "attempt": 0},"x": 1}\n', ['a', 'b']),
    opts: D(['store.lines']),
    want: {'store.lines': 'fail: line 2 is not json.dumps output, at character 49: got "\\"x\\": 1}", expected " \\"x\\": 1}"'},
  },
  {
    name: 'a commit replayed refused',
    fault: nth('commit', 2, () => err(409, 'invalid_phase')),
    opts: D(['commit.replay']),
    want: {'commit.replay': 'fail: commit again with equal arguments: HTTP 409 invalid_phase'},
  },
  {
    name: 'a commit with another scope answered with the first reply (Gym version A)',
    fault: (() => {
      let first: Answer | null = null
      return {
        before: (r) => (authorized(r) && r.op === 'commit' && first ? first : undefined),
        after: (r, a) => {
          if (r.op === 'commit' && a.status === 200) first ??= a
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.conflict']),
    want: {'commit.replay': 'pass: the same reply', 'commit.conflict': 'skip: the first reply replayed: Gym version A replays a completed commit whatever its arguments (B/C and the seed refuse it)'},
  },
  {
    name: 'a commit with another scope refused with 422 checkpoint_conflict',
    fault: {before: (r, inner) => (authorized(r) && r.op === 'commit' && inner.controlPlane!.phase === 'committed' && r.json.episode_ids.length === 1 ? err(422, 'checkpoint_conflict') : undefined)},
    opts: D(['commit.conflict']),
    want: {'commit.conflict': 'fail: commit of committed conformance-TAG-1 with another scope: HTTP 422 checkpoint_conflict (want 409 checkpoint_conflict)'},
  },
  {
    name: 'a commit with another scope answered 500 with the first reply',
    fault: (() => {
      let first: Answer | null = null
      return {
        before: (r) => (authorized(r) && r.op === 'commit' && first && r.json.episode_ids.length === 1 ? {...first, status: 500} : undefined),
        after: (r, a) => {
          if (r.op === 'commit' && a.status === 200) first ??= a
          return a
        },
      }
    })(),
    opts: D(['commit.conflict']),
    want: {
      'commit.conflict':
        'fail: commit of committed conformance-TAG-1 with another scope: HTTP 500 {"phase":"committed","manifest":{"checkpoint_id":"conformance-TAG-1","instance":"p","kind":"model","record_count":0… (356 characters in all) (want 409 checkpoint_conflict)',
    },
  },
  {
    name: 'a participant that stays open whatever is resumed: the cleanup gives up after 4 resumes',
    fault: (() => {
      let open: string | null = null
      return {
        after: (r, a) => {
          if (r.op === 'prepare' && a.json?.phase === 'prepared') open ??= cid(r)
          return r.op === 'status' && open ? {...a, json: {...a.json, phase: 'prepared', checkpoint_id: open, lease_expires_at: 1}} : a
        },
      }
    })(),
    opts: D(['phase.prepare']),
    sent: (requests) => {
      const a = cid(requests.find((r) => r.op === 'prepare')!)
      // phase.resume's, then the cleanup's four.
      expect(requests.filter((r) => r.op === 'resume' && cid(r) === a)).toHaveLength(5)
    },
    want: {'phase.prepare': 'fail: lease_expires_at 1 is before deadline_ts T'},
  },
  {
    name: 'a commit replayed with another reply',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'commit' && a.status === 200 && ++n === 2 ? {...a, json: {...a.json, episode_ids: ['x']}} : a)}
    })(),
    opts: D(['commit.replay']),
    want: {
      'commit.replay':
        'fail: a different reply: {"phase":"committed","manifest":{"checkpoint_id":"conformance-TAG-1","instance":"p","kind":"model","record_count":0,"records_file":"records-e3b0c44298fc1c1… (359 characters in all)',
    },
  },
  {
    name: 'a commit replayed with a text body (it failed as an unexpected error before)',
    fault: (() => {
      let n = 0
      return {after: (r, a) => (r.op === 'commit' && a.status === 200 && ++n === 2 ? {...a, json: 'committed, again'} : a)}
    })(),
    opts: D(['commit.replay']),
    want: {'commit.replay': 'fail: a different reply: committed, again'},
  },
  {
    name: 'a commit replayed with its keys in another order',
    fault: (() => {
      let n = 0
      const reverse = (o: Record<string, unknown>) => Object.fromEntries(Object.entries(o).reverse())
      return {after: (r, a) => (r.op === 'commit' && a.status === 200 && ++n === 2 ? {...a, json: reverse({...a.json, manifest: reverse(a.json.manifest)})} : a)}
    })(),
    opts: D(['commit.replay']),
    want: {'commit.replay': 'pass: the same reply'},
  },
  {
    name: 'a commit with another scope answered with a different reply',
    fault: {
      before: (r, inner) =>
        authorized(r) && r.op === 'commit' && inner.controlPlane!.phase === 'committed' && r.json.episode_ids.length === 1 ? {status: 200, json: {phase: 'committed'}} : undefined,
    },
    opts: D(['commit.conflict']),
    want: {'commit.conflict': 'fail: commit of committed conformance-TAG-1 with another scope: HTTP 200 {"phase":"committed"} (want 409 checkpoint_conflict)'},
  },
  {
    name: 'a replayed commit rewrites the records file',
    fault: (() => {
      let n = 0
      return {
        after: async (r, a, inner) => {
          if (r.op === 'commit' && a.status === 200 && ++n === 2) {
            const pdir = participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p')
            const f = path.join(pdir, a.json.manifest.records_file)
            await unlink(f)
            await writeFile(f, '')
          }
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.export-once']),
    want: {
      'commit.replay': 'pass: the same reply',
      'commit.export-once': 'fail: after the replayed and the conflicting commit, rewritten: records-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.jsonl',
    },
  },
  {
    name: 'a replayed commit removes a file',
    fault: (() => {
      let n = 0
      return {
        after: async (r, a, inner) => {
          if (r.op === 'commit' && a.status === 200 && ++n === 2) await writeFile(path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), 'extra'), 'x')
          if (r.op === 'commit' && a.status === 200 && n === 1) await writeFile(path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), 'old'), 'x')
          if (r.op === 'commit' && a.status === 200 && n === 2) await unlink(path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), 'old'))
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.export-once']),
    want: {'commit.replay': 'pass: the same reply', 'commit.export-once': 'fail: after the replayed and the conflicting commit, new: extra; gone: old'},
  },
  {
    name: 'a replayed commit adds, removes and rewrites two files each: every name is listed',
    fault: (() => {
      let n = 0
      return {
        after: async (r, a, inner) => {
          if (r.op !== 'commit' || a.status !== 200) return a
          const pdir = participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p')
          const files = (...names: string[]) => names.map((f) => path.join(pdir, f))
          if (++n === 1) {
            for (const f of files('old1', 'old2', 'keep1', 'keep2')) await writeFile(f, 'x')
          } else if (n === 2) {
            for (const f of files('extra1', 'extra2')) await writeFile(f, 'x')
            for (const f of files('old1', 'old2')) await unlink(f)
            for (const f of files('keep1', 'keep2')) {
              await unlink(f)
              await writeFile(f, 'yy')
            }
          }
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.export-once']),
    want: {
      'commit.replay': 'pass: the same reply',
      'commit.export-once': 'fail: after the replayed and the conflicting commit, new: extra1, extra2; gone: old1, old2; rewritten: keep1, keep2',
    },
  },
  {
    name: 'a replayed commit removes a file and adds none',
    fault: (() => {
      let n = 0
      return {
        after: async (r, a, inner) => {
          if (r.op !== 'commit' || a.status !== 200) return a
          const old = path.join(participantDir(r.json.checkpoint_dir, inner.participant!.kind, 'p'), 'old')
          if (++n === 1) await writeFile(old, 'x')
          else if (n === 2) await unlink(old)
          return a
        },
      }
    })(),
    opts: D(['commit.replay', 'commit.export-once']),
    want: {'commit.replay': 'pass: the same reply', 'commit.export-once': 'fail: after the replayed and the conflicting commit, gone: old'},
  },
  {
    name: 'the participant directory removed by the conflicting commit: an unexpected error fails that check only',
    fault: {
      after: async (r, a) => {
        if (r.op !== 'commit' || r.json.episode_ids.length !== 1) return a
        await rm(participantDir(r.json.checkpoint_dir, 'model', 'p'), {recursive: true, force: true})
        return {status: 0, json: null}
      },
    },
    opts: D(['commit.conflict', 'commit.export-once', 'phase.resume']),
    want: {
      'commit.conflict': 'fail: commit of committed conformance-TAG-1 with another scope: no reply (connection closed before a reply) (want 409 checkpoint_conflict)',
      'commit.export-once': "fail: unexpected error: ENOENT: no such file or directory, scandir 'SCRATCH/conformance-TAG-1/gym/model/p'",
      'phase.resume': 'pass: idle, idempotent false; checkpoint_id and lease null',
    },
  },
]

describe('store and replay checks name the file and the difference', () => {
  for (const c of STORE) it.concurrent(c.name, () => runCase(c))
})
