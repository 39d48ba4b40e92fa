// store.manifest-last by modification time: files written one right after the other can get
// their times in the wrong order by a fraction of a clock tick (Linux 6.13 on stamps with a
// coarse or a fine clock; 280 µs was seen here). Within MTIME_SLACK_NS the times tell nothing;
// past it, a manifest older than its records file fails.
import {utimes, writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {MTIME_SLACK_NS, checkManifestLast} from '../../src/coordination/conformance.js'
import {tempDir} from '../helpers/tmp.js'

async function filesWithMtimes(manifestS: number, recordsS: number): Promise<string> {
  const dir = await tempDir()
  await writeFile(path.join(dir, 'records-x.jsonl'), '')
  await writeFile(path.join(dir, 'manifest.json'), '{}')
  await utimes(path.join(dir, 'records-x.jsonl'), recordsS, recordsS)
  await utimes(path.join(dir, 'manifest.json'), manifestS, manifestS)
  return dir
}

describe('store.manifest-last by modification time (no directory events)', () => {
  const t = 1_700_000_000
  it('a manifest written after its records file passes', async () => {
    expect(await checkManifestLast(await filesWithMtimes(t + 0.5, t), 'records-x.jsonl', null)).toEqual({
      result: 'pass',
      message: 'the records file was last written before manifest.json (by modification time)',
    })
  })

  it('a manifest 1 ms older than its records file is within the slack: passes, saying so', async () => {
    expect(MTIME_SLACK_NS).toBe(10_000_000n)
    expect(await checkManifestLast(await filesWithMtimes(t, t + 0.001), 'records-x.jsonl', null)).toEqual({
      result: 'pass',
      message: "the records file was last written before manifest.json (by modification time, within the file system's 10 ms of timestamp slack)",
    })
  })

  it('a manifest 50 ms older than its records file fails, naming the gap', async () => {
    const out = await checkManifestLast(await filesWithMtimes(t, t + 0.05), 'records-x.jsonl', null)
    expect(out.result).toBe('fail')
    expect(out.message).toMatch(/^manifest\.json was last written (4999\d|5000\d) µs before records-x\.jsonl: the manifest comes last$/)
  })

  it('directory events that show the records file last fail, whatever the times say', async () => {
    const out = await checkManifestLast(await filesWithMtimes(t + 0.5, t), 'records-x.jsonl', ['records-x.jsonl', 'manifest.json', 'records-x.jsonl'])
    expect(out).toEqual({result: 'fail', message: 'manifest.json appeared in the directory before records-x.jsonl'})
  })
})
