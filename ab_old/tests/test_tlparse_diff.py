"""`tlparse diff RUN_A RUN_B`: a user changes their program (adds a debug print, passes a
new value), runs it again with TORCH_TRACE, and asks what changed in the compiles."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from test_tlparse_fixtures import FIXTURES, check_links
from tlparse.cli import main

PROGRAM = textwrap.dedent('''
    import sys
    import torch
    import engine

    AFTER = len(sys.argv) > 1          # run B: the edited program

    @engine.compile(backend="eager")
    def step(x, scale):
        y = x.sin() * scale
        if AFTER:
            print("debug:", y.shape)   # the edit: a debug print (a graph break)
        return y.cos() + 1

    x = torch.randn(4)
    step(x, 2.0)
    step(x, 3.0 if AFTER else 2.0)     # the edit: a new float value (a recompile)
''')


def trace_run(root, name, *args):
    env = {**os.environ, "TORCH_TRACE": str(root / name)}
    env.pop("TORCH_LOGS", None)
    proc = subprocess.run([sys.executable, str(root / "prog.py"), *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    (root / "prog.py").write_text(PROGRAM)
    return root, trace_run(root, "before"), trace_run(root, "after", "edited")


def test_plain_diff_names_the_new_break_the_recompile_and_what_changed(runs, capsys):
    root, before, after = runs
    status = main(["diff", str(before), str(after), "-o", str(root / "plain"), "--plain"])
    text = capsys.readouterr().out
    assert status == 1                                            # for CI: something new broke or recompiled
    assert text == (root / "plain" / "index.txt").read_text()
    sections = dict(s.split("\n", 1) for s in text.split("\n== ")[1:])
    assert "step (prog.py): 1 -> 2 (+1)" in sections["Compiles per frame (A -> B)"]
    assert sections["Graph breaks"].startswith("+ ") and 'prog.py:12 | print("debug:", y.shape)' in sections["Graph breaks"]
    assert "step (prog.py): 0 -> 1 recompiles\n  + L['scale'] == 2.0: expected 2.0, got 3.0  (prog.py:10 in step)" \
        in sections["Recompiles (A -> B)"]
    assert "+ EQUALS_MATCH: G['AFTER'] == True\n  - EQUALS_MATCH: G['AFTER'] == False" in sections["Guards that changed"]
    assert "step (prog.py) compile #0: 4 -> 2" in sections["Graph op counts (A -> B)"]   # the graph ends at the break
    stages = sections["Compile time per stage (A -> B, largest change first)"].strip().splitlines()
    deltas = [abs(float(ln.split("  ")[-1].split()[0].lstrip("+-"))) for ln in stages]
    assert deltas == sorted(deltas, reverse=True) and any(ln.startswith("entire_frame_compile:") for ln in stages)


def test_html_diff_links_both_reports_and_they_link_back(runs):
    root, before, after = runs
    out = root / "html"
    assert main(["diff", str(before), str(after), "-o", str(out), "--no-browser"]) == 1
    index = (out / "index.html").read_text()
    assert 'href="run_a/index.html"' in index and 'href="run_b/index.html"' in index
    assert "<td>appeared</td>" in index and "print(&#34;debug:&#34;, y.shape)" in index   # escaped
    assert 'href="run_b/compiles/0_1.html"' in index                                     # the new compile
    for run in ("run_a", "run_b"):
        assert 'href="../index.html">diff</a>' in (out / run / "index.html").read_text()
    check_links(out)


def test_a_run_against_itself_has_no_change_and_exit_status_0(runs, capsys):
    root, before, _ = runs
    assert main(["diff", str(before), str(before), "-o", str(root / "same"), "--plain"]) == 0
    text = capsys.readouterr().out
    assert "verdict: no new graph break or recompile" in text
    for title in ("Graph breaks", "Recompiles (A -> B)", "Guards that changed", "Kernels"):
        assert f"== {title}\nno change\n" in text


@pytest.mark.skipif(not os.path.isdir(FIXTURES), reason="PyTorch trace fixtures not present")
def test_torch_traces_diff_a_truncated_run_against_the_whole_one(tmp_path, capsys):
    """PyTorch's own trace: run A is the same trace cut in the middle (the program died
    before it recompiled): B's recompile is new, and A's broken last line is reported."""
    (log,) = [os.path.join(FIXTURES, "recompiles", n) for n in os.listdir(os.path.join(FIXTURES, "recompiles"))
              if n.endswith(".log")]
    data = open(log, "rb").read()
    cut = data.index(b'"frame_compile_id": 1')        # before the second compile of frame 0
    cut = data.rindex(b"\n", 0, cut) + 40              # and inside a line
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "dedicated_log_torch_trace_cut.log").write_bytes(data[:cut])
    status = main(["diff", str(tmp_path / "a"), os.path.dirname(log), "-o", str(tmp_path / "out"), "--plain"])
    text = capsys.readouterr().out
    assert status == 1
    assert "recompiles\n  + " in text
    assert "Unparsed lines: 1" in (tmp_path / "out" / "run_a" / "index.txt").read_text()
