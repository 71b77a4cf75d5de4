"""Distributed training under the engine: two ranks on the CPU (gloo), each a process
started with torch.multiprocessing, each compiling its own model. Every run has a hard
time limit (a hang fails the test instead of blocking CI) and the process group a
collective timeout."""

from __future__ import annotations

import datetime
import json
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
RUN_LIMIT_S = 150          # a whole two-rank run, start-up included
COLLECTIVE_TIMEOUT_S = 60  # a rank waiting on a collective the other never makes

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


# ---------------------------------------------------------------------- running two ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, worker, port, out_dir, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    result = worker(rank, *args)
    with open(os.path.join(out_dir, f"rank_{rank}.json"), "w") as f:
        json.dump(result, f)
    # no rank leaves while another still talks to it (gloo aborts a process whose peer hung up)
    dist.barrier()
    dist.destroy_process_group()
    # skip the interpreter's teardown: gloo's threads sometimes abort in it ("terminate called
    # without an active exception") after all the work is done and written
    os._exit(0)


def run_ranks(worker, out_dir, *args) -> list:
    """`worker(rank, *args)` on each rank; returns what each returned (JSON)."""
    os.makedirs(out_dir, exist_ok=True)
    ctx = mp.start_processes(_rank_main, args=(worker, _free_port(), str(out_dir), args), nprocs=WORLD,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + RUN_LIMIT_S
    files = [os.path.join(out_dir, f"rank_{rank}.json") for rank in range(WORLD)]
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"{worker.__name__} did not finish in {RUN_LIMIT_S}s on {WORLD} ranks (a hang?)")
    except mp.ProcessExitedException:
        if not all(os.path.exists(f) for f in files):   # died before its work was done: a failure
            raise
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    results = []
    for path in files:
        with open(path) as f:
            results.append(json.load(f))
    return results


# ---------------------------------------------------------------------- the users' programs


def mlp(layers: int = 4, width: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)   # the same initial weights on every rank, as a real job loads them
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


LAYER_BYTES = (32 * 32 + 32) * 4          # one Linear(32, 32): weight and bias, float32
ONE_LAYER_PER_BUCKET_MB = LAYER_BYTES / 2**20


def train(model, ddp_model, steps: int, rank: int) -> list:
    """SGD steps on data that differs per rank (so the all-reduce matters); the parameters after."""
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(8, 32, generator=gen)
        loss = ddp_model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


DDP_RUNS = [  # (how the model is wrapped, backend, engine.config.optimize_ddp)
    ("engine.compile(DDP(model))", "inductor", True),
    ("DDP(engine.compile(model))", "inductor", True),
    ("DDP(engine.compile(model)), optimize_ddp off", "aot_eager", False),
]


def ddp_worker(rank):
    """Eager DDP, then each of DDP_RUNS, with one layer per gradient bucket; how many
    graphs each split made."""
    import engine
    import observe

    splits = []
    observe.subscribe(lambda e: splits.append(e.metadata["graphs"])
                      if e.metadata.get("name") == "ddp_bucket_split" else None, events=["artifact"])
    cap = ONE_LAYER_PER_BUCKET_MB
    m = mlp()
    reference = train(m, DDP(m, bucket_cap_mb=cap), 3, rank)
    out = {}
    for name, backend, optimize_ddp in DDP_RUNS:
        engine.config.optimize_ddp = optimize_ddp
        m = mlp()
        if name.startswith("engine"):
            wrapped = engine.compile(DDP(m, bucket_cap_mb=cap), backend=backend)
        else:
            wrapped = DDP(engine.compile(m, backend=backend), bucket_cap_mb=cap)
        wrapped.register_comm_hook(None, record_allreduce)
        del splits[:]
        params = train(m, wrapped, 3, rank)
        out[name] = {"max_diff": max((a - b).abs().max().item() for a, b in zip(reference, params)),
                     "graphs_per_split": list(splits),
                     "allreduces_before_last_piece": allreduces_before_last_piece(wrapped, rank)}
    return out


EVENTS: list = []   # what one backward did, in order: "allreduce", "piece backward"


