"""The scheduler's fusion decisions and what the logs show about them: a layer norm or a
softmax is one kernel with one pass per phase over each row, pointwise chains keep their
intermediates in registers, dead buffers are reused, and every decision is on the bus."""

import math
import torch
import torch.nn.functional as F

import observe
from codegen_helpers import check, compile_graph, peak_bytes, stack_of_blocks

X = torch.randn(8, 32)


class Capture:
    def __init__(self, **kw):
        self.events = []
        self.kw = kw

    def __enter__(self):
        observe.subscribe(self._on, **self.kw)
        return self

    def _on(self, e):
        self.events.append(e)

    def __exit__(self, *exc):
        observe.unsubscribe(self._on)

    def texts(self, log=None, name=None):
        return [e.payload() for e in self.events if (log is None or e.log == log) and (name is None or e.name == name)]


def test_pointwise_chain_is_one_kernel_with_intermediates_in_registers():
    with Capture(logs=["schedule", "kernel_code"]) as cap:
        c = check(lambda x, y: torch.tanh(torch.relu(x * 2 + y) - 1).sigmoid(), X, torch.randn(32))
    assert c.n_kernels == 1
    [sched] = cap.texts(log="schedule")
    assert "kernel0_mul_add_relu_sub_etc: outer [8, 32]" in sched   # named after the ops it fuses
    [kernel] = cap.texts(log="kernel_code")
    assert "#pragma omp simd" in kernel and "#pragma omp parallel for" in kernel
    assert kernel.count("] = ") == 1        # one store: the result; nothing else goes to memory


def test_layer_norm_is_one_kernel_with_three_phases_per_row():
    with Capture(logs=["schedule", "fusion"]) as cap:
        c = check(lambda x, w, b: F.layer_norm(x, (32,), w, b), X, torch.randn(32), torch.randn(32), rtol=1e-4)
    assert c.n_kernels == 1 and c.n_externs == 0
    [sched] = cap.texts(log="schedule")
    assert "outer [8]" in sched and "kept in registers" in sched
    fusions = cap.texts(log="fusion")
    assert fusions and all(f.startswith("fused:") for f in fusions)


def test_softmax_row_reductions_fuse_with_their_epilogue():
    with Capture(logs=["ir_post_fusion"]):          # a reader: the IR dumps are made
        c = check(lambda x: torch.softmax(x, -1), X)
    assert c.n_kernels == 1
    post = c.artifacts["ir_post_fusion.txt"]
    assert "(reduction)" in post and post.count("phase") >= 3


def test_softmax_computes_exp_once_per_element():
    # the sum phase writes exp(x - max) to the output; the last phase reads it back
    with Capture(logs=["kernel_code"]) as cap:
        check(lambda x: torch.softmax(x, -1), X)
    [kernel] = cap.texts(log="kernel_code")
    assert kernel.count("std::exp(") == 1, kernel


def test_exp_is_not_carried_through_a_buffer_the_kernel_reads():
    # log_softmax's output is read by nothing else, but here the output is also an input
    # of the same kernel's later phase (x * softmax(x) summed): results must stay eager's
    c = check(lambda x: (torch.softmax(x, -1) * x).sum(-1, keepdim=True) + torch.softmax(x, -1), X, rtol=1e-4)
    assert c.n_kernels >= 1


def test_a_value_an_extern_kernel_needs_is_stored_once_for_every_user():
    # the cat feeds a matmul, that matmul's transpose and a sum: one buffer, not three
    # recomputations of the cat with masked loads
    def f(a, b, w):
        c = torch.cat([a, b], 1)
        return c @ w, c.t() @ a, c.sum(0)
    with Capture(logs=["kernel_code"]) as cap:
        check(f, X, X * 2, torch.randn(64, 8), rtol=1e-4, atol=1e-4)
    # a cat's masked load: under `if (mask)`, or branch-free with its index kept in bounds
    masked = [k for k in cap.texts(log="kernel_code") if "if (" in k or " : 0)]" in k]
    assert len(masked) == 1, masked


