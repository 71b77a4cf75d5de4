"""The report, second edition (issue 25): pages from Jinja2 templates with autoescaping,
pictures (the captured graph coloured by kernel, compile time per frame and stage), one
"what to fix first" ranking shared by the HTML and --plain-text, and `tlparse run`."""

import glob
import html
import os
import re
import subprocess
import sys
import textwrap

import pytest

from test_tlparse_fixtures import check_links
from tlparse import fixfirst, templating
from tlparse.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A break hit once, and a break in a function called with 4 shapes: 4 compiles that broke
# there + 4 resume functions = 8 frames. The first compile of the process also carries the
# warm-up (imports, first backend call), which must not make the once-hit break look costly.
FIX_FIRST = textwrap.dedent('''
    import torch
    import engine

    def once(x):
        y = x.sin()
        print("debug once")
        return y.cos()

    def per_shape(x):
        y = x * 2
        print("shape", y.shape[0])
        return y + 1

    f = engine.compile(once, backend="eager")
    g = engine.compile(per_shape, backend="eager", dynamic=False)
    f(torch.ones(3))
    for n in (2, 3, 4, 5):
        g(torch.ones(n))
''')

# inductor: the graph page colours each node by the kernel it was fused into
PICTURE = textwrap.dedent('''
    import torch
    import engine

    @engine.compile
    def f(x, w):
        h = torch.relu(x @ w)
        y = h.sin() * 2 + 1
        print("break")
        return y.sum(dim=1).cos()

    f(torch.randn(4, 8), torch.randn(8, 8))
''')


def traced(tmp_path, name, program):
    script = tmp_path / f"{name}.py"
    script.write_text(program)
    trace = tmp_path / f"{name}_trace"
    proc = subprocess.run([sys.executable, str(script)], env={**os.environ, "TORCH_TRACE": str(trace)},
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return trace


@pytest.fixture(scope="module")
def fix_first(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixfirst")
    trace = traced(root, "prog", FIX_FIRST)
    assert main([str(trace), "-o", str(root / "html"), "--no-browser"]) == 0
    assert main([str(trace), "-o", str(root / "plain"), "--plain-text"]) == 0
    return root


def text_of(fragment):
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment))


def test_the_break_that_costs_eight_frames_ranks_above_the_one_hit_once(fix_first):
    index = (fix_first / "html" / "index.html").read_text()
    section = index.split('id="fix-first"')[1].split('id="breaks"')[0]
    rows = section.split("<tbody>")[1].split("</tr>")[:-1]
    sites = [text_of(r) for r in rows]
    # one row per break site and per recompile site, each with its user line, hint and docs
    assert len(sites) == 4, sites
    shape = next(i for i, s in enumerate(sites) if 'print("shape", y.shape[0])' in s)
    once = next(i for i, s in enumerate(sites) if 'print("debug once")' in s)
    assert shape < once == len(sites) - 1                             # the 8-frame break first, the once-hit last
    assert "graph break" in sites[shape] and "docs/graph_breaks.md (GB0001)" in sites[shape]
    assert "Move the call out of the compiled function" in sites[shape]
    assert re.search(r"\b4\s+[\d.]+ s", sites[shape])              # 4 extra graphs: the resume functions
    assert re.search(r"\b1\s+[\d.]+ s", sites[once])
    recompile = next(s for s in sites if "recompile" in s and "y = x * 2" in s)
    assert "size mismatch" in recompile and "mark_dynamic" in recompile and "docs/dynamic_shapes.md" in recompile
    seconds = [float(x) for x in re.findall(r'<td class=num>([\d.]+) s</td>', section)]
    assert seconds == sorted(seconds, reverse=True)                 # the first row saves most
    # the graph-break table lists the breaks in the same order, its anchors are the ranking's
    breaks = index.split('id="breaks"')[1].split('id="recompiles"')[0]
    assert breaks.index('print(&#34;shape&#34;') < breaks.index('print(&#34;debug once&#34;)')
    assert 'href="#break-0"' in section and '<b id="break-0">Call to a builtin' in breaks
    assert breaks.index('<b id="break-0">') < breaks.index('print(&#34;shape&#34;')


