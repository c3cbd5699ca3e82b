"""The HTML page: self-contained, ordered, marked, and rendered cleanly by Chromium."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from chromium_harness import open_page
from report_fixtures import case_id_for

from xconf.report.writer import write_report

OFFSET = case_id_for({"logp.backend": "smoke_only.logp_offset"})


@pytest.fixture
def html(run_dir: Path, tmp_path: Path) -> Path:
    written = write_report(run_dir, tmp_path / "report.html")
    assert written.format == "html" and written.path.is_file()
    return written.path


def test_page_is_self_contained(html: Path) -> None:
    text = html.read_text(encoding="utf-8")
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:|#)""", text)
    assert "http://" not in text and "https://" not in text
    assert text.count('src="data:image/png;base64,') >= 2


def test_failing_case_leads_the_failures_with_its_threshold_line(html: Path) -> None:
    text = html.read_text(encoding="utf-8")
    rows = re.findall(r'<tr class="row-(\w+)[^"]*" data-case-id="([^"]+)"', text)
    assert rows[0][0] == "pass"  # the baseline, pinned first
    assert rows[1] == ("fail", OFFSET)
    figure = re.search(
        rf'<figure class="case-plot" data-plot="histogram\+profile" data-case-id="{OFFSET}" '
        r'data-threshold-line="([^"]+)"',
        text,
    )
    assert figure is not None and float(figure.group(1)) == 1e-5
    articles = re.findall(r'<article class="card case res-(\w+)" id="case-([^"]+)"', text)
    assert articles[1] == ("fail", OFFSET)


def test_report_renders_in_headless_chromium(html: Path, tmp_path: Path) -> None:
    page = open_page(html, tmp_path, screenshot=tmp_path / "report.png")
    assert page.body_attributes.get("data-report-ready") == "1", page.body_attributes
    loaded, total = page.body_attributes["data-images-loaded"].split("/")
    assert int(total) >= 3 and loaded == total
    assert page.body_attributes["data-console-errors"] == "0"
    assert page.console == (), page.console
    assert page.screenshot is not None and page.screenshot.stat().st_size > 50_000
    keep = os.environ.get("XCONF_REPORT_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(page.screenshot, Path(keep) / "report.png")


def test_the_console_check_would_catch_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<html><head><script>window.addEventListener('load', function () {"
        " document.body.setAttribute('data-report-ready', '1'); missingFunction(); });"
        "</script></head><body><img src='data:image/png;base64,AAAA'></body></html>"
    )
    page = open_page(bad, tmp_path)
    assert any("missingFunction" in line for line in page.console)


def test_chromium_absence_skips_unless_required(monkeypatch: pytest.MonkeyPatch) -> None:
    import chromium_harness

    monkeypatch.setattr(chromium_harness.shutil, "which", lambda name: None)
    monkeypatch.delenv("XCONF_REQUIRE_CHROMIUM", raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        chromium_harness.chromium_or_skip()
    monkeypatch.setenv("XCONF_REQUIRE_CHROMIUM", "1")
    with pytest.raises(pytest.fail.Exception, match="XCONF_REQUIRE_CHROMIUM=1"):
        chromium_harness.chromium_or_skip()


def test_verdict_table_sorts_in_the_browser_keeping_the_baseline_pinned(
    html: Path, tmp_path: Path
) -> None:
    def order(fragment: str) -> list[str]:
        page = open_page(html, tmp_path, fragment=fragment)
        table = page.dom[page.dom.index('id="verdict-table"') :]
        table = table[: table.index("</table>")]
        return re.findall(r'<tr class="row-[^"]*" data-case-id="([^"]+)"', table)

    baseline = case_id_for({})
    by_max_asc = order("#sort=verdict-table:9:asc")  # column 9: max |diff|
    assert by_max_asc[0] == baseline
    assert by_max_asc[-2:] == [OFFSET, case_id_for({"rollout.dtype": "bfloat16"})]
    by_max_desc = order("#sort=verdict-table:9:desc")
    assert by_max_desc[:3] == [baseline, case_id_for({"rollout.dtype": "bfloat16"}), OFFSET]


def test_hostile_artifact_text_cannot_run_script(tmp_path: Path) -> None:
    import numpy as np
    from report_fixtures import CaseSpec, logprobs, write_run

    hostile = "</script><script>document.body.setAttribute('data-pwned','1')</script>"
    base = logprobs(1, 8, 0)
    active = np.ones(base.shape, dtype=bool)
    specs = [
        CaseSpec({}, base, base, active, kind="baseline"),
        CaseSpec({"logp.backend": hostile}, base, base + 1.0, active),
    ]
    run = write_run(tmp_path / "out", "exp-hostile", specs)
    page_path = write_report(run, tmp_path / "report.html").path
    text = page_path.read_text(encoding="utf-8")
    assert hostile not in text and "&lt;/script&gt;" in text
    csp = re.search(r'Content-Security-Policy" content="([^"]+)"', text)
    assert csp is not None and re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'", csp.group(1))
    page = open_page(page_path, tmp_path)
    assert page.body_attributes.get("data-report-ready") == "1"
    assert "data-pwned" not in page.body_attributes
