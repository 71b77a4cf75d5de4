"""Differential fuzzer: seeded random PyTorch programs (gen.py, program.py), run eagerly and
through engine.compile (and, with --compare, torch.compile), compared call by call with
changed inputs (runner.py, harness.py). `python -m tests.fuzz --help` from the repository
root."""

import engine  # noqa: F401  (before torch, as in a user's program)
