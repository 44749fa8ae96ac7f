"""The built pages as a browser lays them out (headless Chromium): the benchmarks' tables read as tables.

A Markdown table's right-aligned columns must render right-aligned (the theme has no
rule for MyST's ``text-right``), the headers of the eleven-column lateness tables must
stay on one line, and no benchmark table may need a sideways scrollbar at the docs'
page width.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import IN_CI

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[2]

#: Debian's package (apt-get install chromium; .ci/run installs it). Without it the test is skipped, and says
#: so; under CI=true it fails.
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

#: The width the docs are designed for (docs/_static/ladder.css widens the page to 1100 px).
WINDOW = "1280,2000"

#: Measures the page's tables once laid out, and writes the answer into the DOM for --dump-dom.
PROBE = """
<script>
window.addEventListener("load", () => {
  const tables = [...document.querySelectorAll("table.docutils")].map((table, index) => {
    const right = [...table.querySelectorAll(".text-right")];
    return {
      index,
      headers: [...table.querySelectorAll("thead th")].map(th => th.textContent.trim()),
      columns: table.querySelectorAll("thead th").length,
      misaligned: right.filter(cell => getComputedStyle(cell).textAlign !== "right").length,
      aligned: right.length,
      lines: Math.max(0, ...[...table.querySelectorAll("thead th")].map(th => {
        const style = getComputedStyle(th);
        const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.2;
        return Math.round((th.clientHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom)) / line);
      })),
      overflow: table.scrollWidth - table.clientWidth,
    };
  });
  const out = document.createElement("pre");
  out.id = "ladder-probe";
  out.textContent = JSON.stringify(tables);
  document.body.appendChild(out);
});
</script>
"""


@pytest.fixture(scope="module")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("html")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def layout(page: Path) -> list[dict[str, object]]:
    """Each table of ``page`` as Chromium lays it out at :data:`WINDOW`."""
    probed = page.with_name(page.stem + "-probed.html")
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    done = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WINDOW}",
                           "--virtual-time-budget=10000", "--dump-dom", probed.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="ladder-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"Chromium did not lay the page out: {done.stderr[-2000:]}"
    return list(json.loads(found.group(1).replace("&quot;", '"')))


@pytest.mark.skipif(CHROMIUM is None and not IN_CI, reason="needs Chromium (Debian: apt-get install chromium)")
@pytest.mark.timeout(900)
def test_the_benchmark_tables_align_their_figures_keep_wide_headers_on_one_line_and_fit(html: Path) -> None:
    assert CHROMIUM is not None, "CI needs Chromium to lay the pages out: apt-get install chromium"
    tables = layout(html / "benchmarks.html")
    assert sum(t["aligned"] for t in tables) > 100, "the benchmarks' figure columns are marked text-right"
    assert max(t["columns"] for t in tables) >= 11, "the eleven-column lateness table is there"
    misaligned = [t["headers"] for t in tables if t["misaligned"]]
    assert not misaligned, f"figures not right-aligned in {misaligned}"
    wrapped = [t["headers"] for t in tables if t["columns"] >= 9 and t["lines"] > 1]
    assert not wrapped, f"a header of a wide table wraps: {wrapped}"
    wide = [(t["headers"], t["overflow"]) for t in tables if t["overflow"] > 1]
    assert not wide, f"tables wider than the text column (px too wide): {wide}"