def record_allreduce(state, bucket):
    """A DDP comm hook: DDP's own all-reduce, noting when the bucket was handed over."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    EVENTS.append("allreduce")
    return allreduce_hook(state, bucket)


def allreduces_before_last_piece(ddp_model, rank) -> int:
    """How many buckets went to the all-reduce before the last compiled backward piece (the
    model's first layers) started: communication that overlaps the rest of the backward."""
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(rank))
    loss = ddp_model(x).pow(2).mean()
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "CompiledFunction" in node.name():
            node.register_prehook(lambda grads: EVENTS.append("piece backward"))
        stack.extend(n for n, _ in node.next_functions)
    del EVENTS[:]
    loss.backward()
    last_piece = max(i for i, e in enumerate(EVENTS) if e == "piece backward")
    return EVENTS[:last_piece].count("allreduce")


class Block(torch.nn.Module):
    """A transformer-style block (the unit FSDP2 shards and the recipe compiles)."""

    def __init__(self, width=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, blocks=3, width=32):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(width) for _ in range(blocks)])
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def fsdp2_worker(rank, backend):
    """fully_shard each block and the root; compile each block with the engine."""
    import engine
    from engine.capture import runtime
    from torch.distributed.fsdp import fully_shard

    def run(compiled: bool):
        torch.manual_seed(0)
        net = Net()
        for block in net.blocks:
            fully_shard(block)
        fully_shard(net)
        if compiled:
            for i, block in enumerate(net.blocks):
                net.blocks[i] = engine.compile(block, backend=backend)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        for _ in range(3):
            loss = net(torch.randn(8, 32, generator=gen)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return [p.full_tensor().detach().clone() for p in net.parameters()], losses

    eager_params, eager_losses = run(False)
    params, losses = run(True)
    compiled_forwards = sum(len(c.entries) for c in runtime._CACHES.values() if c.code is Block.forward.__code__)
    return {"max_diff": max((a - b).abs().max().item() for a, b in zip(eager_params, params)),
            "loss_diff": max(abs(a - b) for a, b in zip(eager_losses, losses)),
            "block_forward_compiles": compiled_forwards}


def collectives_worker(rank, backend):
    """A collective in user code: explain() names it, the compiled function computes eager's result."""
    import engine
    import torch.distributed._functional_collectives as funcol

    def average(t):
        y = t * 2
        dist.all_reduce(y)
        return y / dist.get_world_size() + 1

    def average_functional(t):
        return funcol.all_reduce(t * 2, "sum", dist.group.WORLD) / 2 + 1

    x = torch.arange(3.0) + rank
    explained = engine.explain(average)(x)
    reason = explained.break_reasons[0]
    return {
        "eager": average(x).tolist(),
        "compiled": engine.compile(average, backend=backend)(x).tolist(),
        "functional_eager": average_functional(x).tolist(),
        "functional_compiled": engine.compile(average_functional, backend=backend)(x).tolist(),
        "graph_count": explained.graph_count,
        "reason": reason.reason, "id": reason.graph_break_id, "hint": reason.hint,
    }


VERBOSE_RANK = 0   # the rank that logs more


def diverging_worker(rank):
    """Rank 0 takes a different Python branch inside the compiled step: it all-reduces the
    loss there to print the mean, while the other rank joins that all-reduce after the
    step. The collectives still pair up at run time, but the ranks compile differently."""
    import engine

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4).requires_grad_(False)

    @engine.compile(backend="eager")
    def step(x):
        loss = model(x).sum()
        if rank == VERBOSE_RANK:
            mean = loss.clone()
            dist.all_reduce(mean)
            print("mean loss", mean.item() / dist.get_world_size())
        return loss

    for _ in range(2):
        loss = step(torch.ones(2, 4))
        if rank != VERBOSE_RANK:
            dist.all_reduce(loss.clone())
    return {"loss": loss.item()}


def crashing_worker(rank):
    """Rank 1's compiler dies while compiling (as a segfault in a backend would)."""
    import engine

    def fragile_backend(gm, example_inputs):
        if rank == 1:
            os._exit(7)
        return gm.forward

    @engine.compile(backend=fragile_backend)
    def step(x):
        return x.sin() + 1

    step(torch.ones(3))
    return {}


