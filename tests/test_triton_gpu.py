"""The Triton backend on a real GPU: engine.compile on CUDA tensors runs Triton kernels
with eager's results, for the benchmark's models at small sizes, inference and training,
long rows (looped reductions), dynamic sizes, GPU-only math (libdevice) and max-autotune.
Run with `pytest -m gpu tests/test_triton_gpu.py` on a machine with an NVIDIA GPU."""

from __future__ import annotations

import glob
import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "bench"))

import engine  # noqa: E402
import observe  # noqa: E402

F = torch.nn.functional
DEV = "cuda"


@pytest.fixture(autouse=True)
def fresh():
    engine.reset()
    yield
    engine.reset()


class Kernels:
    """Collects the kernel_code events of a compile."""

    def __enter__(self):
        self.sources = []
        self.hints = []
        self.wrappers = []
        observe.subscribe(self, events=["artifact", "inductor_output_code"])
        return self

    def __call__(self, ev):
        if ev.name == "inductor_output_code":
            self.wrappers.append(ev.payload())
        elif ev.metadata.get("name") == "kernel_code":
            self.sources.append(ev.payload())
        elif ev.metadata.get("name") == "perf_hints":
            self.hints.append(ev.payload())

    def __exit__(self, *exc):
        observe.unsubscribe(self)


def assert_close(got, want, tol):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol, equal_nan=True)


def check(fn, *inputs, tol=1e-5, **compile_kw):
    with Kernels() as k:
        got = engine.compile(fn, **compile_kw)(*inputs)
    want = fn(*inputs)
    for g, w in zip(got if isinstance(got, (tuple, list)) else [got], want if isinstance(want, (tuple, list)) else [want]):
        assert_close(g, w, tol)
    assert k.sources and all("@triton.jit" in s for s in k.sources), k.hints
    assert not any("uncompiled" in h for h in k.hints), k.hints
    return k


def test_benchmark_functions_small():
    from bench_gpu import layernorm_gelu, pointwise_chain, rmsnorm, softmax
    x, y = torch.randn(1000, 37, device=DEV), torch.randn(1000, 37, device=DEV)
    check(pointwise_chain, x, y)
    xb = torch.randn(64, 384, device=DEV, dtype=torch.bfloat16)
    wb, bb = torch.randn(384, device=DEV, dtype=torch.bfloat16), torch.randn(384, device=DEV, dtype=torch.bfloat16)
    check(layernorm_gelu, xb, wb, bb, tol=3e-2)
    check(softmax, xb, tol=1e-2)
    check(rmsnorm, xb, wb, tol=3e-2)


def test_gelu_and_rsqrt_compile_without_libdevice():
    # GELU is x * _ndtr(x) (a fitted exp2 form: ex2.approx on the GPU) and rsqrt is PTX's
    # rsqrt.approx: no libdevice to link into these kernels, results as close as eager's
    x = torch.linspace(-9, 9, 200001, device=DEV)
    k = check(lambda t: F.gelu(t), x, tol=1e-6)
    got = engine.compile(lambda t: F.gelu(t))(x).double()
    exact = x.double() * torch.special.ndtr(x.double())
    assert ((got - exact).abs() <= 3e-7 * x.double().abs() + 1e-30).all()
    xb = torch.randn(64, 384, device=DEV, dtype=torch.bfloat16)
    k = check(lambda t: F.gelu(F.layer_norm(t, (384,))), xb, tol=3e-2)
    k2 = check(lambda t: t * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6), xb, tol=3e-2)
    bodies = [s.split("@triton.jit", 1)[1] for s in k.sources + k2.sources]
    assert any("_ndtr(" in b for b in bodies) and any("_rsqrt(" in b for b in bodies)
    assert not any("libdevice" in b for b in bodies)


