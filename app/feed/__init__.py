"""The feed: a partner's events, in commit order, for consumers that pull instead of being
pushed to.

The classic outbox-polling gap: a reader that pages by event id (or by insert time) moves its
cursor past id 7 while id 6, begun earlier, has not committed yet; 6 commits a moment later,
behind the cursor, and is never seen. Ids are assigned before commit, so no order known at
insert time is commit order.

So a feed position is given only to events that have already committed, by one sequencer at
a time, and the cursor is that position:

- `sequencer`: numbers every committed event still without a position (`events.feed_seq`),
  in id order, continuing from the highest number given. Runs are serialised (a PostgreSQL
  advisory transaction lock; SQLite's single writer), and each sees only committed rows, so
  every position given later is higher than every position given earlier: the set of
  numbered events any reader can see is a prefix of the feed. The reader runs it before
  reading (so a read includes everything committed before the request) and the scheduler
  runs it every few seconds; a publish never waits for it (it writes `feed_seq` NULL).
- `cursor`: the opaque cursor, a position and the time it was handed out.
- `read`: one page after a position, in the published version or as one endpoint receives
  it (its subscription and version pins).
- `lag`: what a pull endpoint has not acknowledged yet.
"""
