"""The report in a real browser (headless Chromium, Debian's `chromium` package): pages
render from disk with no network, their scripts run (syntax highlighting, the search box
loading its index), and every link between pages resolves."""

import os
import re
import shutil
import subprocess
import tempfile
import pytest

from test_tlparse_fixtures import check_links
from tlparse.cli import main

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "fixtures", "torch-traces")


def find_chromium():
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install -y chromium)"),
              pytest.mark.skipif(not os.path.isdir(FIXTURES), reason="PyTorch trace fixtures not present")]


def chromium(*args, timeout=90):
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args],
            capture_output=True, text=True, timeout=timeout)
    return proc


def dom(url):
    proc = chromium("--dump-dom", url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("browser") / "report"
    assert main([os.path.join(FIXTURES, "graph_breaks"), "-o", str(out), "--no-browser"]) == 0
    return out


def test_front_page_renders(report):
    page = dom(f"file://{report}/index.html")
    assert "Graph breaks, costliest first" in page and 'class="trie"' in page
    assert "Failed to trace builtin operator" in page
    # the trie's fold markers are live (the script ran without errors up to them)
    assert '<span class="tog">-</span>' in page


def test_code_is_highlighted_by_the_page_script(report):
    graph = next(report.glob("artifacts/*_dynamo_output_graph.html"))
    page = dom(f"file://{graph}")
    assert '<span class="hl-kw">class</span>' in page and '<span class="hl-fn">' in page


def test_search_box_loads_its_index_from_disk(report):
    page = dom(f"file://{report}/search.html?q=x.sin()")
    hits = re.findall(r'<li><span class="tag">(\w[\w ]*)</span> <a href="([^"]+)"', page)
    assert hits, page[-3000:]
    assert any(kind == "code" and "dynamo_output_graph" in href for kind, href in hits)
    assert "match(es)" in page


def test_screenshot_of_the_report(report, tmp_path):
    shot = tmp_path / "index.png"
    proc = chromium(f"--screenshot={shot}", "--window-size=1280,2000", f"file://{report}/index.html")
    assert proc.returncode == 0 and shot.exists() and shot.stat().st_size > 20_000


def test_every_link_resolves(report):
    """The same static check the fast tests run on every fixture, on the report the
    browser opened."""
    check_links(report)