def test_long_rows_loop_and_columns_reduce():
    x = torch.randn(3, 20000, device=DEV)
    k = check(lambda t: torch.softmax(t, -1), x, tol=1e-6)
    assert any("for roffset" in s for s in k.sources)
    k = check(lambda t: t.sum(0), torch.randn(5000, 77, device=DEV), tol=1e-3)
    assert any("_split(" in s for s in k.sources)       # 77 columns: split over the rows
    check(lambda t: (t.argmax(-1), t.amax(0)), torch.randn(33, 9000, device=DEV))
    k = check(lambda t: t.sum(), torch.randn(100000, device=DEV), tol=1e-2)
    assert any("_split(" in s for s in k.sources)
    # a layer norm's weight and bias gradients over 16384 rows, in bf16
    g, x = (torch.randn(16384, 1024, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    check(lambda g, x: ((g * x).sum(0), g.sum(0)), g, x, tol=1e-2)


def test_direct_launch_respects_alignment(monkeypatch):
    # kernels launch past Triton's dispatch and its C launcher; a pointer that is not
    # 16-byte aligned (a view one element in) was not what the kernel was compiled for:
    # it gets its own binary
    import gc

    from triton.runtime.driver import driver

    from engine.codegen.triton.launcher import Launcher

    def no_c_launcher(*a, **kw):
        raise AssertionError("Triton's C launcher was built")
    monkeypatch.setattr(driver.active, "launcher_cls", no_c_launcher)

    def direct_counts():
        return {id(o.direct): (len(o.direct.kernels), o.direct.hits) for o in gc.get_objects()
                if isinstance(o, Launcher) and o.direct is not None}

    before = direct_counts()
    fn = engine.compile(lambda t: t * 2 + 1.2345)      # a kernel no other test compiled
    x = torch.randn(4097, device=DEV)
    for view in (x[:4096], x[:4096], x[1:], x[1:]):
        assert_close(fn(view), view * 2 + 1.2345, 1e-6)
    after = direct_counts()
    new = [(k - before.get(i, (0, 0))[0], h - before.get(i, (0, 0))[1]) for i, (k, h) in after.items()]
    assert sum(k for k, _ in new) == 2          # one binary per alignment
    assert sum(h for _, h in new) == 4          # every call launched directly


def test_a_split_reduction_repeats_both_launches_with_its_workspace():
    # a column sum over many rows runs as two kernels (partials into a workspace, then the
    # combine); from the second call on, both launch from the repeat plan, with the first
    # call's workspace, and each call's result is its own input's
    seen = {id(la) for la in _launchers()}
    fn = engine.compile(lambda t: t.sum(0) * 3)
    xs = [torch.randn(6001, 77, device=DEV) for _ in range(4)]
    outs = [fn(x) for x in xs]
    for got, x in zip(outs, xs):
        assert_close(got, x.sum(0) * 3, 1e-3)
    (split,) = [la for la in _launchers() if id(la) not in seen and la.split_slots]
    assert split.plans, "no repeat plan for the split reduction"
    hits = split.direct.hits
    assert_close(fn(xs[0]), xs[0].sum(0) * 3, 1e-3)
    assert split.direct.hits == hits + 2     # both kernels, from the plan


def _launchers():
    import gc

    from engine.codegen.triton.launcher import Launcher
    return [o for o in gc.get_objects() if isinstance(o, Launcher) and o.direct is not None]


@pytest.mark.parametrize("workers", [4, 0])
def test_first_call_compiles_kernels_in_workers_or_threads(monkeypatch, workers):
    # a training step's kernels (forward and backward) compile on each graph's first call:
    # in worker processes, so this process's Triton never compiles one; or, with no
    # workers, with Triton's JIT on threads. Results are eager's either way.
    import triton.compiler

    from engine.codegen.triton.launcher import compile_workers

    jit_compiles = []
    real_compile = triton.compiler.compile
    monkeypatch.setattr(triton.compiler, "compile", lambda *a, **kw: jit_compiles.append(1) or real_compile(*a, **kw))
    seen = {id(launcher) for launcher in _launchers()}
    width = 160 + workers       # graphs (forward and backward) no other test compiled
    model = torch.nn.Sequential(torch.nn.Linear(96, width), torch.nn.GELU(), torch.nn.LayerNorm(width)).to(DEV)
    x = torch.randn(48, 96, device=DEV)
    scale = 0.5
    with engine.config.patch(triton_compile_workers=workers):
        if workers:     # they start on the first CUDA graph; jobs go to them once one is ready
            assert compile_workers().ready.wait(60)
        out = engine.compile(lambda t: model(t * scale).softmax(-1))(x)
        out.square().sum().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(x * scale).softmax(-1)
    want.square().sum().backward()
    assert_close(out, want, 1e-5)
    for got, p in zip(want_grads, model.parameters()):
        assert_close(got, p.grad, 1e-4)
    new = [launcher.direct for launcher in _launchers() if id(launcher) not in seen]
    assert sum(d.hits for d in new) >= 4                    # forward and backward kernels ran
    if workers:
        assert sum(d.from_workers for d in new) == sum(len(d.kernels) for d in new) >= 4
        assert jit_compiles == []
    else:
        assert sum(d.from_workers for d in new) == 0 and len(jit_compiles) == sum(len(d.kernels) for d in new) >= 4


def test_libdevice_math_and_integers():
    x = torch.randn(4099, device=DEV)
    check(lambda t: (t.tanh(), t.erfc(), torch.pow(t.abs() + 1, t), t.expm1(), t.log1p().nan_to_num(), t.round(),
                     torch.atan2(t, t + 1)), x)
    a = torch.randint(-100, 100, (999,), device=DEV)
    b = torch.randint(1, 9, (999,), device=DEV)
    check(lambda p, q: (p // q, p % q, p * q + 3), a, b)


def test_mlp_and_transformer_block_inference():
    from bench_gpu import MLP, Block
    m = MLP(64, 256).to(DEV, torch.bfloat16)
    x = torch.randn(48, 64, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        check(m, x, tol=5e-2)
    blk = Block(128, 4).to(DEV, torch.bfloat16).eval()
    x = torch.randn(2, 64, 128, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        check(blk, x, tol=6e-2)


def test_transformer_block_training_step_grads_match():
    from bench_gpu import Block
    torch.manual_seed(0)
    blk = Block(64, 4).to(DEV)
    ref = Block(64, 4).to(DEV)
    ref.load_state_dict(blk.state_dict())
    x = torch.randn(2, 32, 64, device=DEV)
    with Kernels() as k:
        out = engine.compile(blk)(x)
        out.square().mean().backward()
    want = ref(x)
    want.square().mean().backward()
    assert_close(out, want, 1e-4)
    for (n, p), q in zip(blk.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=lambda m: f"{n}: {m}")
    assert k.sources          # forward and backward kernels are Triton


@pytest.mark.parametrize("keys,mask_kind", [(256, "padding"), (200, "padding"), (256, "causal")])
def test_a_masked_attention_runs_a_fused_kernel(keys, mask_kind):
    """Transformers' attention under a compiler gets a mask: BERT's bool padding mask, GPT-2's
    additive causal one. Traced on fake tensors it took the math path (float32 scores, two
    bmms); cuDNN's kernel (where torch says it runs the call) or the memory-efficient one runs
    it, forward and backward, with eager's results; 200 keys need the bias rows padded for the
    memory-efficient kernel."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 6, keys, 64, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    if mask_kind == "padding":
        mask = torch.ones(4, 1, 1, keys, dtype=torch.bool, device=DEV)
        mask[1, ..., keys // 2:] = False
    else:
        causal = torch.ones(keys, keys, dtype=torch.bool, device=DEV).tril()
        mask = torch.zeros(1, 1, keys, keys, dtype=torch.bfloat16, device=DEV).masked_fill(~causal, float("-inf"))

    def attn(q, k, v, mask):
        full = mask.expand(4, 1, keys, keys) if mask.dtype == torch.bool else mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=full, scale=0.125)

    with Kernels() as kern:
        got = engine.compile(attn)(q, k, v, mask)
        got.float().square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want = attn(q, k, v, mask)
    want.float().square().sum().backward()
    assert_close(got, want, 2e-2)
    for g, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(g.float(), t.grad.float(), rtol=5e-2, atol=5e-2)
    code = "\n".join(kern.wrappers)
    assert ("_scaled_dot_product_cudnn_attention" in code or "_scaled_dot_product_efficient_attention" in code) \
        and "torch.bmm" not in code, code
    print("kernel:", "cudnn" if "_scaled_dot_product_cudnn_attention" in code else "efficient")


def test_dynamic_sizes_one_compile_many_shapes():
    fn = engine.compile(lambda t, w: F.layer_norm(t, (t.shape[-1],), w) * 2, dynamic=True)
    for rows, cols in ((8, 96), (13, 300), (5, 5000)):
        x, w = torch.randn(rows, cols, device=DEV), torch.randn(cols, device=DEV)
        assert_close(fn(x, w), F.layer_norm(x, (cols,), w) * 2, 1e-4)


def test_max_autotune_caches_configs_on_disk(tmp_path):
    from engine import config
    with config.patch(cache_dir=str(tmp_path)):
        check(lambda t: torch.softmax(t * 2, -1), torch.randn(256, 1000, device=DEV), tol=1e-5, mode="max-autotune")
    files = glob.glob(str(tmp_path / "triton" / "autotune" / "*.json"))
    assert files, os.listdir(tmp_path)


def test_a_large_looped_reduction_times_its_configs_at_its_first_launch(tmp_path):
    """A row reduction too long for one block and this large (a language model's loss over
    512 rows of 50257 logits) has its few launch configs timed at its first launch, in every
    mode (the best differ by kernel); the choice is cached on disk, and reduce-overhead
    captures and replays it with eager's results."""
    from engine import config
    from engine_helpers import logs

    torch.manual_seed(0)
    logits = torch.randn(512, 50257, device=DEV, requires_grad=True)
    target = torch.randint(0, 50257, (512,), device=DEV)

    def loss_of(t):
        return F.cross_entropy(t * 2, target)

    want = loss_of(logits)
    want.backward()
    want_grad, logits.grad = logits.grad.clone(), None
    with config.patch(cache_dir=str(tmp_path)), logs("inductor") as lines:
        fn = engine.compile(loss_of, mode="reduce-overhead")
        for _ in range(3):          # warm-up (timed there), capture, replay
            got = fn(logits)
            got.backward()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(logits.grad, want_grad, rtol=1e-5, atol=1e-6)
            logits.grad = None
    timed = [line for line in lines if line.startswith("autotune ") and "rnumel=50257" in line]
    assert len(timed) >= 2, lines          # the forward's row sums and the backward's
    assert glob.glob(str(tmp_path / "triton" / "autotune" / "*.json"))


def test_lm_head_with_an_odd_vocabulary_pads_the_matmul_rows():
    """A 16-bit matmul with 50257 output columns runs on operands zero-padded to 50264
    (pad_mm.py; cuBLAS takes its unaligned kernel otherwise); the results are eager's, with
    or without a bias; the product returned is a view of the padded one."""
    from engine_helpers import logs

    torch.manual_seed(0)
    x = torch.randn(4, 64, 256, device=DEV, dtype=torch.bfloat16)
    for bias in (False, True):
        head = torch.nn.Linear(256, 50257, bias=bias, device=DEV, dtype=torch.bfloat16)

        def logits(x):
            return head(torch.nn.functional.gelu(x)).float().softmax(-1)

        engine.reset()
        with logs("output_code") as code:
            k = check(logits, x, tol=2e-2)
        # padded to 50264 by a generated kernel, not by an aten call
        assert any("50264" in c and "constant_pad_nd" not in c and ".out(" not in c for c in code), code
        engine.reset()
        raw = engine.compile(lambda x: head(x))(x)     # the padded product itself, returned
        assert raw.stride() == (64 * 50264, 50264, 1)   # with its gaps, as torch.compile returns it
        torch.testing.assert_close(raw.view(-1, 50257), head(x).view(-1, 50257), rtol=2e-2, atol=2e-2)
        assert not k.hints or not any("uncompiled" in h for h in k.hints)


def test_the_backward_of_an_odd_vocabulary_reads_one_padded_copy_of_the_logits_gradient():
    """Training through an lm head of 50257 outputs: both backward matmuls read the logits'
    gradient (one transposed); it is written once with rows padded to 16 bytes, in the
    kernel that computes it (the one that sums its rows), and the gradients are eager's."""
    from engine_helpers import logs

    torch.manual_seed(0)
    head = torch.nn.Linear(256, 50257, bias=False, device=DEV)
    x = torch.randn(2, 64, 256, device=DEV, requires_grad=True)
    target = torch.randint(0, 50257, (128,), device=DEV)

    def loss_of(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = head(x)
        return F.cross_entropy(logits.float().view(-1, 50257), target)

    want = loss_of(x)
    want.backward()
    want_grads = [x.grad.clone(), head.weight.grad.clone()]
    x.grad, head.weight.grad = None, None
    with logs("output_code") as code:
        got = engine.compile(loss_of, backend="inductor")(x)
        got.backward()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for g, w in zip([x.grad, head.weight.grad], want_grads):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-3)
    # the weight gradient's matmul reads all of the padded gradient, transposed (its extra
    # rows are zeros; an odd M took a slower cuBLAS kernel)
    backward = [c for c in code if "_alloc_buf1 = allocator((128, 50264), (50264, 1)" in c
                and "torch.mm(buf1.permute(1, 0), " in c]
    assert backward, "\n".join(code)[-4000:]
    # the backward was compiled for the saved logits as the forward returns them, with gaps
    # (not copied dense on every call)
    assert "(2, 64, 50257), (3216896, 50264, 1), False)" in backward[0], backward[0][-6000:]
    # the padded gradient is computed row by row beside the row sums it reads: no address
    # divides by the row length
    assert "// 50264" not in backward[0] and "% 50264" not in backward[0], backward[0][-6000:]


def test_autocast_weight_gradients_are_fp32_matmuls_not_rounded_to_bf16():
    """Under autocast a Linear's weight gradient is the bf16 matmul's product cast to the
    weight's fp32; compiled, cuBLAS writes it in fp32 (wide_matmul.py): no cast kernel, and
    each element is the fp32 accumulator where eager's is that rounded to bf16: the two
    differ by about half a bf16 step (2**-9 of the value)."""
    from engine_helpers import logs

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)).to(DEV)
    x = torch.randn(4, 96, 256, device=DEV)

    def loss_of(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return mlp(x).float().square().mean()

    loss_of(x).backward()
    want = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad(set_to_none=True)
    with logs("output_code") as code:
        engine.compile(loss_of, backend="inductor")(x).backward()
    got = [p.grad for p in mlp.parameters()]
    assert sum(c.count("out_dtype=torch.float32") for c in code) == 2, "\n".join(code)[-4000:]
    for i in (0, 2):        # the weights: eager's rounded to bf16, ours not
        g, w = got[i], want[i]
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=2 ** -7, atol=1e-3 * w.abs().max().item())
    for i in (1, 3):        # the biases: summed as before
        torch.testing.assert_close(got[i], want[i], rtol=1e-2, atol=1e-5)


def test_an_adamw_step_is_fused_per_parameter_and_updates_in_place():
    """engine.compile(opt.step) on CUDA parameters: the capturable AdamW step's foreach ops
    become one Triton kernel per parameter plus one for every step count, each storing into
    the parameter and state tensors themselves; the parameters after three steps are eager's."""
    from engine_helpers import logs

    torch.manual_seed(0)
    shapes = [(64, 48), (48,), (3, 5, 7)]
    ref = [torch.randn(s, device=DEV, requires_grad=True) for s in shapes]
    mine = [p.detach().clone().requires_grad_() for p in ref]
    eager_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, capturable=True)
    opt = torch.optim.AdamW(mine, lr=1e-2, weight_decay=0.1)
    ptrs = [p.data_ptr() for p in mine]
    with logs("schedule") as sched, logs("perf_hints") as hints:
        step = engine.compile(opt.step)
        for _ in range(3):
            for a, b in zip(ref, mine):
                a.grad = torch.randn_like(a)
                b.grad = a.grad.clone()
            eager_opt.step()
            step()
    for a, b in zip(ref, mine):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert [p.data_ptr() for p in mine] == ptrs
    assert not any("_foreach" in h or "uncompiled" in h for h in hints), hints
    sched = "\n".join(sched)
    assert sched.count("written in its memory") == 4 * len(shapes), sched


def test_a_conv_net_runs_channels_last_with_eager_results():
    """Convolutions read and write NHWC (channels_last.py): ResNet-18 in inference, fp32 and
    bf16, inputs NCHW; the logits come back NCHW-dense as eager's, the values match, and
    the only conversion is the graph's input (one copy kernel, no cuDNN transposes), and the
    max pool is part of a generated kernel."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = torchvision.models.resnet18().to(DEV).eval()
    x = torch.randn(4, 3, 64, 64, device=DEV)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False     # NHWC and NCHW kernels round TF32 differently
    try:
        with torch.no_grad():
            k = check(lambda x: m(x), x, tol=1e-3)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    with torch.no_grad():
        assert any("channels-last" in h for h in k.hints), k.hints
        mb = torchvision.models.resnet18().to(DEV, torch.bfloat16).eval()
        xb = x.to(torch.bfloat16)
        engine.reset()
        compiled = engine.compile(lambda x: mb(x))
        with Kernels() as kb:
            got = compiled(xb)
        # activations are allocated in the layout the convolutions read (no view of a buffer
        # per call; the classifier's weight is read transposed, a view of the input)
        assert kb.wrappers and not any("torch.as_strided(buf" in w for w in kb.wrappers), kb.wrappers
        assert got.is_contiguous()
        assert_close(got, mb(xb), 0.15)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            compiled(xb)
            torch.cuda.synchronize()
        names = [e.key for e in prof.key_averages()]
        assert not [n for n in names if "nchwToNhwc" in n or "nhwcToNchw" in n], names
        # the stem's pool is in a generated kernel (named after it), not aten's
        assert not [n for n in names if "max_pool" in n and not n.startswith(("kernel", "combo"))], names
        # 3x3 filters are copied channels-last by a generated kernel, not inside cuDNN's call
        assert not [n for n in names if "elementwise_kernel" in n], names


def test_the_blocks_of_a_stack_launch_one_compiled_kernel_each_copy():
    """Six identical bf16 blocks (matmul, bias, layer norm, GELU), forward and backward: the
    later blocks' kernels are the first block's (one binary, launched once a block), and the
    results and gradients are eager's."""
    from engine_helpers import logs

    torch.manual_seed(0)
    blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.LayerNorm(256),
                                                       torch.nn.GELU()) for _ in range(6)]).to(DEV)
    x = torch.randn(512, 256, device=DEV, requires_grad=True)

    def loss_of(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return blocks(x).float().square().mean()

    want = loss_of(x)
    want.backward()
    want_grads = [x.grad.clone()] + [p.grad.clone() for p in blocks.parameters()]
    x.grad = None
    blocks.zero_grad(set_to_none=True)
    with logs("output_code") as code:
        got = engine.compile(loss_of, backend="inductor")(x)
        got.backward()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)
    for g, w in zip([x.grad] + [p.grad for p in blocks.parameters()], want_grads):
        torch.testing.assert_close(g, w, rtol=5e-2, atol=5e-3)
    copies = sum(line.endswith("# the same kernel") for c in code for line in c.splitlines())
    assert copies >= 4, "\n".join(code)[-4000:]     # the middle blocks, forward and backward


