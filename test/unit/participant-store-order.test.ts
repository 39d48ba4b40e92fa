// readParticipantState names the first problem in file order, as Gym's restore (which reads line by
// line) would: a line read again because it repeats its episode_id comes before a later bad line
// of the same read chunk.
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {readParticipantState} from '../../src/storage/participant-store.js'
import {handWritten} from '../helpers/store.js'
import {tempDir} from '../helpers/tmp.js'

const ep = (r: string) => `{"rollout_id": "${r}", "attempt": 0}`

async function firstProblem(lines: string[], keep: string[] = []): Promise<string> {
  const dir = path.join(await tempDir(), 'env')
  await handWritten(dir, lines.join('\n') + '\n', lines.length)
  const err = await readParticipantState(dir, {keep: new Set(keep)}).then(
    () => null,
    (e: Error) => e,
  )
  if (!err) throw new Error('the read succeeded')
  return err.message.replace(/^.*\.jsonl /, '')
}

describe('the first problem in file order', () => {
  it('a repeated episode_id whose last value is invalid, before a later bad line in the same chunk', async () => {
    const repeated = `{"episode_id": ${ep('b')}, "v": [1], "episode_id": 7}`
    expect(await firstProblem([`{"episode_id": ${ep('a')}}`, repeated, '{"v": 1}'])).toBe('line 2: checkpoint record has no valid episode_id')
    expect(await firstProblem([`{"episode_id": ${ep('a')}}`, repeated, `{"episode_id": ${ep('k')}, "v": tru}`], ['k'])).toBe('line 2: checkpoint record has no valid episode_id')
    // And the other way round.
    expect(await firstProblem(['{"v": 1}', repeated])).toBe('line 1: checkpoint record has no valid episode_id')
  })

  it('a repeated episode_id that is valid is no problem: the later bad line is', async () => {
    const repeated = `{"episode_id": ${ep('b')}, "episode_id": ${ep('c')}}`
    expect(await firstProblem([repeated, '{"v": 1}'])).toBe('line 2: checkpoint record has no valid episode_id')
  })
})
