"""tlparse on real PyTorch 2.13 traces (../shared/fixtures/torch-traces): what a person
reads on the front page and the compile pages, and what scripts read from the exports."""

import glob
import json
import os
import re
from html.parser import HTMLParser
from urllib.parse import unquote, urlparse

import pytest

from tlparse.cli import main

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "fixtures", "torch-traces")
pytestmark = pytest.mark.skipif(not os.path.isdir(FIXTURES), reason="PyTorch trace fixtures not present")


def log_of(case):
    (path,) = glob.glob(f"{FIXTURES}/{case}/*.log")
    return path


def report(tmp_path, case, *flags):
    out = tmp_path / f"out_{case}"
    assert main([os.path.join(FIXTURES, case), "-o", str(out), "--no-browser", *flags]) == 0
    return out


def text_of(path):
    """The visible text of a page (tags dropped, entities kept)."""
    return re.sub(r"<[^>]+>", " ", path.read_text())


def test_graph_breaks_are_deduplicated_ranked_and_explained(tmp_path):
    out = report(tmp_path, "graph_breaks")
    index = (out / "index.html").read_text()
    section = index.split('id="breaks"')[1].split('id="recompiles"')[0]
    # three distinct breaks, each with the user line, the reason and a hint
    reasons = re.findall(r'<b id="break-\d+">([^<]+)</b>', section)
    assert sorted(reasons) == ["Data-dependent branching", "Failed to trace builtin operator",
                               "Unsupported Tensor.item() call with capture_scalar_outputs=False"]
    assert "case_graph_breaks.py:6" in section and "print(&#34;hello from inside compiled fn&#34;)" in section
    assert "Use `torch.cond` to express dynamic control flow." in section
    # ranked by what fixing each saves: the print() break's restart happened in the process's
    # first compile [0/0], whose extra time is warm-up (charged to no one); the .item() break
    # restarted [4/0] and caused the resume function [5/0]
    assert reasons[0] == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    first_row = section.split('<b id="break-0">')[1].split("</tr>")[0]
    assert "[5/0]" in first_row  # the resume function it caused


def test_stack_trie_colors_compiles_by_outcome(tmp_path):
    out = report(tmp_path, "graph_breaks")
    trie = (out / "index.html").read_text().split('id="trie"')[1].split('id="compiles"')[0]
    links = dict((cid, status) for status, cid in re.findall(r'class="cid status-(\w+)"[^>]*>\[([^\]]+)\]', trie))
    assert links["0/0"] == "restart"  # graph break in print(): analysis restarted, red
    assert links["1/0"] == "resumed"  # its resume function, reached through the break: light green
    assert links["2/0"] == "ok"       # broke on `if x.sum() > 0` without a restart: dark green ...
    assert re.search(r'>\[2/0\]</a> <span class="tag">graph break</span>', trie)   # ... tagged
    assert set(links) == {"0/0", "1/0", "2/0", "3/0", "4/0", "5/0"}
    # the resume functions hang under the <module> line that called them
    assert trie.index("out = c(x)") < trie.index("torch_dynamo_resume_in_f_print_at_6")
    assert (out / "compiles" / "1_0.html").exists()


def test_recompiles_show_failing_guard_expected_actual_and_user_line(tmp_path):
    out = report(tmp_path, "recompiles")
    section = (out / "index.html").read_text().split('id="recompiles"')[1].split('id="failures"')[0]
    assert "size mismatch at index 0. expected 3, actual 4" in section
    row = re.search(r"<tr><td><a [^>]*>\[1/2\]</a></td>(.*?)</tr>", section).group(1)
    cells = re.findall(r"<td>(.*?)</td>", row)
    assert "c == 2.5" in cells[0] and cells[1] == "2.5" and cells[2] == "3.5"  # actual: what [1/2] saw
    assert "case_recompiles.py:13 in g" in cells[3] and "return x * c" in cells[3]


def test_failures_and_restarts_listed(tmp_path):
    out = report(tmp_path, "recompiles")
    fails = (out / "index.html").read_text().split('id="failures"')[1].split('id="slowest"')[0]
    assert "Unsupported" in fails and "Dynamo recompile limit exceeded" in fails and "[1/8]" in fails
    out = report(tmp_path, "compile_error")
    index = (out / "index.html").read_text()
    fails = index.split('id="failures"')[1].split('id="slowest"')[0]
    assert "BackendCompilerFailed" in fails and "boom from bad_backend" in fails
    assert "restart" in fails and "TypeError when making fake tensor call" in fails
    page = (out / "compiles" / "1_0.html").read_text()
    assert 'status-error' in page and "traceback</a>" in page  # the dynamo_error artifact is linked


def test_compile_page_links_every_artifact(tmp_path):
    out = report(tmp_path, "inductor")
    page = (out / "compiles" / "0_1.html").read_text()
    for name in ("aot_joint_graph", "aot_forward_graph", "aot_backward_graph", "inductor_output_code",
                 "dynamo_output_graph", "dynamo_cpp_guards_str"):
        assert f">{name}</a>" in page, name
    for href in re.findall(r'href="\.\./(artifacts/[^"]+)"', page):
        assert (out / href).exists(), href
    assert "GLOBAL_STATE changed: grad_mode" in page                  # why it recompiled
    assert 'id="compilation_metrics"' in page and "Time per stage" in page
    code = next(out.glob("artifacts/0_1-*_inductor_output_code.html")).read_text()
    assert '<pre data-lang="python">' in code


