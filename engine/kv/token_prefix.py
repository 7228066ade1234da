"""The common prefix of two token sequences: how far a queued request's history runs
along another's (engine/kv/shared_prefix.py) and along a radix edge (radix.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_BISECT_SPAN = 64  # list slices shorter than this are compared one element at a time


def common_prefix_len(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two token sequences (lists or int arrays).

    Two lists are compared as list slices, bisecting on the first difference: for histories
    of thousands of ids that is about half the cost of converting both to arrays (the
    scheduler compares queued requests' histories with prefilling ones every step)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if type(a) is list and type(b) is list:
        return _common_list_prefix_len(a, b, n)
    differ = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(differ[0]) if differ.size else n


def _common_list_prefix_len(a: list[int], b: list[int], n: int) -> int:
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low]; they differ before `high`
    while high - low > _BISECT_SPAN:
        middle = (low + high) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle
    return next(i for i in range(low, high) if a[i] != b[i])
