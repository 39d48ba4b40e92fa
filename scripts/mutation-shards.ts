// `npm run mutation` in shards: the whole run takes longer than a working session on a 2-core
// machine, and a Stryker run keeps nothing until it ends. Each shard mutates a fixed part of the
// files (whole files, so each file's score comes from one run) and can run on its own machine or
// in its own session; the merge checks that every shard mutated the same source and gives the
// score of every file, as one whole run would.
//
//   npm run mutation:shard -- 2/4     run shard 2 of 4: reports/mutation/shard-2-of-4.{json,html,meta.json}
//   npm run mutation:shard -- 4/4:1/2 run part 1 of 2 of shard 4 of 4, for a shard too long for one sitting
//   npm run mutation:merge -- 4       merge the 4 shards (each whole or in all its parts) into
//                                     reports/mutation/mutation.json, print the table
//
// Run by Node itself (type stripping): no syntax that needs a compiler, only type annotations.
import {execFileSync} from 'node:child_process'
import {globSync, readFileSync, readdirSync, writeFileSync, mkdirSync, existsSync, rmSync} from 'node:fs'
import path from 'node:path'

export interface Weighted {
  file: string
  weight: number
}

/** The files a mutate list names: Stryker's globs, a leading `!` excluding. Sorted, relative. */
export function mutatedFiles(root: string, patterns: string[]): string[] {
  const include = patterns.filter((p) => !p.startsWith('!'))
  const exclude = patterns.filter((p) => p.startsWith('!')).map((p) => p.slice(1))
  return globSync(include, {cwd: root})
    .map((f) => f.split(path.sep).join('/'))
    .filter((f) => !exclude.some((x) => path.matchesGlob(f, x)))
    .sort()
}

/**
 * Splits files into `n` shards of about equal weight: heaviest file first, each to the lightest
 * shard so far (the lowest-numbered on a tie). The same files and weights always give the same
 * shards, so shards run on different machines agree without talking. Each shard's files are sorted.
 */
export function partition(files: Weighted[], n: number): string[][] {
  if (!Number.isInteger(n) || n < 1) throw new Error(`the number of shards must be a whole number from 1, not ${n}`)
  const shards = Array.from({length: n}, () => ({weight: 0, files: [] as string[]}))
  const order = [...files].sort((a, b) => b.weight - a.weight || (a.file < b.file ? -1 : a.file > b.file ? 1 : 0))
  for (const f of order) {
    let lightest = shards[0]!
    for (const s of shards) if (s.weight < lightest.weight) lightest = s
    lightest.weight += f.weight
    lightest.files.push(f.file)
  }
  return shards.map((s) => s.files.sort())
}

export interface ShardSpec {
  index: number
  count: number
  /** Part J of M of the shard: its files split again the same way. */
  part?: {index: number; count: number}
}

/** `K/N`, or `K/N:J/M` (part J of M of shard K of N), each 1 <= K <= N; or an error naming what is wrong. */
export function parseShard(arg: string | undefined): ShardSpec {
  const m = /^(\d+)\/(\d+)(?::(\d+)\/(\d+))?$/.exec(arg ?? '')
  if (!m) throw new Error(`give the shard as K/N, e.g. 2/4 (shard 2 of 4), or K/N:J/M (part J of M of it), not ${JSON.stringify(arg ?? '')}`)
  const [index, count, partIndex, partCount] = m.slice(1).map(Number) as [number, number, number, number]
  if (count < 1 || index < 1 || index > count) throw new Error(`shard ${arg}: K must be from 1 to N`)
  if (m[3] === undefined) return {index, count}
  if (partCount < 1 || partIndex < 1 || partIndex > partCount) throw new Error(`shard ${arg}: J must be from 1 to M`)
  return {index, count, part: {index: partIndex, count: partCount}}
}

/** The shard's name as the meta file records it: `K/N` or `K/N:J/M`. */
export const shardName = (s: ShardSpec): string => `${s.index}/${s.count}${s.part ? `:${s.part.index}/${s.part.count}` : ''}`

