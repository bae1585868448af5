"""The pure core: the data model, the OFU math, the GPU spec table, the tile model, the blank-value
rule, the DCGM field table and the metric registry.

Plain functions and classes on plain data, no I/O; nothing here imports from the rest of
otel_ofu (tests/test_layout.py enforces it), so every other layer can build on it.
"""
