"""The zoo's models at real sizes on the GPU, bf16: eager, torch.compile (default and
reduce-overhead) and ours (default and reduce-overhead), side by side in one run.

    python -m tests.bench.zoo_gpu                        # every model, inference and training
    python -m tests.bench.zoo_gpu --models gpt2,vit --impls eager,torch,ours --iters 20
    python -m tests.bench.zoo_gpu --models gpt2 --train '' --profile   # GPU busy time, top kernels
    python -m tests.bench.zoo_gpu --gpus 2               # two processes at once, a GPU and half the CPUs each

Inference (torch.no_grad, bf16 weights): GPT-2 124M on 8x512 tokens, a Llama-style ~1B
(16 layers, d=2048, GQA) on 4x512, BERT-base 16x256, T5-base 8x256 (encoder and decoder),
ViT-B/16 and ResNet-50 on 32x3x224x224 (torchvision), Whisper-small's encoder on 8 clips.
Training (fp32 weights, bf16 autocast, AdamW, the whole step compiled): GPT-2 and the Llama;
the step's loss is kept until the next step returns, as `loss = step(batch)` in a loop keeps it.
Ours runs with the default config (the step's backward behind autograd, as torch.compile's);
--impls ours-step,ours-step-ro adds ours with the backward and the optimizer step in the
step's graph (engine.config.backward_in_graph).
Per model and implementation: ms per call (CUDA events, median of --iters after warm-up),
speedup over eager, cold compile seconds (the calls until the first timed one, fresh caches),
peak memory (GiB): allocated (what tensors the allocator owns held at most) and reserved
(what the allocator took from the device at most: with CUDA graphs, both compilers hand out
outputs over graph memory the allocator does not count as allocated, so reserved is the
footprint to compare); then geomeans of the speedups per implementation, inference and training
apart. Each (model, implementation) runs in a fresh process of its own (--same-process: all
in this one), inside a try/except. Per call: "ms" is one call timed alone, synchronized
before and after (what a request waits for); "host ms" the time until the call returns to
Python; "b2b ms" a call's share of calls made back to back (throughput, the host running
ahead of the GPU). With $OUT set (or --json) the rows are written as JSON too.

Before the first model, the C++ tensor-guard checker (engine/guards/native.py) and kernel
launcher (engine/codegen/triton/native_launch.py) are built if this machine has not built
them yet: a user's first compile builds each once per machine on a background thread, and a
process that measures for a few seconds after a fresh machine's first compile would time
the Python they replace (ResNet-50 with CUDA graphs: 0.74 ms
of host time a call against 0.27). The build is not counted in any cold compile."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

_TMP = tempfile.mkdtemp(prefix="zoo-gpu-")
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_TMP, "triton"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_TMP, "inductor"))
os.environ.setdefault("ENGINE_CACHE_DIR", os.path.join(_TMP, "engine"))

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import torch  # noqa: E402

import engine  # noqa: E402

from .memory_peak import peak_sites  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16
IMPLS = ["eager", "torch", "torch-ro", "ours", "ours-ro"]
# also: "ours-step" and "ours-step-ro", ours with engine.config.backward_in_graph on (a
# training step's forward, loss.backward() and optimizer step in one graph, docs/training.md);
# set in the child process, so the other implementations run with the default config.
STEP_IMPLS = ["ours-step", "ours-step-ro"]
_BACKWARD_IN_GRAPH = engine.config.backward_in_graph     # as the environment set it


def _tf():
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


def _ids(b, s, vocab, g):
    return torch.randint(3, vocab, (b, s), device=DEV, generator=g)


def build(name: str, train: bool):
    """(model, inputs dict or tuple, loss fn of the output)"""
    g = torch.Generator(device=DEV).manual_seed(0)
    torch.manual_seed(0)
    tf = _tf() if name in ("gpt2", "llama", "bert", "t5", "whisper") else None
    if name == "gpt2":
        m = tf.GPT2LMHeadModel(tf.GPT2Config())
        ids = _ids(8, 512, 50257, g)
        return m, {"input_ids": ids, "labels": ids} if train else {"input_ids": ids}, lambda o: o.loss
    if name == "llama":
        cfg = tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=32000, max_position_embeddings=1024)
        m = tf.LlamaForCausalLM(cfg)
        ids = _ids(4, 512, 32000, g)
        return m, {"input_ids": ids, "labels": ids} if train else {"input_ids": ids}, lambda o: o.loss
    if name == "bert":
        m = tf.BertForMaskedLM(tf.BertConfig())
        return m, {"input_ids": _ids(16, 256, 30522, g)}, lambda o: o.logits.float().mean()
    if name == "t5":
        cfg = tf.T5Config(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12, d_kv=64)
        m = tf.T5ForConditionalGeneration(cfg)
        return m, {"input_ids": _ids(8, 256, 32128, g), "decoder_input_ids": _ids(8, 256, 32128, g)}, \
            lambda o: o.logits.float().mean()
    if name == "whisper":
        cfg = tf.WhisperConfig(d_model=768, encoder_layers=12, encoder_attention_heads=12, decoder_layers=12,
                               decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072)
        m = tf.WhisperModel(cfg).get_encoder()
        feats = torch.randn(8, 80, 3000, device=DEV, generator=g)
        return m, {"input_features": feats}, lambda o: o.last_hidden_state.float().mean()
    if name in ("vit", "resnet50"):
        import torchvision
        m = torchvision.models.vit_b_16() if name == "vit" else torchvision.models.resnet50()
        x = torch.randn(32, 3, 224, 224, device=DEV, generator=g)
        return m, (x,), lambda o: o.float().mean()
    raise KeyError(name)


INFER = ["gpt2", "llama", "bert", "t5", "vit", "resnet50", "whisper"]
TRAIN = ["gpt2", "llama"]


def compiled(impl: str, fn):
    if impl == "eager":
        return fn
    mode = "reduce-overhead" if impl.endswith("-ro") else None
    if impl.startswith("torch"):
        import torch._dynamo
        torch._dynamo.reset()
        return torch.compile(fn, mode=mode)
    engine.reset()
    engine.config.backward_in_graph = "-step" in impl or _BACKWARD_IN_GRAPH
    return engine.compile(fn, mode=mode)


def measure(call, iters: int, warm: int):
    """(cold seconds of the first `warm` calls, median ms of the next `iters` each timed
    alone (CUDA events, synchronized after each), median host ms of those calls (until the
    call returns), ms a call of `iters` calls back to back (the host runs ahead))"""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(warm):
        call()
    torch.cuda.synchronize()
    cold = time.perf_counter() - t0
    times, host = [], []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        h = time.perf_counter()
        call()
        host.append((time.perf_counter() - h) * 1e3)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    return cold, statistics.median(times), statistics.median(host), (time.perf_counter() - t0) * 1e3 / iters


def fresh_caches(tag: str) -> None:
    """Empty cache folders for each (model, implementation): cold compiles are cold."""
    os.environ["TRITON_CACHE_DIR"] = os.path.join(_TMP, tag, "triton")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_TMP, tag, "inductor")
    engine.config.cache_dir = os.path.join(_TMP, tag, "engine")


def run_one(name: str, train: bool, impl: str, iters: int) -> dict:
    fresh_caches(f"{name}-{train}-{impl}")
    model, inputs, loss_of = build(name, train)
    model = model.to(DEV)
    if not train:
        model = model.to(BF16).eval()
        if isinstance(inputs, dict) and "input_features" in inputs:
            inputs = {k: v.to(BF16) for k, v in inputs.items()}
        elif isinstance(inputs, tuple):
            inputs = tuple(x.to(BF16) for x in inputs)

        def fwd(m, inp):
            with torch.no_grad():
                return m(**inp) if isinstance(inp, dict) else m(*inp)
        fn = compiled(impl, fwd)
        call = lambda: fn(model, inputs)    # noqa: E731
    else:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(m, o, inp):
            with torch.autocast(DEV, dtype=BF16):
                loss = loss_of(m(**inp))
            loss.backward()
            o.step()
            o.zero_grad()
            return loss
        fn = compiled(impl, step)
        last = [None]

        def call():       # as a training loop does (`loss = step(batch)`): the last loss is kept during the next step
            last[0] = fn(model, opt, inputs)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    warm = 3 if impl.endswith("-ro") else 2
    warm_memory, warm_peaks = None, []
    if MEMORY:   # the compiling calls recorded too: their peak is part of the peak reported
        def warm_calls():   # each result dropped before the next call, as in the timed calls
            for _ in range(warm):
                call()
                torch.cuda.synchronize()
                warm_peaks.append(round(torch.cuda.max_memory_allocated() / 2**30, 2))
        warm_memory = peak_sites(warm_calls, top=25)
        warm = 0
    cold, ms, host_ms, tput_ms = measure(call, iters, warm=warm)
    peak = torch.cuda.max_memory_allocated() / 2**30
    reserved = torch.cuda.max_memory_reserved() / 2**30
    row = {"model": name, "mode": "train" if train else "infer", "impl": impl, "ms": ms, "cold_s": cold,
           "peak_gib": peak, "reserved_gib": reserved, "host_ms": host_ms, "tput_ms": tput_ms}
    if PROFILE:
        row["gpu_ms"], row["top_kernels"], row["kernel_kinds"] = top_kernels(call, n=TOP)
    if GAPS:
        row["gaps"] = gpu_gaps(call)
    if HOST_PROFILE:
        row["host_profile"] = host_profile(call, save_as=f"{name}-{row['mode']}-{impl}")
        row["host_ops"] = host_ops(call)
    if MEMORY:
        row["memory"] = peak_sites(call, top=TOP)
        row["warm_memory"] = dict(warm_memory, peak_after_each_gib=warm_peaks)
        row["steady_peak_gib"] = row["memory"]["call_peak_gib"]
    return row


PROFILE = MEMORY = HOST_PROFILE = GAPS = False
TOP = 15


def _kernel_kind(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "splitk")):
        return "matmul"
    if any(k in n for k in ("sdpa", "flash", "fmha", "attention")):
        return "attention"
    if "conv" in n or "cudnn" in n:
        return "conv"
    if n.startswith(("memset", "memcpy")):
        return "memset/copy"
    if n.startswith(("triton_", "kernel", "combo")) or "_etc" in n:
        return "generated"
    return "other aten"


def top_kernels(call, n=15, steps=3):
    """(GPU busy ms per call, its n most expensive kernels: [name, ms per call, launches a call],
    ms a call by kind: matmul, attention, conv, generated, memset/copy, other aten)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    rows = [(e.key, e.self_device_time_total / 1e3 / steps, e.count / steps) for e in prof.key_averages()
            if e.self_device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    kinds: dict = {}
    for k, ms, c in rows:
        kind = kinds.setdefault(_kernel_kind(k), [0.0, 0.0])
        kind[0] += ms
        kind[1] += c
    return (round(sum(r[1] for r in rows), 3), [[k[:90], round(ms, 3), c] for k, ms, c in rows[:n]],
            {k: [round(ms, 3), c] for k, (ms, c) in sorted(kinds.items(), key=lambda kv: -kv[1][0])})


def gpu_gaps(call, steps=3, n=12) -> dict:
    """Where the GPU waits on the host within one call timed alone (torch.profiler, CPU and
    CUDA): the ms from the call's start to its first kernel, the ms the GPU is idle after
    that, and that idle time by the innermost CPU range (an aten op, an autograd node, an
    optimizer step) running when each gap began, the n largest, averaged over `steps` calls."""
    from torch.profiler import ProfilerActivity, profile
    lead, idle, by = 0.0, 0.0, {}
    for _ in range(steps):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        evs = prof.events()
        gpu = sorted((e.time_range.start, e.time_range.end) for e in evs
                     if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start)
        cpu = [e for e in evs if e.device_type == torch.autograd.DeviceType.CPU
               and not e.name.startswith(("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize"))]
        if not gpu or not cpu:
            continue
        start = min(e.time_range.start for e in cpu)
        lead += (gpu[0][0] - start) / 1e3
        end = gpu[0][1]
        for s, e in gpu[1:]:
            if s > end:
                gap = s - end
                idle += gap / 1e3
                inside = [c for c in cpu if c.time_range.start <= end < c.time_range.end]
                name = min(inside, key=lambda c: c.time_range.end - c.time_range.start).name if inside else "(none)"
                by[name] = by.get(name, 0.0) + gap / 1e3
            end = max(end, e)
    rows = sorted(by.items(), key=lambda kv: -kv[1])[:n]
    return {"lead_ms": round(lead / steps, 3), "idle_ms": round(idle / steps, 3),
            "by_range": [[k[:90], round(v / steps, 3)] for k, v in rows]}


def host_profile(call, calls=50, n=25, save_as=None) -> list:
    """cProfile over `calls` calls: the n functions with the most own time, [us a call, calls
    a call, where]. With $OUT set the whole profile is written there too
    (host-<save_as>.pstats)."""
    import cProfile
    import pstats
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    torch.cuda.synchronize()
    if os.environ.get("OUT") and save_as:     # the whole profile, for pstats / snakeviz
        prof.dump_stats(os.path.join(os.environ["OUT"], f"host-{save_as}.pstats"))
    st = pstats.Stats(prof)
    rows = [(tt / calls * 1e6, nc / calls, f"{os.path.basename(f)}:{ln} {name}")
            for (f, ln, name), (cc, nc, tt, ct, callers) in st.stats.items()]
    rows.sort(key=lambda r: -r[0])
    return [[round(us, 1), round(c, 1), w[:100]] for us, c, w in rows[:n]]


def host_ops(call, calls=10, n=20) -> list:
    """torch.profiler's CPU side over `calls` calls: the n aten ops and CUDA runtime calls
    with the most self CPU time, [us a call, calls a call, name]. Unlike cProfile it times
    what C++ does inside one Python call (a convolution's cuDNN plan lookup, an allocation)."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    rows = [(e.self_cpu_time_total / calls, e.count / calls, e.key) for e in prof.key_averages()
            if e.self_cpu_time_total > 0]
    rows.sort(key=lambda r: -r[0])
    return [[round(us, 1), round(c, 1), k[:100]] for us, c, k in rows[:n]]


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def _cpus_of(slot: int, slots: int) -> set:
    """The CPUs of one of `slots` processes running at once: an equal share each, so that two
    compiles at once (each with its compile workers) do not take each other's cores, and each
    runs as on a machine of one GPU and its share of the host."""
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // slots)
    return set(cpus[slot * share:(slot + 1) * share]) or set(cpus)


def _run_child(name: str, train: bool, impl: str, args, gpu: Optional[int] = None) -> dict:
    """run_one in a fresh process (on GPU `gpu` alone when given); its row comes back as JSON,
    its output only when it fails."""
    import subprocess
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu)) if gpu is not None else None
    path = os.path.join(_TMP, f"row-{name}-{train}-{impl}.json")
    cmd = [sys.executable, "-m", "tests.bench.zoo_gpu", "--one", f"{name}:{'train' if train else 'infer'}:{impl}",
           "--iters", str(args.iters), "--json", path] + (["--profile"] if args.profile else []) \
        + (["--memory"] if args.memory else []) + (["--host-profile"] if args.host_profile else []) + (["--gaps"] if args.gaps else []) \
        + ["--top", str(args.top)]
    if gpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", ",".join(map(str, sorted(_cpus_of(gpu, args.gpus))))] + cmd
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if proc.returncode != 0 or not os.path.exists(path):
        print(proc.stdout[-3000:], flush=True)
        raise RuntimeError(f"the child process exited with {proc.returncode}")
    with open(path) as f:
        return json.load(f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(INFER), help="inference models: " + ",".join(INFER))
    ap.add_argument("--train", default=",".join(TRAIN), help="training models ('' for none): " + ",".join(TRAIN))
    ap.add_argument("--impls", default=",".join(IMPLS), help=",".join(IMPLS + STEP_IMPLS))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true", help="also the GPU busy time and top kernels of each")
    ap.add_argument("--host-profile", action="store_true", help="also where each call's host time goes (cProfile)")
    ap.add_argument("--gaps", action="store_true",
                    help="also where the GPU waits on the host in one call (lead-in, idle ms by CPU range)")
    ap.add_argument("--top", type=int, default=15,
                    help="with --profile: how many kernels to list; with --memory: how many allocating lines")
    ap.add_argument("--memory", action="store_true",
                    help="also one call's peak after warm-up and the lines whose tensors are alive at it")
    ap.add_argument("--same-process", action="store_true",
                    help="run every (model, implementation) in this process; by default each runs in a fresh "
                         "one, so none pays for or profits from another's imports, caches and leftover state")
    ap.add_argument("--gpus", type=int, default=1,
                    help="run this many (model, implementation) processes at once, each on a GPU of its own "
                         "and an equal share of the CPUs (a 2-GPU machine: --gpus 2); rows print in the usual order once a model's are all in")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)     # model:mode:impl, in a child process
    args = ap.parse_args(argv)
    global PROFILE, MEMORY, TOP, HOST_PROFILE, GAPS
    PROFILE, MEMORY, TOP, HOST_PROFILE, GAPS = args.profile, args.memory, args.top, args.host_profile, args.gaps
    if args.one:
        name, mode, impl = args.one.split(":")
        with open(args.json, "w") as f:
            json.dump(run_one(name, mode == "train", impl, args.iters), f)
        return
    impls = args.impls.split(",")
    from engine.codegen.triton import native_launch
    from engine.guards import native
    if not native.wait(600):
        print(f"note: the C++ tensor-guard checker did not build ({native.build_error()}); "
              "guards run as Python", flush=True)
    if not native_launch.wait(600):
        print(f"note: the C++ kernel launcher did not build ({native_launch.build_error()}); "
              "launches and allocations run as Python", flush=True)
    rows = []
    # training first: the longest runs, and the ratio most in doubt
    work = [(m, True) for m in args.train.split(",") if m] + [(m, False) for m in args.models.split(",") if m]
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    print(f"{'model':10} {'mode':5} {'impl':9} {'ms':>9} {'x eager':>8} {'cold s':>7} {'peak GiB':>8} "
          f"{'rsvd GiB':>8} {'host ms':>8} {'b2b ms':>8}", flush=True)
    free_gpus = list(range(args.gpus))
    parallel = args.gpus > 1 and not args.same_process

    def one(name, train, impl):
        gpu = free_gpus.pop() if parallel else None
        try:
            return run_one(name, train, impl, args.iters) if args.same_process else \
                _run_child(name, train, impl, args, gpu)
        except Exception as exc:
            traceback.print_exc()
            return {"model": name, "mode": "train" if train else "infer", "impl": impl,
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        finally:
            if gpu is not None:
                free_gpus.append(gpu)

    pending = {}
    if parallel:     # all started now, a GPU each as one frees; collected in order below
        pool = ThreadPoolExecutor(args.gpus)
        # model by model (rows come in as each model's are done), each model's torch.compile
        # runs (the longest) before the others
        order = [(m, t, i) for m, t in work for i in sorted(impls, key=lambda i: not i.startswith("torch"))]
        pending = {w: pool.submit(one, *w) for w in order}
    for name, train in work:
        eager_ms = None
        for impl in impls:
            r = pending[(name, train, impl)].result() if pending else one(name, train, impl)
            rows.append(r)
            if impl == "eager" and "ms" in r:
                eager_ms = r["ms"]
            if "ms" in r:
                r["speedup"] = eager_ms / r["ms"] if eager_ms else None
                print(f"{name:10} {r['mode']:5} {impl:9} {r['ms']:9.2f} {r['speedup'] or float('nan'):8.2f} "
                      f"{r['cold_s']:7.1f} {r['peak_gib']:8.2f} {r.get('reserved_gib', float('nan')):8.2f} "
                      f"{r['host_ms']:8.2f} {r['tput_ms']:8.2f}", flush=True)
                if r.get("gaps"):
                    gp = r["gaps"]
                    print(f"    GPU waits on the host: {gp['lead_ms']} ms before the first kernel, {gp['idle_ms']} ms "
                          "idle after it; idle ms by the CPU range running when a gap began:")
                    for k, ms in gp["by_range"]:
                        print(f"      {ms:8.3f}  {k}")
                if r.get("host_ops"):
                    print("    host time (torch.profiler, CPU; self us a call, calls a call, op):")
                    for us, c, where in r["host_ops"]:
                        print(f"        {us:8.1f} {c:7.1f}  {where}")
                if r.get("host_profile"):
                    print("    host time (cProfile; us a call, calls a call, function):")
                    for us, c, where in r["host_profile"]:
                        print(f"      {us:8.1f} {c:7.1f}  {where}")
                if r.get("warm_memory"):
                    mem = r["warm_memory"]
                    print(f"    the compiling calls: peak {mem['call_peak_gib']:.2f} GiB (peak so far after each: "
                          f"{mem.get('peak_after_each_gib')}); alive at it:")
                    for site, n, mib in mem["sites"]:
                        print(f"      {mib:9.1f} {n:5}  {site}")
                if "memory" in r:
                    mem = r["memory"]
                    print(f"    one call after warm-up: {mem['before_gib']:.2f} GiB before, peak {mem['call_peak_gib']:.2f};"
                          " alive at the peak (MiB, blocks, allocating line):")
                    for site, n, mib in mem["sites"]:
                        print(f"      {mib:9.1f} {n:5}  {site}")
                if "top_kernels" in r:
                    print(f"    GPU busy {r['gpu_ms']} ms a call; top kernels (ms, launches a call):")
                    for k, kms, c in r["top_kernels"]:
                        print(f"      {kms:8.3f} {c:6.1f}  {k}")
                    print("    by kind (ms, launches a call): " + "; ".join(
                        f"{k} {ms:.2f} ({c:.0f})" for k, (ms, c) in r["kernel_kinds"].items()))
            else:
                print(f"{name:10} {r['mode']:5} {impl:9} error: {r['error']}", flush=True)
            torch.cuda.empty_cache()
    print("\ngeomean speedup over eager:")
    summary = {}
    for mode in ("infer", "train"):
        for impl in impls[1:] if impls[0] == "eager" else impls:
            g = geomean([r.get("speedup") for r in rows if r["mode"] == mode and r["impl"] == impl])
            summary[f"{mode}/{impl}"] = g
            if not math.isnan(g):      # (no rows of this mode, or no eager row to divide by)
                print(f"  {mode:5} {impl:9} {g:.3f}")
    # ours over torch.compile: per model, its ms over ours, on the models both ran (so a row
    # missing from one side does not tilt it; eager is not needed)
    ms = {(r["model"], r["mode"], r["impl"]): r["ms"] for r in rows if "ms" in r}
    for mode in ("infer", "train"):
        for ours, theirs in (("ours", "torch"), ("ours-ro", "torch-ro"), ("ours-step", "torch"),
                             ("ours-step-ro", "torch-ro")):
            pairs = [(ms[(m, mode, theirs)], ms[(m, mode, ours)]) for m, train in work
                     if train == (mode == "train") and (m, mode, ours) in ms and (m, mode, theirs) in ms]
            if pairs:
                g = geomean([a / b for a, b in pairs])
                summary[f"{mode}/{ours} over {theirs}"] = g
                print(f"  {mode:5} {ours} / {theirs}: {g:.3f} (models: {len(pairs)})")
    path = args.json or (os.path.join(os.environ["OUT"], "zoo_gpu.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "geomeans": summary}, f, indent=1)


if __name__ == "__main__":
    main()
