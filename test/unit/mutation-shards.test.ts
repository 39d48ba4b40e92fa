import {mkdirSync, rmSync, writeFileSync} from 'node:fs'
import path from 'node:path'

import {describe, expect, it} from 'vitest'

import {type Meta, merge, mutatedFiles, parseShard, partition, readShards, scores, shardFile, shardFiles, shardName, table} from '../../scripts/mutation-shards.js'
import {tempDir} from '../helpers/tmp.js'

const meta = (shard: string, over: Partial<Meta> = {}): Meta => ({
  shard,
  commit: 'c'.repeat(40),
  srcTree: 's'.repeat(40),
  testTree: 't'.repeat(40),
  dirty: false,
  files: [],
  seconds: 60,
  ...over,
})

const mutants = (...statuses: string[]) => ({mutants: statuses.map((status) => ({status}))})

describe('partition', () => {
  const files = [
    {file: 'a.ts', weight: 10},
    {file: 'b.ts', weight: 70},
    {file: 'c.ts', weight: 40},
    {file: 'd.ts', weight: 40},
    {file: 'e.ts', weight: 30},
    {file: 'f.ts', weight: 10},
  ]

  it('puts every file in exactly one shard, heaviest first to the lightest shard, each shard sorted', () => {
    // b (70) to shard 1, c (40) to 2, d (40) to 2 (80), e (30) to 1 (100), a and f (10) to 2 (100).
    expect(partition(files, 2)).toEqual([
      ['b.ts', 'e.ts'],
      ['a.ts', 'c.ts', 'd.ts', 'f.ts'],
    ])
  })

  it('is the same whatever order the files come in, and breaks ties by name and by shard number', () => {
    const shuffled = [files[3], files[0], files[5], files[1], files[4], files[2]]
    expect(partition(shuffled, 3)).toEqual(partition(files, 3))
    // Equal weights: by name, each to the lowest-numbered of the lightest shards.
    expect(
      partition(
        [
          {file: 'z', weight: 1},
          {file: 'y', weight: 1},
          {file: 'x', weight: 1},
        ],
        2,
      ),
    ).toEqual([['x', 'z'], ['y']])
  })

  it('gives one shard everything, and empty shards when there are more shards than files', () => {
    expect(partition(files, 1)).toEqual([['a.ts', 'b.ts', 'c.ts', 'd.ts', 'e.ts', 'f.ts']])
    expect(partition(files.slice(0, 2), 3)).toEqual([['b.ts'], ['a.ts'], []])
  })

  it('refuses a count that is not a whole number from 1', () => {
    expect(() => partition(files, 0)).toThrow('the number of shards must be a whole number from 1, not 0')
    expect(() => partition(files, 1.5)).toThrow('not 1.5')
  })
})

describe('parseShard', () => {
  it('reads K/N', () => {
    expect(parseShard('2/4')).toEqual({index: 2, count: 4})
    expect(parseShard('1/1')).toEqual({index: 1, count: 1})
  })

  it('reads K/N:J/M, part J of M of a shard, and names it back', () => {
    expect(parseShard('4/4:1/2')).toEqual({index: 4, count: 4, part: {index: 1, count: 2}})
    expect(shardName(parseShard('4/4:1/2'))).toBe('4/4:1/2')
    expect(shardName(parseShard('3/4'))).toBe('3/4')
    expect(() => parseShard('4/4:0/2')).toThrow('shard 4/4:0/2: J must be from 1 to M')
    expect(() => parseShard('4/4:3/2')).toThrow('shard 4/4:3/2: J must be from 1 to M')
    expect(() => parseShard('5/4:1/2')).toThrow('shard 5/4:1/2: K must be from 1 to N')
    expect(() => parseShard('4/4:1')).toThrow('or K/N:J/M (part J of M of it), not "4/4:1"')
    expect(() => parseShard('4/4:1/2:1/2')).toThrow('not "4/4:1/2:1/2"')
  })

  it('names what is wrong', () => {
    expect(() => parseShard(undefined)).toThrow('give the shard as K/N, e.g. 2/4 (shard 2 of 4), or K/N:J/M (part J of M of it), not ""')
    expect(() => parseShard('2')).toThrow('not "2"')
    expect(() => parseShard('a/b')).toThrow('not "a/b"')
    expect(() => parseShard(' 1/2')).toThrow('not " 1/2"')
    expect(() => parseShard('0/4')).toThrow('shard 0/4: K must be from 1 to N')
    expect(() => parseShard('5/4')).toThrow('shard 5/4: K must be from 1 to N')
    expect(() => parseShard('1/0')).toThrow('shard 1/0: K must be from 1 to N')
  })
})