# ---------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """DDP_RUNS on two ranks, each rank writing its trace: (each rank's results, trace dir)."""
    root = tmp_path_factory.mktemp("ddp")
    trace = root / "trace"
    old = os.environ.get("TORCH_TRACE")
    os.environ["TORCH_TRACE"] = str(trace)   # each rank writes its own file
    try:
        results = run_ranks(ddp_worker, root / "results")
    finally:
        if old is None:
            os.environ.pop("TORCH_TRACE", None)
        else:
            os.environ["TORCH_TRACE"] = old
    return results, trace


def test_compiled_ddp_trains_like_eager_ddp_with_one_graph_per_bucket(ddp_runs):
    # 4 layers, a bucket holds one layer: each captured graph is cut into 4 pieces, one a
    # bucket, each compiled by the default backend (generated C++ kernels)
    for rank, result in enumerate(ddp_runs[0]):
        for name in ("engine.compile(DDP(model))", "DDP(engine.compile(model))"):
            r = result[name]
            assert r["max_diff"] < 1e-5, (rank, name, r)
            # one split per compiled graph (the forward is captured once, then hits the cache)
            assert r["graphs_per_split"] == [4], (rank, name, r)
            # the last three layers' buckets were all-reduced while the first layer's backward
            # had yet to run: communication overlaps computation
            assert r["allreduces_before_last_piece"] == 3, (rank, name, r)


def test_optimize_ddp_off_compiles_one_graph(ddp_runs):
    for rank, result in enumerate(ddp_runs[0]):
        r = result["DDP(engine.compile(model)), optimize_ddp off"]
        assert r["max_diff"] < 1e-6, (rank, r)
        assert r["graphs_per_split"] == [], (rank, r)   # no split was made
        # one backward piece: every bucket waits for the whole backward
        assert r["allreduces_before_last_piece"] == 0, (rank, r)


def test_fsdp2_blocks_compiled_per_layer_train_like_eager(tmp_path):
    for rank, r in enumerate(run_ranks(fsdp2_worker, tmp_path, "aot_eager")):
        assert r["max_diff"] < 1e-6 and r["loss_diff"] < 1e-6, (rank, r)
        assert r["block_forward_compiles"] >= 1, (rank, r)     # the blocks' forward really compiled


def test_collective_in_user_code_is_a_graph_break_with_reason_and_hint(tmp_path):
    for rank, r in enumerate(run_ranks(collectives_worker, tmp_path, "aot_eager")):
        assert r["compiled"] == r["eager"] and r["functional_compiled"] == r["functional_eager"], r
        assert r["eager"] == [2.0 * i + 1 + 1 for i in range(3)], r    # (2x + 2(x+1)) / 2 + 1 over ranks 0, 1
        assert r["graph_count"] == 2 and r["id"] == "GB0020", r
        assert "torch.distributed.all_reduce" in r["reason"], r
        assert "outside the compiled function" in r["hint"], r


