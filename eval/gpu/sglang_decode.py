"""SGLang 0.5.23's Triton decode (`--attention-backend triton`) on our paged pools, launched as its backend
launches it: a per-request split count from its own heuristic (at most 8, its --triton-attention-num-kv-splits
default) and PDL on sm90 and newer. bench_peers.py and sweep_decode.py both time it.

Import it after the interpreter switch (TRITON_INTERPRET is read when triton is imported).
"""

import torch
import triton

from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

MAX_SPLITS = 8
# SGLang's use_pdl = is_arch_support_pdl(); cleared for the process when this triton cannot launch with it.
PDL = [torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9]


class SglangDecode:
    """One decode step for a batch whose request i reads the slots in `slots[i]` (page size 1 for SGLang):
    q [b, Hq, D], pools [slots, Hkv, D], seq [b] int32. Call it to run; `splits` and `note` say how."""

    def __init__(self, q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, slots: torch.Tensor,
                 seq: torch.Tensor, sms: int, scale: float):
        b, hq, _ = q.shape
        dev, dv = q.device, vp.shape[-1]
        self.q, self.kp, self.vp, self.scale = q, kp, vp, scale
        self.splits = torch.full((b,), MAX_SPLITS, dtype=torch.int32, device=dev)
        self.note = None
        try:
            get_num_kv_splits_triton[(1,)](self.splits, seq, b, 1, hq, kp.shape[1], MAX_SPLITS, sms,
                                           MAX_NUM_SEQ=max(256, triton.next_power_of_2(b)))
        except Exception as e:  # the interpreter cannot run it under numpy 2: SGLang's max splits then
            self.note = f"{type(e).__name__}: heuristic not run, {MAX_SPLITS} splits"
        self.out = torch.empty(b, hq, dv, dtype=q.dtype, device=dev)
        self.logits = torch.empty(b, hq, MAX_SPLITS, dv, dtype=torch.float32, device=dev)
        self.lse = torch.empty(b, hq, MAX_SPLITS, dtype=torch.float32, device=dev)
        self.indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * slots.shape[1]
        self.indices = slots.flatten()

    @property
    def pdl(self) -> bool:
        return PDL[0] and self.q.is_cuda

    def __call__(self) -> torch.Tensor:
        try:
            decode_attention_fwd(self.q, self.kp, self.vp, self.out, self.indptr, self.indices, self.logits,
                                 self.lse, self.splits, MAX_SPLITS, self.scale, 1.0, 1.0, use_pdl=self.pdl)
        except Exception as e:
            if not self.pdl:
                raise
            PDL[0] = False  # this triton cannot launch it with PDL: without, and say so
            print(f"sglang decode: no PDL ({type(e).__name__}: {str(e)[-200:]})", flush=True)
            return self()
        return self.out
