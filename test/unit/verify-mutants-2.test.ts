// More rules of offline verification (src/storage/verify.ts) that no other test holds (issue 12):
// participants are told apart by kind AND instance, and the scope notes name each key once.
import {mkdir, rm} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {writeParticipantState} from '../../src/storage/participant-store.js'
import {FORMAT_VERSION, writeControllerManifest} from '../../src/storage/root.js'
import {verifyCheckpoint} from '../../src/storage/verify.js'
import {tempDir} from '../helpers/tmp.js'

const rec = (r: string, pad = 0) => `{"episode_id": {"rollout_id": "${r}", "attempt": 0}, "p": "${'p'.repeat(pad)}"}`

/** Writes every `kind/instance` with its records, names them in gymckpt.json in this order, then removes `removed`. */
async function make(records: [string, string[]][], opts: {removed?: string[]; unnamed?: string[]; continued?: string[]; restarted?: string[]} = {}) {
  const dir = path.join(await tempDir(), 'ck')
  await mkdir(dir, {recursive: true})
  const participants = []
  for (const [ki, lines] of records) {
    const [kind, instance] = ki.split('/') as [string, string]
    const manifest = await writeParticipantState({checkpointDir: dir, kind, instance, checkpointId: 'ck'}, lines)
    if (!opts.unnamed?.includes(ki)) participants.push({server: `srv-${kind}-${instance}`, kind, instance, manifest, episode_ids: []})
  }
  const ep = (r: string) => ({rollout_id: r, attempt: 0})
  await writeControllerManifest(dir, {
    format_version: FORMAT_VERSION,
    checkpoint_id: 'ck',
    created_at: 1,
    continued: (opts.continued ?? []).map(ep),
    restarted: (opts.restarted ?? []).map(ep),
    participants,
  })
  for (const ki of opts.removed ?? []) await rm(path.join(dir, 'gym', ki), {recursive: true})
  return dir
}

describe('participants are told apart by kind and instance', () => {
  it('a directory is compared with the manifest of its own kind and instance; a missing one or an unnamed one is named', async () => {
    // model/x and environment/x share an instance name, model/x and model/y a kind.
    const dir = await make(
      [
        ['model/x', [rec('a', 50)]],
        ['environment/x', [rec('a')]],
        ['model/y', [rec('a', 9)]],
        ['environment/z', [rec('a', 3)]],
        ['agent/w', [rec('a', 4)]],
        ['agent/z', [rec('a', 5)]],
      ],
      {removed: ['model/x', 'environment/z', 'agent/w'], unnamed: ['agent/z']},
    )
    const r = await verifyCheckpoint(dir)
    expect(r.problems.filter((p) => p.severity !== 'info').map((p) => [p.severity, p.where.startsWith(dir) ? path.relative(dir, p.where) : p.where, p.message])).toEqual([
      ['error', 'gym/model/x', 'participant srv-model-x committed but its directory is missing'],
      ['error', 'gym/environment/z', 'participant srv-environment-z committed but its directory is missing'],
      ['error', 'gym/agent/w', 'participant srv-agent-w committed but its directory is missing'],
      ['warning', 'gym/agent/z', 'directory not named in the controller manifest'],
    ])
    expect(r.participants.map((p) => [p.kind, p.instance, p.ok])).toEqual([
      ['agent', 'z', true],
      ['environment', 'x', true],
      ['model', 'y', true],
    ])
  })
})

describe('the controller manifest and the scope notes', () => {
  it('episodes both continued and restarted are all named', async () => {
    const dir = await make([['environment/e', [rec('a'), rec('b')]]], {continued: ['a', 'b'], restarted: ['a', 'b']})
    const r = await verifyCheckpoint(dir)
    expect(r.problems.filter((p) => p.severity === 'error').map((p) => p.message)).toEqual(['episodes both continued and restarted: a, b'])
  })

  it('a key outside the scope held by several records is named once in the note', async () => {
    const dir = await make([['environment/e', [rec('a'), rec('q'), rec('q', 1)]]], {continued: ['a']})
    const r = await verifyCheckpoint(dir)
    const note = r.problems.find((p) => p.severity === 'info')!
    expect(note.message).toBe('2 record(s) outside the commit scope: q; a restore skips them and installs only the 1 in scope')
  })
})
