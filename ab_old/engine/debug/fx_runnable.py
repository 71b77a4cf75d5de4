"""Write an FX graph as a standalone script: `python fx_graph_runnable.py` rebuilds the
graph module from its code, makes random inputs of the recorded shapes, dtypes and
strides, runs it and prints what came out.

The script holds the graph's own code (`gm.graph.python_code`), the imports its globals
need, and the input specs. Parameters, buffers and submodules the graph reads are saved
beside it (`<name>_state.pt`) so that outputs match the compiled graph's exactly; above
`MAX_STATE_BYTES` they are replaced by random tensors of the same shape.
"""

from __future__ import annotations

import os
import textwrap
from typing import Any, Optional, Sequence

import torch
import torch.fx

MAX_STATE_BYTES = 256 << 20


def describe_inputs(gm: torch.fx.GraphModule, example_inputs: Optional[Sequence[Any]] = None) -> list[tuple]:
    """One spec per placeholder: ("tensor", shape, stride, dtype, device, requires_grad) or
    ("value", python_value). Taken from example_inputs, else from the placeholders'
    `example_value`/`val` meta (FakeTensors); symbolic sizes use their hints."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    specs = []
    for i, node in enumerate(placeholders):
        if example_inputs is not None and i < len(example_inputs):
            value = example_inputs[i]
        else:
            value = node.meta.get("example_value", node.meta.get("val"))
        specs.append(_spec(value))
    return specs


def _hint(value: Any) -> Any:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node = value.node
        hint = getattr(node, "hint", None)
        if hint is None:
            from torch.fx.experimental.symbolic_shapes import hint_int

            return hint_int(value, fallback=4)
        return hint
    return value


def _spec(value: Any) -> tuple:
    if isinstance(value, torch.Tensor):
        shape = [int(_hint(s)) for s in value.shape]
        try:
            stride = [int(_hint(s)) for s in value.stride()]
        except Exception:  # sparse or otherwise strideless: contiguous is the best guess
            stride = list(torch.empty(shape, device="meta").stride())
        return ("tensor", shape, stride, value.dtype, str(value.device), bool(value.requires_grad))
    value = _hint(value)
    if value is None or isinstance(value, (bool, int, float, str, complex)):
        return ("value", value)
    if isinstance(value, (torch.dtype, torch.device)):
        return ("value", value)
    if isinstance(value, (list, tuple)) and all(isinstance(_hint(v), (bool, int, float)) for v in value):
        return ("value", type(value)(_hint(v) for v in value))
    return ("unknown", type(value).__name__)


def make_inputs(specs: Sequence[tuple], seed: int = 0) -> list:
    """The inputs the script makes (the same function is written into it)."""
    namespace: dict = {"torch": torch}
    exec(_MAKE_INPUTS_SRC, namespace)
    return namespace["_make_inputs"](specs, seed)


_MAKE_INPUTS_SRC = '''
def _make_inputs(specs, seed=0):
    """Random inputs of the recorded shapes, strides and dtypes (same seed, same inputs)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for spec in specs:
        if spec[0] == "value":
            out.append(spec[1])
            continue
        if spec[0] != "tensor":
            raise TypeError(f"cannot make an input of type {spec[1]}: pass it in by hand")
        _, shape, stride, dtype, device, requires_grad = spec
        numel = 1 + sum((size - 1) * st for size, st in zip(shape, stride)) if all(shape) else 0
        if dtype.is_floating_point or dtype.is_complex:
            base = torch.randn(numel, generator=gen, dtype=torch.complex128 if dtype.is_complex else torch.float32)
        elif dtype == torch.bool:
            base = torch.randint(0, 2, (numel,), generator=gen) > 0
        else:
            base = torch.randint(0, 3, (numel,), generator=gen)
        tensor = base.to(dtype).to(device).as_strided(shape, stride)
        if requires_grad:
            tensor = tensor.detach().requires_grad_()
        out.append(tensor)
    return out
