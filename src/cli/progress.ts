import {Listr, ListrLogger, ProcessOutput} from 'listr2'

type State = 'start' | 'done' | 'failed'

/**
 * Shows the phases of a long operation with listr2, on stderr only (stdout stays for the result).
 * `run` reports phases through its callback; the renderer just follows them.
 */
export async function withProgress<P extends string, T>(phases: Record<P, string>, enabled: boolean, run: (onPhase: (p: P, s: State) => void) => Promise<T>): Promise<T> {
  if (!enabled) return run(() => {})
  const settle = new Map<P, {resolve: (v: 'done' | 'skip') => void; reject: (e: Error) => void; promise: Promise<'done' | 'skip'>}>()
  for (const p of Object.keys(phases) as P[]) {
    let resolve!: (v: 'done' | 'skip') => void
    let reject!: (e: Error) => void
    const promise = new Promise<'done' | 'skip'>((res, rej) => ((resolve = res), (reject = rej)))
    promise.catch(() => {})
    settle.set(p, {resolve, reject, promise})
  }
  const list = new Listr(
    (Object.entries(phases) as [P, string][]).map(([p, title]) => ({
      title,
      task: async (_ctx: unknown, task: {skip: (m?: string) => void}) => {
        if ((await settle.get(p)!.promise) === 'skip') task.skip(`${title} (skipped)`)
      },
    })),
    {
      concurrent: false,
      exitOnError: false,
      registerSignalListeners: false,
      fallbackRendererCondition: () => !process.stderr.isTTY,
      rendererOptions: {logger: new ListrLogger({processOutput: toStderr()})} as never,
      fallbackRendererOptions: {logger: new ListrLogger({processOutput: toStderr()})} as never,
    },
  )
  const rendering = list.run().catch(() => {})
  try {
    return await run((p, s) => {
      if (s === 'done') settle.get(p)?.resolve('done')
      else if (s === 'failed') settle.get(p)?.reject(new Error(`${phases[p]} failed`))
    })
  } finally {
    for (const s of settle.values()) s.resolve('skip')
    await rendering
  }
}

function toStderr(): ProcessOutput {
  return new ProcessOutput(process.stderr, process.stderr)
}
