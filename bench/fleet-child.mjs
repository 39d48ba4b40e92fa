// Hosts N participant doubles in their own process (so the controller's event loop is measured
// alone). Prints their URLs as one JSON line, then serves until stdin closes.
import {ParticipantServer} from '../dist/control-plane/server.js'
import {SimDownstream} from '../dist/control-plane/sim.js'

const n = Number(process.argv[2])
const maxDelay = Number(process.argv[3])
const token = process.argv[4]
const servers = []
for (let i = 0; i < n; i++) {
  const name = `m${String(i).padStart(4, '0')}`
  const s = new ParticipantServer({name, token, participant: new SimDownstream('model', name)})
  // Participant latency: spread evenly over [0, maxDelay], the last one the slowest.
  const delay = n === 1 ? maxDelay : Math.round((maxDelay * i) / (n - 1))
  if (delay > 0) for (const route of ['renew', 'prepare', 'resume']) s.faults.add(route, {type: 'delay', ms: delay}, Infinity)
  await s.listen()
  servers.push(s)
}
process.stdout.write(JSON.stringify(servers.map((s) => ({name: s.name, url: s.url}))) + '\n')
process.stdin.resume()
process.stdin.on('end', async () => {
  await Promise.all(servers.map((s) => s.close()))
  process.exit(0)
})
