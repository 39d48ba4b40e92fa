import {FleetCommand} from '../../cli/base.js'
import {ENV} from '../../cli/config.js'
import {exitCodesHelp} from '../../cli/exit-codes.js'
import {rootFlag} from '../../cli/flags.js'
import {table} from '../../cli/output.js'
import type {CommandJson} from '../../cli/json-schemas.js'

export default class ConfigShow extends FleetCommand<typeof ConfigShow> {
  static override summary = 'Show the fleet, root and token source every command would use, and where each comes from.'
  static override description = `Precedence: a flag, else an environment variable (${Object.values(ENV).join(', ')}),
else the selected context of the config file (--config, GYMCKPT_CONFIG, or config.yaml in the
config directory; --context, GYMCKPT_CONTEXT, or its current-context). The token itself is never
shown, never read from the config file, and never a flag: only where it would be read from.

Config file:
  current-context: staging
  contexts:
    staging: {head: http://head:11000, root: /shared/ckpt, token-file: ~/.gymckpt/staging.token}
    local:   {fleet: ./fleet.yaml, root: /tmp/ckpt}

${exitCodesHelp('input')}`
  static override examples = ['<%= config.bin %> config show', '<%= config.bin %> config show --context staging --json']
  static override flags = {root: rootFlag()}

  async run(): Promise<CommandJson<'config show'>> {
    const s = await this.settings()
    const fleet = s.fleet ? Object.entries(s.fleet.value).map(([k, v]) => `${k} ${Array.isArray(v) ? v.join(',') : v}`)[0]! : null
    const tokenFrom = 'tokenFile' in s.token.value ? `file ${s.token.value.tokenFile}` : `env ${s.token.value.tokenEnv} (${process.env[s.token.value.tokenEnv] ? 'set' : 'not set'})`
    const rows = [
      {setting: 'fleet', value: fleet, from: s.fleet?.from ?? null},
      {setting: 'root', value: s.root?.value ?? null, from: s.root?.from ?? null},
      {setting: 'token', value: tokenFrom, from: s.token.from},
      {setting: 'context', value: s.context, from: s.configFile},
    ]
    if (!this.jsonEnabled()) this.log(table(rows, ['setting', 'value', 'from']))
    return {config_file: s.configFile, context: s.context, config_dir: this.config.configDir, fleet: s.fleet, root: s.root, token_source: {value: tokenFrom, from: s.token.from}}
  }
}
