"""The baseline for the storage benchmarks: a participant store in stdlib-only Python, written the
way Gym's store.py writes and reads (reference section 7.3-7.5).

  commit SOURCE_RECORDS OUT_CHECKPOINT_DIR KIND INSTANCE CHECKPOINT_ID
      Loads SOURCE_RECORDS (untimed: this is the participant's memory), then times the commit:
      json.dumps per record streamed into a temp file and hashed, flush, fsync, rename to
      records-<sha256>.jsonl, manifest (sort_keys, indent=1) into a temp file, fsync, hard link
      to manifest.json, fsync of the directory.
  restore PARTICIPANT_DIR MODE [SCOPE_FILE]
      Times a restore: the records file read line by line, every line hashed and counted, digest
      and count checked against the manifest. MODE says how the records in scope are found:
        decode-every  every line json.loads'd, its episode_id read, the records in scope kept
                      (what Gym's store does)
        line-start    the episode read off the line start (the record's first key, as json.dumps
                      writes it); only the lines in scope are json.loads'd
      SCOPE_FILE holds one capture key a line; without it every record is in scope.

Prints one JSON line: {"ms", "sha256", "records", "kept", "peak_rss_kb", "data_rss_kb"}.
"""

import hashlib
import json
import os
import re
import resource
import sys
import tempfile
import time

RESERVED = re.compile(r"-a[1-9][0-9]*$")
PREFIX = re.compile(rb'^\{"episode_id": \{"rollout_id": "([A-Za-z0-9][A-Za-z0-9._-]*)", "attempt": (0|[1-9][0-9]{0,14})\}[,}]')


def rss_kb():
    # VmHWM belongs to this program alone (getrusage's ru_maxrss survives execve on Linux, so it
    # would report the size of the process that spawned this one).
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def reset_peak_rss():
    # Linux: `5` in clear_refs starts VmHWM over from the current RSS.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def current_rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def capture_key(rollout_id, attempt):
    return rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(source, checkpoint_dir, kind, instance, checkpoint_id):
    with open(source, "rb") as f:
        records = [json.loads(line) for line in f]
    reset_peak_rss()
    data_rss = current_rss_kb()
    t0 = time.perf_counter()
    d = os.path.join(checkpoint_dir, "gym", kind, instance)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".records.jsonl.", dir=d)
    h = hashlib.sha256()
    count = 0
    with os.fdopen(fd, "wb") as out:
        for record in records:
            line = (json.dumps(record) + "\n").encode("utf-8")
            h.update(line)
            out.write(line)
            count += 1
        out.flush()
        os.fsync(out.fileno())
    sha = h.hexdigest()
    name = f"records-{sha}.jsonl"
    os.rename(tmp, os.path.join(d, name))
    manifest = {
        "checkpoint_id": checkpoint_id,
        "instance": instance,
        "kind": kind,
        "record_count": count,
        "records_file": name,
        "records_sha256": sha,
        "schema_version": 1,
    }
    fd, mtmp = tempfile.mkstemp(prefix=".manifest.json.", dir=d)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(manifest, sort_keys=True, indent=1))
        out.flush()
        os.fsync(out.fileno())
    os.link(mtmp, os.path.join(d, "manifest.json"))
    os.unlink(mtmp)
    fsync_dir(d)
    ms = (time.perf_counter() - t0) * 1000
    return {"ms": ms, "sha256": sha, "records": count, "kept": count, "peak_rss_kb": rss_kb(), "data_rss_kb": data_rss}


def restore(d, mode, scope_file=None):
    scope = None
    if scope_file:
        with open(scope_file) as f:
            scope = {line.strip() for line in f if line.strip()}
    reset_peak_rss()
    data_rss = current_rss_kb()
    t0 = time.perf_counter()
    with open(os.path.join(d, "manifest.json")) as f:
        manifest = json.load(f)
    path = os.path.join(d, manifest["records_file"])
    h = hashlib.sha256()
    count = 0
    kept = []
    with open(path, "rb") as f:
        for line in f:
            h.update(line)
            count += 1
            if mode == "line-start":
                m = PREFIX.match(line)
                if m:
                    key = capture_key(m.group(1).decode("ascii"), int(m.group(2)))
                    if scope is not None and key not in scope:
                        continue
                    if line.find(b'"episode_id"', m.end()) < 0:
                        kept.append(json.loads(line))
                        continue
            record = json.loads(line)
            ep = record["episode_id"]
            key = capture_key(ep["rollout_id"], ep["attempt"])
            if scope is None or key in scope:
                kept.append(record)
    sha = h.hexdigest()
    if sha != manifest["records_sha256"]:
        raise SystemExit(f"{path} does not match its manifest digest")
    if count != manifest["record_count"]:
        raise SystemExit(f"{path}: expected {manifest['record_count']} records, found {count}")
    ms = (time.perf_counter() - t0) * 1000
    return {"ms": ms, "sha256": sha, "records": count, "kept": len(kept), "peak_rss_kb": rss_kb(), "data_rss_kb": data_rss}


def main(argv):
    if len(argv) >= 6 and argv[0] == "commit":
        out = commit(*argv[1:6])
    elif len(argv) >= 3 and argv[0] == "restore":
        out = restore(argv[1], argv[2], argv[3] if len(argv) > 3 else None)
    else:
        raise SystemExit(__doc__)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
