"""A generate request of the wrong shape (`sampling_params: []`, `n: 0` on a batch) is a 400,
not a 500 (request_shape.py)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.request_shape import SHAPE_ERRORS

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"
HOOK_TYPE = HookType.AROUND


def hook(original, obj, *args, **kwargs):
    try:
        result = original(obj, *args, **kwargs)
    except SHAPE_ERRORS as e:
        raise ValueError(f"malformed request: {type(e).__name__}: {e}") from None
    n = getattr(obj, "parallel_sample_num", 1)
    if not isinstance(n, int) or n < 1:
        # SGLang splits a batch into n copies per prompt; n = 0 indexed an empty list (a 500)
        raise ValueError(f"n (samples per prompt) must be a whole number of at least 1, not {n!r}")
    return result