def test_a_value_an_unlowered_op_reads_and_the_graph_returns_is_stored_once():
    # attention on the GPU (no lowering, called as it is) reads the KV cache's cat, which
    # the forward also returns for the backward: one buffer serves both
    def f(a, b):
        c = torch.cat([a, b], 1)
        return torch.cumsum(c, 1), c
    with Capture(logs=["kernel_code"]) as cap:
        check(f, torch.randn(1, 2, 4, 4), torch.randn(1, 2, 4, 4), allow_fallback=True)
    # a cat's masked load: under `if (mask)`, or branch-free with its index kept in bounds
    masked = [k for k in cap.texts(log="kernel_code") if "if (" in k or " : 0)]" in k]
    assert len(masked) == 1 and masked[0].count("] = ") == 1, masked


def test_a_loss_gradients_one_hot_is_recomputed_where_it_is_read_not_stored():
    """The cross entropy's backward builds `-1/n` at each label (from the labels, shifted as
    a causal LM shifts them) and reads it twice: in the row sums and in the gradient. It
    reads only tensors far smaller than itself, so each reader recomputes it: no
    [tokens, vocabulary] float32 buffer is written and read back."""
    vocab = 1000

    def f(logits, labels):
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        loss = F.cross_entropy(logits.view(-1, vocab), shifted.reshape(-1), ignore_index=-100)
        return loss, torch.autograd.grad(loss, [logits])[0]

    logits = torch.randn(4, 16, vocab, requires_grad=True)
    labels = torch.randint(0, vocab, (4, 16))
    with Capture(logs=["output_code"]) as cap:
        check(f, logits, labels, rtol=1e-5, atol=1e-6)
    [code] = cap.texts(log="output_code")
    assert "empty_strided((64, 1000)" not in code and "empty_strided((4, 16, 1000)" in code, code[-3000:]


def test_refused_fusion_says_why():
    # a reduction over dim 0 and a row-wise consumer do not share a loop structure;
    # positive input, so no column sum is near zero and the division stays well conditioned
    with Capture(logs=["fusion"]) as cap:
        check(lambda x: x / x.sum(0) + x.sum(1, keepdim=True), X.abs() + 1)
    refused = [f for f in cap.texts(log="fusion") if f.startswith("refused")]
    assert refused and all("(" in f and ":" in f for f in refused)


def test_matmul_epilogue_runs_in_place_in_the_matmul_output():
    with Capture(logs=["schedule"]) as cap:
        c = check(lambda x, w, b: torch.relu(F.linear(x, w, b)) * 2, X, torch.randn(16, 32), torch.randn(16))
    sched = "\n".join(cap.texts(log="schedule"))
    assert "computed in place in extern0's memory" in sched
    assert "empty_strided" not in c.source.split("def call")[1]    # no buffer allocated at all


def test_dead_buffers_memory_is_reused_or_updated_in_place():
    # the column softmax needs two kernels; the second writes over the dead matmul result
    with Capture(logs=["schedule"]) as cap:
        check(lambda x, w: torch.softmax(torch.mm(x, w), 0) * 2, X, torch.randn(32, 16), rtol=1e-4, atol=1e-5)
    sched = "\n".join(cap.texts(log="schedule"))
    assert "reuses the memory of" in sched or "computed in place" in sched, sched


def test_a_residual_stack_holds_about_as_much_memory_as_eager():
    """Pre-norm residual blocks, as in a transformer encoder. Two things held every block's
    outputs alive to the end of the call: the residual sum, recomputed by each layer norm
    from all the outputs before it, and dead buffers kept for a reuse many blocks later
    (Whisper-small's encoder: 0.87 GiB at the peak, torch.compile 0.43)."""
    d = 256
    ws = [torch.randn(d, d) / 16 for _ in range(12)]

    def stack(h, *ws):
        for wa, w1, w2 in zip(ws[0::3], ws[1::3], ws[2::3]):
            h = h + F.layer_norm(h, (d,)) @ wa
            h = h + F.gelu(F.layer_norm(h, (d,)) @ w1) @ w2
        return h

    x = torch.randn(512, d)
    compiled = check(stack, x, *ws, rtol=1e-4, atol=1e-4)
    eager, ours = peak_bytes(lambda: stack(x, *ws)), peak_bytes(lambda: compiled(x, *ws))
    one = x.numel() * x.element_size()
    assert ours <= eager + one, (ours / one, eager / one)     # was 7 activations to eager's 3


