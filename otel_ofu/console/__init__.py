"""The live console: what it shows (:mod:`.state`), how it looks (:mod:`.render`) and the log routing
that keeps log lines above the live region (:mod:`.logs`). The ``console`` exporter and ``otel-ofu top``
drive it; docs/console.md describes it for users.
"""
