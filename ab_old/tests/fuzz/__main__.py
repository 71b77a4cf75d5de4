"""`python -m tests.fuzz --help` (from the repository root): see tests/fuzz/runner.py."""

import sys

from .runner import main

sys.exit(main())
