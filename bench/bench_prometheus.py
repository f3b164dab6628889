"""What ``prometheus_client`` would cost a node: import time, resident memory, one scrape.

Run in a process that has already imported what a node runs (torch, hivemind, aiohttp and the
dashboard), so the figures are the marginal cost. ``prometheus_client`` is not a dependency of this
project: ``pip install prometheus_client`` first (the script says so if it is missing).

    python bench/bench_prometheus.py
"""

from __future__ import annotations

import importlib.util
import sys
import time


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    if importlib.util.find_spec("prometheus_client") is None:
        print("prometheus_client is not installed: pip install prometheus_client, then run this again")
        return 2
    import aiohttp  # noqa: F401  (what a node has loaded already)
    import hivemind  # noqa: F401
    import torch  # noqa: F401

    import node.dashboard.server  # noqa: F401

    rss0, t0 = _rss_mb(), time.perf_counter()
    from prometheus_client import CollectorRegistry, Gauge, generate_latest
    from prometheus_client.process_collector import ProcessCollector

    took_ms = 1e3 * (time.perf_counter() - t0)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    for i in range(21):  # as many metric families as the dashboard's /metrics has
        Gauge(f"swarm_node_g{i}", "help", ["source"], registry=registry).labels(source="local").set(1.0)
    t1, n = time.perf_counter(), 200
    for _ in range(n):
        text = generate_latest(registry)
    scrape_ms = 1e3 * (time.perf_counter() - t1) / n
    print(
        f"import {took_ms:.0f} ms, +{_rss_mb() - rss0:.1f} MB resident, one scrape {scrape_ms:.2f} ms "
        f"({len(text)} bytes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
