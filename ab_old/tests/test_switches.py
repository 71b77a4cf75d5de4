"""The switches of PyTorch's troubleshooting guide, typed into a program that runs the
engine: torch._logging.set_logs, set_stance (engine's and torch.compiler's),
torch._dynamo.config / torch._inductor.config knobs, disable, mode="reduce-overhead".
Each one works here, or says once what to do instead (docs/switches.md)."""

import logging
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch._dynamo            # a user's program may load these; the engine never does
import torch._inductor.config

import engine
from engine import stance, torch_config
from engine.capture import runtime
from engine_helpers import cache_entries as entries, fresh_engine, logs  # noqa: F401 (fresh_engine: autouse)
from observe import logs as observe_logs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def default_switches(monkeypatch):
    """No TORCH_LOGS from the outside; every test ends in the default stance, with logs off
    and engine.config as torch's knobs leave it."""
    monkeypatch.delenv("TORCH_LOGS", raising=False)
    torch_config.reset()
    yield
    engine.set_stance("default")
    torch._logging.set_logs()          # ours and torch's loggers off
    torch_config.sync()
    torch_config.reset()


def counting(calls):
    """A backend that counts the graphs it compiles and the times they run."""
    def backend(gm, example_inputs):
        calls.append("compiled")

        def run(*args):
            calls.append("ran")
            return gm(*args)
        return run
    return backend


def double_plus_one(x):
    return x * 2 + 1


def chatty(x):
    print("step")           # a graph break
    return x.relu()


def run_script(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "TORCH_TRACE")}
    full_env.update(env, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, cwd=REPO, timeout=300)


# ---------------------------------------------------------------------- torch._logging.set_logs


def test_torch_set_logs_shows_the_engine_graph_breaks_and_recompiles(caplog):
    torch._logging.set_logs(graph_breaks=True, recompiles=True)
    logging.getLogger("engine").addHandler(caplog.handler)
    try:
        f = engine.compile(chatty, backend="eager", dynamic=False)
        with caplog.at_level(logging.INFO, logger="engine"):
            f(torch.randn(3))
            f(torch.randn(4))
    finally:
        logging.getLogger("engine").removeHandler(caplog.handler)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"Graph break in user code at {__file__}:{chatty.__code__.co_firstlineno + 1}" in text
    assert "Recompiling function chatty" in text
    assert "tensor 'L['x']' size mismatch at index 0. expected 3, actual 4" in text


def test_torch_set_logs_levels_are_those_of_the_same_torch_logs():
    torch._logging.set_logs(dynamo=logging.DEBUG, aot=logging.INFO, graph_code=True)
    assert observe_logs.SINK.levels == observe_logs.parse("+dynamo,aot,graph_code")[0]
    torch._logging.set_logs()
    assert observe_logs.SINK.levels == {}


def test_a_set_logs_name_the_engine_has_no_log_for_is_named_once():
    with pytest.warns(UserWarning, match="the engine writes no side_effects log") as seen:
        torch._logging.set_logs(side_effects=True, guards=True)
        torch._logging.set_logs(side_effects=True, guards=True)
    assert len([w for w in seen if "side_effects" in str(w.message)]) == 1
    assert observe_logs.SINK.levels == {"guards": logging.INFO}   # the names it has are on


def test_with_torch_logs_set_the_variable_wins_and_torch_stays_quiet():
    # torch imported first (its own TORCH_LOGS handling runs), set_logs called twice
    result = run_script("""
        import torch, engine
        torch._logging.set_logs(graph_breaks=True)
        torch._logging.set_logs(graph_breaks=True)

        @engine.compile(backend="eager", dynamic=False)
        def f(x):
            print("step")
            return x + 1

        f(torch.ones(2)); f(torch.ones(3))
    """, TORCH_LOGS="recompiles")
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "ignoring call to set_logs" not in err                    # torch's warning, once per call
    assert err.count("TORCH_LOGS='recompiles' is set and takes precedence") == 1
    assert "Recompiling function f" in err                          # what TORCH_LOGS asked for
    assert "Graph break in user code" not in err                   # what set_logs asked for


# ---------------------------------------------------------------------- set_stance


def test_force_eager_compiles_nothing_and_ends_with_its_block():
    calls = []
    f = engine.compile(double_plus_one, backend=counting(calls))
    with engine.set_stance("force_eager"):
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 3.0))
    assert calls == [] and entries(double_plus_one) == []
    f(torch.ones(2))
    assert calls == ["compiled", "ran"]


def test_eager_on_recompile_runs_cached_graphs_and_runs_a_miss_eagerly():
    calls = []
    f = engine.compile(double_plus_one, backend=counting(calls), dynamic=False)
    f(torch.ones(2))
    engine.set_stance("eager_on_recompile")
    calls.clear()
    f(torch.ones(2))                                  # cached: the graph runs
    with logs("recompiles") as lines:
        out = f(torch.ones(3))                        # a miss: eager, nothing compiled
    assert calls == ["ran"]
    assert torch.equal(out, torch.full((3,), 3.0))
    assert len(entries(double_plus_one)) == 1
    assert "stance 'eager_on_recompile': it runs eagerly instead" in lines[0]
    assert "- 0/0: tensor 'L['x']' size mismatch at index 0. expected 2, actual 3" in lines[0]


