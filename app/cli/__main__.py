"""`python -m app.cli` — how `kurir up` starts its children with the same interpreter."""

from app.cli import main

main()
