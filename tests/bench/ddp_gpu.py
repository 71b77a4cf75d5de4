"""DDP training benchmark: GPT-2 124M (transformers, random init) on 2 ranks, eager DDP vs
torch.compile vs ours (engine.compile), each compiled one with the graph split at DDP's
gradient buckets (optimize_ddp on, the default) and as one graph (off), in one run.

    python3 tests/bench/ddp_gpu.py                         # 2 GPUs, NCCL, bf16 autocast
    python3 tests/bench/ddp_gpu.py --device cpu --tiny     # 2 CPU processes, gloo, a tiny GPT-2
    python3 tests/bench/ddp_gpu.py --modes eager,engine    # a subset

Each mode trains a fresh model from the same initial weights on the same batches:
`DDP(compile(model))`, AdamW, the forward under bf16 autocast (on GPU). Per mode:

- step ms: median wall time of a whole step (forward, backward with DDP's all-reduces,
  optimizer), after the warm-up steps (which compile);
- no-sync ms: the same step inside `ddp.no_sync()` (no all-reduce at all);
- exposed comm ms = step - no-sync: the communication the backward did not hide;
- all-reduce ms: all-reducing every gradient's bytes alone (in 25 MiB buckets, as DDP);
- hidden %: 1 - exposed / all-reduce, how much of the communication overlapped compute;
- the overlap the bucket split gained: the step time with optimize_ddp off minus on;
- first step s (compile included), graphs each compiler captured, and the pieces the
  engine's bucket split cut them into (one a bucket), peak memory;
- loss diff: the largest difference from eager DDP's loss over the measured steps;
- with --profile, rank 0's GPU timeline of two more steps: the ms a step of compute
  kernels, of NCCL kernels, of NCCL running beside compute (overlap), of NCCL alone, and of
  the GPU idle; each mode's timeline is written to $OUT as a gzipped Chrome trace.

With $OUT set (or --json PATH) the results are written as JSON too. NCCL's NVLink
multicast stays off (the device machines require it)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import statistics
import sys
import time
import traceback

# the GPU machines' rule: never NVLink multicast (NCCL, PyTorch symmetric memory, NVSHMEM)
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

MODES = {
    "eager": ("eager", None),
    "torch.compile": ("torch", True),
    "torch.compile, optimize_ddp off": ("torch", False),
    "engine": ("engine", True),
    "engine, optimize_ddp off": ("engine", False),
}
SHORT = {"eager": "eager", "torch": "torch.compile", "torch_off": "torch.compile, optimize_ddp off",
         "engine": "engine", "engine_off": "engine, optimize_ddp off"}
WORLD = 2


def gpt2(tiny: bool):
    from transformers import GPT2Config, GPT2LMHeadModel
    if tiny:
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=64)
    else:
        cfg = GPT2Config()   # GPT-2 small: 12 layers, 768 wide, 124M parameters
    cfg.use_cache = False
    # no dropout: each compiler draws its own random numbers, and the losses are compared with eager's
    cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.0
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg), cfg


def batches(cfg, args, rank, device, n):
    gen = torch.Generator().manual_seed(1000 + rank)   # each rank its own data
    return [torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=gen).to(device) for _ in range(n)]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class GraphCounter:
    """Graphs each compiler handed to its backend (the DDP pieces count one each)."""

    def __init__(self):
        self.engine_pieces = 0
        self.engine_graphs = 0

    def __call__(self, event):
        if event.name == "artifact" and event.metadata.get("name") == "ddp_bucket_split":
            self.engine_pieces += int(event.metadata.get("graphs", 1))
        elif event.name == "dynamo_output_graph":
            self.engine_graphs += 1


def build(mode, args, device):
    compiler, optimize_ddp = MODES[mode]
    model, cfg = gpt2(args.tiny)
    model.to(device)
    if compiler == "torch":
        from torch import _dynamo
        from torch._dynamo.utils import counters
        _dynamo.reset()
        counters.clear()
        _dynamo.config.optimize_ddp = optimize_ddp
        model = torch.compile(model, backend=args.torch_backend)
    elif compiler == "engine":
        import engine
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:   # torch's knob (the engine honours it) back at its default
            dynamo.config.optimize_ddp = True
        engine.reset()
        engine.config.optimize_ddp = optimize_ddp
        model = engine.compile(model, backend=args.engine_backend)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    return ddp, opt, cfg


def step(ddp, opt, ids, device, autocast):
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = ddp(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def allreduce_ms(ddp, device, reps) -> float:
    """All-reducing every gradient's bytes, bucket by bucket as DDP sends them, alone."""
    total = sum(p.numel() for p in ddp.parameters() if p.requires_grad)
    bucket = (25 << 20) // 4
    bufs = [torch.ones(min(bucket, total - i), device=device) for i in range(0, total, bucket)]
    times = []
    for _ in range(reps + 2):
        sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        for b in bufs:
            dist.all_reduce(b)
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1e3


