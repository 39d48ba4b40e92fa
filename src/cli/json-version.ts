/**
 * The version of every command's --json document (the envelope and each command's fields). One
 * constant for the commands (base.ts) and the documented schemas (json-schemas.ts). 2: the fields
 * were made one contract (snake_case, `checkpoint_id`/`checkpoint_dir`, `*_count`, `dry_run`),
 * which renamed or removed fields of version 1 (list, describe, retire, forget, prune, demo).
 */
export const JSON_SCHEMA_VERSION = 2
