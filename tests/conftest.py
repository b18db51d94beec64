"""Every test starts from the same random state.

This torch build seeds its default generator differently in every process, so a test that initialises a layer or
draws data without its own generator would see different numbers in every run: a failure that cannot be replayed.
Seeding before each test makes the suite deterministic in any order (tests still seed their own generators where
the numbers matter).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _same_random_state() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
