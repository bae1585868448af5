"""Scraping Prometheus text endpoints: the HTTP client, auth and TLS settings, the per-endpoint
pool with its failure telemetry, and the one text parser (prometheus_client's). The
``dcgm_exporter`` receiver (GPU counters) and the ``prometheus`` receiver (a job's own
metrics, such as its MFU) both scrape through it.
"""
