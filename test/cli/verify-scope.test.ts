import {mkdir, rename, symlink} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, publishLatest, writeControllerManifest} from '../../src/storage/root.js'
import {cli} from '../helpers/cli.js'
import {tempDir} from '../helpers/tmp.js'

// The worker threads run the built JavaScript, so this test imports verify from dist/.
const dist = (await import(path.resolve('dist/storage/verify.js'))) as typeof import('../../src/storage/verify.js')

const rec = (r: string) => `{"episode_id": {"rollout_id": "${r}", "attempt": 0}, "s": [NaN]}`

/** env holds a (in scope) and b, c (outside); policy holds a; the scope is a and z. */
async function make(records: Record<string, string[]> = {'environment/env': [rec('a'), rec('b'), rec('c')], 'model/policy': [rec('a')]}) {
  const root = await tempDir()
  const dir = path.join(root, 'ck')
  const participants = []
  for (const [ki, lines] of Object.entries(records)) {
    const [kind, instance] = ki.split('/') as [string, string]
    const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: 'ck'}, lines)
    participants.push({server: instance, kind, instance, manifest, episode_ids: []})
  }
  const continued = [
    {rollout_id: 'a', attempt: 0},
    {rollout_id: 'z', attempt: 0},
  ]
  await writeControllerManifest(dir, {format_version: FORMAT_VERSION, checkpoint_id: 'ck', created_at: 1, continued, restarted: [], participants})
  await publishLatest(root, 'ck')
  return {root, dir}
}

describe('verify: scope counts in the CLI output', () => {
  it('--json has in_scope, outside_scope and scope_without_record per participant, and exit 0', async () => {
    const {root} = await make()
    const r = await cli(['verify', root, '--json'])
    expect(r.code, r.stdout).toBe(0)
    expect(r.json.valid).toBe(true)
    expect(r.json.participants.map((p: Record<string, unknown>) => [p.instance, p.records, p.in_scope, p.outside_scope, p.scope_without_record])).toEqual([
      ['env', 3, 1, 2, 1],
      ['policy', 1, 1, 0, 1],
    ])
    expect(r.json.problems).toContainEqual({
      severity: 'info',
      where: expect.stringMatching(/environment[/\\]env$/),
      message: '2 record(s) outside the commit scope: b, c; a restore skips them and installs only the 1 in scope',
    })
  })

  it('the human table shows the counts and the summary says what a restore installs', async () => {
    const {root} = await make()
    const r = await cli(['verify', root])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toMatch(/KIND\s+INSTANCE\s+OK\s+RECORDS\s+IN_SCOPE\s+OUTSIDE_SCOPE\s+SCOPE_WITHOUT_RECORD\s+BYTES/)
    expect(r.stdout).toMatch(/environment\s+env\s+yes\s+3\s+1\s+2\s+1\s/)
    expect(r.stdout).toContain('a restore installs the 2 record(s) in scope and skips the 2 outside it')
    expect(r.stderr).toContain('note: ')
  })
})

describe('verify in worker threads: the offline-only checks', () => {
  it('duplicates, a symlink out and scope counts give the same report as in one thread', async () => {
    const {dir, root} = await make({'agent/agent': [rec('a'), rec('b')], 'environment/env': [rec('a'), rec('a'), rec('b')], 'model/policy': [rec('a')]})
    const outside = path.join(await tempDir(), 'moved')
    await mkdir(outside)
    await rename(path.join(dir, 'gym', 'model', 'policy'), path.join(outside, 'policy'))
    await symlink(path.join(outside, 'policy'), path.join(dir, 'gym', 'model', 'policy'))
    const threaded = await dist.verifyCheckpoint(root, {concurrency: 2, workerMinBytes: 0})
    const inline = await dist.verifyCheckpoint(root, {concurrency: 1})
    expect(threaded).toEqual(inline)
    expect(threaded.problems.filter((p) => p.severity === 'error').map((p) => p.message)).toEqual([
      expect.stringMatching(/holds more than one record of episode 'a' \(2 records\)/),
      expect.stringMatching(/policy is a symlink to .*moved[/\\]policy, outside the checkpoint directory/),
    ])
    expect(threaded.participants.map((p) => [p.instance, p.inScope, p.outsideScope, p.scopeWithoutRecord])).toEqual([
      ['agent', 1, 1, 1],
      ['env', 2, 1, 1],
      ['policy', 0, 0, 0],
    ])
  })
})