def test_self_description_names_versions_and_config(tmp_path):
    out = report(tmp_path, "dynamic")
    about = text_of(out / "index.html").split("About this report")[1]
    assert "2.13.0+cpu" in about and "cf30153c4c131c8164ee7798e5022d810682e2cb" in about
    assert "dedicated_log_torch_trace_t64hojoq.log" in about and "tlparse 0.1.0" in about
    assert "create_symbol: 5" in about
    cfg = re.search(r'href="(artifacts/global-\d+_dynamo_config\.html)"', (out / "index.html").read_text()).group(1)
    assert "recompile_limit" in (out / cfg).read_text()


def test_exports_are_valid_for_scripts(tmp_path):
    out = report(tmp_path, "graph_breaks")
    lines = (out / "raw.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == 164 and events[0]["tlparse"]["line"] == 1
    graph = next(e for e in events if "dynamo_output_graph" in e)
    assert (out / graph["tlparse"]["payload_file"]).exists()
    timeline = json.loads((out / "chromium_events.json").read_text())
    assert len(timeline) == 104 and {e["ph"] for e in timeline} == {"B", "E"}
    directory = json.loads((out / "compile_directory.json").read_text())
    assert directory["[0/0]"]["status"] == "restart" and directory["[0/0]"]["artifacts"]


def test_all_ranks_points_at_diverging_rank(tmp_path):
    out = report(tmp_path, "two_ranks", "--all-ranks-html")
    index = text_of(out / "index.html")
    assert "Ranks diverge" in index
    assert "compiled by rank(s) 1, not by 0" in index           # rank 1's extra compile [0/1]
    assert "rank 0: 1 compile(s), rank 1: 2 compile(s)" in index
    assert "size mismatch at index 0. expected 5, actual 9" in index
    assert "f32[4, 3]" in index and "f32[5, 3]" in index       # how the [0/0] graphs differ
    for r in (0, 1):
        assert (out / f"rank_{r}" / "index.html").exists()
    timeline = json.loads((out / "chromium_events.json").read_text())
    assert {e["pid"] for e in timeline} == {0, 1}


def test_search_index_covers_frames_reasons_and_code(tmp_path):
    out = report(tmp_path, "graph_breaks")
    entries = []
    for shard in sorted(out.glob("search/shard_*.js")):
        text = shard.read_text()
        assert text.startswith("TL_SEARCH.add(") and text.rstrip().endswith(");")
        entries += json.loads(text[len("TL_SEARCH.add("):-3])
    kinds = {e["k"] for e in entries}
    assert {"frame", "graph break", "code"} <= kinds
    assert any("l_x_.sin()" in e.get("x", "") for e in entries if e["k"] == "code")
    search = (out / "search.html").read_text()
    assert '"shards": ' in search and 'id="q"' in search


class Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        for key in ("href", "src", "action"):
            if a.get(key):
                self.links.append(a[key])


def check_links(report_dir):
    """Every href/src of every page points at a file of the report (no network, no CDN),
    and every #anchor exists on its page."""
    pages = {p.resolve(): Links() for p in report_dir.rglob("*.html")}
    for path, parser in pages.items():
        parser.feed(path.read_text())
    assert len(pages) > 3
    for path, parser in pages.items():
        for link in parser.links:
            url = urlparse(link)
            assert url.scheme == "" and url.netloc == "", f"{path}: external link {link}"
            target = (path.parent / unquote(url.path)).resolve() if url.path else path
            assert target.exists(), f"{path}: broken link {link}"
            if url.fragment and target.suffix == ".html":
                assert url.fragment in pages[target].ids, f"{path}: missing anchor {link}"


@pytest.mark.parametrize("case", ["graph_breaks", "recompiles", "dynamic", "inductor", "compile_error"])
def test_every_link_resolves_and_nothing_is_fetched_from_the_network(tmp_path, case):
    out = report(tmp_path, case)
    check_links(out)
    for path in out.rglob("*.html"):
        assert "http://" not in re.sub(r"<pre.*?</pre>", "", path.read_text(), flags=re.S).replace(
            "chrome://tracing", "")


def test_all_ranks_links_resolve(tmp_path):
    check_links(report(tmp_path, "two_ranks", "--all-ranks-html"))


def test_a_torch_trace_front_page_names_torch_compile_and_its_commit(tmp_path):
    out = report(tmp_path, "graph_breaks")
    run = (out / "index.html").read_text().split('<div id="run">')[1].split("</div>")[0]
    assert "<td>compiler</td><td>torch.compile</td>" in run
    assert "<td>torch</td><td>2.13.0+cpu (commit cf30153c4c13)</td>" in run
    assert "<td>program</td><td>not in the trace</td>" in run
