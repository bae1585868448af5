"""Developer tools: dashboard and rule generators, the demo loaded into Prometheus, previews."""