def test_a_multi_output_call_is_dropped_once_unpacked_and_unread_outputs_are_not_kept():
    """An attention call returns (output, logsumexp, ...). Holding the tuple kept every
    layer's attention output alive to the end of the call (110 MiB of a ViT-B's peak), and
    an output nothing reads was bound to a name nothing freed."""
    q = torch.randn(2, 4, 16, 16)

    def f(q, w):
        o = F.scaled_dot_product_attention(q, q, q)
        return o.transpose(1, 2).reshape(2, 16, 64) @ w

    with Capture() as cap:
        check(f, q, torch.randn(64, 8), rtol=1e-4, atol=1e-5)
    [code] = cap.texts(name="inductor_output_code")
    lines = [ln.strip() for ln in code.splitlines()]
    call = next(i for i, ln in enumerate(lines) if "_scaled_dot_product" in ln and " = " in ln)
    name = lines[call].split(" = ")[0]
    after = [ln for ln in lines[call + 1:call + 5] if not ln.startswith("del arg")]   # inputs read last here
    assert after[0].startswith(f"{name}_0 = ") and after[1] == f"del {name}", lines[call:call + 5]
    assert not any(ln.startswith(f"{name}_1 = ") for ln in lines), code


def test_output_code_is_a_runnable_module_and_stages_are_timed():
    with Capture() as cap:
        c = compile_graph(lambda x: (x * 2).sum(1), X)
    [code] = cap.texts(name="inductor_output_code")
    assert "def call(args):" in code and "load_cpp(" in code and "empty_strided(" in code
    stages = [e.metadata["name"] for e in cap.events if e.name == "stage_end"]
    for s in ("lowering", "scheduling", "codegen"):
        assert s in stages
    ns = {}
    exec(compile(code, "output_code.py", "exec"), ns)   # compiles or loads the kernels itself
    torch.testing.assert_close(ns["call"]([X])[0], (X * 2).sum(1))


def test_debug_files_for_torch_compile_debug():
    """The FX graph and IR dumps are made when something reads them (here TORCH_LOGS=
    ir_post_fusion; a trace or the debug folder too), and emitted; with no reader, the
    compiler does not write them (zero cost when off): the output code alone."""
    from engine.codegen import debug_files
    with Capture(logs=["ir_pre_fusion", "ir_post_fusion"]) as cap:
        c = compile_graph(lambda x: torch.relu(x) + 1, X)
    files = debug_files(c)
    assert set(files) == {"fx_graph_transformed.py", "ir_pre_fusion.txt", "ir_post_fusion.txt", "output_code.py"}
    assert "Pointwise(ranges=[8, 32])" in files["ir_pre_fusion.txt"]
    assert "kernel0" in files["ir_post_fusion.txt"]
    assert cap.texts(log="ir_post_fusion") == [files["ir_post_fusion.txt"]]
    assert set(debug_files(compile_graph(lambda x: torch.relu(x) + 2, X))) == {"output_code.py"}


def test_attention_kernels_with_different_loop_nests_keep_their_own_index_math():
    # regression: kernels share loop-variable names (x0, r0, ...); each index expression
    # must be simplified against its own kernel's ranges, not the last kernel built
    import math
    b, t, d, heads = 2, 5, 16, 4

    def attention(x, w1, b1, w2, b2):
        q, k, v = F.linear(x, w1, b1).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // heads)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1), float("-inf")).softmax(-1)
        return F.linear((att @ v).transpose(1, 2).reshape(b, t, d), w2, b2)
    check(attention, torch.randn(b, t, d), torch.randn(3 * d, d), torch.randn(3 * d), torch.randn(d, d),
          torch.randn(d), rtol=1e-4, atol=1e-4)


def test_cat_of_reshaped_transposes_loads_each_part_only_inside_its_range():
    # like the qkv gradient of attention: three (b, h, t, d) views made (b*t, h*d) and
    # concatenated; a middle part's loads are masked on both sides (no negative addresses)
    def f(q, k, v):
        return torch.cat([z.transpose(1, 2).reshape(2 * 8, 4 * 16) for z in (q, k, v)], 1) * 2
    with Capture(logs=["kernel_code"]) as cap:
        check(f, *[torch.randn(2, 4, 8, 16) for _ in range(3)])
    [kernel] = cap.texts(log="kernel_code")
    assert ">= tmp" in kernel and "&&" in kernel, kernel


