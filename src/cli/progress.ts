import {Listr, ListrLogger, ProcessOutput} from 'listr2'

import type {CallEvent} from '../coordination/operations.js'

type State = 'start' | 'done' | 'failed'
type End = 'done' | 'failed' | 'interrupted' | 'not_run'

export interface Phase {
  title: string
  /** The control calls that belong to this phase: its first call starts it, and its calls' replies are its progress. */
  operations: string[]
  /**
   * Ended only by onPhase (or the run settling), not by a later phase starting: for a phase whose
   * failure is known only after cleanup calls of a later phase began (prepare's own resume).
   */
  endsExplicitly?: boolean
}

export interface ProgressHooks<P extends string> {
  /** Explicit phase boundaries, for phases that do more than their calls (e.g. commit and publish). */
  onPhase: (p: P, s: State) => void
  /** The coordinator's call events: which servers of which stage are pending, and the deadline. */
  onCall: (e: CallEvent) => void
}

/**
 * How progress is drawn on stderr, from GYMCKPT_PROGRESS: `auto` (default: listr2 on a terminal,
 * nothing otherwise), `plain` (one line per change, on a terminal or not: CI logs), `off`.
 */
export function progressMode(jsonMode: boolean, env = process.env, tty = process.stderr.isTTY === true): 'tty' | 'plain' | 'off' {
  const v = (env.GYMCKPT_PROGRESS ?? 'auto').toLowerCase()
  if (v === 'off' || v === '0') return 'off'
  if (v === 'plain') return 'plain'
  return tty && !jsonMode ? 'tty' : 'off'
}

interface PhaseState {
  started: boolean
  end: End | null
  interrupted: boolean
  stage: string | null
  pending: Set<string>
  total: number
  /** Servers whose call failed in this phase; stageFailed: in its current stage. */
  failed: string[]
  stageFailed: string[]
  deadlineTs: number | null
  startedAt: number
  wake: () => void
  changed: Promise<void>
}

/**
 * Shows the phases of a long operation with listr2 on stderr (stdout stays for the result): for
 * the running phase its stage, the servers still pending and the time left to the deadline; a
 * phase running when SIGINT/SIGTERM came ends as interrupted, a phase never reached as not run.
 * Phases start on their first control call (or an explicit onPhase) and end when a later one
 * starts or the run settles.
 */
