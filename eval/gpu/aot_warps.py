"""AOT spill check of the sm_90 extend launches with the shipped warps and with 4 warps, by the Triton at hand.

Device machine, with .gpu_carry carried (eval/gpu/make_carry.sh builds it):
    cd .gpu_carry && PYTHONPATH=proj python3 aot_warps.py
Here (the venv's Triton): .venv/bin/python eval/gpu/aot_warps.py
Why: sweep_extend.py found 128 x 32 tiles on 4 warps faster than the shipped 8, and `kernels.aot` refuses any
spill; this tells whether that Triton spills them (eval/results/gpu/h100.md).
"""
import triton

import sglang_mepic.kernels.attention as k
import sglang_mepic.kernels.aot as aot

shipped = k.launch_config
for warps in (None, 4):
    k.launch_config = (shipped if warps is None else
                       lambda *a, **kw: {**shipped(*a, **kw), **({"num_warps": warps} if a[0] == "extend" else {})})
    print(f"\n## triton {triton.__version__}, extend warps: {'shipped' if warps is None else warps}", flush=True)
    aot.main(["--only", "extend", "--arch", "90"])
