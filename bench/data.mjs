// Realistic session state for the storage benchmarks: what a Gym rollout holds mid-flight, not
// lorem ipsum. Deterministic (seeded), so every run and every tool sees the same bytes.
//
// A record is a transcript of messages (English with accents, CJK and emoji, code with quotes,
// backslashes, tabs and newlines), per-token ids and logprob floats on the policy's turns, tool
// calls with nested arguments, and an environment state holding what Python's json.dumps writes
// and a strict JSON reader cannot take: NaN, Infinity, -Infinity, -0.0, integers beyond 2^64,
// integral floats (2.0) and integer-like keys in an unsorted order. Dicts are Maps (key order is
// part of the record), strings are flat (as a server holds them after reading them off the wire).
import {PyFloat} from './dist.mjs'

/** mulberry32: a small seeded PRNG. */
export function rng(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

const EN =
  'the a of to and in is it that for on with as was at by this be from or have an are not which but what all were when we there can your said if do will each about how up out them then she many some so these would other into has more her two like him see time could no make than first been its who now people my made over did down only way find use may water long little very after words called just where most know get through back much before go good new write our used me man too any day same right look think also around another came come work three word must because does part even place well such here take why things help put years different away again off went old number great tell men say small every found still between name should home big give air line set own under read last never us left end along while might next sound below saw something thought both few those always looked show large often together asked house world going want school important until form food keep children feet land side without boy once animal life enough took sometimes four head above kind began almost live page got earth need far hand high year mother light parts country father let night following picture being study second eyes soon times story boys since white days ever paper hard near sentence better best across during today others however sure means knew try told young miles sun ways thing whole hear example heard several change answer room sea against top turned learn point city play toward five using himself usually'.split(
    ' ',
  )
const ACCENTED = [
  'café',
  'résumé',
  'naïve',
  'façade',
  'über',
  'São Paulo',
  'Zürich',
  'Ångström',
  'crème brûlée',
  'déjà vu',
  'piñata',
  'Kraków',
  'smørrebrød',
  'Ærø',
  'Dvořák',
  'jalapeño',
  'coöperate',
  'Øresund',
  'Straße',
  'naïveté',
]
const CJK = [
  '你好世界',
  '检查点',
  '强化学习',
  '模型',
  '环境服务器',
  '東京',
  'こんにちは',
  'ありがとう',
  '日本語のテキスト',
  '한국어',
  '서울특별시',
  '数据集',
  '推理',
  '工具调用',
  '天气预报',
  '北京市海淀区',
]
const EMOJI = ['🚀', '🙂', '👍🏽', '🎉', '🔥', '✅', '❌', '🤖', '📈', '🧪', '👩‍💻', '🇯🇵', '❤️', '⚡', '🌧️', '☀️']
const CODE = [
  'def f(x):\n\treturn x * 2\n',
  'print("hello, \\"world\\"")',
  'C:\\Users\\gym\\rollouts\\r1.jsonl',
  '{"nested": "json in a string", "n": [1, 2, 3]}',
  'SELECT * FROM episodes WHERE score > 0.5;\r\n',
  'if (a < b && c > d) { return "<tag>"; }',
  '$ grep -rn "TODO" src/ | wc -l\n42\n',
]
const TOOLS = ['get_weather', 'search_web', 'run_python', 'read_file', 'book_flight', 'calculator']

function pick(r, xs) {
  return xs[Math.floor(r() * xs.length)]
}

/** A paragraph of about `chars` characters: mostly ASCII words, some accents, CJK, emoji and code. */
function text(r, chars) {
  const parts = []
  let n = 0
  while (n < chars) {
    const x = r()
    let w
    if (x < 0.86) w = pick(r, EN)
    else if (x < 0.92) w = pick(r, ACCENTED)
    else if (x < 0.96) w = pick(r, CJK)
    else if (x < 0.985) w = pick(r, EMOJI)
    else w = pick(r, CODE)
    parts.push(w)
    n += w.length + 1
    if (r() < 0.06) parts.push(r() < 0.5 ? '.\n\n' : ', ')
  }
  return parts.join(' ')
}

/** A logprob as a sampler reports it: a full-precision negative float, sometimes exactly 0 or tiny. */
function logprob(r) {
  const x = r()
  if (x < 0.02) return -0.0
  if (x < 0.04) return -1e-7 * r()
  return Math.log(r() * 0.999 + 0.001) * (x < 0.7 ? 0.05 : 1)
}

function toolCall(r, i, m) {
  const tool = pick(r, TOOLS)
  return new Map([
    ['id', `call_${i}_${m}_${Math.floor(r() * 1e9).toString(36)}`],
    ['type', 'function'],
    [
      'function',
      new Map([
        ['name', tool],
        [
          'arguments',
          new Map([
            ['query', text(r, 40)],
            [
              'location',
              new Map([
                ['city', pick(r, ['Zürich', '東京', 'São Paulo', 'Seattle'])],
                ['lat', r() * 180 - 90],
                ['lon', r() * 360 - 180],
              ]),
            ],
            [
              'options',
              new Map([
                ['units', 'metric'],
                ['days', 1 + Math.floor(r() * 7)],
                ['verbose', r() < 0.5],
                [
                  'filters',
                  [
                    new Map([
                      ['k', 'rain'],
                      ['gt', 0.25],
                    ]),
                    new Map([
                      ['k', 'wind'],
                      ['lt', null],
                    ]),
                  ],
                ],
              ]),
            ],
            ['limit', Math.floor(r() * 100)],
          ]),
        ],
      ]),
    ],
  ])
}

/** The environment's own state: the values that make Python's JSON Python's. */
function environmentState(r, i) {
  const big = 2n ** 64n + BigInt(i) * 1_000_003n
  return new Map([
    ['step', 3 + (i % 17)],
    ['reward', i % 7 === 0 ? NaN : r()],
    ['best', Infinity],
    ['worst', -Infinity],
    ['baseline', -0.0],
    ['scale', new PyFloat(2)],
    ['seed', big],
    ['seeds', [2n ** 70n + BigInt(i), -(2n ** 65n) - BigInt(i), 18446744073709551615n, 9007199254740993n]],
    // Integer-like keys in insertion order, not sorted: a JS object would reorder them.
    [
      'visits',
      new Map([
        ['10', 3],
        ['2', 1],
        ['1', 4],
        ['33', 1],
        ['0', 9],
        ['-1', 2],
        ['007', 5],
      ]),
    ],
    [
      'inventory',
      new Map([
        ['umbrella', true],
        ['coat', false],
        ['notes', null],
        ['tags', ['wet', 'cold', '❄️']],
      ]),
    ],
  ])
}

/** One record of about `kb` KB when encoded, with the episode_id first (as Gym writes it). */
export function realisticRecord(i, kb = 350, attempt = 0) {
  const r = rng(0x9e3779b1 ^ Math.imul(i + 1, 2654435761))
  const messages = [
    new Map([
      ['role', 'system'],
      ['content', `You are a helpful agent. Rollout ${i}. ${text(r, 300)}`],
    ]),
  ]
  let size = 600
  for (let m = 0; size < kb * 1024 - 2500; m++) {
    const role = m % 3 === 0 ? 'user' : m % 3 === 1 ? 'assistant' : 'tool'
    const content = text(r, 200 + Math.floor(r() * 1400))
    const msg = new Map([
      ['role', role],
      ['content', content],
    ])
    // ensure_ascii writes a non-ASCII UTF-16 unit as 6 bytes.
    let bytes = 30
    for (let k = 0; k < content.length; k++) bytes += content.charCodeAt(k) < 0x7f ? 1 : 6
    if (role === 'assistant') {
      const tokens = Math.ceil(content.length / 4)
      const ids = new Array(tokens)
      const lps = new Array(tokens)
      for (let k = 0; k < tokens; k++) {
        ids[k] = Math.floor(r() * 151_646)
        lps[k] = logprob(r)
      }
      msg.set('token_ids', ids)
      msg.set('logprobs', lps)
      bytes += tokens * 31
      if (r() < 0.5) {
        msg.set('tool_calls', [toolCall(r, i, m)])
        bytes += 420
      }
    } else if (role === 'tool') msg.set('tool_call_id', `call_${i}_${m - 1}`)
    messages.push(msg)
    size += bytes
  }
  return new Map([
    [
      'episode_id',
      new Map([
        ['rollout_id', `r${i}`],
        ['attempt', attempt],
      ]),
    ],
    ['session_id', `sess-${i}-${Math.floor(r() * 1e12).toString(16)}`],
    [
      'task',
      new Map([
        ['id', `task-${i % 97}`],
        ['prompt', text(r, 200)],
        ['answer', null],
      ]),
    ],
    ['transcript', messages],
    ['environment', environmentState(r, i)],
    ['score', i % 10 === 0 ? NaN : r()],
  ])
}

/** The records of participant `p` of `participants` (round-robin), as the store streams them. */
export function* recordsOf(p, participants, n, kb) {
  for (let i = p; i < n; i += participants) yield realisticRecord(i, kb)
}

export const KINDS = ['environment', 'model', 'agent', 'resources']
