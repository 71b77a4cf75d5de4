"""The minifier (docs/minifier.md): from a backend crash or a wrong result to repro.py, the
smallest graph that fails the same way."""

from .check import AccuracyFailure, Failure, reproduce
from .minify import MinifyResult, minify, minify_script

__all__ = ["AccuracyFailure", "Failure", "MinifyResult", "minify", "minify_script", "reproduce"]
