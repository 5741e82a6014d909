"""Intake: turning a publish request into an event and its deliveries, in one transaction.

`publish.publish` parses the envelope, applies idempotency, plans the targets and versions,
and writes the event and one delivery per target: in one statement on PostgreSQL's fast path
(`sql` holds those hand-built statements), else with `publish_in_transaction`. `kurir_test`
sends the `kurir.test` event a partner or operator asks for. After commit, the deliveries are
handed to `sender` to send.
"""
