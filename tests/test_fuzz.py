"""The differential fuzzer (tests/fuzz) over a fixed range of seeds: random programs with
in-place ops, views, aliasing, control flow, globals, closures, modules and gradients, each
called several times with changed inputs, eagerly and through engine.compile.

A wrong result (call 0 differs from eager) or a stale one (a later call, after the
inputs, globals or module changed, differs) fails, with the shrunk repro scripts and
their programs in the message. Crashes (the engine raised where eager did not) are printed
and warned about, not failures. More seeds: `python -m tests.fuzz --help`."""

import logging
import os
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.fuzz import runner  # noqa: E402

# (backend, seeds): about 60 s together on 2 cores, plus a few seconds of shrinking per failure
CASES = [("eager", range(0, 60)), ("aot_eager", range(1000, 1050)), ("inductor", range(2000, 2008))]


def _program_lines(src):
    """The program without its fixed header (imports, DEVNULL, LOG) and blank lines."""
    header = src.split("DEVNULL = Sink()\n", 1)[0] + "DEVNULL = Sink()\n"
    return [x for x in src[len(header):].splitlines() if x.strip() and not x.startswith("LOG =")]


@pytest.mark.parametrize("backend,seeds", CASES, ids=[c[0] for c in CASES])
def test_fuzz_matches_eager(backend, seeds, tmp_path):
    trace_log = logging.getLogger("torch.__trace")   # its DEBUG records would flood the captured log
    level = trace_log.level
    trace_log.setLevel(logging.WARNING)
    try:
        results = runner.fuzz(backend, list(seeds), out=str(tmp_path), shrink_budget=8.0, log=lambda s: None)
    finally:
        trace_log.setLevel(level)
    print(runner.summarize(results, backend, compare=False))
    crashes = [r for r in results if r.engine.category == "crash"]
    for r in crashes:
        msg = f"fuzz {backend} seed {r.seed}: {r.engine.line()}  [{r.repro}]"
        print(msg)
        warnings.warn(msg, stacklevel=1)
    bad = [r for r in results if r.engine.category in ("wrong", "stale")]
    if bad:
        parts = []
        for r in bad:
            parts.append(f"--- seed {r.seed}: {r.shrunk.line()}\n    repro: {r.repro}\n"
                         + "\n".join("    " + x for x in _program_lines(r.shrunk_source)))
        pytest.fail(f"{len(bad)} of {len(results)} fuzz programs ({backend}) give results that differ from eager:\n"
                    + "\n".join(parts), pytrace=False)
    assert results, "the generator made no programs"
