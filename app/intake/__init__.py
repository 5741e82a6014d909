"""Intake: turning a publish request into an event and its deliveries, in one transaction.

`publish.publish` is the entry point. It parses the envelope (`envelope`), applies the
Idempotency-Key (`idempotency`), reads the partner's endpoints and the contract (`targets`,
cached per process for the hot path), plans the event row, its versions and one delivery per
target (`plan`), and writes them: in one statement on PostgreSQL's fast path (`sql` holds
those hand-built statements), else with `publish.publish_in_transaction`. `kurir_test` sends
the `kurir.test` event a partner or operator asks for. After commit, the deliveries are
handed to `sender` to send.
"""
