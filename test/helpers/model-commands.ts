import fc from 'fast-check'

import {Fault} from '../../src/control-plane/faults.js'
import {FaultSpec, InvariantViolation, Route, Server, TaskSpec, World, faultText} from './model-world.js'

/**
 * The commands of the model-based run. The world decides from what really happened whether a
 * command applies (a commit needs a prepared checkpoint, a retire a running episode); one that does
 * not is a no-op, so a replayed seed runs the same sequence. Every command ends with the invariants.
 */

type Model = Record<string, never>
type Cmd = fc.AsyncCommand<Model, World>

class Step implements Cmd {
  constructor(
    private readonly label: string,
    private readonly body: (w: World) => Promise<void>,
  ) {}

  check(): boolean {
    return true
  }

  async run(_m: Model, w: World): Promise<void> {
    w.begin(this.label)
    try {
      await this.body(w)
    } catch (err) {
      if (err instanceof InvariantViolation) throw err
      w.fail(`the step threw: ${(err as Error).stack ?? String(err)}`)
    }
    await w.check()
  }

  toString(): string {
    return this.label
  }
}

const SERVERS: Server[] = ['env', 'policy', 'agent', 'res']

const faultKind: fc.Arbitrary<Fault> = fc.oneof(
  fc.constant<Fault>({type: 'status', status: 500}),
  // A brief hang; 700 ms outlives the 0.5 s deadline of a faulted step, so the work runs late.
  fc.constantFrom(30, 250, 700, 700).map((ms): Fault => ({type: 'delay', ms})),
  fc.constant<Fault>({type: 'hang'}),
  fc.constant<Fault>({type: 'drop'}),
  fc.constant<Fault>({type: 'drop-after'}),
)

/**
 * A fault on one participant's route, or none (half the time). `noHang` routes are those whose
 * cleanup resume waits at least 30 s by design (checkpoint's and prepare's own resume): a hang
 * there would only make the run slow.
 */
function faultOn(routes: Route[], noHang: Route[] = []): fc.Arbitrary<FaultSpec | null> {
  return fc.option(
    fc
      .record({server: fc.constantFrom(...SERVERS), route: fc.constantFrom(...routes), fault: faultKind})
      .map((f) => (f.fault.type === 'hang' && noHang.includes(f.route) ? {...f, fault: {type: 'drop'} as Fault} : f)),
    {freq: 2},
  )
}

const spec: fc.Arbitrary<TaskSpec> = fc.record({
  steps: fc.integer({min: 1, max: 30}),
  stepMs: fc.integer({min: 2, max: 10}),
  stepMode: fc.constantFrom<TaskSpec['stepMode']>('wait', 'wait', 'wait', 'replay'),
  // One in six: the resources server cannot capture it, so it restarts instead of continuing.
  restart: fc.integer({min: 0, max: 5}).map((r) => r === 0),
  replyLagMs: fc.constantFrom(0, 0, 15, 40, 150, 300),
})

const specText = (s: TaskSpec) => `${s.steps}x${s.stepMs}ms${s.stepMode === 'replay' ? ' replay' : ''}${s.restart ? ' restart' : ''}${s.replyLagMs ? ` lag ${s.replyLagMs}ms` : ''}`

export const initialTasks = fc.array(spec, {minLength: 2, maxLength: 6})
export const start = fc.array(spec, {minLength: 1, maxLength: 3}).map((specs) => new Step(`start ${specs.map(specText).join(', ')}`, (w) => w.start(specs)))
export const dispatch = fc.constant(null).map(() => new Step('dispatch pending', (w) => w.dispatchPending()))
export const wait = fc.integer({min: 0, max: 80}).map((ms) => new Step(`wait ${ms}ms`, (w) => w.wait(ms)))
export const latency = fc
  .record({server: fc.constantFrom<Server>('policy', 'agent', 'res'), ms: fc.constantFrom(0, 3, 10, 30)})
  .map(({server, ms}) => new Step(`latency ${server} ${ms}ms`, (w) => w.latency(server, ms)))
export const prepare = faultOn(['prepare']).map((f) => new Step(`prepare${faultText(f)}`, (w) => w.prepare(f)))
export const commit = faultOn(['commit']).map((f) => new Step(`commit+publish${faultText(f)}`, (w) => w.commit(f)))
export const resume = faultOn(['resume']).map((f) => new Step(`resume${faultText(f)}`, (w) => w.resume(f)))
export const checkpoint = faultOn(['prepare', 'commit', 'resume'], ['resume']).map((f) => new Step(`checkpoint${faultText(f)}`, (w) => w.checkpoint(f)))
export const checkpointAtEnd = faultOn(['prepare', 'commit', 'resume'], ['resume']).map((f) => new Step(`checkpoint as an episode ends${faultText(f)}`, (w) => w.checkpointAtEnd(f)))
export const retire = fc.tuple(fc.nat(20), faultOn(['retire'])).map(([pick, f]) => new Step(`retire running #${pick}${faultText(f)}`, (w) => w.retire(pick, f)))
export const forget = faultOn(['forget']).map((f) => new Step(`forget${faultText(f)}`, (w) => w.forget(f)))
export const crashRestore = fc.tuple(faultOn(['retire', 'restore', 'resume']), fc.constantFrom<'rerun' | 'fresh'>('rerun', 'fresh'), fc.integer({min: 0, max: 3})).map(
  ([f, recover, n]) =>
    // Mostly once a checkpoint is published; one in four crashes whatever the root holds.
    new Step(`crash + restore LATEST${n === 0 ? ' (if any)' : ''}${faultText(f)}${f ? ` (on failure: ${recover})` : ''}`, (w) => w.crashRestore(f, recover, n === 0)),
)
export const restoreBusy = fc
  // Live for at least 400 ms: far longer than the attempt, so the fleet is busy when it is probed.
  .record({steps: fc.integer({min: 40, max: 60}), stepMs: fc.constant(10), stepMode: fc.constant<TaskSpec['stepMode']>('wait'), restart: fc.constant(false), replyLagMs: fc.constant(0)})
  .map((s) => new Step(`restore on the busy fleet (holder ${specText(s)})`, (w) => w.restoreBusy(s)))

/** The command mix, weighted by repetition. */
export function commandsArb(maxCommands: number) {
  const mix: [fc.Arbitrary<Cmd>, number][] = [
    [start, 3],
    [dispatch, 1],
    [wait, 3],
    [latency, 1],
    [prepare, 2],
    [commit, 3],
    [resume, 2],
    [checkpoint, 3],
    [checkpointAtEnd, 2],
    [retire, 2],
    [forget, 1],
    [crashRestore, 3],
    [restoreBusy, 1],
  ]
  return fc.commands(
    mix.flatMap(([a, n]) => Array.from({length: n}, () => a)),
    {maxCommands, size: 'max'},
  )
}