def test_warm_up_is_charged_to_no_one(fix_first):
    index = (fix_first / "html" / "index.html").read_text()
    warm = re.search(r"warm-up \(([\d.]+) (ms|s),", index)
    assert warm, "the front page names the warm-up it left out"
    warm_s = float(warm.group(1)) / (1000 if warm.group(2) == "ms" else 1)
    timings = (fix_first / "plain" / "timings.txt").read_text()
    costs = [float(x) for x in re.findall(r"extra graph\(s\), ([\d.]+) s\)", timings)]
    assert costs and all(c < warm_s for c in costs)   # no site is charged the first compile's extra time


def test_plain_text_has_the_same_ranking(fix_first):
    index = (fix_first / "html" / "index.html").read_text()
    section = index.split('id="fix-first"')[1].split('id="breaks"')[0]
    html_order = [text_of(m) for m in re.findall(r'<a href="#[^"]+">(.*?)</a>', section)]
    plain = (fix_first / "plain" / "index.txt").read_text()
    block = plain.split("== What to fix first")[1].split("\n== ")[0]
    plain_order = re.findall(r"^\d+\. \[[a-z ]+\] (.*?)  \(\d+ extra graph", block, re.M)
    assert plain_order == html_order
    timings = (fix_first / "plain" / "timings.txt").read_text().split("What to fix first")[1]
    assert re.findall(r"^\d+\. \[[a-z ]+\] (.*?)  \(", timings, re.M) == html_order
    assert "at /" in block and "fix: " in block and "docs: " in block
    assert not re.search(r"\d\.\d{3,} s", plain.split("== About")[1])   # no seconds in index.txt


def test_warmup_is_the_first_compiles_excess_over_the_median():
    class C:
        def __init__(self, order, t):
            self.order, self.t = order, t

        def compile_time_s(self):
            return self.t

    assert fixfirst.warmup_s([C(0, 1.0), C(1, 0.1), C(2, 0.2), C(3, 0.3)]) == pytest.approx(0.8)
    assert fixfirst.warmup_s([C(0, 0.1), C(1, 0.5)]) == 0.0      # the first was not the slow one
    assert fixfirst.warmup_s([C(0, 1.0)]) == 0.0                  # nothing to compare with


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    root = tmp_path_factory.mktemp("picture")
    trace = traced(root, "prog", PICTURE)
    out = root / "report"
    assert main([str(trace), "-o", str(out), "--no-browser"]) == 0
    return out


def test_graph_page_draws_the_graph_coloured_by_kernel(picture):
    page = (picture / "compiles" / "0_0.html").read_text()
    assert '<h2 id="graph">Graph</h2>' in page
    svg_url = re.search(r'<object type="image/svg\+xml" data="\.\./(pictures/graph_\d+\.svg)"', page).group(1)
    svg = (picture / svg_url).read_text()
    # every node of the captured graph, the fused ones in their kernel's colour
    for node in ("l_x_", "l_w_", "matmul", "relu", "sin", "mul", "add", "output"):
        assert f"<title>{node} = " in svg or f"<title>{node.upper()} = " in svg or node in svg, node
    fills = dict(re.findall(r"<title>(\w+) = [^<]*\(kernel (\w+)\)</title><rect [^>]*fill=\"(#\w+)\"", svg)
                 and [(n, f) for n, _, f in re.findall(
                     r"<title>(\w+) = [^<]*\(kernel (\w+)\)</title><rect [^>]*fill=\"(#\w+)\"", svg)])
    assert {"relu", "sin", "mul", "add"} <= set(fills)
    assert len({fills[n] for n in ("relu", "sin", "mul", "add")}) == 1          # one fused kernel, one colour
    assert fills["matmul"] != fills["relu"]                                     # the mm is a kernel of its own
    assert "kernel0_relu_sin_mul_add" in page                                   # the legend names the kernel
    # the graph ended at the print(): drawn as a cut below it
    assert "graph break: Call to a builtin that cannot be traced" in svg and "stroke-dasharray" in svg


