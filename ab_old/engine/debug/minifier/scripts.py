"""The two scripts the minifier writes, both fx_runnable scripts of a graph with their own
`__main__`: minifier_launcher.py (the whole failing graph; running it minifies) and
repro.py (the smallest graph that still fails; running it fails the same way)."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import torch

from .. import fx_runnable
from .backend_ref import BackendRef
from .check import Failure

_IMPORTS = "import sys\n"
# engine before torch: it keeps torch from reading TORCH_LOGS names only the engine knows (minifier)
FIRST_IMPORTS = "import engine\n"


def write_launcher(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], path: str, ref: BackendRef,
                   failure: Failure, *, accuracy_check: bool, tolerance: float,
                   compile_id: Optional[str]) -> str:
    title = (f"minifier_launcher.py: the graph whose compile failed ({failure}), after {ref.stage}; "
             f"`python {os.path.basename(path)}` shrinks it and writes repro.py beside this file.")
    main = f'''\
{_IMPORTS}
{ref.setup}

# The failure the engine saw: the minifier looks for this one and no other.
EXPECTED = dict(kind={failure.kind!r}, error_type={failure.error_type!r}, message={failure.message!r},
                when={failure.when!r})

if __name__ == "__main__":
{_indent(ref.config_lines())}
    from engine.debug.minifier import minify_script
    result = minify_script(Repro(), make_inputs, backend, stage={ref.stage!r}, backend_name={ref.name!r},
                           backend_setup={ref.setup!r}, expected=EXPECTED, accuracy_check={accuracy_check!r},
                           tolerance={tolerance!r}, out_dir=os.path.dirname(os.path.abspath(__file__)),
                           compile_id={compile_id!r})
    sys.exit(0 if result.reproduced else 1)
'''
    return fx_runnable.write(gm, example_inputs, path, title=title, main=main, first_imports=FIRST_IMPORTS)


def write_repro(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], path: str, ref: BackendRef,
                failure: Failure, *, accuracy_check: bool, tolerance: float, minimized: bool) -> str:
    what = "the smallest graph that still fails" if minimized else "the whole failing graph (not minimized)"
    title = (f"repro.py: {what} with the {ref.name} backend (after {ref.stage}): {failure}. "
             f"`python {os.path.basename(path)}` fails the same way.")
    main = f'''\
{_IMPORTS}
{ref.setup}

if __name__ == "__main__":
{_indent(ref.config_lines())}
    from engine.debug.minifier.check import reproduce
    # raises {failure.error_type}{" with the numbers" if failure.kind == "accuracy" else ""}, as the failing compile did
    reproduce(backend, Repro(), make_inputs, accuracy_check={accuracy_check!r}, tolerance={tolerance!r},
              aten_graph={ref.stage == "aot"!r})
    print("repro.py: no failure (the backend compiled and ran this graph{" correctly" if accuracy_check else ""})")
'''
    return fx_runnable.write(gm, example_inputs, path, title=title, main=main, first_imports=FIRST_IMPORTS)


def _indent(lines: str) -> str:
    return "\n".join("    " + line for line in lines.splitlines())
