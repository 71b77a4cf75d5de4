"""Backends by name. A backend is PyTorch's contract:
`backend(gm: torch.fx.GraphModule, example_inputs: list) -> callable`."""

from __future__ import annotations

from typing import Callable

Backend = Callable

_BACKENDS: dict[str, Backend] = {}


def register_backend(name: str) -> Callable[[Backend], Backend]:
    def register(fn: Backend) -> Backend:
        _BACKENDS[name] = fn
        return fn

    return register


def lookup_backend(backend) -> Backend:
    """A name from the registry, or any callable (a user backend)."""
    if callable(backend):
        return backend
    _load_builtin_backends()
    try:
        return _BACKENDS[backend]
    except KeyError:
        raise ValueError(
            f"unknown backend {backend!r}; available: {', '.join(sorted(_BACKENDS))}, or pass a callable "
            "backend(gm, example_inputs)"
        ) from None


def list_backends() -> list[str]:
    _load_builtin_backends()
    return sorted(_BACKENDS)


def _load_builtin_backends() -> None:
    # Each module registers itself on import; a backend whose stage is missing is simply absent.
    import importlib

    for module in ("eager", "aot_eager", "inductor"):
        try:
            importlib.import_module(f"engine.backends.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"engine.backends.{module}":
                raise
