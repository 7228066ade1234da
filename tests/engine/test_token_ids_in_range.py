"""The prompt and continuation check of EngineCore: plain ints in [0, vocab) only."""

from __future__ import annotations

import numpy as np
import pytest

from engine.request import token_ids_in_range


@pytest.mark.parametrize("ids", [[0], [0, 1, 99], (5, 7), list(range(100))])
def test_ids_in_range_pass(ids):
    assert token_ids_in_range(ids, 100)


@pytest.mark.parametrize(
    "ids",
    [[100], [-1, 3], [1, True], [False], [1.0], [np.int64(3)], ["3"], [3, None], [2**70]],
    ids=["at-vocab", "negative", "bool", "only-bool", "float", "numpy-int", "str", "none", "huge"],
)
def test_ids_out_of_range_or_not_int_fail(ids):
    assert not token_ids_in_range(ids, 100)
