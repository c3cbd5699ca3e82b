"""Headless Chromium for the report tests: screenshot, DOM dump, console scan."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--hide-scrollbars",
)
CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\]\s*(.*)")
BODY = re.compile(r"<body\b[^>]*>")


@dataclass(frozen=True)
class PageRun:
    dom: str
    body_attributes: dict[str, str]
    console: tuple[str, ...]
    screenshot: Path | None


def chromium_or_skip() -> str:
    """The chromium binary; skip (or fail under XCONF_REQUIRE_CHROMIUM=1) without one."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("XCONF_REQUIRE_CHROMIUM") == "1":
        pytest.fail("XCONF_REQUIRE_CHROMIUM=1 but no chromium binary is installed")
    pytest.skip("chromium is not installed (apt-get install -y chromium)")


def _run(binary: str, profile: Path, extra: list[str], url: str) -> subprocess.CompletedProcess:
    command = [binary, *FLAGS, f"--user-data-dir={profile}", *extra, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def open_page(
    html: Path, workdir: Path, screenshot: Path | None = None, fragment: str = ""
) -> PageRun:
    """Load ``html`` once for its DOM and console, once more for a screenshot."""
    binary = chromium_or_skip()
    url = html.resolve().as_uri() + fragment
    dumped = _run(
        binary,
        workdir / f"profile-dom{len(list(workdir.glob('profile-dom*')))}",
        ["--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom"],
        url,
    )
    if dumped.returncode != 0:
        raise AssertionError(f"chromium --dump-dom failed: {dumped.stderr[-2000:]}")
    console = tuple(m.group(1) for m in CONSOLE.finditer(dumped.stderr))
    body = BODY.search(dumped.stdout)
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(0))) if body else {}
    if screenshot is not None:
        shot = _run(
            binary,
            workdir / "profile-shot",
            [f"--screenshot={screenshot}", "--window-size=1400,3000"],
            url,
        )
        if shot.returncode != 0 or not screenshot.is_file():
            raise AssertionError(f"chromium --screenshot failed: {shot.stderr[-2000:]}")
    return PageRun(dumped.stdout, attributes, console, screenshot)
