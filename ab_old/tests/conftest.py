"""Every test module is imported, and every test starts, from the same random state: a
numeric test sees the same inputs in CI as where it was written and checked."""

import random

import pytest

import engine  # noqa: F401  (first, as in a user's program: observe reads TORCH_LOGS before torch does)
import torch

SEED = 0


def pytest_collectstart(collector):
    if isinstance(collector, pytest.Module):    # its import makes the module-level inputs
        torch.manual_seed(SEED)


@pytest.fixture(autouse=True)
def _same_random_state():
    torch.manual_seed(SEED)
    random.seed(SEED)
