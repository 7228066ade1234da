"""engine.sync_guard: every host-sync op of docs/design.md §4 fails inside the guard with a
message that names it and says how to fix it; host-data tensor creation, copies and
fixed-shape ops pass; the designated wait passes and is counted."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from engine.sync_guard import HostSyncError, SyncGuard

X = torch.arange(8)
MASK = X > 3
F = X.float()

FLAGGED: dict[str, tuple[Callable[[], object], str]] = {
    # name: (the op, a word its message must contain)
    "item": (lambda: X[0].item(), ".item()"),
    "int": (lambda: int(X[1]), "int("),
    "float": (lambda: float(F[1]), "float("),
    "bool": (lambda: bool(X[1] > 0), "bool("),
    "if_tensor": (lambda: 1 if X.any() else 0, "bool("),
    "index_by_tensor": (lambda: [1, 2, 3][X[1]], "index"),
    "tolist": (lambda: X.tolist(), ".tolist()"),
    "numpy": (lambda: X.numpy(), ".numpy()"),
    "np_asarray": (lambda: np.asarray(X), "numpy"),
    "cpu": (lambda: X.cpu(), ".cpu()"),
    "to_cpu_str": (lambda: X.to("cpu"), '.to("cpu")'),
    "to_cpu_device": (lambda: X.to(device=torch.device("cpu")), '.to("cpu")'),
    "to_cpu_with_dtype": (lambda: X.to("cpu", torch.float32), '.to("cpu")'),
    "print": (lambda: str(X), "printing"),
    "format": (lambda: f"{X}", "formatting"),
    "nonzero": (lambda: torch.nonzero(X), "nonzero"),
    "nonzero_method": (lambda: MASK.nonzero(), "nonzero"),
    "nonzero_as_tuple": (lambda: MASK.nonzero(as_tuple=True), "nonzero"),
    "argwhere": (lambda: torch.argwhere(MASK), "argwhere"),
    "where_one_arg": (lambda: torch.where(MASK), "torch.where(condition)"),
    "bool_mask_index": (lambda: X[MASK], "boolean-mask indexing"),
    "bool_mask_index_2d": (lambda: X.view(2, 4)[MASK.view(2, 4)], "boolean-mask indexing"),
    "bool_mask_assign": (lambda: X.clone().__setitem__(MASK, 0), "boolean-mask assignment"),
    "bool_mask_assign_tensor": (lambda: X.clone().__setitem__(MASK, X[:4]), "boolean-mask assignment"),
    "index_put_bool": (lambda: X.clone().index_put_((MASK,), torch.tensor(0)), "boolean-mask assignment"),
    "masked_select": (lambda: torch.masked_select(X, MASK), "masked_select"),
    "unique": (lambda: torch.unique(X), "unique"),
    "unique_method": (lambda: X.unique(return_counts=True), "unique"),
    "unique_consecutive": (lambda: torch.unique_consecutive(X), "unique_consecutive"),
    "repeat_interleave": (lambda: torch.repeat_interleave(X, X), "output_size"),
    "repeat_interleave_method": (lambda: X.repeat_interleave(X, dim=0), "output_size"),
    "repeat_interleave_repeats_only": (lambda: torch.repeat_interleave(X), "output_size"),
    "bincount": (lambda: torch.bincount(X), "bincount"),
    "bincount_minlength": (lambda: torch.bincount(X, minlength=100), "bincount"),
    "equal": (lambda: torch.equal(X, X), "equal"),
    "allclose": (lambda: torch.allclose(F, F), "allclose"),
    "histc_auto_range": (lambda: torch.histc(F, bins=4), "histc"),
    "arange_tensor_end": (lambda: torch.arange(X[3]), "Python number"),
}


@pytest.mark.parametrize("name", sorted(FLAGGED))
def test_guard_catches(name: str) -> None:
    op, named = FLAGGED[name]
    with SyncGuard("cpu"), pytest.raises(HostSyncError) as caught:
        op()
    message = str(caught.value)
    assert named in message and "Fix:" in message and "guard.permitted" in message


ALLOWED: dict[str, Callable[[], object]] = {
    "tensor_from_list": lambda: torch.tensor([1, 2, 3], dtype=torch.int64),
    "tensor_from_numpy": lambda: torch.from_numpy(np.arange(4)),
    "as_tensor_numpy": lambda: torch.as_tensor(np.ones(3)),
    "staging_copy": lambda: torch.empty(8, dtype=torch.int64).copy_(X),
    "staging_copy_non_blocking": lambda: torch.empty(8, dtype=torch.int64).copy_(X, non_blocking=True),
    "to_cpu_non_blocking": lambda: X.to("cpu", non_blocking=True),
    "to_dtype": lambda: X.to(torch.float32),
    "to_like": lambda: X.to(F),
    "arithmetic": lambda: (F * 2 + 1).softmax(-1).log(),
    "reductions_stay_tensors": lambda: (X.sum(), X.max(), MASK.any(), X.float().mean()),
    "where_three_args": lambda: torch.where(MASK, X, 0),
    "masked_fill": lambda: X.masked_fill(MASK, 0),
    "mask_multiply": lambda: X * MASK,
    "topk_sort_argmax": lambda: (F.topk(3), F.sort(descending=True), F.argmax()),
    "gather_scatter": lambda: torch.zeros(8).scatter_add_(0, X, F).gather(0, X),
    "index_with_long": lambda: X[torch.tensor([0, 2])],
    "index_put_long": lambda: X.clone().index_put_((torch.tensor([1]),), torch.tensor(5)),
    "slices_and_ints": lambda: (X[2:5], X[3], X.view(2, 4)[:, 1]),
    "repeat_interleave_output_size": lambda: torch.repeat_interleave(X, X, output_size=28),
    "repeat_interleave_int": lambda: X.repeat_interleave(2),
    "nonzero_static": lambda: torch.nonzero_static(MASK, size=8),
    "cumsum_searchsorted": lambda: torch.searchsorted(F.cumsum(0), F),
    "histc_explicit_range": lambda: torch.histc(F, bins=4, min=0, max=8),
    "shape_reads": lambda: (X.shape[0], len(X), X.numel(), X.dtype),
}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_guard_lets_fixed_shape_work_through(name: str) -> None:
    with SyncGuard("cpu"):
        ALLOWED[name]()


def test_permitted_wait_passes_and_is_counted() -> None:
    pinned_out = torch.empty(4, dtype=torch.int64)  # the host copy of step N-1's tokens
    with SyncGuard("cpu") as guard:
        tokens = torch.zeros(4, dtype=torch.int64)
        host: list[int] = []
        for _step in range(5):
            tokens = (tokens + 1) % 7  # "launch" step N
            with guard.permitted("previous step's output tokens"):
                host = pinned_out.tolist()  # wait on step N-1's copy
            pinned_out.copy_(tokens, non_blocking=True)
        with pytest.raises(HostSyncError):
            tokens.tolist()  # outside permitted() the guard is back
    assert guard.waits == 5
    assert guard.wait_reasons == {"previous step's output tokens": 5}
    assert host == [4, 4, 4, 4]
    guard.reset_counts()
    assert guard.waits == 0


def test_guard_leaves_no_trace_after_exit_even_on_error() -> None:
    with pytest.raises(HostSyncError), SyncGuard("cpu"):
        X.tolist()
    assert X[0].item() == 0 and X.tolist()[:2] == [0, 1]
    with SyncGuard("cpu", enabled=False):
        assert X.tolist()[0] == 0


def test_guard_is_not_reentrant() -> None:
    guard = SyncGuard("cpu")
    with guard, pytest.raises(RuntimeError, match="re-entrant"), guard:
        pass


def test_cuda_guard_needs_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CUDA"), SyncGuard("cuda"):
        pass


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_cuda_guard_uses_sync_debug_mode() -> None:
    x = torch.arange(8, device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    with SyncGuard("cuda") as guard:
        assert torch.cuda.get_sync_debug_mode() == 2
        y = torch.repeat_interleave(x, x, output_size=28)  # no sync
        with pytest.raises(RuntimeError, match="synchroniz"):
            x.sum().item()
        with guard.permitted("output"):
            assert y.shape[0] == 28 and int(y[-1]) == 7
        assert torch.cuda.get_sync_debug_mode() == 2
    assert torch.cuda.get_sync_debug_mode() == before and guard.waits == 1
