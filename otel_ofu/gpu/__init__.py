"""Seams to real GPU libraries (DCGM bindings, NVML) and what the receivers built on them share.

Everything here imports the vendor libraries lazily, so a machine without them can still load
the receivers, run ``otel-ofu doctor`` and run the tests (which inject fakes through the
providers in :mod:`dcgm_api` and :mod:`nvml_api`).
"""
