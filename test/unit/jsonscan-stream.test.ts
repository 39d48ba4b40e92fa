// The streaming JSON scanner and the records reader built on it: a record checked in pieces, cut
// anywhere, gets the same verdict as the record checked whole (issue 11: verify streams within a
// record, so a 20 MB line is never held).
import {createHash} from 'node:crypto'
import {mkdir, writeFile} from 'node:fs/promises'
import path from 'node:path'

import fc from 'fast-check'
import {describe, expect, it} from 'vitest'

import {JsonScanner, MAX_NESTING, ScanError, isJsonValue} from '../../src/storage/jsonscan.js'
import {encodeManifest, readParticipantState} from '../../src/storage/participant-store.js'
import {PyValue, pyDumps, pyLoads} from '../../src/storage/pyjson.js'
import {tempDir} from '../helpers/tmp.js'

/** Feeds `buf` in the pieces `cuts` makes, as the records reader does: a cut token is fed again. */
function scanPieces(buf: Buffer, cuts: number[]): {ok: boolean; error: ScanError; episodeKeys: number} {
  const sc = new JsonScanner()
  let carry = Buffer.alloc(0)
  let prev = 0
  for (const at of [...new Set(cuts.map((c) => c % (buf.length + 1)))].sort((a, b) => a - b).concat(buf.length)) {
    if (at < prev) continue
    const data = Buffer.concat([carry, buf.subarray(prev, at)])
    const last = at === buf.length
    const k = sc.feed(data, 0, data.length, last)
    if (sc.error) return {ok: false, error: sc.error, episodeKeys: sc.episodeKeys}
    carry = Buffer.from(data.subarray(k))
    prev = at
    if (last) break
  }
  return {ok: sc.complete, error: sc.error, episodeKeys: sc.episodeKeys}
}

const whole = (buf: Buffer) => {
  const sc = new JsonScanner()
  sc.feed(buf, 0, buf.length, true)
  return {ok: sc.complete, error: sc.error, episodeKeys: sc.episodeKeys}
}

const leaf = fc.oneof(fc.string({unit: 'binary'}), fc.integer(), fc.double(), fc.boolean(), fc.constant(null), fc.constantFrom('episode_id', 'é😀', '\\', '"'))
const value = fc.letrec((tie) => ({
  v: fc.oneof({depthSize: 'small'}, leaf, fc.array(tie('v'), {maxLength: 5}), fc.dictionary(fc.oneof(fc.string(), fc.constant('episode_id')), tie('v'), {maxKeys: 4})),
})).v

