"""Intake: turning a publish request into an event and its deliveries, in one transaction.

`publish` parses the envelope, applies idempotency, plans the targets and versions, and
writes the event and one delivery per target (`sql` holds the hand-built fast-path
statements); `kurir_test` sends the `kurir.test` event a partner or operator asks for. After
commit, the deliveries are handed to `sender` to send.
"""
