import {writeFile} from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {loadConfig, resolveSettings} from '../../src/cli/config.js'
import {ControllerError} from '../../src/coordination/errors.js'
import {tempDir} from '../helpers/tmp.js'

async function configFile(text: string): Promise<string> {
  const f = path.join(await tempDir(), 'config.yaml')
  await writeFile(f, text)
  return f
}

const CONFIG = `current-context: staging
contexts:
  staging: {head: 'http://head:11000', root: ckpt, token-file: ~/staging.token}
  local: {fleet: ./fleet.yaml, root: /tmp/local, token-env: LOCAL_TOKEN}
`

describe('settings: flag > environment > config context', () => {
  it('takes each setting from the config context when neither a flag nor the environment gives it; paths resolve against the file', async () => {
    const f = await configFile(CONFIG)
    const s = resolveSettings({flags: {}, env: {}, config: await loadConfig(f, '/nonexistent')})
    expect(s.context).toBe('staging')
    expect(s.fleet).toEqual({value: {head: 'http://head:11000'}, from: `context staging (${f})`})
    expect(s.root?.value).toBe(path.join(path.dirname(f), 'ckpt'))
    expect(s.token.value).toEqual({tokenFile: path.join(os.homedir(), 'staging.token')})
  })

  it('the environment beats the config, and a flag beats both; --fleet is not refused because GYMCKPT_HEAD is set', async () => {
    const config = await loadConfig(await configFile(CONFIG), '/nonexistent')
    const env = {GYMCKPT_HEAD: 'http://env:1', GYMCKPT_ROOT: '/env/root', GYMCKPT_TOKEN_ENV: 'ENV_TOKEN'}
    const fromEnv = resolveSettings({flags: {}, env, config})
    expect([fromEnv.fleet?.from, fromEnv.root?.from, fromEnv.token.from]).toEqual(['GYMCKPT_HEAD', 'GYMCKPT_ROOT', 'GYMCKPT_TOKEN_ENV'])
    const fromFlags = resolveSettings({flags: {fleet: 'f.yaml', root: '/flag', 'token-file': '/t'}, env, config})
    expect(fromFlags.fleet).toEqual({value: {fleet: 'f.yaml'}, from: '--fleet'})
    expect(fromFlags.root).toEqual({value: '/flag', from: '--root'})
    expect(fromFlags.token).toEqual({value: {tokenFile: '/t'}, from: '--token-file'})
  })

  it('--context and GYMCKPT_CONTEXT select another context; GYMCKPT_SERVERS splits on commas', async () => {
    const config = await loadConfig(await configFile(CONFIG), '/nonexistent')
    expect(resolveSettings({flags: {context: 'local'}, env: {}, config}).token).toEqual({value: {tokenEnv: 'LOCAL_TOKEN'}, from: expect.stringContaining('context local')})
    expect(resolveSettings({flags: {}, env: {GYMCKPT_CONTEXT: 'local'}, config}).root?.value).toBe('/tmp/local')
    expect(resolveSettings({flags: {}, env: {GYMCKPT_SERVERS: 'a=http://x:1, b=http://y:2'}, config: null}).fleet?.value).toEqual({servers: ['a=http://x:1', 'b=http://y:2']})
  })

  it('without any source: no fleet, no root, the default token variable', () => {
    const s = resolveSettings({flags: {}, env: {}, config: null})
    expect([s.fleet, s.root, s.token]).toEqual([null, null, {value: {tokenEnv: 'NEMO_GYM_CHECKPOINT_CONTROL_TOKEN'}, from: 'default'}])
  })

  it('refuses a token in the config file, an unknown context, two fleet variables, unknown keys, and YAML that is not', async () => {
    const err = async (p: Promise<unknown>) => ((await p.catch((e: unknown) => e)) as ControllerError).message
    expect(await err(loadConfig(await configFile('contexts:\n  a: {head: x, token: s3cret}\n'), '/x'))).toMatch(/contexts\.a\.token: the token is never kept in the config file/)
    expect(await err(loadConfig(await configFile('contexts:\n  a: {hed: x}\n'), '/x'))).toMatch(/contexts\.a: Unrecognized key: "hed"/)
    expect(await err(loadConfig(await configFile('contexts: [\n'), '/x'))).toMatch(/is not YAML/)
    expect(await err(loadConfig('/does/not/exist.yaml', '/x'))).toMatch(/cannot read config file \/does\/not\/exist.yaml: ENOENT/)
    expect(await loadConfig(undefined, '/does/not/exist')).toBeNull()
    const config = await loadConfig(await configFile(CONFIG), '/x')
    expect(() => resolveSettings({flags: {context: 'prod'}, env: {}, config})).toThrow(/has no context 'prod' \(it has: staging, local\)/)
    expect(() => resolveSettings({flags: {}, env: {GYMCKPT_HEAD: 'a', GYMCKPT_FLEET: 'b'}, config: null})).toThrow(/GYMCKPT_HEAD and GYMCKPT_FLEET are all set/)
  })
})