def test_softmax_in_place_over_a_matmul_result_still_computes_exp_once():
    w = torch.randn(32, 16)
    with Capture(logs=["kernel_code", "schedule"]) as cap:
        check(lambda x, w: torch.softmax(x @ w, -1), X, w, rtol=1e-4, atol=1e-5)
    assert "computed in place in extern0's memory" in "\n".join(cap.texts(log="schedule"))
    [kernel] = cap.texts(log="kernel_code")
    assert kernel.count("std::exp(") == 1, kernel
    # the output phase also reads the scores themselves: they must not be overwritten early
    def f(x, w):
        s = x @ w
        return torch.softmax(s, -1) * s
    with Capture(logs=["kernel_code", "schedule"]) as cap:
        check(f, X, w, rtol=1e-4, atol=1e-5)
    assert "computed in place in extern0's memory" in "\n".join(cap.texts(log="schedule"))
    [kernel] = cap.texts(log="kernel_code")
    assert kernel.count("std::exp(") == 2, kernel


def test_a_transposed_sibling_is_not_fused_into_a_column_sum():
    # the column sum walks the 32 outputs contiguously; the transposed copy is stored
    # contiguously along the summed dim: in one loop nest one of them would be strided
    a = torch.randn(64, 32)
    with Capture(logs=["fusion"]) as cap:
        c = check(lambda a: (a.sum(0), (a.t() * 2).contiguous()), a, rtol=1e-4)
    assert c.n_kernels == 2
    assert any("loop order" in f for f in cap.texts(log="fusion")), cap.texts(log="fusion")


def test_a_full_reduction_never_serializes_a_large_sibling_kernel():
    """GPT-2's loss counts its labels (a sum to one value) from the token ids its embedding
    also reads: joined into the embedding's kernel, one program walked all 3 million
    elements (1.8 ms on an H100, for a 10 us kernel). Large kernels keep their outer loop."""
    ids = torch.randint(0, 100, (64, 128))
    w = torch.randn(100, 64)

    def f(ids, w):
        e = (F.embedding(ids, w) + 1).tanh().sigmoid()     # two users, not cheap: realized where computed
        return e * 2, e - 1, (ids[:, 1:] != 3).sum()

    with Capture(logs=["schedule"]) as cap:
        check(f, ids, w, rtol=1e-4, atol=1e-5)
    kernels = [ln for ln in "\n".join(cap.texts(log="schedule")).splitlines() if ": outer " in ln]
    assert any(": outer [64, 128, 64]" in k and "sum" not in k.split(":")[0] for k in kernels), kernels
    assert any(": outer []" in k and "sum" in k.split(":")[0] for k in kernels), kernels


def test_a_large_sibling_never_becomes_a_phase_of_a_full_reduction():
    """The other order: a Llama loss's count of labels (a sum to one value, no outer loop)
    comes first, and the embedding gather of the same token ids, 4 million elements, tried
    to join it as a loop of its own: one program walked it all (a 1.4 ms kernel on an H200).
    It keeps its own kernel, with an outer loop."""
    ids = torch.randint(0, 100, (64, 128))
    w = torch.randn(100, 64)

    def f(ids, w):
        count = (ids != 3).sum()
        e = F.embedding(ids, w)
        return count, e.tanh()

    with Capture(logs=["schedule"]) as cap:
        check(f, ids, w, rtol=1e-4, atol=1e-5)
    kernels = [ln for ln in "\n".join(cap.texts(log="schedule")).splitlines() if ": outer " in ln]
    [alone] = [k for k in kernels if ": outer []" in k]
    assert "embedding" not in alone.split(":")[0] and "tanh" not in alone.split(":")[0], kernels
    assert any(": outer [64, 128, 64]" in k for k in kernels), kernels


def test_a_loss_gradient_written_into_padded_rows_fuses_with_the_row_sums_it_reads():
    """A cross-entropy's logit gradient, stored into rows padded to a multiple of 8 (what
    pad_mm makes of a GPT-2 vocabulary of 50257 for the matmul that reads it): one kernel
    with the row sums, looping over the padded row after the unpadded one, and the logits
    are read row by row (no division by the row length in any index)."""
    logits, labels = torch.randn(4, 16, 1003), torch.randint(0, 1003, (4, 16))

    def loss_backward(logits, labels):
        flat = logits.view(-1, 1003)
        lsm = torch.log_softmax(flat, -1)
        g = torch.ops.aten._log_softmax_backward_data(
            torch.zeros_like(flat).scatter(1, labels.view(-1, 1), -1 / 64), lsm, 1, torch.float32)
        return F.pad(g, (0, 5))

    with Capture(logs=["schedule"]) as cap:
        c = check(loss_backward, logits, labels, rtol=1e-4, atol=1e-6)
    [sched] = cap.texts(log="schedule")
    rows = [line for line in sched.splitlines() if "inner [1008]" in line]
    assert rows and "inner [1003]" in rows[0], sched      # the padded row is a phase of the sums' kernel
    code = "\n".join(c.artifacts[k] for k in c.artifacts if k.startswith("output_code"))
    assert "/ 1003" not in code and "% 1003" not in code, code


