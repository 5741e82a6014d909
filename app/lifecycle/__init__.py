"""The data lifecycle: finished history is purged after its kind's retention period, in
short batches, and what was purged is remembered.

- `policy`: the horizon of each kind (`KURIR_RETAIN_<KIND>_DAYS`) and what counts as
  finished — the only rows a purge may touch.
- `purge`: the run the scheduler starts: each kind's rows past its horizon, examined in id
  order (ids are creation times, so a time range is a primary-key range) and deleted in
  foreign-key order, one short transaction per batch, each batch sized by how long the last
  one held the writer (`KURIR_RETENTION_BATCH_MS`) and followed by a pause, so publishing
  goes on meanwhile.
- `marks`: per kind, rows purged so far, the last horizon and the oldest row kept
  (persisted, so `/metrics`, `/ui` and `kurir db stats` read one small table).
- `partitions` (PostgreSQL): `deliveries` and `attempts` are partitioned by day of the
  delivery's id; the scheduler makes the days ahead (`make-partitions`).
- `drop` (PostgreSQL): a run first drops each whole day past its horizon, setting aside and
  putting back the rows that must stay, so the batches find only what was kept back.
- `stats`: rows (and, on PostgreSQL, bytes) per table.
- `archive`: with `KURIR_ARCHIVE_DIR`, what a purge deletes is first written there (gzip
  JSON Lines per table and day, with a manifest) before the delete commits.
- `restore`: archived day files loaded back, checked against their manifests, parents
  first, rows already present skipped.

Never purged: open dead letters, deliveries not finished (pending, delivering, retrying, or
dead with a letter still kept), so an ordered key's held deliveries too, and the events a
live pull endpoint has not acknowledged yet. The feed learns how far each partner's feed was
purged (`app.feed.horizon`) and refuses a cursor or acknowledgement behind it with `410`.
"""
