// Shared helpers for the benchmarks (plain ESM over the built dist/).
import {execFileSync} from 'node:child_process'

export function median(xs) {
  const s = [...xs].sort((a, b) => a - b)
  const m = s.length >> 1
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2
}

export function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : dflt
}

export function machine() {
  let cpu = ''
  try {
    cpu = execFileSync('sh', ['-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"]).toString().trim()
  } catch {}
  return `node ${process.version}, ${cpu || 'unknown cpu'}`
}

export const fmt = (ms) => `${(ms / 1000).toFixed(2)} s`
