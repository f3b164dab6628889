"""Observability primitives every layer of the node may use: log context, the metrics event file, reachability.

Owns the ``[peer r=round]`` log prefix, the append-only ``metrics.jsonl``
writer and reader, and the pure reachability advice printed at start. It
imports nothing else from :mod:`node`.
"""