describe('shardFiles', () => {
  const files = ['a', 'b', 'c', 'd', 'e', 'f', 'g'].map((f, i) => ({file: `${f}.ts`, weight: [50, 10, 40, 30, 20, 25, 5][i]!}))

  it('splits a shard again the same way: its parts hold its files, each once, and nothing of another shard', () => {
    expect(shardFiles(files, {index: 1, count: 2})).toEqual(partition(files, 2)[0])
    const shard = partition(files, 2)[1]!
    const parts = [1, 2, 3].map((j) => shardFiles(files, {index: 2, count: 2, part: {index: j, count: 3}}))
    expect(parts.flat().sort()).toEqual(shard)
    expect(parts.every((p) => p.length > 0)).toBe(true)
    expect(parts).toEqual(
      partition(
        files.filter((f) => shard.includes(f.file)),
        3,
      ),
    )
    expect(shardFiles(files, {index: 2, count: 2, part: {index: 1, count: 1}})).toEqual(shard)
  })
})

describe('mutatedFiles', () => {
  it("lists the globs' files, sorted, without the ones a leading ! excludes", async () => {
    const root = await tempDir()
    for (const f of ['src/a/index.ts', 'src/a/z.ts', 'src/a/b.ts', 'src/c/deep/d.ts', 'src/c/e.js', 'src/other.ts']) {
      mkdirSync(path.join(root, path.dirname(f)), {recursive: true})
      writeFileSync(path.join(root, f), '')
    }
    expect(mutatedFiles(root, ['src/a/**/*.ts', 'src/c/**/*.ts', '!src/**/index.ts'])).toEqual(['src/a/b.ts', 'src/a/z.ts', 'src/c/deep/d.ts'])
    expect(mutatedFiles(root, ['src/other.ts'])).toEqual(['src/other.ts'])
  })
})

describe('scores', () => {
  it("counts each status and computes Stryker's score over the mutants that compiled, sorted by file", () => {
    const rows = scores({
      files: {
        'src/b.ts': mutants('Killed', 'Killed', 'Timeout', 'Survived', 'NoCoverage', 'CompileError', 'Ignored', 'RuntimeError'),
        'src/a.ts': mutants('CompileError', 'Ignored'),
      },
    })
    expect(rows).toEqual([
      {file: 'src/a.ts', mutants: 2, killed: 0, timeout: 0, survived: 0, noCoverage: 0, compileErrors: 1, ignored: 1, score: null},
      {file: 'src/b.ts', mutants: 8, killed: 2, timeout: 1, survived: 1, noCoverage: 1, compileErrors: 1, ignored: 1, score: 60},
    ])
    expect(table(rows)).toBe(
      [
        '| file | mutants | compiling | killed + timeout | survived + no coverage | score |',
        '| --- | --- | --- | --- | --- | --- |',
        '| src/a.ts | 2 | 0 | 0 + 0 | 0 + 0 | n/a |',
        '| src/b.ts | 8 | 5 | 2 + 1 | 1 + 1 | 60.00% |',
      ].join('\n'),
    )
  })
})

