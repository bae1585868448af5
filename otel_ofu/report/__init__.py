"""``otel-ofu report``: per-job answers from recorded file-exporter output.

:mod:`.build` reads recordings and computes the report, :mod:`.plots` draws it,
:mod:`.command` is the command line.
"""
