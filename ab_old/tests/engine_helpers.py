"""Shared helpers of the engine tests: a fresh engine around each test, the events a
compile emits, what TORCH_LOGS=<names> would show, and a compiled function's cache."""

from __future__ import annotations

import contextlib

import pytest

import engine
import observe
from engine.capture import runtime


@pytest.fixture(autouse=True)
def fresh_engine():
    """Each test starts and ends with an empty cache (autouse: importing it is enough)."""
    engine.reset()
    yield
    engine.reset()


@pytest.fixture
def events():
    """Every event emitted on the bus during the test."""
    seen = []
    fn = observe.subscribe(seen.append)
    yield seen
    observe.unsubscribe(fn)


@contextlib.contextmanager
def logs(*names):
    """Collect what TORCH_LOGS=<names> would show, one string per event."""
    out = []

    def sink(e):
        if e.name == "log":
            out.append(e.metadata["msg"] % e.metadata["args"])
        else:
            out.append(e.payload_fn() if e.payload_fn else str(e.metadata))

    observe.subscribe(sink, logs=list(names))
    try:
        yield out
    finally:
        observe.unsubscribe(sink)


def cache_entries(fn):
    """The cache entries of a compiled function (or of a module's forward)."""
    return runtime.cache_for(getattr(fn, "__code__", None) or fn.forward.__code__).entries