describe('JsonScanner fed in pieces', () => {
  it('agrees with the scan of the whole value, for valid and corrupted JSON, escaped or raw UTF-8, cut anywhere', () => {
    fc.assert(
      fc.property(value, fc.boolean(), fc.array(fc.nat(), {maxLength: 6}), fc.nat(), fc.integer({min: 0, max: 255}), fc.boolean(), (v, raw, cuts, pos, byte, corrupt) => {
        // pyDumps escapes all non-ASCII; JSON.stringify writes it raw (UTF-8), as other writers may.
        const text = raw ? (JSON.stringify(v as never) ?? 'null') : pyDumps(v as PyValue)
        let buf = Buffer.from(text, 'utf8')
        if (corrupt && buf.length) {
          buf = Buffer.from(buf)
          buf[pos % buf.length] = byte
        }
        const w = whole(buf)
        expect(scanPieces(buf, cuts)).toEqual(w)
        // Every single cut point too, on short values.
        if (buf.length < 40) for (let c = 0; c <= buf.length; c++) expect(scanPieces(buf, [c]), `cut at ${c} of ${JSON.stringify(buf.toString('latin1'))}`).toEqual(w)
        if (!corrupt && !raw) expect(w.ok).toBe(true)
      }),
      {numRuns: 1500},
    )
  })

  it('refuses invalid UTF-8 in a string (overlong, surrogate, beyond U+10FFFF, truncated) and names it', () => {
    for (const bytes of [[0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xf8], [0x80], [0xe2, 0x82]]) {
      const buf = Buffer.concat([Buffer.from('["a'), Buffer.from(bytes), Buffer.from('"]')])
      expect(isJsonValue(buf), bytes.join(',')).toBe(false)
      expect(whole(buf).error).toBe(ScanError.Utf8)
    }
    expect(isJsonValue(Buffer.from('["é€😀"]', 'utf8'))).toBe(true)
  })

  it('counts top-level episode_id keys, escaped spellings included, nested ones not', () => {
    expect(whole(Buffer.from('{"episode_id": 1, "a": {"episode_id": 2}, "b": "episode_id"}')).episodeKeys).toBe(1)
    expect(whole(Buffer.from('{"episode_id": 1, "episode\\u005fid": 2}')).episodeKeys).toBe(2)
    expect(whole(Buffer.from('{"episode_id": 1, "episode_id": 2}')).episodeKeys).toBe(2)
    expect(scanPieces(Buffer.from('{"episode_id": 1, "x": 3, "episode_id": 2}'), [29, 31, 33]).episodeKeys).toBe(2)
  })

  it('refuses nesting deeper than the exact reader decodes (MAX_NESTING containers), objects and arrays alike', () => {
    const nested = (n: number) => Buffer.from('['.repeat(n) + ']'.repeat(n))
    const objects = (n: number) => Buffer.from('{"a": '.repeat(n - 1) + '{}' + '}'.repeat(n - 1))
    expect(MAX_NESTING).toBe(2_000)
    for (const make of [nested, objects]) {
      expect(isJsonValue(make(MAX_NESTING))).toBe(true)
      const s = new JsonScanner()
      s.feed(make(MAX_NESTING + 1), 0, make(MAX_NESTING + 1).length, true)
      expect(s.complete).toBe(false)
      expect(s.error).toBe(ScanError.Depth)
    }
    // Streamed in small pieces, the stack grows through every size to the limit.
    expect(scanPieces(nested(MAX_NESTING), [7, 300, 1999, 2001, 3000]).ok).toBe(true)
    expect(scanPieces(nested(MAX_NESTING + 1), [7, 300, 1999, 2001, 3000]).error).toBe(ScanError.Depth)
  })

  it('a misspelled word or a malformed number is a JSON error wherever the piece holding it starts, however deep it sits', () => {
    // A piece that starts with a whole value, then goes deeper to the bad token: the scan must stop
    // there, not go back into the piece (which would re-read it one level deeper each time).
    const words = ['[0, [tx]]', '{"a": 1, "b": {"c": nul}}', '[1 , [[fals]]]', '{"a": "x", "b": [Nan]}', '[0, [-Inf]]']
    const numbers = ['[0, [-]]', '[0, [1.]]', '[0, [2.5e]]', '{"a": 1, "b": {"c": -x}}', '[7, [[0, 3.]]]', '[0, [1E+]]']
    for (const line of [...words, ...numbers]) {
      const buf = Buffer.from(line)
      expect(whole(buf), line).toEqual({ok: false, error: ScanError.Json, episodeKeys: 0})
      for (let c = 0; c <= buf.length; c++) expect(scanPieces(buf, [c]).error, `${line} cut at ${c}`).toBe(ScanError.Json)
    }
  })
})

/** A participant directory holding `lines` (each without its newline) and a manifest naming them. */
async function participant(lines: Buffer[]): Promise<string> {
  const root = await tempDir()
  const dir = path.join(root, 'gym', 'agent', 'a')
  await mkdir(dir, {recursive: true})
  const body = Buffer.concat(lines.flatMap((l) => [l, Buffer.from('\n')]))
  const sha = createHash('sha256').update(body).digest('hex')
  await writeFile(path.join(dir, `records-${sha}.jsonl`), body)
  await writeFile(
    path.join(dir, 'manifest.json'),
    encodeManifest({checkpoint_id: 'c', instance: 'a', kind: 'agent', record_count: lines.length, records_file: `records-${sha}.jsonl`, records_sha256: sha, schema_version: 1}),
  )
  return dir
}

const record = (id: string, size: number, extra = '') =>
  Buffer.from(`{"episode_id": {"rollout_id": "${id}", "attempt": 0}, "n": [${'1.5, '.repeat(size / 5)}-0.0], "s": "${'\\u00e9x'.repeat(size / 14)}"${extra}}`)

