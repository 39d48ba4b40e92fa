// Fan-out to N participants: wall time of one operation minus the slowest participant's own
// latency = the controller's overhead. Participants run in a child process on 127.0.0.1.
// Usage: npm run bench:fanout -- [--participants 1000] [--max-delay 50] [--rounds 15]
import {spawn} from 'node:child_process'
import {createInterface} from 'node:readline'

import {ControlClient} from '../dist/coordination/client.js'
import {encodeBody, fanOut, prepare, resume} from '../dist/coordination/operations.js'
import {arg, machine, median} from './lib.mjs'

const N = arg('participants', 1000)
const MAX_DELAY = arg('max-delay', 50)
const ROUNDS = arg('rounds', 15)
const TOKEN = 'bench-token'

async function withFleet(maxDelay, fn) {
  const child = spawn(process.execPath, [new URL('./fleet-child.mjs', import.meta.url).pathname, String(N), String(maxDelay), TOKEN], {stdio: ['pipe', 'pipe', 'inherit']})
  const line = await new Promise((resolve) => createInterface({input: child.stdout}).once('line', resolve))
  try {
    return await fn(JSON.parse(line))
  } finally {
    child.stdin.end()
    await new Promise((r) => child.on('exit', r))
  }
}

async function measure(maxDelay) {
  return withFleet(maxDelay, async (servers) => {
    const client = new ControlClient({token: TOKEN, connections: 4})
    const c = {client, participants: servers.map((s) => ({server: s.name, url: s.url, kind: 'model', instance: s.name}))}
    try {
      const deadline = () => Date.now() / 1000 + 120
      let t = performance.now()
      const prep = await prepare(c, 'bench', deadline())
      const prepareMs = performance.now() - t
      if (!prep.prepared) throw new Error('not prepared')
      const walls = []
      let cpu0 = process.cpuUsage()
      for (let r = 0; r < ROUNDS; r++) {
        // CPU of warm rounds only: the first one opens every connection.
        if (r === 1) cpu0 = process.cpuUsage()
        const body = encodeBody({checkpoint_id: 'bench', deadline_ts: deadline()})
        t = performance.now()
        const out = await fanOut(c, 'renew', c.participants, body, deadline())
        walls.push(performance.now() - t)
        if (out.failures.length) throw new Error(JSON.stringify(out.failures.slice(0, 3)))
      }
      const cpu = process.cpuUsage(cpu0)
      const controllerCpuMs = (cpu.user + cpu.system) / 1000 / (ROUNDS - 1)
      t = performance.now()
      await resume(c, 'bench', deadline())
      const resumeMs = performance.now() - t
      return {prepareMs, walls, resumeMs, controllerCpuMs}
    } finally {
      await client.close()
    }
  })
}

const zero = await measure(0)
const delayed = await measure(MAX_DELAY)
const warm = (w) => median(w.slice(1))
const result = {
  bench: 'fanout',
  machine: machine(),
  participants: N,
  rounds: ROUNDS,
  note: 'renew fanned out to every participant at once; participants in a child process on 127.0.0.1',
  no_latency: {
    first_call_ms: +zero.walls[0].toFixed(1),
    median_warm_ms: +warm(zero.walls).toFixed(1),
    per_participant_us: +((warm(zero.walls) * 1000) / N).toFixed(1),
    controller_cpu_ms_per_warm_fanout: +zero.controllerCpuMs.toFixed(1),
    prepare_first_contact_ms: +zero.prepareMs.toFixed(1),
  },
  with_latency: {
    participant_latency_ms: `0..${MAX_DELAY} (spread evenly)`,
    slowest_ms: MAX_DELAY,
    median_warm_ms: +warm(delayed.walls).toFixed(1),
    overhead_over_slowest_ms: +(warm(delayed.walls) - MAX_DELAY).toFixed(1),
    ratio_to_slowest: +(warm(delayed.walls) / MAX_DELAY).toFixed(2),
    resume_4_stages_ms: +delayed.resumeMs.toFixed(1),
  },
}
console.log(JSON.stringify(result, null, 1))