def test_fail_on_recompile_names_the_guard_that_failed():
    f = engine.compile(double_plus_one, backend="eager", dynamic=False)
    f(torch.ones(2))
    with engine.set_stance("fail_on_recompile"):
        f(torch.ones(2))                              # a hit is fine
        with logs("recompiles") as lines:
            with pytest.raises(engine.RecompileError) as err:
                f(torch.ones(5))
    assert "double_plus_one" in str(err.value) and "would recompile" in str(err.value)
    assert "- 0/0: tensor 'L['x']' size mismatch at index 0. expected 2, actual 5" in str(err.value)
    assert "RecompileError raised" in lines[0]
    assert len(entries(double_plus_one)) == 1


def test_fail_on_recompile_refuses_a_first_compile_too():
    f = engine.compile(double_plus_one, backend="eager")
    with engine.set_stance("fail_on_recompile"), pytest.raises(RuntimeError, match="for the first time"):
        f(torch.ones(2))


def test_eager_then_compile_runs_the_first_call_eagerly_and_compiles_dynamic_after():
    calls = []
    f = engine.compile(double_plus_one, backend=counting(calls))

    @engine.set_stance("eager_then_compile")
    def train():
        f(torch.ones(2))
        assert calls == []                            # eager
        f(torch.ones(3))
        assert calls == ["compiled", "ran"]
        f(torch.ones(7))                              # the size that changed is dynamic: no recompile
        assert calls == ["compiled", "ran", "ran"]

    assert stance.current() == "default"              # a decorator sets it only while train runs
    train()
    assert stance.current() == "default"
    assert len(entries(double_plus_one)) == 1


SCALE = 2.0


def scaled(x):
    return x * SCALE


def test_skip_guard_eval_unsafe_runs_the_only_graph_unchecked():
    global SCALE
    f = engine.compile(scaled, backend="eager")
    x = torch.ones(2)
    f(x)
    SCALE = 3.0
    try:
        with engine.set_stance("default", skip_guard_eval_unsafe=True):
            stale = f(x)                              # the guard on SCALE is not checked: unsafe
        fresh = f(x)
    finally:
        SCALE = 2.0
    assert torch.equal(stale, torch.full((2,), 2.0))
    assert torch.equal(fresh, torch.full((2,), 3.0))


def test_an_unknown_stance_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'eager_on_recompile'"):
        engine.set_stance("eager_on_recompiles")
    assert stance.current() == "default"


def test_torch_compiler_set_stance_is_followed():
    calls = []
    f = engine.compile(double_plus_one, backend=counting(calls))
    torch.compiler.set_stance("force_eager")
    try:
        f(torch.ones(2))
    finally:
        torch.compiler.set_stance("default")
    assert calls == []
    with torch.compiler.set_stance("eager_on_recompile"):
        f(torch.ones(2))
    assert calls == [] and stance.current() == "default"


