// The JSON of list and describe, in the contract's names (src/cli/json-schemas.ts). Apart from
// output.ts so that only these two commands load the catalog.
import {type Catalog, type CheckpointDescription, catalogJson, descriptionJson, entryJson} from '../storage/catalog.js'

/** A catalog entry in the JSON contract: a checkpoint is checkpoint_id/checkpoint_dir, a count is *_count. */
function entryContract(e: ReturnType<typeof entryJson>) {
  const {id, dir, participants, ...rest} = e
  return {
    checkpoint_id: id,
    checkpoint_dir: dir,
    state: rest.state,
    latest: rest.latest,
    manifest: rest.manifest,
    created: rest.created,
    age_seconds: rest.age_seconds,
    size_bytes: rest.size_bytes,
    participant_count: participants,
    continued_count: rest.continued_count,
    restarted_count: rest.restarted_count,
    error: rest.error,
  }
}

/** `list --json` fields; its warnings go to the envelope. */
export function listJson(c: Catalog) {
  const j = catalogJson(c)
  return {root: j.root, latest: j.latest, checkpoints: j.checkpoints.map(entryContract), warnings: j.warnings}
}

/** `describe --json` fields; its warnings go to the envelope. */
export function describeJson(d: CheckpointDescription) {
  const {checkpoint, restores, ...j} = descriptionJson(d)
  return {...j, checkpoint: entryContract(checkpoint), restores: restores.map(({participants, ...r}) => ({...r, participant_count: participants}))}
}