def _wrapper_modules():
    import gc
    import types
    return [m for m in gc.get_objects() if isinstance(m, types.ModuleType)
            and m.__name__.startswith("engine_codegen_graph_")]


def _layer(x, w):
    # pointwise kernels around a matmul: launches, extern calls and buffers
    return torch.relu((torch.sin(x) + 1) @ w.t()) * 2


def test_launches_and_allocations_repeat_through_cpp_once_it_is_built():
    # the wrapper's repeated launches are C++ Launch objects and its buffers come from C++
    # Alloc objects; every call after the first launches from them, with eager's results
    from engine.codegen.triton import native_launch
    assert native_launch.wait(600), native_launch.build_error()
    seen, seen_mods = {id(la) for la in _launchers()}, {id(m) for m in _wrapper_modules()}
    fn = engine.compile(_layer)
    x, w = torch.randn(64, 96, device=DEV), torch.randn(80, 96, device=DEV)
    for _ in range(2):
        assert_close(fn(x, w), _layer(x, w), 1e-4)
    new = [la for la in _launchers() if id(la) not in seen]
    assert new and all(type(la.fast).__name__ == "Launch" for la in new), [type(la.fast) for la in new]
    (mod,) = [m for m in _wrapper_modules() if id(m) not in seen_mods]
    allocs = {k: type(v).__name__ for k, v in vars(mod).items() if k.startswith("_alloc_")}
    assert allocs and set(allocs.values()) == {"Alloc"}, allocs
    hits = sum(la.direct.hits for la in new)
    x2 = torch.randn(64, 96, device=DEV)
    assert_close(fn(x2, w), _layer(x2, w), 1e-4)
    assert sum(la.direct.hits for la in new) == hits + len(new)


