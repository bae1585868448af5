"""The ``otel-ofu`` command line: :mod:`.main` (run, validate and the subcommand table),
:mod:`.doctor` (what this machine can read), :mod:`.logs` (logging setup shared by commands).
"""
