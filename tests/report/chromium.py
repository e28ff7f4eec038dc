"""Headless Chromium for the page tests (Debian's `chromium`, `make browser`): the DOM after the page's scripts
ran, a screenshot, and how much of it is inked."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make browser installs "
                                                             "Debian's chromium package as root)")


def chromium(args: list[str], profile: Path, timeout: float = 120) -> str:
    """Run headless Chromium in its own process group (killed with it on timeout); its stdout."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--hide-scrollbars", f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"chromium exited {proc.returncode}"
    return out


def dom(url: str, profile: Path, budget_ms: int = 20_000) -> str:
    return chromium([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], profile)


def screenshot(url: str, path: Path, profile: Path, budget_ms: int = 20_000) -> Path:
    chromium([f"--virtual-time-budget={budget_ms}", "--window-size=1280,2400", f"--screenshot={path}", url],
              profile)
    return path


def ink(png: Path) -> tuple[float, float]:
    """Fraction of pixels that are not (near) white, and of those in strong colour (chart lines and markers;
    text, tables and a blank page are black, grey and white)."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int).reshape(-1, 3)
    inked = float((pixels.min(axis=1) < 235).mean())
    return inked, float((pixels.max(axis=1) - pixels.min(axis=1) > 80).mean())
