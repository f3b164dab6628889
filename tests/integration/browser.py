"""Headless Chromium for dashboard tests: dump the DOM after the page's scripts ran, take screenshots.

Offline and quiet: no background networking, component updates, sync or
QUIC, and a fresh profile per call. Install with ``apt-get install -y chromium``
(Debian/Ubuntu); tests skip with that hint when no browser is found.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

INSTALL_HINT = "headless Chromium not found; install it with: sudo apt-get install -y chromium"
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    """Path of a Chromium-family browser, or None."""
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(binary: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [binary, *FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def dump_dom(binary: str, url: str, budget_ms: int = 6000, timeout: float = 60.0) -> str:
    """The page's DOM after ``budget_ms`` of (virtual) time: the scripts have fetched and rendered."""
    res = _run(binary, [f"--virtual-time-budget={budget_ms}", "--dump-dom", url], timeout)
    if res.returncode != 0 or "<html" not in res.stdout:
        raise AssertionError(f"chromium --dump-dom failed ({res.returncode}): {res.stderr[-2000:]}")
    return res.stdout


def screenshot(binary: str, url: str, path: Path, size: str = "1280,900", budget_ms: int = 6000) -> Path:
    """Save a PNG of the page after ``budget_ms`` of (virtual) time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    args = [f"--virtual-time-budget={budget_ms}", f"--screenshot={path}", f"--window-size={size}", url]
    res = _run(binary, args, 60.0)
    if res.returncode != 0 or not path.exists():
        raise AssertionError(f"chromium --screenshot failed ({res.returncode}): {res.stderr[-2000:]}")
    return path