/** The base name of a shard's report and meta files: `shard-K-of-N` or `shard-K-of-N-part-J-of-M`. */
export const shardFile = (s: ShardSpec): string => `shard-${s.index}-of-${s.count}${s.part ? `-part-${s.part.index}-of-${s.part.count}` : ''}`

/** The files of a shard (or of a part of one): the split of all files, then the split of the shard's. */
export function shardFiles(files: Weighted[], s: ShardSpec): string[] {
  const mine = partition(files, s.count)[s.index - 1]!
  if (!s.part) return mine
  return partition(
    files.filter((f) => mine.includes(f.file)),
    s.part.count,
  )[s.part.index - 1]!
}

interface Mutant {
  status: string
}
interface Report {
  files: Record<string, {mutants: Mutant[]}>
  testFiles?: Record<string, unknown>
  [key: string]: unknown
}
export interface Meta {
  shard: string
  commit: string
  srcTree: string
  testTree: string
  dirty: boolean
  files: string[]
  seconds: number
}

export interface FileScore {
  file: string
  mutants: number
  killed: number
  timeout: number
  survived: number
  noCoverage: number
  compileErrors: number
  ignored: number
  /**
   * Stryker's mutation score: killed and timed out over every mutant that compiled and ran or had
   * no test; null when no mutant did (a file of types and constants only).
   */
  score: number | null
}

export function scores(report: Report): FileScore[] {
  return Object.entries(report.files)
    .map(([file, {mutants}]) => {
      const n = (status: string): number => mutants.filter((m) => m.status === status).length
      const killed = n('Killed')
      const timeout = n('Timeout')
      const survived = n('Survived')
      const noCoverage = n('NoCoverage')
      const valid = killed + timeout + survived + noCoverage
      return {
        file,
        mutants: mutants.length,
        killed,
        timeout,
        survived,
        noCoverage,
        compileErrors: n('CompileError'),
        ignored: n('Ignored'),
        score: valid === 0 ? null : (100 * (killed + timeout)) / valid,
      }
    })
    .sort((a, b) => (a.file < b.file ? -1 : a.file > b.file ? 1 : 0))
}

/**
 * One report from the shards' reports, after checking that they are the `count` shards of one split
 * and mutated the same source (the git tree of src/). Shards run on different commits whose src/
 * is the same are accepted; the commits are returned to be named.
 */
export function merge(shards: {meta: Meta; report: Report}[], count: number): {report: Report; commits: string[]} {
  const want = Array.from({length: count}, (_, i) => `${i + 1}/${count}`)
  const missing: string[] = []
  for (const w of want) {
    if (shards.some((s) => s.meta.shard === w)) continue
    // A shard run in parts: every part of one split of it.
    const parts = shards.map((s) => parseShard(s.meta.shard)).filter((p) => p.part && `${p.index}/${p.count}` === w)
    if (!parts.length) {
      missing.push(w)
      continue
    }
    const splits = [...new Set(parts.map((p) => p.part!.count))]
    if (splits.length > 1) throw new Error(`shard ${w} is in parts of different splits (${parts.map(shardName).join(', ')}); run all the parts of one split`)
    for (let j = 1; j <= splits[0]!; j++) if (!parts.some((p) => p.part!.index === j)) missing.push(`${w}:${j}/${splits[0]}`)
  }
  if (missing.length) throw new Error(`shard ${missing.join(', ')} missing: run npm run mutation:shard -- ${missing[0]}`)
  const trees = [...new Set(shards.map((s) => s.meta.srcTree))]
  if (trees.length > 1) {
    const by = shards.map((s) => `${s.meta.shard} on ${s.meta.commit.slice(0, 7)}`).join(', ')
    throw new Error(`the shards mutated different sources (src/ differs: ${by}); run them again on one commit`)
  }
  const dirty = shards.filter((s) => s.meta.dirty).map((s) => s.meta.shard)
  if (dirty.length) throw new Error(`shard ${dirty.join(', ')} ran with uncommitted changes in src/ or test/; run it again on a clean checkout`)
  const files: Report['files'] = {}
  const owner = new Map<string, string>()
  const testFiles: Record<string, unknown> = {}
  for (const {meta, report} of shards) {
    for (const [file, data] of Object.entries(report.files)) {
      // A report and a meta file of different runs (one run stopped after its report was written).
      if (!meta.files.includes(file)) throw new Error(`the report of shard ${meta.shard} holds ${file}, which its meta file does not name: run npm run mutation:shard -- ${meta.shard} again`)
      const other = owner.get(file)
      if (other !== undefined)
        throw new Error(
          `${file} was mutated by two shards, ${other} and ${meta.shard} (a shard run both whole and in parts?): remove the files of the one not to keep from reports/mutation/ and merge again`,
        )
      owner.set(file, meta.shard)
      files[file] = data
    }
    Object.assign(testFiles, report.testFiles ?? {})
  }
  const first = shards.find((s) => s.meta.shard === want[0] || s.meta.shard.startsWith(`${want[0]}:`))!.report
  return {report: {...first, files, testFiles}, commits: [...new Set(shards.map((s) => s.meta.commit))]}
}