class HalfInBF16(torch.nn.Module):
    """Four layers, the first two under autocast inside forward."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(32, 32) for _ in range(4)])

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x = self.layers[1](self.layers[0](x).relu()).relu()
        x = x.float()
        return self.layers[3](self.layers[2](x).relu())


def test_the_bucket_split_never_cuts_inside_an_autocast_block():
    # one layer a bucket would make 4 pieces; the first two layers share an autocast block,
    # which a piece must hold whole (its casts are made while the piece is traced): 3 pieces
    import engine
    from engine.distributed.bucket_split import split_and_compile

    torch.manual_seed(0)
    model, x = HalfInBF16(), torch.randn(8, 32)
    captured = {}

    def split_backend(gm, example_inputs):
        captured["split"] = split_and_compile(gm, example_inputs, engine.backends.registry.lookup_backend("aot_eager"),
                                              LAYER_BYTES, LAYER_BYTES)
        return captured["split"]

    out = engine.compile(model, backend=split_backend)(x)
    plan = captured["split"].ddp_split_plan
    assert len(plan.buckets) == 3, plan.summary()
    assert plan.buckets[0].extended and len(plan.buckets[0].params) == 4, plan.summary()
    expected = model(x)
    assert out.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    out.sum().backward()   # the pieces' backward runs too
    assert all(p.grad is not None for p in model.parameters())


def _all_ranks_report(trace_dir, out):
    from tlparse.cli import main
    assert main([str(trace_dir), "-o", str(out), "--all-ranks-html", "--no-browser"]) == 0
    with open(os.path.join(out, "ranks.json")) as f:
        return json.load(f)


def test_ranks_that_take_different_branches_are_flagged_in_the_all_ranks_report(tmp_path, monkeypatch):
    trace = tmp_path / "trace"
    monkeypatch.setenv("TORCH_TRACE", str(trace))      # each rank writes its own file
    results = run_ranks(diverging_worker, tmp_path / "results")
    assert results[0] == results[1]                     # the program itself is fine
    assert sorted(f.split("_rank_")[1][0] for f in os.listdir(trace)) == ["0", "1"]
    report = _all_ranks_report(trace, tmp_path / "report")
    kinds = {d["kind"]: d for d in report["divergences"]}
    # rank 0 broke the graph at the print and at the all_reduce: compiles rank 1 never made
    assert "compile ids" in kinds and "graph breaks" in kinds, report["divergences"]
    assert "rank(s) 0, not by 1" in kinds["compile ids"]["detail"]
    # the first compile's graph and guards differ (rank 0's stops at the print), and so do its collectives
    assert kinds["graph"]["what"] == "[0/0]" and kinds["guards"]["what"] == "[0/0]"
    assert "L['rank'] == 0" in kinds["guards"]["detail"] and "L['rank'] == 1" in kinds["guards"]["detail"]
    collective = [d for d in report["divergences"] if d["kind"] == "collectives"]
    assert any("all_reduce (graph break)" in d["detail"] for d in collective), collective
    html = (tmp_path / "report" / "index.html").read_text()
    assert "Ranks diverge" in html and "Compiles side by side" in html


def test_ranks_that_agree_are_not_flagged_and_the_report_shows_the_ddp_pieces(ddp_runs, tmp_path):
    report = _all_ranks_report(ddp_runs[1], tmp_path / "report")
    assert report["divergences"] == []
    html = (tmp_path / "report" / "index.html").read_text()
    assert "All ranks compiled the same compile ids" in html
    pages = os.listdir(tmp_path / "report" / "rank_0" / "artifacts")
    # two splits (one a DDP spelling) of four pieces each, and the split tables
    assert sum("optimize_ddp_split_child" in p for p in pages) == 8, pages
    assert sum("ddp_bucket_split" in p for p in pages) == 2, pages


def test_a_rank_that_dies_in_a_compile_leaves_a_trace_that_says_where(tmp_path, monkeypatch):
    trace = tmp_path / "trace"
    monkeypatch.setenv("TORCH_TRACE", str(trace))
    with pytest.raises(mp.ProcessExitedException, match="process 1 terminated with exit code 7"):
        run_ranks(crashing_worker, tmp_path / "results")
    (log,) = [trace / f for f in os.listdir(trace) if "_rank_1_" in f]
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    envelope = json.loads(next(line for line in reversed(lines) if not line.startswith("\t")).split("] ", 1)[1])
    payload = json.loads(lines[-1].strip())
    # the last thing written: compile [0/0] began its backend compile (flushed before the crash)
    assert "chromium_event" in envelope and (envelope["frame_id"], envelope["frame_compile_id"]) == (0, 0)
    assert (payload["name"], payload["ph"]) == ("backend_compile", "B"), payload


EARLY_EVENT_PROGRAM = """
import os, sys
import engine, observe                      # TORCH_TRACE is read here, before any process group
import torch, torch.distributed as dist
observe.emit("artifact", {"name": "setup", "encoding": "string"}, lambda: "before the process group")
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:%d")
engine.compile(lambda x: x.sin() + 1)(torch.ones(3))
dist.destroy_process_group()
"""


def test_a_trace_opened_before_the_process_group_takes_the_rank_once_it_is_known(tmp_path):
    import subprocess
    import sys
    trace = tmp_path / "trace"
    env = {**os.environ, "TORCH_TRACE": str(trace)}
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    subprocess.run([sys.executable, "-c", EARLY_EVENT_PROGRAM % _free_port()], env=env, check=True,
                   timeout=RUN_LIMIT_S, capture_output=True)
    (name,) = os.listdir(trace)
    assert name.startswith("dedicated_log_torch_trace_rank_0_"), name
    assert '"rank": 0' in (trace / name).read_text()
