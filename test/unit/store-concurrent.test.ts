import {readFile} from 'node:fs/promises'
import path from 'node:path'
import {describe, expect, it} from 'vitest'

import {readParticipantState, writeParticipantState} from '../../src/storage/participant-store.js'
import {PyValue, pyDumps, pyDumpsView} from '../../src/storage/pyjson.js'
import {tempDir} from '../helpers/tmp.js'

const record = (p: number, i: number, big: number): Map<string, PyValue> =>
  new Map<string, PyValue>([
    [
      'episode_id',
      new Map<string, PyValue>([
        ['rollout_id', `p${p}r${i}`],
        ['attempt', 0],
      ]),
    ],
    [
      'state',
      new Map<string, PyValue>([
        ['text', `participant ${p} record ${i} ${'x'.repeat(i % 7 === 0 ? big : 40)}`],
        ['n', [p, i, NaN]],
      ]),
    ],
  ])

describe('records writers running at once in one process (the fleet double, the demo)', () => {
  it.each([
    ['small records', 0],
    ['records larger than the write batch', 3 << 20],
  ])('each writes exactly its own records, encoded through the shared pyDumpsView scratch (%s)', async (_, big) => {
    const dir = await tempDir()
    const kinds = ['environment', 'model', 'agent', 'resources']
    const n = big ? 15 : 20_000
    const writes = kinds.map((kind, p) => {
      function* lines(): Generator<Buffer> {
        for (let i = 0; i < n; i++) yield pyDumpsView(record(p, i, big))
      }
      return writeParticipantState({checkpointDir: dir, kind, instance: kind, checkpointId: 'c'}, lines())
    })
    const manifests = await Promise.all(writes)
    for (const [p, kind] of kinds.entries()) {
      const m = manifests[p]!
      const text = await readFile(path.join(dir, 'gym', kind, kind, m.records_file), 'latin1')
      const expected = Array.from({length: n}, (_, i) => pyDumps(record(p, i, big)) + '\n').join('')
      expect(text === expected, `${kind}'s records file holds exactly its records`).toBe(true)
      const r = await readParticipantState(path.join(dir, 'gym', kind, kind), {keep: null})
      expect(r.keys.length).toBe(n)
    }
  })
})
