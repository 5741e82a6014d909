"""Self-healing endpoints: an endpoint Kurir disabled after failures is probed, and the first
2xx answer re-enables it and replays what it parked.

`schedule` when the next probe is due · `due` which endpoints are due, claimed by the
scheduler · `probe` one signed `kurir.endpoint.probe` sent and recorded · `recover`
re-enabling and the ordered replay (`endpoint_recovered`, the one place a recovery happens).

A probe is never a delivery: it writes no event, delivery, attempt or dead letter and moves
no health counter; it is kept in `endpoint_probes`, the endpoint's probe history.
"""
