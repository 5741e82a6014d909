"""Process entry points: the long-running loops `kurir worker` and `kurir scheduler` start.

They sit above the pipelines and services they drive, so that no pipeline has to import
another to be started, and the CLI (`app.cli.run`) is the only face that imports them.
"""