/** What to do with a meta file that cannot be trusted (edited or renamed by hand): running a shard again would not replace it. */
const REMOVE_AND_MERGE = 'remove it and merge again (the merge then names any shard missing, with the command that runs it)'

/** A JSON file's value; `fix` says what to do when it holds no JSON (a file cut short or edited). */
function readJson(file: string, fix: string): unknown {
  try {
    return JSON.parse(readFileSync(file, 'utf8'))
  } catch (e) {
    throw new Error(`${file} holds no JSON (${(e as Error).message}): ${fix}`, {cause: e})
  }
}

/**
 * The shards of an N-way split found in `out` (reports/mutation/), whole or in parts, each meta file
 * with the report of its name; those of other splits are left alone.
 */
export function readShards(out: string, count: number): {meta: Meta; report: Report}[] {
  const shards = []
  const metas = (existsSync(out) ? readdirSync(out) : []).filter((n) => n.startsWith('shard-') && n.endsWith('.meta.json')).sort()
  for (const metaFile of metas) {
    const meta = readJson(path.join(out, metaFile), REMOVE_AND_MERGE) as Meta
    let spec: ShardSpec
    try {
      spec = parseShard(meta.shard)
    } catch (e) {
      throw new Error(`${path.join(out, metaFile)} names no shard (${(e as Error).message}): ${REMOVE_AND_MERGE}`, {cause: e})
    }
    if (spec.count !== count) continue
    const name = shardFile(spec)
    if (`${name}.meta.json` !== metaFile) throw new Error(`${path.join(out, metaFile)} is the meta file of shard ${meta.shard}, whose files are ${name}.*: ${REMOVE_AND_MERGE}`)
    const reportFile = path.join(out, `${name}.json`)
    if (!existsSync(reportFile)) throw new Error(`${reportFile} is missing beside its meta file: run npm run mutation:shard -- ${meta.shard} again`)
    shards.push({meta, report: readJson(reportFile, `run npm run mutation:shard -- ${meta.shard} again`) as Report})
  }
  return shards
}

export function table(rows: FileScore[]): string {
  const lines = ['| file | mutants | compiling | killed + timeout | survived + no coverage | score |', '| --- | --- | --- | --- | --- | --- |']
  for (const r of rows) {
    const compiling = r.killed + r.timeout + r.survived + r.noCoverage
    lines.push(`| ${r.file} | ${r.mutants} | ${compiling} | ${r.killed} + ${r.timeout} | ${r.survived} + ${r.noCoverage} | ${r.score === null ? 'n/a' : `${r.score.toFixed(2)}%`} |`)
  }
  return lines.join('\n')
}

