"""CTAs per SM of a compiled kernel: what decode split counts are sized from.

The occupancy arithmetic of CUDA's calculator, from the compiled kernel's own
resources (registers per thread, warps, shared memory) and the device's limits.
The same kernel source compiles to different register counts under different
Triton versions (the previous 32-key decode source: 3.7.1, 138 registers, 3 CTAs/SM
on sm_90; the H100 run's 3.6.0, 109, 4 CTAs/SM, eval/results/gpu/after.md), so on a GPU the capacity comes from
the kernel Triton actually built there (`compiled_ctas_per_sm`), not from a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from triton.compiler.compiler import CompiledKernel

REG_ALLOC_UNIT = 256  # registers are allocated to a warp in blocks of 256
RESERVED_SHARED_PER_CTA = 1024  # bytes the driver reserves in shared memory for each CTA (sm_80 on)
# CTAs one SM holds at most, by compute capability (not among torch's device properties).
MAX_CTAS_PER_SM = {(8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32, (10, 0): 32, (12, 0): 24}


@dataclass(frozen=True)
class SmLimits:
    registers: int = 65536
    threads: int = 2048
    ctas: int = 32
    shared: int = 228 * 1024  # bytes per SM (sm_90; sm_80: 164 KB)
    warp_size: int = 32

    @classmethod
    def of_arch(cls, arch: int) -> "SmLimits":
        """Limits of an H100 (90) or A100 (80): what the static model and the CPU fallback assume."""
        return cls() if arch >= 90 else cls(shared=164 * 1024)

    @classmethod
    def of_device(cls, device: torch.device | str | int) -> SmLimits:
        import torch

        props = torch.cuda.get_device_properties(device)
        arch = cls.of_arch(10 * props.major + props.minor)
        return cls(registers=getattr(props, "regs_per_multiprocessor", arch.registers),
                   threads=getattr(props, "max_threads_per_multi_processor", arch.threads),
                   ctas=MAX_CTAS_PER_SM.get((props.major, props.minor), 16),
                   shared=getattr(props, "shared_memory_per_multiprocessor", arch.shared),
                   warp_size=getattr(props, "warp_size", arch.warp_size))


def ctas_per_sm(registers: int, num_warps: int, shared: int, limits: SmLimits = SmLimits()) -> int:
    """CTAs of a kernel one SM runs at once: the least of what its registers, threads, shared memory and
    the CTA slots allow (registers: per warp, rounded up to the allocation unit)."""
    warps = max(1, num_warps)
    per_warp = -(-max(1, registers) * limits.warp_size // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    by_registers = limits.registers // per_warp // warps
    by_threads = limits.threads // (warps * limits.warp_size)
    by_shared = limits.shared // (shared + RESERVED_SHARED_PER_CTA)
    return max(0, min(by_registers, by_threads, by_shared, limits.ctas))


def compiled_ctas_per_sm(kernel: CompiledKernel, limits: SmLimits) -> int:
    """CTAs per SM of a Triton `CompiledKernel` (from `JITFunction.warmup` or a launch) on a device with
    these limits (`SmLimits.of_device`).

    Loading the kernel's module on the current device (`_init_handles`, what its first launch does
    anyway) is what sets `n_regs`: the register count the driver reports for the code it will run.
    No stream sync."""
    kernel._init_handles()
    return ctas_per_sm(kernel.n_regs, kernel.metadata.num_warps, kernel.metadata.shared, limits)