export async function withProgress<P extends string, T>(
  phases: Record<P, Phase>,
  opts: {mode: 'tty' | 'plain' | 'off'; signal?: AbortSignal},
  run: (hooks: ProgressHooks<P>) => Promise<T>,
): Promise<T> {
  if (opts.mode === 'off') return run({onPhase: () => {}, onCall: () => {}})
  const keys = Object.keys(phases) as P[]
  const st = new Map<P, PhaseState>()
  for (const p of keys) {
    const s: PhaseState = {
      started: false,
      end: null,
      interrupted: false,
      stage: null,
      pending: new Set(),
      total: 0,
      failed: [],
      stageFailed: [],
      deadlineTs: null,
      startedAt: 0,
      wake: () => {},
      changed: Promise.resolve(),
    }
    rearm(s)
    st.set(p, s)
  }
  let settled = false
  const running = () => keys.find((p) => st.get(p)!.started && st.get(p)!.end === null)
  const finish = (p: P, end: End) => {
    const s = st.get(p)!
    if (s.end !== null) return
    s.end = s.interrupted ? 'interrupted' : end
    s.wake()
  }
  const start = (p: P) => {
    const s = st.get(p)!
    if (s.started) return
    // A later phase starting ends the earlier ones still running.
    for (const q of keys.slice(0, keys.indexOf(p))) if (st.get(q)!.started && !phases[q].endsExplicitly) finish(q, st.get(q)!.failed.length ? 'failed' : 'done')
    s.started = true
    s.startedAt = Date.now()
    s.wake()
  }
  const onAbort = () => {
    const p = running()
    if (p) st.get(p)!.interrupted = true
  }
  opts.signal?.addEventListener('abort', onAbort, {once: true})

  const list = new Listr(
    keys.map((p) => ({
      title: phases[p].title,
      task: async (_ctx: unknown, task: {title: string; output: string; skip: (m?: string) => void}) => {
        const s = st.get(p)!
        // A phase never reached: skipped once a later one starts or the run settles.
        const later = () => keys.slice(keys.indexOf(p) + 1).some((q) => st.get(q)!.started)
        while (!s.started && !settled && !later()) await Promise.race(keys.map((q) => st.get(q)!.changed))
        if (!s.started) return task.skip(`${phases[p].title}: not run${opts.signal?.aborted ? ' (interrupted)' : ''}`)
        let last = ''
        // The time left, redrawn every second on a terminal; in a log, every 10 s at most.
        const tick = setInterval(() => show(), opts.mode === 'tty' ? 1000 : 10_000)
        const show = () => {
          const line = detail(s)
          if (line && line !== last) task.output = last = line
        }
        try {
          while (s.end === null) {
            show()
            await s.changed
          }
        } finally {
          clearInterval(tick)
        }
        const took = `${((Date.now() - s.startedAt) / 1000).toFixed(1)} s`
        if (s.end === 'done') return void (task.title = `${phases[p].title} (${took})`)
        task.title = `${phases[p].title} (${took})`
        throw new Error(s.end === 'interrupted' ? 'interrupted' : `failed${s.failed.length ? ` on ${[...new Set(s.failed)].join(', ')}` : ''}`)
      },
    })),
    {
      concurrent: false,
      exitOnError: false,
      registerSignalListeners: false,
      renderer: opts.mode === 'tty' ? 'default' : 'simple',
      rendererOptions: {logger: new ListrLogger({processOutput: toStderr()}), collapseErrors: false, outputBar: 1} as never,
    },
  )
  const rendering = list.run().catch(() => {})
  const hooks: ProgressHooks<P> = {
    onPhase: (p, state) => {
      if (state === 'start') start(p)
      else finish(p, state === 'done' ? 'done' : 'failed')
    },
    onCall: (e) => {
      const p = keys.find((k) => phases[k].operations.includes(e.operation) && st.get(k)!.end === null)
      if (!p) return
      start(p)
      const s = st.get(p)!
      if (e.ms === null) {
        if (s.stage !== e.stage || s.pending.size === 0) {
          s.stage = e.stage
          s.pending = new Set()
          s.stageFailed = []
          s.total = 0
        }
        s.pending.add(e.server)
        s.total++
        s.deadlineTs = e.deadlineTs
      } else {
        s.pending.delete(e.server)
        if (!e.ok) {
          s.failed.push(e.server)
          s.stageFailed.push(`${e.server}: ${e.code ?? 'failed'}`)
        }
      }
      s.wake()
    },
  }
  try {
    const out = await run(hooks)
    for (const p of keys) if (st.get(p)!.started) finish(p, 'done')
    return out
  } catch (err) {
    // The error belongs to a phase that already ended failed or interrupted, if one did (a phase
    // still running then is cleanup, and failed only if its own calls did); else to the running one.
    const blamed = keys.some((q) => st.get(q)!.end === 'failed' || st.get(q)!.end === 'interrupted')
    for (const p of keys.filter((q) => st.get(q)!.started && st.get(q)!.end === null)) {
      const s = st.get(p)!
      finish(p, s.failed.length ? 'failed' : blamed ? 'done' : (err as {code?: string}).code === 'interrupted' ? 'interrupted' : 'failed')
    }
    throw err
  } finally {
    settled = true
    opts.signal?.removeEventListener('abort', onAbort)
    for (const s of st.values()) s.wake()
    await rendering
  }
}

function rearm(s: PhaseState): void {
  s.changed = new Promise<void>((resolve) => {
    s.wake = () => {
      resolve()
      rearm(s)
    }
  })
}

/** `model: 1/2 replied; waiting for policy_b · 283 s to the deadline` */
export function detail(s: {stage: string | null; pending: Set<string>; total: number; stageFailed: string[]; deadlineTs: number | null}, now = Date.now()): string {
  if (s.stage === null) return ''
  const replied = s.total - s.pending.size - s.stageFailed.length
  const failed = s.stageFailed.length ? `, ${s.stageFailed.length} failed (${s.stageFailed.slice(0, 3).join('; ')}${s.stageFailed.length > 3 ? '; …' : ''})` : ''
  const names = [...s.pending]
  const waiting = names.length === 0 ? 'none pending' : `waiting for ${names.slice(0, 6).join(', ')}${names.length > 6 ? ` … (+${names.length - 6})` : ''}`
  const left = s.deadlineTs === null ? '' : ` · ${Math.max(0, Math.round(s.deadlineTs - now / 1000))} s to the deadline`
  return `${s.stage === 'all' ? '' : `${s.stage}: `}${replied}/${s.total} replied${failed}; ${waiting}${names.length ? left : ''}`
}

function toStderr(): ProcessOutput {
  return new ProcessOutput(process.stderr, process.stderr)
}
