"""Per-job answers from per-GPU OFU: aggregation, the MFU audit, regression alarms.

Everything in this package is pure (no I/O, no clocks): time is the data's own timestamps, in
seconds. The ``jobs`` processor and ``otel-ofu report`` both drive :class:`book.JobBook`,
so a live pipeline and a report over a recording reach the same numbers.
"""
