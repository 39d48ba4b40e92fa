/**
 * The version of every command's --json document (the envelope and each command's fields). One
 * constant for the commands (base.ts) and the documented schemas (json-schemas.ts). 2: the fields
 * were made one contract (snake_case, `checkpoint_id`/`checkpoint_dir`, `*_count`, `dry_run`),
 * which renamed or removed fields of version 1 (list, describe, retire, forget, prune, demo).
 * 3: restore's `restored` is a list of participants (it was an object keyed by server), and error
 * details are documented shapes (prepare's `blockers` and `open` became lists, the publish gate's
 * `problems` are problem objects, demo's details are its whole document).
 */
export const JSON_SCHEMA_VERSION = 3
