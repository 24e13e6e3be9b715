"""`toolfence demo`: see `executor.cli.demo.run` for what it does, in order."""
