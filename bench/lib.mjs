// Shared helpers for the benchmarks (plain ESM over the built dist/).
import {execFileSync, spawnSync} from 'node:child_process'
import {existsSync, readFileSync, writeFileSync} from 'node:fs'

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

// ---------------------------------------------------------------- side-by-side runs

/** True when `cmd` can be run (found on PATH and answers `args`). */
export function have(cmd, args = ['--version']) {
  const r = spawnSync(cmd, args, {stdio: 'ignore'})
  return !r.error && r.status === 0
}

const TIME = '/usr/bin/time'
export const canTimeRss = existsSync(TIME)

/**
 * Runs a command to completion: wall ms (spawn included, as a shell user sees it), peak RSS in KB
 * (the child's own report when it prints one, else GNU time's when installed, else null), stdout.
 */
export function run(cmd, args, {json = false, env} = {}) {
  const wrap = !json && canTimeRss
  const t = performance.now()
  const r = wrap ? spawnSync(TIME, ['-f', '%M', cmd, ...args], {encoding: 'utf8', maxBuffer: 1 << 26, env}) : spawnSync(cmd, args, {encoding: 'utf8', maxBuffer: 1 << 26, env})
  const ms = performance.now() - t
  if (r.error) throw r.error
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${r.stderr.slice(-2000)}`)
  if (json) {
    const out = JSON.parse(r.stdout.trim().split('\n').at(-1))
    return {wallMs: ms, ...out}
  }
  const rss = wrap ? Number(r.stderr.trim().split('\n').at(-1)) : null
  return {wallMs: ms, peak_rss_kb: Number.isFinite(rss) ? rss : null, stdout: r.stdout}
}

export const mb = (kb) => (kb == null ? 'n/a' : `${Math.round(kb / 1024)} MB`)
export const secs = (ms) => (ms == null ? 'n/a' : ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`)

/** Median of the per-run ratios a/b (each taken in the same run), or null when a side is missing. */
export function ratio(as, bs) {
  if (!as.length || as.length !== bs.length || bs.some((b) => b == null)) return null
  return median(as.map((a, i) => a / bs[i]))
}

/** Prints a markdown table (stdout): the header's keys pick and order the columns. */
export function table(title, header, rows) {
  const lines = [`\n${title}\n`, `| ${header.join(' | ')} |`, `|${header.map(() => '---').join('|')}|`]
  for (const r of rows) lines.push(`| ${r.map((c) => (c == null ? '' : String(c))).join(' | ')} |`)
  console.log(lines.join('\n'))
}

/** What else the machine was doing: load average and the busiest other processes. */
export function load() {
  let top = ''
  try {
    top = execFileSync('sh', ['-c', "ps -eo pcpu,comm --sort=-pcpu | sed -n '2,6p' | awk '{printf \"%s %s%%, \", $2, $1}'"]).toString().trim().replace(/,$/, '')
  } catch {}
  let avg = ''
  try {
    avg = execFileSync('cat', ['/proc/loadavg']).toString().split(' ').slice(0, 3).join(' ')
  } catch {}
  return `load average ${avg || 'n/a'}; busiest: ${top || 'n/a'}`
}

/** Reads files once so that every tool then reads them from the page cache. */
export function warm(files) {
  spawnSync('sh', ['-c', 'cat "$@" > /dev/null', 'sh', ...files], {stdio: 'ignore'})
}

/**
 * This process's peak RSS in KB: VmHWM, which belongs to this program alone. (getrusage's maxrss
 * survives execve on Linux, so a child spawned by a large parent would report the parent's size.)
 */
export function peakRssKb() {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8'))
    if (m) return Number(m[1])
  } catch {}
  return process.resourceUsage().maxRSS
}

/** Starts peakRssKb over from the current RSS (Linux: `5` in clear_refs resets VmHWM). */
export function resetPeakRss() {
  try {
    writeFileSync('/proc/self/clear_refs', '5')
  } catch {}
}