class _Mlp(torch.nn.Module):
    # a bias-free projection (mm), two Linear layers with bias (addmm) and GELU between them
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(96, 128, bias=False)
        self.up, self.down = torch.nn.Linear(128, 256), torch.nn.Linear(256, 96)

    def forward(self, x):
        return self.down(F.gelu(self.up(self.proj(x)))) + x


def _gemms(mod):
    return {k: v for k, v in vars(mod).items() if k.startswith("_gemm_")}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_matmuls_go_to_cublaslt_directly_with_torch_mms_results(dtype):
    # the wrapper's 16-bit matmuls (mm, addmm with its bias, the training step's weight
    # gradients computed in fp32 under autocast) are native_launch Gemm objects once it is
    # built: planned on their first call, they give what torch.mm gives, forward and backward
    from engine.codegen.triton import native_launch
    assert native_launch.wait(600), native_launch.build_error()
    seen = {id(m) for m in _wrapper_modules()}
    torch.manual_seed(0)
    model = _Mlp().to(DEV)
    x = torch.randn(4, 64, 96, device=DEV)

    def step(m, x):
        with torch.autocast(DEV, dtype=dtype):
            out = m(x)
        out.float().pow(2).mean().backward()
        return out

    ref = _Mlp().to(DEV)
    ref.load_state_dict(model.state_dict())
    fn = engine.compile(step)
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        assert_close(fn(model, x), step(ref, x), 2e-2)
        for p, q in zip(model.parameters(), ref.parameters()):
            assert_close(p.grad, q.grad, 2e-2)
    gemms = {k: v for m in _wrapper_modules() if id(m) not in seen for k, v in _gemms(m).items()}
    assert gemms and {type(g).__name__ for g in gemms.values()} == {"Gemm"}, gemms
    assert {g.state for g in gemms.values()} == {1}, {k: g.state for k, g in gemms.items()}
    # forward: proj (mm), up and down (addmm); backward: their input and weight gradients
    assert len(gemms) >= 7, sorted(gemms)


