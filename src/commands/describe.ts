import {existsSync} from 'node:fs'

import {Args, Flags} from '@oclif/core'

import {BaseCommand} from '../cli/base.js'
import {color} from '../cli/color.js'
import {checkpointId, rootFlag} from '../cli/flags.js'
import {exitCodesHelp} from '../cli/exit-codes.js'
import {describeJson} from '../cli/catalog-json.js'
import {keys, note, problemNote, table, warn} from '../cli/output.js'
import {ControllerError} from '../coordination/errors.js'
import {SAFE_ID_PATTERN, fromWire, quoteInput} from '../protocol/episode.js'
import {describeCheckpoint, formatAge, formatBytes} from '../storage/catalog.js'
import type {CommandJson} from '../cli/json-schemas.js'

function validId(id: string): string {
  if (!SAFE_ID_PATTERN.test(id) || id.length > 128) throw new ControllerError('input', `ID ${quoteInput(id)}: a checkpoint ID is 1 to 128 characters matching ^[A-Za-z0-9][A-Za-z0-9._-]*$`)
  return id
}

const checkpointIdArg = Args.custom<string>({
  async parse(id: string) {
    return validId(id)
  },
})

export default class Describe extends BaseCommand<typeof Describe> {
  static override summary = 'Show one checkpoint: its manifest, each participant, and the restores recorded for it.'
  static override description = `Describes the checkpoint ID in ROOT (default: the one LATEST names; ROOT may also be a checkpoint directory). Shows its state, when it was created, its size, the controller manifest (which file, the continued and restarted episodes, Gym's run_id), each participant's kind, instance, committing server, records, bytes and records digest (from its manifest.json and a stat of its records file), and every restore of it recorded in ROOT/restores.jsonl (restore ID, time, outcome: restored, failed or refused). Reads no records file unless --verify, which runs the full offline verification (as gymckpt verify) and adds IN_SCOPE, OUTSIDE_SCOPE and SCOPE_WITHOUT_RECORD per participant; an invalid checkpoint then exits 6. Touches no server.\n\n${exitCodesHelp('input', 'invalid_checkpoint')}`
  static override examples = [
    '<%= config.bin %> describe /shared/ckpt',
    '<%= config.bin %> describe /shared/ckpt ckpt-20261202T120000-1a2b3c4d --verify',
    '<%= config.bin %> describe /shared/ckpt --json',
  ]
  static override args = {
    root: Args.string({description: 'Checkpoint root (the directory holding LATEST), or a checkpoint directory (default: --root, GYMCKPT_ROOT, or the config context).'}),
    id: checkpointIdArg({description: 'Checkpoint ID in the root (default: LATEST).'}),
  }
  static override flags = {
    verify: Flags.boolean({summary: 'Also verify the checkpoint offline (reads every records file).'}),
    root: rootFlag('Checkpoint root, instead of the positional'),
    id: checkpointId({summary: 'Checkpoint ID in the root, instead of the positional (default: LATEST).'}),
  }

  async run(): Promise<CommandJson<'describe'>> {
    let [rootArg, idArg] = [this.args.root, this.args.id]
    // One positional that is an ID and no path, with the root given otherwise (--root,
    // GYMCKPT_ROOT, the config context): `describe --root R ID`.
    if (rootArg !== undefined && idArg === undefined && rootArg !== this.flags.root && SAFE_ID_PATTERN.test(rootArg) && !existsSync(rootArg)) {
      if (this.flags.root !== undefined || (await this.settings()).root !== null) [rootArg, idArg] = [undefined, validId(rootArg)]
    }
    if (idArg !== undefined && this.flags.id !== undefined && idArg !== this.flags.id) throw new ControllerError('input', `two checkpoint IDs given, ${idArg} and --id ${this.flags.id}: pass one`)
    const d = await describeCheckpoint(await this.rootDir(rootArg, this.flags.root), idArg ?? this.flags.id, {verify: this.flags.verify})
    const {warnings, ...json} = describeJson(d)
    for (const w of warnings) warn(w)
    if (!this.jsonEnabled()) this.render(json)
    if (json.verify && !json.verify.valid) {
      const errs = json.verify.problems.filter((p) => p.severity === 'error')
      throw new ControllerError('invalid_checkpoint', `checkpoint ${json.checkpoint.checkpoint_dir} is invalid: ${errs.length} error(s); first: ${errs[0]?.where}: ${errs[0]?.message}`, json)
    }
    return json
  }

  private render(json: Omit<ReturnType<typeof describeJson>, 'warnings'>): void {
    const c = json.checkpoint
    const m = json.manifest
    const lines: [string, string][] = [
      ['checkpoint', `${c.checkpoint_id}${c.latest ? ' (LATEST)' : ''}`],
      ['directory', c.checkpoint_dir],
      ['state', `${c.state}${c.manifest ? ` (${c.manifest})` : ''}`],
      ['created', `${c.created.replace(/\.\d+Z$/, 'Z')} (${formatAge(c.age_seconds)} ago${m ? '' : ', directory time'})`],
      ['size', `${formatBytes(c.size_bytes)} (${c.size_bytes} bytes) in ${c.participant_count} participant(s)`],
    ]
    if (m) {
      lines.push(['continued', `${m.continued.length}: ${keys(m.continued.map(fromWire))}`], ['restarted', `${m.restarted.length}: ${keys(m.restarted.map(fromWire))}`])
      if (m.run_id) lines.push(['run_id', m.run_id])
    }
    if (c.error) lines.push(['error', c.error])
    const w = Math.max(...lines.map(([k]) => k.length))
    this.log(lines.map(([k, v]) => `${color.bold(k.padEnd(w))}  ${v}`).join('\n'))
    this.log('')
    const cols = ['kind', 'instance', 'server', 'records', 'bytes', 'records_sha256']
    if (json.verify) cols.push('ok', 'in_scope', 'outside_scope', 'scope_without_record')
    this.log(table(json.participants, cols))
    for (const p of json.participants) if (p.error) note(`${p.kind}/${p.instance}: ${p.error}`)
    this.log('')
    this.log(color.bold(`RESTORES (${json.restores.length})`))
    this.log(
      table(
        json.restores.map((r) => ({...r, participants: r.participant_count, time: r.time.replace(/\.\d+Z$/, 'Z')})),
        ['restore_id', 'time', 'outcome', 'participants'],
      ),
    )
    for (const r of json.restores) if (r.error) this.log(`${r.restore_id}: ${r.error}`)
    if (json.verify) {
      for (const p of json.verify.problems) problemNote(p)
      this.log(json.verify.valid ? color.green('valid') : color.red('INVALID'))
    }
  }
}
