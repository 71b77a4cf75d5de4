"""`python -m observe`: regenerate the table in docs/logging.md from the registry."""

import os

from .registry import _write_docs_table

_write_docs_table(os.path.join(os.path.dirname(__file__), "..", "docs", "logging.md"))
