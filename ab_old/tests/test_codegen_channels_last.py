"""Convolutions on CUDA compute channels-last (engine/codegen/channels_last.py): the aten
graph of a conv net is rewritten before lowering so that cuDNN reads and writes NHWC and
converts nothing around each conv. Checked here on fake CUDA tensors (the rewrite reads only
metadata) and by running the rewritten graph on the CPU; tests/test_triton_gpu.py runs a
torchvision ResNet on a GPU."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from engine.codegen import decomposition_table
from engine.codegen.channels_last import convolutions_channels_last

aten = torch.ops.aten


class Block(torch.nn.Module):
    """A ResNet basic block with a downsampling branch: two convs read the block's input."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.down = torch.nn.Conv2d(8, 16, 1, stride=2, bias=False)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + self.down(x))
        return self.fc(y.mean((2, 3))), y


def traced(model, x, device="cuda"):
    params = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    with FakeTensorMode():
        fakes = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device) for k, v in params.items()}
        fx = torch.empty(x.shape, dtype=x.dtype, device=device)

    def fn(p, x):
        return torch.func.functional_call(model, p, (x,))
    return make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(fakes, fx), params


@pytest.fixture
def cudnn_layouts(monkeypatch):
    """The layout a fake CUDA conv gives its result comes from torch asking the conv backend
    it would pick, which on a machine without cuDNN is not cuDNN. cuDNN's rule, as on the
    GPU machine: channels-last out when the input or the weight is channels-last."""
    real = torch._C._conv_determine_backend_memory_format

    def rule(x, w, backend):
        if x.device.type == "cuda" and any(t.dim() == 4 and not t.is_contiguous()
                                           and t.is_contiguous(memory_format=torch.channels_last) for t in (x, w)):
            return torch.channels_last
        return real(x, w, backend)
    monkeypatch.setattr(torch._C, "_conv_determine_backend_memory_format", rule)


def test_a_conv_net_reads_its_input_once_in_channels_last_and_returns_eager_strides(cudnn_layouts):
    model = Block().eval()
    x = torch.randn(2, 8, 12, 12)
    gm, params = traced(model, x)
    assert convolutions_channels_last(gm) == 1           # the graph's input, copied once
    convs = [n for n in gm.graph.nodes if n.target is aten.convolution.default]
    assert len(convs) == 3
    for c in convs:   # every conv reads and writes channels-last
        for t in (c.args[0].meta["val"], c.meta["val"]):
            assert t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
    out = next(n for n in gm.graph.nodes if n.op == "output")
    logits, act = out.args[0]
    assert act.meta["val"].is_contiguous()               # as eager returns it
    # the rewritten graph computes what the model does (run on the CPU)
    for n in gm.graph.nodes:
        if n.kwargs.get("device") is not None:
            n.kwargs = {**n.kwargs, "device": torch.device("cpu")}
    gm.recompile()
    with torch.no_grad():
        got = gm(params, x)
        want = model(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_left_alone_on_cpu_or_when_already_channels_last():
    model = Block().eval()
    gm, _ = traced(model, torch.randn(2, 8, 12, 12), device="cpu")
    assert convolutions_channels_last(gm) == 0
    assert not any(n.target is aten.clone.default for n in gm.graph.nodes)
