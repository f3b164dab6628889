"""The live dashboard and Prometheus endpoint: read-only views of the nodes' ``metrics.jsonl`` files."""
