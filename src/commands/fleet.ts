import {writeFile} from 'node:fs/promises'

import {Flags} from '@oclif/core'
import {stringify} from 'yaml'

import {BaseCommand} from '../cli/base.js'
import {checked} from '../cli/flags.js'
import {exitCodesHelp} from '../cli/exit-codes.js'
import {DEFAULT_TOKEN_ENV, readToken} from '../cli/inputs.js'
import {note, table} from '../cli/output.js'
import {ServerFault, parseServerFault} from '../control-plane/faults.js'
import {DEFAULT_FLEET, Fleet, FleetMember, parseMember} from '../control-plane/fleet.js'
import {ControllerError} from '../coordination/errors.js'

export default class FleetCmd extends BaseCommand<typeof FleetCmd> {
  static override summary = 'Run a simulated Gym fleet on 127.0.0.1 to rehearse checkpoints and crashes.'
  static override description = `Starts the participant double (same routes, phases, errors and on-disk format as Gym) for each
member, plus a head server, and runs until SIGINT/SIGTERM. The token comes from the same place
as every other command's. Faults: SERVER:ROUTE:TYPE[:ARG][xN] with TYPE status|hang|delay|drop|drop-after,
e.g. policy_model:commit:status:500 or weather_env:prepare:hang.\n\n${exitCodesHelp('input', 'interrupted')}`
  static override examples = [
    'export NEMO_GYM_CHECKPOINT_CONTROL_TOKEN=$(openssl rand -hex 16); <%= config.bin %> fleet --write-fleet fleet.yaml --episode-count 20',
    '<%= config.bin %> fleet --member env=environment --member policy=model --fault policy:commit:status:500',
  ]
  static override flags = {
    member: Flags.custom<FleetMember>({parse: checked(parseMember)})({
      summary: 'A member as NAME=KIND (environment|model|agent|resources|none); repeatable. Default: one of each and a judge.',
      multiple: true,
    }),
    'write-fleet': Flags.string({summary: 'Write a fleet YAML file for --fleet.'}),
    fault: Flags.custom<ServerFault>({parse: checked(parseServerFault)})({summary: 'Inject a fault (repeatable).', multiple: true}),
    'episode-count': Flags.integer({summary: 'Start this many long-running episodes.', default: 0, min: 0, aliases: ['episodes']}),
    steps: Flags.integer({summary: 'Steps per started episode.', default: 50, min: 1}),
    'step-ms': Flags.integer({summary: 'Duration of one step, ms.', default: 200, min: 1}),
    'token-env': Flags.string({summary: 'Environment variable holding the control token.', default: DEFAULT_TOKEN_ENV}),
    'token-file': Flags.string({summary: 'File holding the control token.'}),
  }

  async run() {
    // SIGINT/SIGTERM handled from the start: one that comes while the fleet starts stops it cleanly too.
    const signal = this.signal
    const members = this.flags.member?.length ? this.flags.member : DEFAULT_FLEET
    const twice = members.find((m, i) => members.findIndex((x) => x.name === m.name) !== i)
    if (twice) throw new ControllerError('input', `--member ${twice.name}: named twice; every member needs its own name`)
    const token = await readToken({tokenEnv: this.flags['token-env'], tokenFile: this.flags['token-file']})
    const fleet = await Fleet.start({token, members, head: true})
    try {
      for (const f of this.flags.fault ?? []) {
        const s = fleet.servers.find((x) => x.name === f.server)
        if (!s) throw new ControllerError('input', `--fault: no member named '${f.server}'`)
        s.faults.add(f.rule.route, f.rule.fault, f.rule.times)
      }
      const rows = fleet.servers.map((s, i) => ({server: s.name, kind: members[i]!.kind, url: s.url}))
      if (this.flags['write-fleet']) await writeFile(this.flags['write-fleet'], stringify({servers: Object.fromEntries(rows.map((r) => [r.server, r.url]))}))
      // Printed while the fleet runs (the command returns only when stopped): the envelope of every --json document.
      if (this.jsonEnabled()) process.stdout.write(JSON.stringify(this.toSuccessJson({head: fleet.headUrl, servers: rows})) + '\n')
      else {
        this.log(table(rows, ['server', 'kind', 'url']))
        this.log(`head server: ${fleet.headUrl}`)
        note('running; Ctrl-C to stop')
      }
      for (let i = 0; i < this.flags['episode-count']; i++) {
        void fleet
          .run({rolloutId: `ep-${i}`, steps: this.flags.steps, stepMs: this.flags['step-ms']})
          .then((r) => note(`ep-${i}: HTTP ${r.status}`))
          .catch((err: Error) => note(`ep-${i}: ${err.message}`))
      }
      await new Promise<void>((resolve) => {
        if (signal.aborted) resolve()
        else signal.addEventListener('abort', () => resolve(), {once: true})
      })
    } finally {
      await fleet.close()
    }
    return undefined
  }
}