def run_mode(mode, args, device, rank, data, reference_losses):
    import observe
    counter = GraphCounter()
    observe.subscribe(counter, events=["artifact", "dynamo_output_graph"])
    autocast = device.type == "cuda"
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        ddp, opt, _ = build(mode, args, device)
        sync(device)
        t0 = time.perf_counter()
        losses = [step(ddp, opt, data[0], device, autocast)]
        sync(device)
        first_s = time.perf_counter() - t0
        for i in range(1, args.warmup):
            losses.append(step(ddp, opt, data[i], device, autocast))
        times = []
        for i in range(args.warmup, args.warmup + args.steps):
            sync(device)
            dist.barrier()
            t0 = time.perf_counter()
            losses.append(step(ddp, opt, data[i], device, autocast))
            sync(device)
            times.append(time.perf_counter() - t0)
        nosync = []
        with ddp.no_sync():
            for i in range(args.steps + 1):   # the first one untimed: it may compile again
                sync(device)
                dist.barrier()
                t0 = time.perf_counter()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    loss = ddp(input_ids=data[i], labels=data[i]).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                sync(device)
                nosync.append(time.perf_counter() - t0)
        timeline = gpu_timeline(lambda i: step(ddp, opt, data[i], device, autocast), mode, args, rank) \
            if args.profile and device.type == "cuda" else None
        comm = allreduce_ms(ddp, device, max(3, args.steps // 2))
        losses = [float(x) for x in losses]
        # every rank's timing: a step is as slow as its slowest rank
        mine = torch.tensor([statistics.median(times) * 1e3, statistics.median(nosync[1:]) * 1e3, comm, first_s],
                            dtype=torch.float64, device=device)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        step_ms, nosync_ms, comm_ms, first = mine.tolist()
        exposed = max(0.0, step_ms - nosync_ms)
        compiler = MODES[mode][0]
        graphs = {"engine": counter.engine_graphs, "torch": _torch_graph_count()}.get(compiler)
        pieces = (counter.engine_pieces or counter.engine_graphs) if compiler == "engine" else None
        return {
            "mode": mode, "ok": True, "step_ms": step_ms, "nosync_ms": nosync_ms, "exposed_comm_ms": exposed,
            "allreduce_ms": comm_ms, "hidden_pct": min(100.0, max(0.0, 100.0 * (1 - exposed / comm_ms))) if comm_ms > 0 else None,
            "first_step_s": first, "graphs": graphs, "engine_pieces": pieces,
            "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
            "losses": losses,
            "loss_diff": (max(abs(a - b) for a, b in zip(losses, reference_losses)) if reference_losses else 0.0),
            "tokens_per_s": WORLD * args.batch * args.seq / (step_ms / 1e3),
            "timeline": timeline,
        }
    except Exception as exc:
        traceback.print_exc()
        return {"mode": mode, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        observe.unsubscribe(counter)


def _union(spans):
    """Merged [start, end) intervals, sorted."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(spans) -> float:
    return sum(b - a for a, b in spans)


def _intersection(xs, ys) -> float:
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, b - a)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def gpu_timeline(run_step, mode, args, rank, steps=2):
    """Two steps under torch.profiler: how long a step's compute and NCCL kernels ran, and
    how much of the NCCL time ran beside compute. Every rank profiles (a collective needs
    both); rank 0 reports and writes its Chrome trace."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    device = torch.device("cuda", rank)
    sync(device)
    dist.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            run_step(args.warmup + i)
        sync(device)
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    if rank != 0:
        return None
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start]
    nccl = _union([(e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower()])
    compute = _union([(e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower()])
    span = (max(b for _, b in nccl + compute) - min(a for a, _ in nccl + compute)) if kernels else 0.0
    overlap = _intersection(nccl, compute)
    out = os.environ.get("OUT")
    if out:
        import gzip
        tmp = os.path.join(out, f"_trace_{rank}.json")
        prof.export_chrome_trace(tmp)
        name = "ddp_trace_" + re.sub(r"[^a-z0-9]+", "_", mode.lower()).strip("_") + ".json.gz"
        with open(tmp, "rb") as f, gzip.open(os.path.join(out, name), "wb") as g:
            g.write(f.read())
        os.remove(tmp)
    per = 1e3 * steps   # profiler times are in us, over `steps` steps
    return {"wall_ms": wall_ms, "compute_ms": _length(compute) / per, "nccl_ms": _length(nccl) / per,
            "overlap_ms": overlap / per, "nccl_alone_ms": (_length(nccl) - overlap) / per,
            "idle_ms": (span - _length(_union(nccl + compute))) / per,
            "kernels": len(kernels) / steps}


def _torch_graph_count():
    """Graphs torch.compile captured (before its DDP split) since the mode's reset."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


def worker(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD))
    if args.device == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", rank=rank, world_size=WORLD, device_id=device,
                                timeout=datetime.timedelta(seconds=args.timeout))
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)   # as torchrun does: ranks sharing a CPU must not each spin up every core
        dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=args.timeout))
    import engine  # noqa: F401  (after the process group: the trace file is named by rank)
    _, cfg = gpt2(args.tiny)
    data = batches(cfg, args, rank, device, args.warmup + args.steps)
    results = []
    reference = None
    for short in args.modes.split(","):
        mode = SHORT.get(short, short)
        if rank == 0:
            print(f"[{time.strftime('%H:%M:%S')}] {mode} ...", flush=True)
        r = run_mode(mode, args, device, rank, data, reference)
        # a mode that failed on one rank failed: all ranks go on to the next together
        flag = torch.tensor([1 if r["ok"] else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if not flag.item() and r["ok"]:
            r = {"mode": mode, "ok": False, "error": "failed on another rank"}
        if mode == "eager" and r["ok"]:
            reference = r["losses"]
        results.append(r)
        if rank == 0 and r["ok"]:
            print(f"    step {r['step_ms']:.2f} ms, first step {r['first_step_s']:.1f} s", flush=True)
    if rank == 0:
        report(results, args, device)
    dist.barrier()   # no rank leaves while another still talks to it
    dist.destroy_process_group()


def report(results, args, device):
    by = {r["mode"]: r for r in results}
    eager = by.get("eager", {})
    head = (f"{'mode':34} {'step ms':>9} {'vs eager':>8} {'no-sync':>8} {'exposed':>8} {'allred':>7} "
            f"{'hidden':>7} {'1st s':>7} {'graphs':>6} {'pieces':>6} {'GiB':>6} {'loss diff':>10}")
    print()
    print(f"GPT-2 {'tiny' if args.tiny else '124M'}, {WORLD} ranks on {_device_name(device)}, batch {args.batch} x "
          f"{args.seq} tokens per rank, {args.steps} timed steps after {args.warmup} warm-up steps")
    print(head)
    print("-" * len(head))
    for r in results:
        if not r["ok"]:
            print(f"{r['mode']:34} FAILED: {r['error'][:150]}")
            continue
        vs = f"{eager['step_ms'] / r['step_ms']:.2f}x" if eager.get("ok") else ""
        hidden = f"{r['hidden_pct']:.0f}%" if r["hidden_pct"] is not None else ""
        mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else ""
        print(f"{r['mode']:34} {r['step_ms']:9.2f} {vs:>8} {r['nosync_ms']:8.2f} {r['exposed_comm_ms']:8.2f} "
              f"{r['allreduce_ms']:7.2f} {hidden:>7} {r['first_step_s']:7.1f} "
              f"{'' if r['graphs'] is None else r['graphs']:>6} {r['engine_pieces'] or '':>6} "
              f"{mem:>6} {r['loss_diff']:10.2e}")
    print()
    gains = {}
    for compiler, name in (("torch.compile", "torch.compile"), ("engine", "engine")):
        on, off = by.get(compiler), by.get(f"{compiler}, optimize_ddp off")
        if on and off and on["ok"] and off["ok"]:
            gains[name] = off["step_ms"] - on["step_ms"]
            print(f"overlap gained by the bucket split, {name}: {gains[name]:+.2f} ms a step "
                  f"({off['step_ms']:.2f} -> {on['step_ms']:.2f}; exposed comm {off['exposed_comm_ms']:.2f} -> "
                  f"{on['exposed_comm_ms']:.2f} ms)")
    ours, theirs = by.get("engine"), by.get("torch.compile")
    if ours and theirs and ours["ok"] and theirs["ok"]:
        print(f"engine vs torch.compile (both split): {theirs['step_ms'] / ours['step_ms']:.3f}x "
              f"({ours['step_ms']:.2f} vs {theirs['step_ms']:.2f} ms a step)")
    if any(r.get("timeline") for r in results):
        print()
        print("GPU timeline of rank 0, ms a step (NCCL kernels include their wait for the other rank):")
        print(f"{'mode':34} {'wall':>7} {'compute':>8} {'nccl':>6} {'overlap':>8} {'nccl alone':>10} "
              f"{'idle':>6} {'kernels':>8}")
        for r in results:
            t = r.get("timeline")
            if t:
                print(f"{r['mode']:34} {t['wall_ms']:7.2f} {t['compute_ms']:8.2f} {t['nccl_ms']:6.2f} "
                      f"{t['overlap_ms']:8.2f} {t['nccl_alone_ms']:10.2f} {t['idle_ms']:6.2f} {t['kernels']:8.0f}")
    path = args.json or (os.path.join(os.environ["OUT"], "ddp_gpu.json") if os.environ.get("OUT") else None)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"device": _device_name(device), "world": WORLD, "tiny": args.tiny, "batch": args.batch,
                       "seq": args.seq, "steps": args.steps, "warmup": args.warmup,
                       "bucket_cap_mb": args.bucket_cap_mb, "engine_backend": args.engine_backend, "torch_backend": args.torch_backend,
                       "torch": torch.__version__, "results": results, "overlap_gain_ms": gains}, f, indent=1)
        print(f"results -> {path}")


def _device_name(device) -> str:
    if device.type == "cuda":
        return f"{WORLD}x {torch.cuda.get_device_name(device)}"
    return "CPU (gloo)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide GPT-2 (for trying the script on a CPU)")
    ap.add_argument("--modes", default="eager,torch,torch_off,engine,engine_off",
                    help="comma-separated: eager, torch, torch_off, engine, engine_off")
    ap.add_argument("--batch", type=int, default=None, help="sequences per rank (default 8; tiny: 2)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 1024; tiny: 32)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 20; tiny: 5)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before timing (the first compiles)")
    ap.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's bucket_cap_mb (default: DDP's, 25)")
    ap.add_argument("--engine-backend", default="inductor")
    ap.add_argument("--torch-backend", default="inductor")
    ap.add_argument("--timeout", type=int, default=900, help="seconds a rank waits in a collective")
    ap.add_argument("--json", default=None, help="write results here (default: $OUT/ddp_gpu.json if $OUT is set)")
    ap.add_argument("--profile", action="store_true",
                    help="also rank 0's GPU timeline of two steps per mode: compute, NCCL, their overlap, idle")
    args = ap.parse_args(argv)
    args.batch = args.batch or (2 if args.tiny else 8)
    args.seq = args.seq or (32 if args.tiny else 1024)
    args.steps = args.steps or (5 if args.tiny else 20)
    if args.device == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", "1")   # the generated C++ kernels' OpenMP too
    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        sys.exit(f"ddp_gpu.py: needs {WORLD} GPUs, found {torch.cuda.device_count()} (--device cpu runs on gloo)")
    mp.spawn(worker, args=(args, _free_port()), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main()
