"""The registry: partners, their endpoints and the endpoints' signing secrets.

The field rules (`endpoint_fields`) and writes (`partners`, `endpoints`, `secrets`) behind
every face that creates or changes them (the API, the operator UI, the partner portal, the CLI
all reach here through `app.services`). Delivery reads what is registered here; it never
writes it.
"""
