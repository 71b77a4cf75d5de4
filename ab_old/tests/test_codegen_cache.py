"""The on-disk kernel cache: a second process compiling the same graph loads the library
from ENGINE_CACHE_DIR (log: "hit"); a change to the key says which part changed."""

import json
import os
import subprocess
import sys

import torch

import observe
from engine import config
from engine.codegen import cache

SCRIPT = r"""
import logging, observe, engine, torch
from torch.fx.experimental.proxy_tensor import make_fx
from engine.codegen import compile_fx_graph, decomposition_table
lines = []
observe.subscribe(lambda e: lines.append(e.metadata["msg"] % e.metadata["args"]), logs=["inductor"])
observe.set_logs(inductor=logging.INFO)
f = lambda x: torch.softmax(x * 3, -1)
x = torch.randn(4, 16)
c = compile_fx_graph(make_fx(f, decomposition_table=decomposition_table())(x), [x])
torch.testing.assert_close(c(x), f(x))
print([l for l in lines if "kernel cache" in l][0])
"""


def run(cache_dir):
    env = dict(os.environ, ENGINE_CACHE_DIR=str(cache_dir), TORCH_LOGS="")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_second_process_hits_the_disk_cache(tmp_path):
    first = run(tmp_path)
    assert "kernel cache miss" in first and "no previous compile of this graph" in first
    second = run(tmp_path)
    assert "kernel cache hit" in second


def test_miss_names_the_part_of_the_key_that_changed(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    src = '#include <cstdint>\nextern "C" void k(int64_t* p) { p[0] = 1; }\n'
    lines = []
    fn = observe.subscribe(lambda e: lines.append(e.metadata["msg"] % e.metadata["args"]), logs=["inductor"])
    try:
        cache.load_cpp(src, "g1")
        monkeypatch.setattr(cache, "FLAGS", cache.FLAGS + ["-DENGINE_TEST=1"])
        cache.load_cpp(src, "g1")
    finally:
        observe.unsubscribe(fn)
    misses = [l for l in lines if "miss" in l]
    assert len(misses) == 2 and "flags" in misses[1] and "source" not in misses[1].split("changed")[1]
    index = json.load(open(tmp_path / "index" / "g1.json"))
    assert "-DENGINE_TEST=1" in index["parts"]["flags"]


def test_default_cache_dir_is_private_to_the_process(monkeypatch):
    monkeypatch.setattr(config, "cache_dir", None)
    d = cache.cache_dir()
    assert str(os.getpid()) in os.path.basename(d) and os.path.isdir(d)