'''


def _literal(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return str(value)                      # "torch.float32"
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f"float({str(value)!r})"
    return repr(value)


def _spec_source(spec: tuple) -> str:
    return "(" + ", ".join(_literal(v) for v in spec) + ("," if len(spec) == 1 else "") + ")"


def _import_block(globals_: dict) -> str:
    """Imports for the names the graph's code uses; a name that cannot be imported (a
    function defined in a script's __main__, say) fails loudly when the script starts."""
    from torch.fx.graph_module import _format_import_block
    from torch.package import sys_importer

    lines = []
    for name, obj in globals_.items():
        try:
            lines.append(_format_import_block({name: obj}, sys_importer).strip())
        except Exception:
            where = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
            lines.append(f"raise ImportError({f'fx_graph_runnable: the graph calls {where}, which cannot be imported here; define {name} above this line'!r})")
    return "\n".join(line for line in lines if line and line != "import torch")  # imported above


def _state(gm: torch.fx.GraphModule) -> dict:
    """What the graph reads from `self`: get_attr tensors and call_module submodules."""
    state = {}
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module") and node.target not in state:
            obj = gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            state[node.target] = obj
    return state


def _nbytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, torch.nn.Module):
        return sum(_nbytes(t) for t in [*obj.parameters(), *obj.buffers()])
    return 0


def render(gm: torch.fx.GraphModule, example_inputs: Optional[Sequence[Any]] = None, *,
           title: str = "", state_file: Optional[str] = None, main: Optional[str] = None,
           first_imports: str = "") -> str:
    """The script's text. `state_file` is the basename of the saved state, if any; `main`
    replaces the `if __name__ == "__main__":` block and `first_imports` go before torch's
    (the minifier's scripts)."""
    code = gm.graph.python_code(root_module="self")
    specs = describe_inputs(gm, example_inputs)
    placeholders = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    spec_lines = "\n".join(f"    {_spec_source(s)},  # {name}" for s, name in zip(specs, placeholders))
    load_state = ""
    if state_file:
        load_state = textwrap.dedent(f"""\
            state = torch.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), {state_file!r}), weights_only=False)
            for target, value in state.items():
                *path, leaf = target.split(".")
                owner = self
                for part in path:
                    if not hasattr(owner, part):
                        owner.add_module(part, torch.nn.Module())
                    owner = getattr(owner, part)
                if isinstance(value, torch.nn.Module):
                    owner.add_module(leaf, value)
                elif isinstance(value, torch.nn.Parameter):
                    owner.register_parameter(leaf, value)
                elif isinstance(value, torch.Tensor):
                    owner.register_buffer(leaf, value)
                else:
                    setattr(owner, leaf, value)
            """)
    init_body = textwrap.indent(load_state, " " * 8) if load_state else ""
    forward = textwrap.indent(code.src.strip("\n"), "    ")
    how = "" if main else ("\n# Run it standalone: python {this file}  (rebuilds the graph module, makes random "
                           "inputs of\n# the recorded shapes/dtypes with a fixed seed, runs it and prints each output).")
    main = main or _PRINT_OUTPUTS_MAIN
    return f'''\
# {title or "An FX graph, rebuilt from its code."}{how}
{first_imports}import os

import torch

{_import_block(code.globals)}


class Repro(torch.nn.Module):
    def __init__(self):
        super().__init__()
{init_body or "        pass"}

{forward}


INPUT_SPECS = [
{spec_lines}
]
{_MAKE_INPUTS_SRC}

def make_inputs(seed=0):
    return _make_inputs(INPUT_SPECS, seed)


def run(seed=0):
    return Repro()(*make_inputs(seed))


{main}'''


_PRINT_OUTPUTS_MAIN = '''\
if __name__ == "__main__":
    outputs = run()
    for i, out in enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        if isinstance(out, torch.Tensor):
            summary = out.detach().double().sum().item() if out.numel() else 0.0
            print(f"output {i}: {tuple(out.shape)} {out.dtype} sum={summary:.6g}")
        else:
            print(f"output {i}: {out!r}")
'''


def write(gm: torch.fx.GraphModule, example_inputs: Optional[Sequence[Any]], path: str, *, title: str = "",
          main: Optional[str] = None, first_imports: str = "") -> str:
    """Write the runnable script (and its state file when the graph reads parameters or
    submodules). Returns the script's path."""
    state = _state(gm)
    state_file = None
    if state:
        if sum(_nbytes(v) for v in state.values()) > MAX_STATE_BYTES:
            state = {k: _randomized(v) for k, v in state.items()}
            title += " (parameters above the size limit are random)"
        state_file = os.path.splitext(os.path.basename(path))[0] + "_state.pt"
        torch.save(state, os.path.join(os.path.dirname(path), state_file))
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(gm, example_inputs, title=title, state_file=state_file, main=main,
                       first_imports=first_imports))
    return path


def _randomized(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor) and obj.dtype.is_floating_point:
        fresh = torch.randn(obj.shape, dtype=obj.dtype, device=obj.device)
        return torch.nn.Parameter(fresh, obj.requires_grad) if isinstance(obj, torch.nn.Parameter) else fresh
    return obj
