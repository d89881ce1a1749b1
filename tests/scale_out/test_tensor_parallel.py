"""Tensor parallelism without a server: what a forward that raises does under TP (batch_guard). The launcher's
TP checks are tests/launch/test_launch.py's, a rank's storage keys tests/tiers/test_storage.py's, and the
servers e2e/test_tensor_parallel_server.py's."""

from types import SimpleNamespace

import pytest
import torch

from sglang_mepic.hardening import batch_guard


def _batch(decode: bool):
    mode = SimpleNamespace(is_extend=lambda: not decode, is_decode=lambda: decode, is_split_prefill=lambda: False)
    return SimpleNamespace(forward_mode=mode, spec_algorithm=SimpleNamespace(is_none=lambda: True))


@pytest.mark.parametrize("decode", [False, True])
def test_a_raising_forward_is_recovered_on_one_rank_and_fatal_under_tp(decode):
    """One rank of several cannot end its requests and serve on: the others may still be inside a collective
    of that forward, and its next forward's collectives would pair with theirs. So under TP it re-raises."""
    from sglang.srt.runtime_context import get_parallel

    scheduler = SimpleNamespace(is_generation=True, disaggregation_mode=SimpleNamespace(value="null"))
    error = RuntimeError("a request's forward failed")
    with get_parallel().override(tp_size=1, pp_size=1):
        assert batch_guard.recoverable(scheduler, _batch(decode), error)
    with get_parallel().override(tp_size=2, pp_size=1):
        assert not batch_guard.recoverable(scheduler, _batch(decode), error)
    with get_parallel().override(tp_size=1, pp_size=1):
        assert not batch_guard.recoverable(scheduler, _batch(decode), torch.cuda.OutOfMemoryError("oom"))
