"""The report's replay timeline and kernel cache pages, from a real trace: a program
compiled with inductor against a shared kernel cache (first float32, then float64: a
miss the page explains), and an engine.debug.replay of a function with a graph break."""

import html
import io
import re

import torch

import engine
import engine.debug
from engine import config
from engine.codegen import cache
from observe import trace

from tlparse.cli import main


def scale(t, k):
    s = t * k
    return s - 1


def step(x, y):
    z = x + y
    z = scale(z, 2)
    print("<b>checkpoint</b>")
    return z.relu()


def gelu_twice(x):
    return torch.nn.functional.gelu(x) * 2


def write_report(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "cache_dir", str(tmp_path / "cache"))
    monkeypatch.setattr(cache, "_loaded", {})      # as in a new process: no library loaded yet
    monkeypatch.setattr(cache, "_compile_seconds", {})
    trace.start(str(tmp_path / "trace"))
    try:
        engine.reset()
        compiled = engine.compile(gelu_twice)
        compiled(torch.randn(8, 8))
        compiled(torch.randn(8, 8, dtype=torch.float64))     # a new graph: misses the kernel cache
        engine.reset()
        engine.compile(gelu_twice)(torch.randn(8, 8))         # the first graph again: found in the cache
        engine.debug.replay(step, commands="q", out=io.StringIO())(torch.ones(4), torch.ones(4))
    finally:
        trace.stop()
    out = tmp_path / "report"
    assert main([str(tmp_path / "trace"), "-o", str(out), "--no-browser"]) == 0
    return out


def cells(page, row_pattern):
    row = re.search(row_pattern, page, re.S).group(0)
    return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def test_the_cache_page_shows_each_graphs_result_the_miss_reason_and_the_saving(tmp_path, monkeypatch):
    out = write_report(tmp_path, monkeypatch)
    page = (out / "cache.html").read_text()
    statuses = re.findall(r'<td class="cache-(\w+)">', page)
    assert statuses[:3] == ["miss", "miss", "hit"]
    second = cells(page, r"<tr><td><a[^>]*>\[0/1\]</a>.*?</tr>")
    assert second[2] == "miss" and second[4] == "input 0: dtype torch.float32 -> torch.float64"
    third = cells(page, r"<tr><td><a[^>]*>\[0/0\]</a>(?:(?!</tr>).)*cache-hit.*?</tr>")
    assert third[6].endswith(" ms") or third[6].endswith(" s")          # the seconds the hit saved
    index = (out / "index.html").read_text()
    assert 'href="cache.html"' in index and "1 hit, 2 misses, 0 bypasses; the hits saved" in index


def test_the_replay_page_is_a_timeline_of_the_users_lines_with_the_graph_beside_it(tmp_path, monkeypatch):
    out = write_report(tmp_path, monkeypatch)
    page = (out / "replay.html").read_text()
    assert "Record 1:" in page and "1 graph break" in page
    mul_row = cells(page, r'<tr class="row" data-row="\d+">(?:(?!</tr>).)*s = t \* k.*?</tr>')
    assert mul_row[2].split()[0] == "scale" and "%mul = operator.mul(%add, 2)" in mul_row[5]
    broken = cells(page, r'<tr class="row brk".*?</tr>')
    assert "graph break: Call to a builtin" in broken[3]
    assert "<b>checkpoint</b>" not in page and "&lt;b&gt;checkpoint&lt;/b&gt;" in page   # escaped
    assert 'href="replay.html"' in (out / "index.html").read_text()


def test_the_plain_report_lists_the_cache_results_too(tmp_path, monkeypatch):
    write_report(tmp_path, monkeypatch)
    plain = tmp_path / "plain"
    assert main([str(tmp_path / "trace"), "-o", str(plain), "--plain"]) == 0
    text = (plain / "index.txt").read_text()
    section = text.split("== Kernel cache: 1 hit, 2 misses, 0 bypasses\n", 1)[1].split("\n\n", 1)[0]
    assert "[0/1] graph" in section and "miss: kernel0_gelu_mul\n    input 0: dtype torch.float32 -> torch.float64" \
        in section
    assert "Kernel cache: the hits saved" in (plain / "timings.txt").read_text()