function git(root: string, ...args: string[]): string {
  return execFileSync('git', args, {cwd: root, encoding: 'utf8'}).trim()
}

function formatSeconds(s: number): string {
  const h = Math.floor(s / 3600)
  const m = Math.floor((s % 3600) / 60)
  return h ? `${h} h ${m} min` : `${m} min ${Math.round(s % 60)} s`
}

async function main(argv: string[]): Promise<number> {
  const root = path.resolve(import.meta.dirname, '..')
  const out = path.join(root, 'reports', 'mutation')
  const {default: base} = await import(path.join(root, 'stryker.config.mjs'))
  const [command, arg] = argv
  if (command === 'run') {
    const spec = parseShard(arg)
    const files = mutatedFiles(root, base.mutate)
    const weighted = files.map((file) => ({file, weight: readFileSync(path.join(root, file), 'utf8').split('\n').length}))
    const mine = shardFiles(weighted, spec)
    const name = shardFile(spec)
    console.log(`${name}: ${mine.length} of ${files.length} files: ${mine.join(', ')}`)
    const meta = {
      shard: shardName(spec),
      commit: git(root, 'rev-parse', 'HEAD'),
      srcTree: git(root, 'rev-parse', 'HEAD:src'),
      testTree: git(root, 'rev-parse', 'HEAD:test'),
      dirty: git(root, 'status', '--porcelain', '--', 'src', 'test') !== '',
      files: mine,
    }
    // A run stopped part-way leaves no meta file, so the merge reports the shard missing instead of
    // pairing an earlier run's meta with whatever report this one left.
    rmSync(path.join(out, `${name}.meta.json`), {force: true})
    const started = Date.now()
    const {Stryker} = await import('@stryker-mutator/core')
    // Stryker reads stryker.config.mjs itself and lays these over it.
    const stryker = new Stryker({
      mutate: mine,
      tempDirName: `.stryker-tmp-${name}`,
      htmlReporter: {fileName: `reports/mutation/${name}.html`},
      jsonReporter: {fileName: `reports/mutation/${name}.json`},
    })
    await stryker.runMutationTest()
    mkdirSync(out, {recursive: true})
    const seconds = Math.round((Date.now() - started) / 1000)
    writeFileSync(path.join(out, `${name}.meta.json`), JSON.stringify({...meta, seconds}, null, 2) + '\n')
    console.log(`${name} took ${formatSeconds(seconds)}; merge them with npm run mutation:merge -- ${spec.count}`)
    return 0
  }
  if (command === 'merge') {
    const count = Number(arg)
    if (!Number.isInteger(count) || count < 1) throw new Error(`give the number of shards, e.g. 4, not ${JSON.stringify(arg ?? '')}`)
    const shards = readShards(out, count)
    const {report, commits} = merge(shards, count)
    writeFileSync(path.join(out, 'mutation.json'), JSON.stringify(report))
    const rows = scores(report)
    const low = base.thresholds?.low ?? 85
    console.log(table(rows))
    const seconds = shards.reduce((t, s) => t + s.meta.seconds, 0)
    console.log(`\n${rows.length} files from ${count} shard${count === 1 ? '' : 's'} on ${commits.map((c) => c.slice(0, 7)).join(', ')}; the shards took ${formatSeconds(seconds)} together`)
    const below = rows.filter((r) => r.score !== null && r.score < low)
    if (below.length) {
      console.log(`below ${low}%: ${below.map((r) => r.file).join(', ')}`)
      return 1
    }
    console.log(`every file at ${low}% or more`)
    return 0
  }
  throw new Error('usage: mutation-shards.ts run K/N[:J/M] | merge N')
}

if (import.meta.main) {
  try {
    process.exitCode = await main(process.argv.slice(2))
  } catch (e) {
    console.error(`mutation-shards: ${(e as Error).message}`)
    process.exitCode = 2
  }
}
