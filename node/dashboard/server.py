"""The live dashboard: an aiohttp server on its own thread and event loop, so it never blocks training.

Routes: ``/`` the page, ``/api/summary`` its JSON, ``/metrics`` Prometheus
text. It binds 127.0.0.1 unless told otherwise (``--dashboard-host 0.0.0.0``).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from node.dashboard import prometheus
from node.dashboard.data import SwarmView
from node.dashboard.page import PAGE
from swarm.loop import LoopThread

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DashboardConfig:
    """Where the dashboard listens; ``port=None`` turns it off."""

    port: int | None = field(default=None, metadata={"help": "TCP port; 0 picks a free one; None: no dashboard."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to bind; 0.0.0.0 shows it to your network."})

    def __post_init__(self) -> None:
        if self.port is not None and not 0 <= self.port <= 65535:
            raise ValueError(f"--dashboard-port {self.port}: use 0-65535 (0 picks a free port)")
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise ValueError(f"--dashboard-host {self.host!r}: use an IP address, e.g. 127.0.0.1 or 0.0.0.0") from None


_LOOPBACK_NAMES = ("localhost", "localhost.")


def host_allowed(host_header: str | None, bind_host: str) -> bool:
    """Whether a request's ``Host`` may be served: on a loopback bind only loopback names.

    A page on another site can point its own DNS name at 127.0.0.1 (DNS
    rebinding) and then read a loopback dashboard as same-origin; its requests
    still carry that foreign name in ``Host``, so refusing it closes the hole.
    A dashboard bound to a non-loopback address was exposed on purpose and
    accepts any name.

    >>> host_allowed("127.0.0.1:8765", "127.0.0.1"), host_allowed("attacker.example", "127.0.0.1")
    (True, False)
    >>> host_allowed("attacker.example", "0.0.0.0")
    True
    """
    if not ipaddress.ip_address(bind_host).is_loopback:
        return True
    if not host_header:
        return False
    name = host_header.strip().lower()
    if name.startswith("["):  # [::1]:port
        name = name[1 : name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def node_view(metrics_path: Path, title: str) -> SwarmView:
    """The view of one node: its own metrics file."""
    return SwarmView(title, lambda: [metrics_path])


def swarm_view(log_dir: Path, title: str) -> SwarmView:
    """The view of every node logging under ``log_dir`` (``<log-dir>/*/metrics.jsonl``)."""
    return SwarmView(title, lambda: sorted(log_dir.glob("*/metrics.jsonl")))


class Dashboard:
    """Serves a :class:`SwarmView`. :meth:`start` returns the URL; always :meth:`close`."""

    def __init__(self, view: SwarmView, cfg: DashboardConfig) -> None:
        self.view, self.cfg = view, cfg
        self._loop: LoopThread | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.refused_hosts = 0  # requests refused for a foreign Host header

    def _app(self) -> web.Application:
        async def page(_: web.Request) -> web.Response:
            return web.Response(text=PAGE, content_type="text/html")

        async def summary(_: web.Request) -> web.Response:
            body = json.dumps(self.view.snapshot(), separators=(",", ":"))
            return web.Response(text=body, content_type="application/json", headers={"Cache-Control": "no-store"})

        async def metrics(_: web.Request) -> web.Response:
            text = prometheus.render(self.view.snapshot())
            return web.Response(body=text.encode(), headers={"Content-Type": prometheus.CONTENT_TYPE})

        @web.middleware
        async def check_host(request: web.Request, handler: Any) -> web.StreamResponse:
            if not host_allowed(request.headers.get("Host"), self.cfg.host):
                self.refused_hosts += 1
                logger.warning(
                    "dashboard refused a request for host %r (bound to loopback)", request.headers.get("Host")
                )
                return web.Response(status=421, text="this dashboard answers only to localhost / 127.0.0.1\n")
            response: web.StreamResponse = await handler(request)
            return response

        app = web.Application(middlewares=[check_host])
        app.router.add_get("/", page)
        app.router.add_get("/api/summary", summary)
        app.router.add_get("/metrics", metrics)
        return app

    async def _serve(self, port: int) -> int:
        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, port)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    def start(self, fallback_to_free_port: bool = False) -> str:
        """Bind and serve; a busy port is an OSError unless ``fallback_to_free_port``."""
        assert self.cfg.port is not None, "dashboard is off"
        self._loop = LoopThread("dashboard")
        try:
            port = self._loop.run(self._serve(self.cfg.port), START_TIMEOUT_S)
        except OSError:
            if not fallback_to_free_port:
                self.close()
                raise
            logger.warning("dashboard port %d is busy; using a free port instead", self.cfg.port)
            port = self._loop.run(self._serve(0), START_TIMEOUT_S)
        shown = "127.0.0.1" if self.cfg.host == "0.0.0.0" else self.cfg.host
        self.url = f"http://{shown}:{port}/"
        return self.url

    def close(self) -> None:
        """Stop serving (bounded); idempotent."""
        if self._loop is not None and self._runner is not None:
            try:
                self._loop.run(self._runner.cleanup(), 5.0)
            except Exception as e:  # shutting down: log and go on
                logger.debug("dashboard cleanup: %s", e)
        if self._loop is not None:
            self._loop.stop(5.0)
        self._loop, self._runner = None, None
