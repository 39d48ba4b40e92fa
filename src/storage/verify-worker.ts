// Worker thread body: verifies participant directories sent by verifyCheckpoint (hashing and
// scanning one records file per core).
import {parentPort} from 'node:worker_threads'

import {CheckpointStateError} from './errors.js'
import {readParticipantState} from './participant-store.js'

parentPort!.on('message', async (job: {id: number; dir: string; kind: string; instance: string}) => {
  try {
    const r = await readParticipantState(job.dir, {kind: job.kind, instance: job.instance, keep: null})
    parentPort!.postMessage({id: job.id, ok: true, manifest: r.manifest, keys: r.keys, bytes: r.bytes})
  } catch (err) {
    parentPort!.postMessage({id: job.id, ok: false, stateError: err instanceof CheckpointStateError, message: (err as Error).message})
  }
})