def test_front_page_draws_compile_time_per_frame_and_stage(picture):
    index = (picture / "index.html").read_text()
    chart = index.split('id="time-chart"')[1].split('id="fix-first"')[0]
    bars = re.findall(r'<a href="(compiles/[^"]+)"><text class="label"[^>]*>([^<]+)</text>', chart)
    assert [label for _, label in bars] and {href for href, _ in bars} == {"compiles/0_0.html", "compiles/1_0.html"}
    stages = set(re.findall(r"<title>[^:<]+: ([\w ]+?) [\d.]+ m?s</title>", chart))
    assert "bytecode_tracing" in stages and len(stages) >= 2
    check_links(picture)


def test_everything_shown_is_escaped_by_the_template_engine(tmp_path):
    """A frame named like markup stays text on every page (autoescape), and the one place
    that marks text safe is the code filter, which escapes first."""
    bad = "<img src=x onerror=alert(1)>"
    out = templating.render("artifact.html", depth=1, title=bad, label=bad, name=bad, slug="0_0", lineno=1,
                            size=len(bad), text=bad, lang="text", picture=False)
    assert bad not in out and "&lt;img src=x onerror=alert(1)&gt;" in out
    assert str(templating.code_text(bad)) == "&lt;img src=x onerror=alert(1)&gt;"
    sources = {p: open(p).read() for p in glob.glob(os.path.join(ROOT, "tlparse", "*.py"))}
    assert sum(s.count("Markup(") for s in sources.values()) == 1            # code_text, and nothing else
    for path in glob.glob(os.path.join(ROOT, "tlparse", "templates", "*")):
        text = open(path).read()
        assert "|safe" not in text and "autoescape false" not in text, path


def test_templates_ship_with_the_package():
    """pyproject installs templates/ as package data, so a wheel renders reports too."""
    pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert re.search(r'\[tool\.setuptools\.package-data\]\s*\ntlparse = \[[^\]]*"templates/\*', pyproject)
    assert re.search(r'dependencies = \[[^\]]*"jinja2', pyproject)
    names = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tlparse", "templates", "*"))}
    assert {"base.html", "index.html", "compile.html", "artifact.html", "graph.svg"} <= names


def test_tlparse_run_traces_renders_and_exits_with_the_scripts_status(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent('''
        import sys, torch, engine

        @engine.compile(backend="eager")
        def f(x):
            return x.sin() + 1

        f(torch.ones(3))
        print("args:", sys.argv[1:])
        sys.exit(3)
    '''))
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "tlparse.cli", "run", "-o", str(out), str(script), "--flag", "x"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "TMPDIR": str(tmp_path)})     # the fresh trace directory goes here
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "args: ['--flag', 'x']" in proc.stdout
    assert f"tlparse run: report: {out / 'index.html'}" in proc.stderr
    trace = re.search(r"trace: (\S+)", proc.stderr).group(1)
    assert trace.startswith(str(tmp_path)) and os.listdir(trace) and (out / "index.html").exists()
    assert "[0/0]" in (out / "index.html").read_text()


def test_tlparse_run_on_a_script_that_compiles_nothing(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print('no compile here')\n")
    proc = subprocess.run([sys.executable, "-m", "tlparse.cli", "run", str(script)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0 and "the script wrote no trace" in proc.stderr


def test_artifact_pages_keep_the_top_bar_of_every_other_page(picture):
    """artifact.html writes base.html out by hand (for speed): the two must not drift."""
    def chrome(path):
        text = path.read_text()
        return text.split("<main>")[0].split("<title>")[0], text.split("</main>")[1]
    artifact = next((picture / "artifacts").glob("*_dynamo_output_graph.html"))
    assert chrome(artifact) == chrome(picture / "compiles" / "0_0.html")
    header = artifact.read_text().split("<header")[1].split("</header>")[0]
    assert header == (picture / "compiles" / "0_0.html").read_text().split("<header")[1].split("</header>")[0]
