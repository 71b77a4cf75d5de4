"""Cache misses explained (docs/cache.md): two processes share ENGINE_CACHE_DIR; the second
one's miss names what differs from the closest entry the first one left in the cache."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from engine.codegen import cache_explain

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = """
import sys
import torch
import engine


@engine.compile
def f(x):
    return torch.relu(x * 3) + 1


f(torch.randn(8, 16, dtype=getattr(torch, sys.argv[1])))
"""


def run(tmp_path, dtype="float32", cache=True, trace=None, **env):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, TORCH_LOGS="cache", **env)
    env.pop("ENGINE_CACHE_DIR", None)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    if cache:
        env["ENGINE_CACHE_DIR"] = str(tmp_path / "cache")
    if trace:
        env["TORCH_TRACE"] = str(trace)
    out = subprocess.run([sys.executable, str(script), dtype], capture_output=True, text=True, env=env,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stderr.split("\n[") if "[__cache]" in line]


def test_same_program_twice_hits_and_says_what_it_saved(tmp_path):
    first = run(tmp_path)
    assert len(first) == 1 and "kernel cache miss" in first[0] and "a cold start" in first[0]
    second = run(tmp_path)
    assert len(second) == 1 and "kernel cache hit" in second[0]
    assert "(1 kernel: kernel0_mul_relu_add)" in second[0] and "s of compiling" in second[0]


def test_a_changed_input_dtype_misses_naming_the_dtype_and_nothing_else(tmp_path):
    run(tmp_path)
    miss = run(tmp_path, "float64")
    assert len(miss) == 1 and "kernel cache miss" in miss[0]
    assert miss[0].split("the closest entry in the cache differs in\n")[1].strip() == \
        "input 0: dtype torch.float32 -> torch.float64"


def test_a_changed_config_knob_misses_naming_the_knob(tmp_path):
    run(tmp_path)
    miss = run(tmp_path, ENGINE_CPP_FLAGS="-DENGINE_EXPLAIN_TEST")
    assert miss[0].split("the closest entry in the cache differs in\n")[1].strip() == \
        "config cpp_extra_flags: [] -> ['-DENGINE_EXPLAIN_TEST']"


def test_without_a_cache_directory_the_cache_is_bypassed_and_it_says_so(tmp_path):
    (line,) = run(tmp_path, cache=False)
    assert "kernel cache bypass" in line and "no cache directory is set (ENGINE_CACHE_DIR" in line


def test_the_trace_has_one_cache_artifact_per_graph_with_the_reason(tmp_path):
    run(tmp_path)
    run(tmp_path, "float64", trace=tmp_path / "trace")
    (name,) = os.listdir(tmp_path / "trace")
    lines = open(tmp_path / "trace" / name).read().splitlines()
    i = next(i for i, line in enumerate(lines) if '"name": "kernel_cache_miss"' in line)
    payload = json.loads(lines[i + 1][1:])
    assert payload["reasons"] == ["input 0: dtype torch.float32 -> torch.float64"]
    assert payload["kernels"] == ["kernel0_mul_relu_add"] and payload["compile_s"] > 0


@pytest.mark.parametrize("change, expected", [
    (dict(inputs=[["torch.float32", ["8", "32"], ["32", "1"]]]), ["input 0: shape (8, 32) -> (8, 16)",
                                                                  "input 0: stride (32, 1) -> (16, 1)"]),
    (dict(versions={"torch": "2.12.0", "triton": None, "engine": "codegen x", "python": "3.11.7"}),
     ["engine version: codegen x -> codegen y", "torch version: 2.12.0 -> 2.13.0"]),
    (dict(graph_code="def forward(self, x):\n    return x * 4\n"),
     ["the graph's code: line 2: 'return x * 4' -> 'return x * 3'"]),
])
def test_each_kind_of_difference_is_named_in_the_users_terms(change, expected):
    now = cache_explain.Manifest(
        key="a", graph_key="g", graph_code="def forward(self, x):\n    return x * 3\n",
        inputs=[["torch.float32", ["8", "16"], ["16", "1"]]], config={"cpp_extra_flags": []},
        versions={"torch": "2.13.0", "triton": None, "engine": "codegen y", "python": "3.11.7"},
        compiler="g++ 12", flags="-O3", cpu="x86", source="s1", kernels=["k0"])
    then = dataclasses.replace(now, key="b", source="s0", graph_hash="", **change)
    assert cache_explain.differences(now, then) == expected


def manifest(key, graph_key, code, dtype="torch.float32"):
    return cache_explain.Manifest(
        key=key, graph_key=graph_key, graph_code=code, inputs=[[dtype, ["8"], ["1"]]],
        config={"cpp_extra_flags": []}, versions={"torch": "2.13.0"}, compiler="g++ 12", flags="-O3",
        cpu="x86", source=key, kernels=["k0"])


def test_a_graph_the_cache_has_never_seen_is_compared_with_the_nearest_code_there(tmp_path):
    mul = "def forward(self, x):\n    mul = torch.ops.aten.mul.Tensor(x, 3)\n    return (mul,)\n"
    softmax = "def forward(self, x):\n    s = torch.ops.aten._softmax.default(x, -1, False)\n    return (s,)\n"
    cache_explain.write_manifest(str(tmp_path), manifest("k-mul", "g-mul", mul))
    cache_explain.write_manifest(str(tmp_path), manifest("k-softmax", "g-softmax", softmax, "torch.float64"))
    now = manifest("k-new", "g-new", mul.replace(", 3)", ", 4)"))
    reasons, closest = cache_explain.explain_miss(str(tmp_path), now)
    assert closest == "k-mul"     # only the code differs; the softmax graph differs in its input dtype too
    assert reasons == ["no entry for this graph's code among the 2 in the cache; closest: graph g-mul",
                       "the graph's code: line 2: 'mul = torch.ops.aten.mul.Tensor(x, 3)' -> "
                       "'mul = torch.ops.aten.mul.Tensor(x, 4)'"]
