"""The report as a person sees it: rendered by headless Chromium, screenshot taken, content checked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest


def chromium() -> str | None:
    """Debian's chromium, installed here when missing and we are root (the test set-up)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return None
    from apt_lock import apt_install

    apt_install("chromium")
    return shutil.which("chromium")


# appended to a copy of the report: once the page has drawn the first page's figure, what the browser made of
# it (decoded: its natural width; drawn: its box, the page column's width, the window's height) as JSON
MEASURE = """<script>
(function () {
  function measure() {
    var img = document.querySelector('#growlm-answer img');
    if (!img || !img.complete || !img.naturalWidth) { setTimeout(measure, 100); return; }
    var box = img.getBoundingClientRect(), column = img.closest('.prose');
    var out = document.createElement('pre');
    out.id = 'growlm-measured';
    out.textContent = JSON.stringify({natural: img.naturalWidth, width: box.width, top: box.top,
      column: column ? column.getBoundingClientRect().width : 0, window: window.innerHeight});
    document.body.appendChild(out);
  }
  window.addEventListener('load', function () { setTimeout(measure, 100); });
})();
</script>"""


def render(browser: str, html, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    base = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--proxy-server=127.0.0.1:9", "--virtual-time-budget=15000", "--window-size=1400,1000"]
    return subprocess.run([*base, *args, f"file://{html}"], capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_report_renders_with_the_comparison_and_plots(tiny_run, tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("Chromium is not installed and cannot be installed here (needs root and apt-get)")
    report = tiny_run / "results" / "tiny" / "report.html"
    dom = render(browser, report, "--dump-dom").stdout
    assert len(dom) > 10000, "the report page did not render"
    # the first page states the answer, a sentence per arm, with numbers and without Python reprs
    import pandas as pd

    comparison = pd.read_csv(tiny_run / "results" / "tiny" / "eval" / "comparison.csv")
    m0 = comparison["m0_final_val_loss"].iloc[0]
    assert "growlm: does growing pay?" in dom
    per_param = (f"({comparison['tokens_per_param'].iloc[0]:.3g} tokens per non-embedding parameter, "
                 f"{comparison['tokens_per_param_total'].iloc[0]:.3g} per parameter; "
                 f"{comparison['m0_passes'].iloc[0]:.3g} passes over its training text, "
                 f"the members {comparison['members_passes'].iloc[0]:.3g})")
    assert (f"M_0 (width 32, 2 layers) trained from scratch for 24,000 tokens {per_param} ends at validation loss "
            f"{m0:.3f}") in dom
    for _, row in comparison.iterrows():
        assert f"<strong>{row['method']}</strong>" in dom, row["method"]
        assert f"it ended at {row['m1_final_val_loss']:.3f}" in dom or f"ended at {row['m1_final_val_loss']:.3f}" in dom
    # the description, no reprs, a space after "method(s)"
    assert "growth method(s) hyperclone+zero_block, concat+zero_block into a model of width 32" in dom
    assert "The models were all computed in one mode: eager, 1 CPU thread." in dom
    text = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)  # what a reader sees, not the page's code
    assert "['" not in text and "[2]" not in text, "a Python list repr on the report page"
    for item in ("comparison.html", "loss_vs_flops.svg", "cost_ratio.svg", "scaling.svg", "corpus_stats.html"):
        assert item in dom, f"{item} is not on the rendered report page"
    for category in ("Corpus", "Training", "Comparison"):
        assert category in dom
    first_page_figure(browser, tiny_run / "results" / "tiny", tmp_path)
    shot = tmp_path / "report.png"
    render(browser, report, f"--screenshot={shot}")
    assert shot.is_file() and shot.stat().st_size > 20000  # a blank page is a few kB
    # the comparison table itself, as a browser draws it
    table_dom = render(browser, tiny_run / "results/tiny/report/comparison.html", "--dump-dom").stdout
    assert "cost ratio within one schedule (small counted)" in table_dom and "M_0 final val loss" in table_dom
    # the columns that decide lead the table: by envelope (here one run per arm: a cosine run of one budget has
    # none, and says so), then within one schedule
    headers = re.findall(r"<th>([^<]+)</th>", table_dom.split('id="comparison"')[1])
    assert headers[:10] == ["method", "arm", "cost ratio by envelope (small counted)",
                            "cost ratio by envelope (small models free)", "reached M_0's loss within one schedule",
                            "cost ratio within one schedule (small counted)",
                            "cost ratio within one schedule (small models free)", "M_0 final val loss",
                            "M_1 final val loss", "loss gap at equal total FLOPs"], headers[:12]
    assert "one run per arm" in table_dom


def first_page_figure(browser: str, results, tmp_path) -> None:
    """Page 1 shows the loss-against-FLOPs figure (report/answer.svg, inside the page): the browser decodes
    it and draws it across the page's column, at the top of the first screen, its smallest text at 10 CSS
    pixels or more."""
    import html as html_text
    import json

    page = (results / "report.html").read_text()
    cut = page.rindex("</body>")
    (tmp_path / "measured.html").write_text(page[:cut] + MEASURE + page[cut:])
    dom = render(browser, tmp_path / "measured.html", "--dump-dom").stdout
    found = re.search(r'<pre id="growlm-measured">(.*?)</pre>', dom)
    assert found, "the first page's figure was not drawn (missing, or not an image the browser decodes)"
    seen = json.loads(html_text.unescape(found.group(1)))
    assert seen["natural"] > 0 and 400 <= seen["column"] <= 800, seen  # the report's first-page column: 32 rem
    # across the column, in the first screen (not above it either, where a centred page taller than the window
    # would put its top out of reach)
    assert seen["width"] >= 0.95 * seen["column"] and 0 <= seen["top"] < seen["window"] / 2, seen
    svg = (results / "report" / "answer.svg").read_text()
    view_width = float(re.search(r'viewBox="0 0 ([0-9.]+) ', svg).group(1))
    smallest = min(float(v) for v in re.findall(r"font-size: ([0-9.]+)px", svg))
    assert smallest * seen["width"] / view_width >= 10, (smallest, seen, view_width)  # text, not a thumbnail
