import {describe, expect, it} from 'vitest'

import {cli} from '../helpers/cli.js'
import {FULL, control, soon, startFleet, coordinatorFor} from '../helpers/fleet.js'
import {prepare, resume} from '../../src/coordination/operations.js'

function servers(fleet: {serverArgs(): string[]}): string[] {
  return fleet.serverArgs().flatMap((s) => ['--server', s])
}

describe('--dry-run of retire and forget', () => {
  it('retire --dry-run shows the stages in Gym order and sends nothing but status probes', async () => {
    const fleet = await startFleet({members: FULL})
    const r = await cli(['retire', ...servers(fleet), '--episode', 'r7', '--episode', 'r9@1', '--dry-run', '--json'])
    expect(r.code, r.stdout + r.stderr).toBe(0)
    expect(r.json).toMatchObject({
      dry_run: true,
      episode_count: 2,
      participant_count: 4,
      calls_per_server: 1,
      stages: [
        {stage: 'environment', servers: ['env']},
        {stage: 'agent', servers: ['agent']},
        {stage: 'model+resources', servers: ['policy', 'res']},
      ],
      would_refuse: [],
    })
    expect(fleet.servers.flatMap((s) => s.journal.map((j) => j.route)).filter((x) => x !== 'status')).toEqual([])
    expect((await control(fleet.server('env').url, 'status')).json.retired_rollouts).toBe(0)
  })

  it('forget --dry-run names the participants that would refuse it while a checkpoint is open', async () => {
    const fleet = await startFleet({members: FULL})
    const c = await coordinatorFor(fleet)
    await prepare(c, 'ckpt-open', soon())
    const r = await cli(['forget', ...servers(fleet), '--rollout', 'r7', '--dry-run', '--json'])
    expect(r.code, r.stdout + r.stderr).toBe(0)
    expect(r.json.would_refuse.map((x: {server: string; phase: string}) => `${x.server} ${x.phase}`)).toEqual(['env prepared', 'policy prepared', 'agent prepared', 'res prepared'])
    expect(fleet.servers.flatMap((s) => s.journal.map((j) => j.route)).filter((x) => x !== 'status' && x !== 'prepare')).toEqual([])
    await resume(c, 'ckpt-open', soon())
  })
})