def test_matmuls_take_torch_mm_where_cublas_settings_are_not_the_default():
    # reduced-precision reductions turned off: the direct call (which allows them, as the
    # default does) steps aside for torch.mm, which honours the setting
    from engine.codegen.triton import native_launch
    from engine.codegen.triton.launcher import gemm_stream
    assert native_launch.wait(600), native_launch.build_error()
    matmul = torch.backends.cuda.matmul
    fn = engine.compile(lambda a, b: torch.mm(a, b).relu())
    a, b = torch.randn(64, 96, device=DEV, dtype=torch.bfloat16), torch.randn(96, 32, device=DEV, dtype=torch.bfloat16)
    assert_close(fn(a, b), torch.mm(a, b).relu(), 1e-2)
    assert gemm_stream(0) == 0
    try:
        matmul.allow_bf16_reduced_precision_reduction = False
        assert gemm_stream(0) is None
        assert torch.equal(fn(a, b), torch.mm(a, b).relu())
    finally:
        matmul.allow_bf16_reduced_precision_reduction = True
    assert gemm_stream(0) == 0


def test_a_direct_matmul_answers_torch_mm_for_other_layouts_and_replays_in_a_cuda_graph():
    # a Gemm is planned for its first call's layout: another layout, dtype or a missing stream
    # get None (the wrapper then calls torch.mm); captured into a CUDA graph, it replays
    from engine.codegen.triton import native_launch
    from engine.codegen.triton.launcher import launch_stream
    assert native_launch.wait(600), native_launch.build_error()
    g = native_launch.gemm(False)
    a, b = torch.randn(64, 48, device=DEV, dtype=torch.half), torch.randn(48, 80, device=DEV, dtype=torch.half)
    s = launch_stream(torch.cuda.current_device())
    assert torch.equal(g(s, a, b), torch.mm(a, b)) and g.state == 1
    assert torch.equal(g(s, a.clone(), b), torch.mm(a, b))
    assert g(s, a[:32], b) is None and g(s, a.t().contiguous().t(), b) is None
    assert g(s, a.float(), b.float()) is None and g(None, a, b) is None

    class Sub(torch.Tensor):       # a subclass keeps its own dispatch: torch.mm's path
        pass
    assert g(s, a.as_subclass(Sub), b) is None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = g(launch_stream(torch.cuda.current_device()), a, b)
    a.copy_(torch.randn_like(a))
    graph.replay()
    assert torch.equal(captured, torch.mm(a, b))
    bias = native_launch.gemm(True)
    c = torch.randn(80, device=DEV, dtype=torch.half)
    assert torch.equal(bias(s, a, b, c), torch.addmm(c, a, b))
    fp32 = native_launch.gemm(False)
    assert fp32(s, a.float(), b.float()) is None and fp32.state == -1   # not 16-bit: torch.mm, always


