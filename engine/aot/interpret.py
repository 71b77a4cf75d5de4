"""Running the captured (torch-level) graph node by node, so that a failure while tracing
it names the node, with its parameters and buffers swapped for the lifted inputs."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.nn.utils.stateless import _reparametrize_module

from . import attention
from .errors import AOTAutogradError
from .inputs import LiftedParams


class _NamingInterpreter(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, step: str):
        super().__init__(gm)
        self.step = step

    def call_function(self, target, args, kwargs) -> Any:
        if target in attention.ATTENTION:
            return attention.scaled_dot_product_attention(*args, **kwargs)
        return super().call_function(target, args, kwargs)

    def run_node(self, n: torch.fx.Node) -> Any:
        try:
            return super().run_node(n)
        except AOTAutogradError:
            raise
        except Exception as exc:
            raise AOTAutogradError(self.step, n, exc) from exc


def run_captured_graph(gm: torch.fx.GraphModule, lifted: LiftedParams, user_args: list,
                       param_values: list, step: str) -> Any:
    """`gm(*user_args)` with every lifted tensor replaced by `param_values`."""
    with _reparametrize_module(gm, lifted.name_map(param_values)):
        return _NamingInterpreter(gm, step).run(*user_args)