def test_the_switches_load_neither_torch_dynamo_nor_inductor():
    # before anything compiles (torch's own ShapeEnv loads torch._dynamo once a compile runs)
    result = run_script("""
        import sys, torch, engine
        torch._logging.set_logs(recompiles=True)
        with torch.compiler.set_stance("eager_on_recompile"):
            pass
        engine.set_stance("fail_on_recompile")
        engine.compile(lambda x: x + 1, mode="reduce-overhead")
        print(sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor"))))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_no_engine_observe_or_tlparse_module_imports_torch_dynamo_or_inductor():
    import ast
    banned = ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd")
    found = []
    for pkg in ("engine", "observe", "tlparse"):
        for root, _, files in os.walk(os.path.join(REPO, pkg)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(root, name)
                for node in ast.walk(ast.parse(open(path).read())):
                    mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    found += [f"{path}: {m}" for m in mods if m.startswith(banned)]
                    if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.compile":
                        found.append(f"{path}: torch.compile(...)")
    assert found == []


# ---------------------------------------------------------------------- torch._dynamo.config, torch._inductor.config


def failing_backend(gm, example_inputs):
    raise RuntimeError("backend exploded")


def test_torch_suppress_errors_runs_a_failing_frame_eagerly():
    f = engine.compile(double_plus_one, backend=failing_backend)
    with pytest.raises(engine.BackendCompilerFailed):
        f(torch.ones(2))
    engine.reset()
    with torch._dynamo.config.patch(suppress_errors=True), pytest.warns(RuntimeWarning, match="backend exploded"):
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 3.0))


def test_torch_cache_size_limit_stops_recompiles():
    f = engine.compile(double_plus_one, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(cache_size_limit=1):
        f(torch.ones(2))
        with pytest.warns(RuntimeWarning, match=r"config.cache_size_limit \(1\)"):
            f(torch.ones(3))
    assert len(entries(double_plus_one)) == 1
    f(torch.ones(4))                                  # the patch ended: the limit is 8 again
    assert engine.config.cache_size_limit == 8
    assert len(entries(double_plus_one)) == 2


def test_engine_config_set_by_the_user_wins_over_the_torch_knob():
    f = engine.compile(double_plus_one, backend="eager", dynamic=False)
    with engine.config.patch(cache_size_limit=3), torch._dynamo.config.patch(cache_size_limit=1):
        for n in (2, 3, 4):
            f(torch.ones(n))
        assert engine.config.cache_size_limit == 3
    assert len(entries(double_plus_one)) == 3


def test_capture_scalar_outputs_from_torch_config_keeps_item_in_the_graph():
    def total(x):
        return x * x.sum().item()

    f = engine.compile(total, backend="eager")
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        explained = engine.explain(f)(torch.ones(3))
    assert explained.graph_break_count == 0
    engine.reset()
    assert engine.explain(f)(torch.ones(3)).graph_break_count == 1


def test_inductor_knobs_reach_the_engine_while_set():
    seen = []

    def backend(gm, example_inputs):
        seen.append((engine.config.max_autotune, engine.config.compile_debug))
        return gm

    f = engine.compile(double_plus_one, backend=backend, dynamic=False)
    with torch._inductor.config.patch({"max_autotune": True, "trace.enabled": True}):
        f(torch.ones(2))
    f(torch.ones(3))
    assert seen == [(True, True), (False, False)]


def test_inductor_debug_shows_the_generated_code_logs():
    f = engine.compile(double_plus_one, backend="eager", dynamic=False)
    with torch._inductor.config.patch(debug=True):
        f(torch.ones(2))
        assert observe_logs.SINK.levels["output_code"] == logging.INFO
        assert observe_logs.SINK.levels["inductor"] == logging.DEBUG
    f(torch.ones(3))
    assert observe_logs.SINK.levels == {}


def test_a_torch_knob_the_engine_lacks_is_named_in_one_warning():
    f = engine.compile(double_plus_one, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(replay_record_enabled=True), torch._inductor.config.patch(fallback_random=True):
        with pytest.warns(UserWarning) as seen:
            f(torch.ones(2))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            f(torch.ones(3))                          # a recompile: not said again
    (w,) = [w for w in seen if "no such knob" in str(w.message)]
    assert "torch._dynamo.config.replay_record_enabled" in str(w.message)
    assert "torch._inductor.config.fallback_random" in str(w.message)
    assert w.filename == __file__                     # points at the user's call


# ---------------------------------------------------------------------- disable, mode=


def helper(x):
    return x.cos() + 1


def test_disable_recursive_false_still_compiles_what_it_calls():
    def outer(x):
        return helper(x) * 2

    for recursive, compiled in ((True, False), (False, True)):
        engine.reset()
        f = engine.compile(engine.disable(outer, recursive=recursive), backend="eager")
        torch.testing.assert_close(f(torch.ones(2)), outer(torch.ones(2)))
        assert bool(runtime._CACHES.get(helper.__code__) and entries(helper)) is compiled
        assert not (runtime._CACHES.get(outer.__code__) and entries(outer))


def test_reduce_overhead_says_why_a_graph_runs_without_cuda_graphs():
    from engine_helpers import logs

    with logs("cudagraphs") as shown:
        f = engine.compile(double_plus_one, mode="reduce-overhead")
        assert torch.equal(f(torch.ones(2)), torch.full((2,), 3.0))
    # CUDA graphs need CUDA tensors (tests/test_cudagraphs.py runs them on the GPU)
    assert len(shown) == 1 and "runs without CUDA graphs" in shown[0]
    assert ("no CUDA device" in shown[0]) or ("cpu tensor" in shown[0])


# ---------------------------------------------------------------------- environment variables


def test_capture_scalar_outputs_env_var_is_read():
    result = run_script("import engine; print(engine.config.capture_scalar_outputs)",
                        TORCHDYNAMO_CAPTURE_SCALAR_OUTPUTS="1")
    assert result.stdout.strip() == "True", result.stderr


def test_guide_env_vars_the_engine_ignores_are_named_once_at_import():
    result = run_script("import engine", TORCHDYNAMO_EXTENDED_DEBUG_CREATE_SYMBOL="s0", TORCHDYNAMO_DYNAMIC_SHAPES="0",
                        TORCHDYNAMO_REPRO_AFTER="aot")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("UserWarning") == 1
    assert "TORCHDYNAMO_EXTENDED_DEBUG_CREATE_SYMBOL (TORCH_LOGS=dynamic shows" in result.stderr
    assert "TORCHDYNAMO_REPRO_AFTER" not in result.stderr                 # the minifier reads it
    assert "TORCHDYNAMO_DYNAMIC_SHAPES (pass dynamic=True or dynamic=False" in result.stderr
    assert '<string>:1: UserWarning' in result.stderr    # at the user's import line