def test_a_wrapper_loaded_before_the_cpp_launcher_was_built_switches_to_it(monkeypatch):
    from engine.codegen.triton import native_launch
    assert native_launch.wait(600), native_launch.build_error()
    built = native_launch._BUILD.module
    monkeypatch.setattr(native_launch._BUILD, "module", None)      # as while it builds
    seen, seen_mods = {id(la) for la in _launchers()}, {id(m) for m in _wrapper_modules()}
    fn = engine.compile(lambda x, w: _layer(x, w) - 1)
    x, w = torch.randn(32, 48, device=DEV), torch.randn(16, 48, device=DEV)
    for _ in range(2):
        assert_close(fn(x, w), _layer(x, w) - 1, 1e-4)
    new = [la for la in _launchers() if id(la) not in seen]
    (mod,) = [m for m in _wrapper_modules() if id(m) not in seen_mods]
    assert new and not any(type(la.fast).__name__ == "Launch" for la in new)
    assert mod in native_launch._BUILD.waiting
    monkeypatch.setattr(native_launch._BUILD, "module", built)     # the build finishes
    native_launch._upgrade(mod)
    for _ in range(2):
        x = torch.randn(32, 48, device=DEV)
        assert_close(fn(x, w), _layer(x, w) - 1, 1e-4)
    assert all(type(la.fast).__name__ == "Launch" for la in new)
    assert {type(v).__name__ for k, v in vars(mod).items() if k.startswith("_alloc_")} == {"Alloc"}


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_a_training_step_with_its_backward_in_the_graph_matches_eager(mode):
    """forward, loss.backward(), AdamW and zero_grad in one compiled function under bf16
    autocast: the backward is traced into the forward's graph (capture/backward.py); three
    steps give eager's losses and parameters (to bf16 rounding), with CUDA graphs too."""
    import copy
    from bench_gpu import Block
    torch.manual_seed(0)
    ref = Block(64, 4).to(DEV)
    mine = copy.deepcopy(ref)
    ref_opt, opt = torch.optim.AdamW(ref.parameters(), lr=1e-3), torch.optim.AdamW(mine.parameters(), lr=1e-3)

    def step(m, o, x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(x).float().square().mean()
        loss.backward()
        o.step()
        o.zero_grad()
        return loss

    with engine.config.patch(backward_in_graph=True):
        compiled = engine.compile(step, mode=mode)
        for i in range(3):
            x = torch.randn(2, 32, 64, device=DEV, generator=torch.Generator(DEV).manual_seed(i))
            want = step(ref, ref_opt, x)
            got = compiled(mine, opt, x)
            torch.testing.assert_close(got, want.detach(), rtol=2e-2, atol=1e-3)
        for (n, p), q in zip(mine.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-2, atol=2e-3, msg=lambda m: f"{n}: {m}")
        assert not any("backward" in b.reason for b in engine.explain(step)(mine, opt, x).break_reasons)
