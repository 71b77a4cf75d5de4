"""The differential corpus (eager PyTorch vs engine.compile) for every registered backend:
any wrong result fails; errors and graph-count mismatches are printed as a summary
(`pytest -s tests/test_corpus.py` shows it)."""

import json
import os
import subprocess
import sys

import pytest

import engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.environ.get("ENGINE_CORPUS", os.path.join(os.path.dirname(ROOT), "shared", "corpus"))


def _backends():
    from engine.backends import list_backends
    names = list_backends()
    return [b for b in ("eager", "aot_eager", "aot_eager_decomp_partition", "inductor") if b in names]


@pytest.mark.parametrize("backend", _backends())
def test_corpus_has_no_wrong_results(backend, tmp_path):
    if not os.path.isdir(os.path.join(CORPUS, "public")):
        if os.environ.get("CI"):  # in CI the corpus is beside the checkout; missing it must not pass silently
            pytest.fail(f"corpus not found at {CORPUS} (set ENGINE_CORPUS)")
        pytest.skip("corpus not found (set ENGINE_CORPUS)")
    out = tmp_path / "corpus.json"
    cmd = [sys.executable, os.path.join(CORPUS, "run_corpus.py"), "--impl", "engine", "--engine-path", ROOT,
           "--backend", backend, "--timeout", "120", "--no-count-check", "--json", str(out), os.path.join(CORPUS, "public")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=str(tmp_path))
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    cases = result["cases"]
    wrong = [c for c in cases if c["status"] == "wrong_result"]
    others = [c for c in cases if c["status"] not in ("pass", "wrong_result")]
    counts = [c for c in cases if c.get("count_mismatch")]
    print(f"\ncorpus backend={backend}: {result['passed']} passed, {result['failed']} failed; "
          f"by status {result['by_status']}")
    for c in others:
        print(f"  {c['status']:<8} {c['name']}: {(c.get('error') or '')[:200]}")
    for c in counts:
        print(f"  graph count mismatch {c['name']}: graphs {c['graph_count']} breaks {c['graph_break_count']} "
              f"(expected {c['expected_graphs']}/{c['expected_graph_breaks']})")
    assert not wrong, "wrong results:\n" + "\n".join(f"  {c['name']}: {c['error']}" for c in wrong)
