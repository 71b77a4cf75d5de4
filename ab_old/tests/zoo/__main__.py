"""`python -m tests.zoo --help` (from the repository root): see tests/zoo/runner.py."""

import sys

from .runner import main

sys.exit(main())