describe('readParticipantState streams records larger than its read buffer', () => {
  it('verifies lines of 3 MB and lines whose start straddles a chunk, and keeps exactly the ones in scope', async () => {
    // Sizes put line starts just before the 1 MiB chunk boundaries.
    const lines = [record('a', 3 << 20), record('b', (1 << 20) - 300), record('c', 200), record('d', 2 << 20), record('e', 50)]
    const dir = await participant(lines)
    const all = await readParticipantState(dir, {keep: null})
    expect(all.keys).toEqual(['a', 'b', 'c', 'd', 'e'])
    const some = await readParticipantState(dir, {keep: new Set(['b', 'e'])})
    expect(some.kept.map((k) => k.key)).toEqual(['b', 'e'])
    expect(pyDumps(some.kept[0]!.record)).toBe(lines[1]!.toString('latin1'))
  })

  it('finds a broken byte deep inside a large out-of-scope record, as JSON or as UTF-8', async () => {
    for (const [byte, what] of [
      [0x01, /line 2 holds a record that is not JSON/],
      [0xff, /line 2 holds a record that is not UTF-8/],
    ] as const) {
      const big = record('b', 3 << 20)
      // A plain character of the string value, well past the first chunk.
      big[big.lastIndexOf('x', big.length - 1000)] = byte
      const dir = await participant([record('a', 100), big, record('c', 100)])
      await expect(readParticipantState(dir, {keep: null})).rejects.toThrow(what)
    }
  })

  it('verify (streamed), a restore keeping the record (decoded) and a record whose episode is not first all agree at the nesting limit', async () => {
    const deep = (n: number, id: string, first = true) => {
      const ep = `"episode_id": {"rollout_id": "${id}", "attempt": 0}`
      const x = `"x": ${'['.repeat(n - 1)}${']'.repeat(n - 1)}`
      return Buffer.from(first ? `{${ep}, ${x}}` : `{${x}, ${ep}}`)
    }
    // The record object itself is one of the containers.
    const ok = await participant([deep(MAX_NESTING, 'a'), deep(MAX_NESTING, 'b', false)])
    expect((await readParticipantState(ok, {keep: null})).keys).toEqual(['a', 'b'])
    const kept = await readParticipantState(ok, {keep: new Set(['a', 'b'])})
    expect(kept.kept.map((k) => k.key)).toEqual(['a', 'b'])
    expect(pyDumps(kept.kept[0]!.record)).toBe(deep(MAX_NESTING, 'a').toString('latin1'))
    for (const line of [deep(MAX_NESTING + 1, 'a'), deep(MAX_NESTING + 1, 'a', false), deep(5_000, 'a')]) {
      const dir = await participant([record('z', 100), line])
      for (const keep of [null, new Set(['a'])]) {
        await expect(readParticipantState(dir, {keep}), `keep ${keep ? 'a' : 'none'}`).rejects.toThrow(`line 2 holds a record nested deeper than ${MAX_NESTING} levels`)
      }
    }
  })

  it('a record naming episode_id again is decoded whole, and the last one counts (as in Python)', async () => {
    const dup = record('a', 2 << 20, ', "episode_id": {"rollout_id": "z", "attempt": 3}')
    const dir = await participant([record('x', 100), dup, record('y', 100)])
    const r = await readParticipantState(dir, {keep: new Set(['z-a3', 'y'])})
    expect(r.keys).toEqual(['x', 'z-a3', 'y'])
    expect(r.kept.map((k) => k.key)).toEqual(['z-a3', 'y'])
    expect((pyLoads(dup.toString('latin1')) as Map<string, PyValue>).get('episode_id')).toEqual(
      new Map<string, PyValue>([
        ['rollout_id', 'z'],
        ['attempt', 3],
      ]),
    )
  })

  it('a last line without its newline is a record, and an empty line is not JSON', async () => {
    const root = await tempDir()
    const dir = path.join(root, 'gym', 'agent', 'a')
    await mkdir(dir, {recursive: true})
    for (const [body, expectation] of [
      [Buffer.concat([record('a', 100), Buffer.from('\n'), record('b', 100)]), ['a', 'b']],
      [Buffer.concat([record('a', 100), Buffer.from('\n\n')]), /line 2 holds a record that is not JSON/],
    ] as const) {
      const sha = createHash('sha256').update(body).digest('hex')
      await writeFile(path.join(dir, `records-${sha}.jsonl`), body)
      const count = Array.isArray(expectation) ? expectation.length : 2
      await writeFile(
        path.join(dir, 'manifest.json'),
        encodeManifest({checkpoint_id: 'c', instance: 'a', kind: 'agent', record_count: count, records_file: `records-${sha}.jsonl`, records_sha256: sha, schema_version: 1}),
      )
      if (Array.isArray(expectation)) expect((await readParticipantState(dir, {keep: null})).keys).toEqual(expectation)
      else await expect(readParticipantState(dir, {keep: null})).rejects.toThrow(expectation as RegExp)
    }
  })
})