describe('merge', () => {
  const shard = (s: string, files: Record<string, ReturnType<typeof mutants>>, over: Partial<Meta> = {}) => ({
    meta: meta(s, {files: Object.keys(files), ...over}),
    report: {schemaVersion: '2', thresholds: {high: 90, low: 85}, files, testFiles: {[`test/${s.replace('/', '-')}.test.ts`]: {tests: []}}},
  })

  it('joins the files and test files of every shard into one report, keeping the first shard’s other fields', () => {
    const {report, commits} = merge([shard('2/2', {'src/b.ts': mutants('Survived')}, {commit: 'd'.repeat(40)}), shard('1/2', {'src/a.ts': mutants('Killed')})], 2)
    expect(Object.keys(report.files).sort()).toEqual(['src/a.ts', 'src/b.ts'])
    expect(Object.keys(report.testFiles!).sort()).toEqual(['test/1-2.test.ts', 'test/2-2.test.ts'])
    expect(report.schemaVersion).toBe('2')
    expect(commits).toEqual(['d'.repeat(40), 'c'.repeat(40)])
  })

  it('refuses missing shards, naming them and the command that runs the first', () => {
    expect(() => merge([shard('2/4', {})], 4)).toThrow('shard 1/4, 3/4, 4/4 missing: run npm run mutation:shard -- 1/4')
    expect(() => merge([shard('1/2', {}), shard('2/3', {})], 2)).toThrow('shard 2/2 missing')
  })

  it('refuses shards that mutated different sources, naming each shard’s commit', () => {
    expect(() => merge([shard('1/2', {}), shard('2/2', {}, {srcTree: 'x'.repeat(40), commit: 'abcdef0123'})], 2)).toThrow(
      'the shards mutated different sources (src/ differs: 1/2 on ccccccc, 2/2 on abcdef0); run them again on one commit',
    )
  })

  it('refuses a shard run with uncommitted changes', () => {
    expect(() => merge([shard('1/2', {}, {dirty: true}), shard('2/2', {})], 2)).toThrow('shard 1/2 ran with uncommitted changes in src/ or test/; run it again on a clean checkout')
  })

  it('refuses a report holding a file its meta file does not name (the two are of different runs)', () => {
    expect(() => merge([shard('1/2', {'src/a.ts': mutants('Killed')}, {files: ['src/b.ts']}), shard('2/2', {})], 2)).toThrow(
      'the report of shard 1/2 holds src/a.ts, which its meta file does not name: run npm run mutation:shard -- 1/2 again',
    )
  })

  it('takes a shard run in parts when every part of one split is there', () => {
    const {report} = merge([shard('1/2', {'src/a.ts': mutants('Killed')}), shard('2/2:2/2', {'src/c.ts': mutants('Killed')}), shard('2/2:1/2', {'src/b.ts': mutants('Survived')})], 2)
    expect(Object.keys(report.files).sort()).toEqual(['src/a.ts', 'src/b.ts', 'src/c.ts'])
    // The first shard's other fields, from its first part when it ran in parts.
    const first = shard('1/2:1/1', {})
    first.report.thresholds = {high: 1, low: 1}
    expect(merge([shard('2/2', {}), first], 2).report.thresholds).toEqual({high: 1, low: 1})
  })

  it('refuses a shard with a part missing, or in parts of two splits, naming the command to run', () => {
    expect(() => merge([shard('1/2', {}), shard('2/2:1/3', {}), shard('2/2:3/3', {})], 2)).toThrow('shard 2/2:2/3 missing: run npm run mutation:shard -- 2/2:2/3')
    expect(() => merge([shard('1/2', {}), shard('2/2:1/2', {}), shard('2/2:2/3', {})], 2)).toThrow('shard 2/2 is in parts of different splits (2/2:1/2, 2/2:2/3); run all the parts of one split')
    expect(() => merge([shard('1/2:1/2', {}), shard('2/2', {})], 2)).toThrow('shard 1/2:2/2 missing')
    expect(() => merge([shard('1/2:2/2', {}), shard('2/2', {})], 2)).toThrow('shard 1/2:1/2 missing')
  })

  it('refuses a shard run both whole and in parts (its files twice)', () => {
    expect(() => merge([shard('1/2', {'src/a.ts': mutants('Killed')}), shard('1/2:1/1', {'src/a.ts': mutants('Killed')}), shard('2/2', {})], 2)).toThrow(
      'src/a.ts was mutated by two shards, 1/2 and 1/2:1/1 (a shard run both whole and in parts?): remove the files of the one not to keep from reports/mutation/ and merge again',
    )
  })

  it('refuses a file mutated by two shards', () => {
    expect(() => merge([shard('1/2', {'src/a.ts': mutants('Killed')}), shard('2/2', {'src/a.ts': mutants('Killed')})], 2)).toThrow('src/a.ts was mutated by two shards, 1/2 and 2/2')
  })
})

