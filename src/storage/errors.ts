/** Any problem with checkpoint state on disk; Gym's `invalid_checkpoint_state` (HTTP 422). */
export class CheckpointStateError extends Error {
  readonly code = 'invalid_checkpoint_state'
  constructor(message: string) {
    super(message)
    this.name = 'CheckpointStateError'
  }
}

/** A write that resume stopped before it published. */
export class WriteStoppedError extends CheckpointStateError {
  constructor(what: string) {
    super(`${what} was resumed before its write finished`)
    this.name = 'WriteStoppedError'
  }
}