def test_the_layers_of_a_stack_call_one_compiled_kernel_each_copy():
    """Four identical blocks: the later blocks' kernels are the first block's (same code over
    other buffers), compiled once; a block of another width keeps its own."""
    stack, inputs = stack_of_blocks()
    c = check(stack, *inputs, rtol=1e-4, atol=1e-4)
    code = c.artifacts["output_code.py"]
    assert sum(line.endswith("# the same kernel") for line in code.splitlines()) == 3, code
    assert code.count('extern "C" void kernel') == 2, code


def _stored_orders(fn, *inputs, numel, ndim=3):
    """The sizes, outermost dim first, of each `ndim`-d buffer of `numel` elements fn's kernels store."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from engine.codegen import decomposition_table
    from engine.codegen.graph import GraphLowering
    from engine.codegen.ir import ComputedBuffer

    gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
    g = GraphLowering(gm, list(inputs)).run()
    return [tuple(int(s) for s in n.layout.sizes) for n in g.nodes
            if isinstance(n, ComputedBuffer) and len(n.layout.sizes) == ndim and math.prod(int(s) for s in n.layout.sizes) == numel]


def test_a_permuted_residual_stream_is_stored_row_major():
    """Whisper's encoder permutes its convolution's output to (batch, frames, channels), and
    eager keeps the frames innermost in every residual sum after it. Stored that way, each
    residual add read its matmul's row-major output across the rows (121 us a kernel on an
    H200). The stored sums are row-major here; the result is eager's, with eager's strides."""
    conv = torch.nn.Conv1d(8, 16, 3, padding=1)
    layers = [torch.nn.Linear(16, 16) for _ in range(3)]

    def encoder(x, *params):
        h = F.gelu(conv(x)).permute(0, 2, 1)       # (2, 40, 16), frames innermost
        for lin in layers:
            h = h + lin(F.layer_norm(h, (16,)))
        return F.layer_norm(h, (16,))

    x = torch.randn(2, 8, 40)
    with torch.no_grad():
        check(encoder, x, rtol=1e-4, atol=1e-4)
        orders = _stored_orders(encoder, x, numel=2 * 40 * 16)
    assert orders and all(o == (2, 40, 16) for o in orders), orders


def test_an_intermediate_read_in_eagers_order_keeps_it():
    """A value every kernel reads in its input's permuted order (a channels-last net's
    activations) is stored in eager's order: row-major would make each read strided."""
    def f(x):
        h = x.permute(0, 2, 1).exp().sin()         # (2, 40, 16), frames innermost, as x lies
        return h.sum(-1), (h * x.permute(0, 2, 1)).amax(1)

    x = torch.randn(2, 16, 40)
    check(f, x)
    orders = _stored_orders(f, x, numel=2 * 40 * 16)
    assert (2, 16, 40) in orders and (2, 40, 16) not in orders, orders


def test_a_pooled_channels_last_activation_keeps_its_layout():
    """ResNet's stem: a channels-last activation pooled, the pool read by two convolutions
    (the block's and its shortcut's). The pool's loads are of its larger input; counted,
    they keep the pool's output channels-last (stored row-major it took 0.33 ms on an H200
    where torch.compile's takes 0.02, and each conv then copied it back)."""
    w = torch.randn(8)

    def stem(x):
        y = F.max_pool2d(torch.relu(x * w.view(1, 8, 1, 1)), 3, 2, 1)   # (2, 8, 6, 6), channels innermost
        return y.amax(1), (y * y).sum((2, 3))

    x = torch.randn(2, 8, 12, 12).to(memory_format=torch.channels_last)
    check(stem, x)
    assert _stored_orders(stem, x, numel=2 * 8 * 6 * 6, ndim=4) == [(2, 6, 6, 8)]
