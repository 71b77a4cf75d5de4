"""End to end: a user's program compiled by our engine with TORCH_TRACE set, then its
report. The graph break, the resume function it caused and the recompiles must all be
on the front page, linked to their compile pages."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from test_tlparse_fixtures import check_links
from tlparse.cli import main

PROGRAM = textwrap.dedent('''
    import torch
    import engine

    @engine.compile(backend="eager")
    def f(x):
        y = x.sin()
        print("hello from f")
        return y.cos() + 1

    @engine.compile(backend="eager")
    def g(x, c):
        return x * c

    @engine.compile(backend="eager", dynamic=True)
    def h(x, y):
        return x + y

    x = torch.randn(4)
    f(x)
    for i in range(3):
        g(x, 0.5 + i)
    h(torch.randn(4), torch.randn(4))
    h(torch.randn(6), torch.randn(1))
''')


@pytest.fixture(scope="module")
def engine_report(tmp_path_factory):
    pytest.importorskip("engine")
    import engine
    if not hasattr(engine, "compile"):
        pytest.skip("engine.compile not available")
    root = tmp_path_factory.mktemp("engine")
    (root / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "TORCH_TRACE": str(root / "trace")}
    env.pop("TORCH_LOGS", None)
    proc = subprocess.run([sys.executable, str(root / "prog.py")], env=env, capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = root / "report"
    assert main([str(root / "trace"), "-o", str(out), "--no-browser", "--strict"]) == 0
    return root, out


def test_graph_break_and_its_resume_function(engine_report):
    root, out = engine_report
    index = (out / "index.html").read_text()
    breaks = index.split('id="breaks"')[1].split('id="recompiles"')[0]
    assert breaks.count('<b id="break-') == 1
    assert f"{root}/prog.py:8" in breaks and "print(&#34;hello from f&#34;)" in breaks
    assert "[0/0]" in breaks and "resumed" in breaks    # the resume function it caused is linked
    directory = json.loads((out / "compile_directory.json").read_text())
    assert directory["[0/0]"]["status"] in ("ok", "restart")   # broke on print() (restarting or not)
    assert directory["[1/0]"]["status"] == "resumed"
    names = {a["name"] for a in directory["[0/0]"]["artifacts"]}
    assert "dynamo_output_graph" in names and "dynamo_cpp_guards_str" in names
    assert any(n.endswith("_MODIFIED_BYTECODE") for n in names)


def test_recompiles_name_the_failing_guard(engine_report):
    _, out = engine_report
    recompiles = (out / "index.html").read_text().split('id="recompiles"')[1].split('id="failures"')[0]
    assert "g <span class=muted>" in recompiles and "3 compiles" in recompiles
    assert "L[&#39;c&#39;] == 0.5" in recompiles
    # each row: the guard, what it expected, what it saw, and the user line that made it
    assert ("<td><code>L[&#39;c&#39;] == 0.5</code> <span class=\"muted\">(entry 2/0)</span></td>"
            "<td>0.5</td><td>1.5</td><td>prog.py:13 in g<br><code>return x * c</code></td>") in recompiles
    # a shape guard (duck sizing tied y to x) has its user line too
    assert ("<td><code>L[&#39;y&#39;].size()[0] == L[&#39;x&#39;].size()[0]</code> <span class=\"muted\">"
            "(entry 3/0)</span></td><td>true</td><td>false (1 == 6)</td><td>prog.py:17 in h<br>"
            "<code>return x + y</code></td>") in recompiles


def test_engine_report_pages_link(engine_report):
    _, out = engine_report
    check_links(out)
    timeline = json.loads((out / "chromium_events.json").read_text())
    assert any(e["name"] == "entire_frame_compile" for e in timeline)


def test_front_page_says_what_ran(engine_report):
    """The first thing on the page: the program, the compiler and its version, torch and
    Python, and the config the compiles ran with."""
    from importlib import metadata
    import torch
    root, out = engine_report
    index = (out / "index.html").read_text()
    run = index.split('<div id="run">')[1].split("</div>")[0]
    assert index.index('<div id="run">') < index.index('class="cards"')   # before everything else
    assert f"<td>program</td><td><code>python {root}/prog.py</code></td>" in run
    assert f"<td>compiler</td><td>engine {metadata.version('engine-observe')}</td>" in run
    assert f"<td>torch</td><td>{torch.__version__}</td>" in run
    assert f"<td>Python</td><td>{sys.version.split()[0]}</td>" in run
    assert "<td><code>cache_size_limit</code></td><td><code>8</code></td>" in run    # the knobs, with values
    assert "TORCH_TRACE=" in run                                                      # the switches it ran with
    plain = tmp_plain(root)
    assert f"program: python {root}/prog.py" in plain and "compiler: engine " in plain


def tmp_plain(root):
    out = root / "plain"
    if not out.exists():
        assert main([str(root / "trace"), "-o", str(out), "--plain-text"]) == 0
    return (out / "index.txt").read_text()
