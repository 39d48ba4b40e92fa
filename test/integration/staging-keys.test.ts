// The policy model's commit reply carries `staging_keys`: the token-store keys its checkpointed
// episodes still reference, which the training framework must keep (reference 4.6). gymckpt hands
// them on: in the commit outcome (--json's participants), and in gymckpt.json, so a script can find
// them from the checkpoint it is about to restore.
import {readFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {commitJson} from '../../src/cli/output.js'
import {checkpoint} from '../../src/coordination/controller.js'
import {readCheckpointSummary} from '../../src/storage/root.js'
import {FULL, FULL_PARTICIPANTS, coordinatorFor, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

describe("the policy model's staging keys", () => {
  it('reach the commit outcome and gymckpt.json for the model alone, and read back unchanged', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    // Two rollouts with model calls made, then frozen mid-run.
    for (const id of ['r1', 'r2']) void fleet.run({rolloutId: id, steps: 100_000, stepMs: 5}).catch(() => {})
    const model = fleet.server('policy')
    await new Promise((r) => setTimeout(r, 300))
    const root = await tempDir()
    const episodes = [
      {rolloutId: 'r1', attempt: 0},
      {rolloutId: 'r2', attempt: 0},
    ]
    const out = await checkpoint(c, {root, timeoutS: 10, episodes})
    const modelReply = out.replies.get(model.name)!
    expect(modelReply.staging_keys!.length).toBeGreaterThan(2)
    expect(modelReply.staging_keys).toEqual([...modelReply.staging_keys!].sort())
    expect(new Set(modelReply.staging_keys!.map((k) => k.split('/')[0]))).toEqual(new Set(['r1', 'r2']))
    expect([...out.replies.keys()].sort()).toEqual(FULL_PARTICIPANTS)
    for (const [server, r] of out.replies) if (server !== model.name) expect(r.staging_keys, server).toBeUndefined()

    const json = commitJson(out)
    expect(json.participants.find((p) => p.server === model.name)).toMatchObject({staging_keys: modelReply.staging_keys})
    expect(json.participants.filter((p) => 'staging_keys' in p).map((p) => p.server)).toEqual([model.name])

    const file = JSON.parse(await readFile(path.join(out.checkpointDir, 'gymckpt.json'), 'utf8'))
    expect(file.participants.filter((p: {staging_keys?: string[]}) => p.staging_keys).map((p: {server: string}) => p.server)).toEqual([model.name])
    const summary = await readCheckpointSummary(out.checkpointDir)
    expect(summary!.participants!.find((p) => p.server === model.name)!.staging_keys).toEqual(modelReply.staging_keys)
  })
})
