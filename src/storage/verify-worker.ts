// Worker thread body: verifies participant directories sent by verifyCheckpoint (hashing and
// scanning one records file per core).
import {parentPort} from 'node:worker_threads'

import {CheckpointStateError} from './errors.js'
import {DirJob, verifyDir} from './verify.js'

parentPort!.on('message', async (job: DirJob & {id: number}) => {
  try {
    const r = await verifyDir(job)
    parentPort!.postMessage({id: job.id, ok: true, ...r})
  } catch (err) {
    parentPort!.postMessage({id: job.id, ok: false, stateError: err instanceof CheckpointStateError, message: (err as Error).message})
  }
})
