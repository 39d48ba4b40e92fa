import {writeFile} from 'node:fs/promises'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {cli} from '../helpers/cli.js'
import {FULL, TOKEN, startFleet} from '../helpers/fleet.js'
import {tempDir} from '../helpers/tmp.js'

describe('fleet, root and token from the environment and a config context', () => {
  it('checkpoint and verify with no fleet, root or token flag: GYMCKPT_* and then a config context supply them', async () => {
    const fleet = await startFleet({members: FULL})
    const dir = await tempDir()
    const fleetFile = path.join(dir, 'fleet.yaml')
    await writeFile(fleetFile, `servers:\n${fleet.servers.map((s) => `  ${s.name}: ${s.url}`).join('\n')}\n`)
    const tokenFile = path.join(dir, 'token')
    await writeFile(tokenFile, TOKEN)

    // From the environment only (and no token variable: the token file comes from GYMCKPT_TOKEN_FILE).
    const env = {GYMCKPT_FLEET: fleetFile, GYMCKPT_ROOT: path.join(dir, 'root-env'), GYMCKPT_TOKEN_FILE: tokenFile, NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: undefined}
    const ck = await cli(['checkpoint', '--episodes-file', '/dev/null', '--json'], {env})
    expect(ck.code, ck.stdout + ck.stderr).toBe(0)
    expect(ck.json.checkpoint_dir.startsWith(path.join(dir, 'root-env'))).toBe(true)
    const v = await cli(['verify', '--json'], {env})
    expect(v.code, v.stdout).toBe(0)
    expect(v.json.checkpoint_id).toBe(ck.json.checkpoint_id)

    // From a config context, selected by GYMCKPT_CONTEXT; relative paths resolve against the file.
    const config = path.join(dir, 'gymckpt.yaml')
    await writeFile(config, `current-context: other\ncontexts:\n  other: {head: 'http://127.0.0.1:1'}\n  rehearsal: {fleet: fleet.yaml, root: root-ctx, token-file: token}\n`)
    const env2 = {GYMCKPT_CONFIG: config, GYMCKPT_CONTEXT: 'rehearsal', NEMO_GYM_CHECKPOINT_CONTROL_TOKEN: undefined}
    const show = await cli(['config', 'show', '--json'], {env: env2})
    expect(show.code, show.stdout).toBe(0)
    expect(show.json).toMatchObject({context: 'rehearsal', fleet: {value: {fleet: fleetFile}}, root: {value: path.join(dir, 'root-ctx')}, token_source: {value: `file ${tokenFile}`}})
    expect(show.stdout).not.toContain(TOKEN)
    const ck2 = await cli(['checkpoint', '--episodes-file', '/dev/null', '--json'], {env: env2})
    expect(ck2.code, ck2.stdout + ck2.stderr).toBe(0)
    expect(ck2.json.checkpoint_dir.startsWith(path.join(dir, 'root-ctx'))).toBe(true)
    // A flag still wins over the context.
    const flagged = await cli(['config', 'show', '--root', '/elsewhere', '--json'], {env: env2})
    expect(flagged.json.root).toEqual({value: '/elsewhere', from: '--root'})
  })

  it('no fleet anywhere is exit 2 naming every way to give one', async () => {
    const r = await cli(['status', '--json'], {env: {GYMCKPT_CONFIG: undefined}})
    expect(r.code).toBe(2)
    expect(r.json.error.message).toMatch(/no fleet given: pass --head URL, --server NAME=URL \(repeatable\) or --fleet FILE, set GYMCKPT_HEAD/)
  })
})