describe('readShards', () => {
  const write = (dir: string, name: string, m: Meta, report: object | null = {files: {}}) => {
    writeFileSync(path.join(dir, `${name}.meta.json`), JSON.stringify(m))
    if (report) writeFileSync(path.join(dir, `${name}.json`), JSON.stringify(report))
  }

  it('finds the shards of one split, whole and in parts, each with the report of its name, and leaves other splits alone', async () => {
    const dir = await tempDir()
    expect(shardFile(parseShard('2/4'))).toBe('shard-2-of-4')
    expect(shardFile(parseShard('4/4:1/3'))).toBe('shard-4-of-4-part-1-of-3')
    write(dir, 'shard-2-of-4', meta('2/4'), {files: {'src/b.ts': mutants('Killed')}})
    write(dir, 'shard-4-of-4-part-1-of-3', meta('4/4:1/3'), {files: {'src/d.ts': mutants('Survived')}})
    write(dir, 'shard-1-of-2', meta('1/2'))
    writeFileSync(path.join(dir, 'mutation.json'), '{}')
    const found = readShards(dir, 4)
    expect(found.map((s) => s.meta.shard)).toEqual(['2/4', '4/4:1/3'])
    expect(Object.keys(found[1]!.report.files)).toEqual(['src/d.ts'])
    expect(readShards(path.join(dir, 'none'), 4)).toEqual([])
  })

  it('refuses a meta file that names no shard or another shard, or has no report, saying what to run', async () => {
    const dir = await tempDir()
    write(dir, 'shard-1-of-2', meta('one'))
    expect(() => readShards(dir, 2)).toThrow(
      /shard-1-of-2\.meta\.json names no shard \(give the shard as K\/N.*not "one"\): remove it and merge again \(the merge then names any shard missing, with the command that runs it\)$/,
    )
    write(dir, 'shard-1-of-2', meta('2/2'))
    expect(() => readShards(dir, 2)).toThrow(/shard-1-of-2\.meta\.json is the meta file of shard 2\/2, whose files are shard-2-of-2\.\*: remove it and merge again/)
    write(dir, 'shard-1-of-2', meta('1/2'), null)
    rmSync(path.join(dir, 'shard-1-of-2.json'))
    expect(() => readShards(dir, 2)).toThrow(/shard-1-of-2\.json is missing beside its meta file: run npm run mutation:shard -- 1\/2 again$/)
    // Cut short or edited: the file is named, with what to do.
    writeFileSync(path.join(dir, 'shard-1-of-2.json'), '{"files": {')
    expect(() => readShards(dir, 2)).toThrow(/shard-1-of-2\.json holds no JSON \(.*\): run npm run mutation:shard -- 1\/2 again$/)
    writeFileSync(path.join(dir, 'shard-1-of-2.meta.json'), 'null')
    expect(() => readShards(dir, 2)).toThrow(/shard-1-of-2\.meta\.json names no shard .*: remove it and merge again/)
    writeFileSync(path.join(dir, 'shard-1-of-2.meta.json'), '{"shard": "1/2",')
    expect(() => readShards(dir, 2)).toThrow(/shard-1-of-2\.meta\.json holds no JSON \(.*\): remove it and merge again/)
  })
})
