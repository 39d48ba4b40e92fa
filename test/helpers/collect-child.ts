// A Collector in its own process, for tests that SIGKILL it mid-run (test/helpers/collect-kit.ts).
// argv[2]: the JSON config. Prints one JSON message per line: {log}, {progress}, {outcome}, {error}.
// SIGUSR1 takes a checkpoint and SIGTERM stops after one, as in the collect command.
import {ControlClient} from '../../src/coordination/client.js'
import {Collector} from '../../src/coordination/collect.js'
import {discover} from '../../src/coordination/discover.js'
import {ResultsFile, readRows} from '../../src/storage/collector.js'

const cfg = JSON.parse(process.argv[2]!) as {
  token: string
  servers: {name: string; url: string}[]
  input: string
  output: string
  root: string
  concurrency: number
  checkpointEveryMs: number | null
  resume: boolean
}
const emit = (m: unknown) => process.stdout.write(JSON.stringify(m) + '\n')

const client = new ControlClient({token: cfg.token})
try {
  const d = await discover(client, cfg.servers, {probeTimeoutMs: 5000})
  const env = d.participants.find((p) => p.kind === 'environment')!
  const collector = new Collector(
    {client, participants: d.participants},
    {
      rows: await readRows(cfg.input),
      root: cfg.root,
      output: await ResultsFile.open(cfg.output, {resume: cfg.resume}),
      runUrl: env.url,
      concurrency: cfg.concurrency,
      checkpointEveryMs: cfg.checkpointEveryMs,
      timeoutS: 30,
      maxAttempts: 3,
      resume: cfg.resume,
      log: (m) => emit({log: m}),
      onProgress: (s) => emit({progress: {done: s.done, inFlight: s.inFlight, checkpoints: s.checkpoints}}),
    },
  )
  process.on('SIGUSR1', () => collector.requestCheckpoint())
  process.on('SIGTERM', () => collector.requestStop())
  emit({outcome: await collector.run()})
} catch (err) {
  emit({error: (err as Error).stack ?? String(err)})
  process.exitCode = 1
} finally {
  await client.close()
}
