"""What the stand-in does for names it does not implement.

Three kinds of name (the package README lists them):

* implemented: real functions, in the package's modules;
* stubbed: any other public name of `sgl_kernel` or of a `sgl_kernel.<sub>` module imports
  fine and raises `NotImplementedError` naming itself when called, so SGLang's many
  module-level `from sgl_kernel import X` (under `if _is_cuda:`) load, and a path we did
  not foresee fails loudly instead of silently;
* absent: names and submodules that SGLang *probes* (`try: from sgl_kernel... import X
  except ImportError`, `hasattr`) to choose a path. They raise ImportError/AttributeError,
  as if the kernel were missing from the wheel, so SGLang takes its fallback.
"""

import importlib.abc
import importlib.machinery
import sys
import types

PACKAGE = "sgl_kernel"
TAG = "sgl_kernel stand-in (sglang-mepic eval/gpu/e2e)"

# Submodules SGLang imports inside try/except ImportError to decide whether a feature exists.
# sgl_kernel.allreduce: custom_all_reduce_ops.py:21 -> IS_CUSTOM_AR_AVAILABLE = False (TP=1 never
#   needs it; a stub would make a TP>1 run try IPC all-reduce through NotImplementedError).
# sgl_kernel.scalar_type: quantization/utils.py:27 -> SGLang's mock scalar types (marlin/GPTQ only).
ABSENT_SUBMODULES = frozenset({"allreduce", "scalar_type"})

# Names probed with try/except ImportError (or hasattr), per module. See README "Absent".
ABSENT_NAMES = {
    PACKAGE: frozenset({
        # rotary_embedding/base.py:76 (XPU): None -> generic rotary path
        "fused_qk_rope_with_cos_sin_cache_inplace",
        # rotary_embedding/mrope.py:46 (XPU): None -> torch mrope
        "multimodal_rotary_embedding",
        # hardware_backend/gpu/quantization/awq_kernels.py:40 (XPU): None -> triton AWQ
        "awq_dequantize",
        # mem_cache/memory_pool_host.py:32 (XPU): None
        "transfer_cache_dsv4_mla",
        # kernels/ops/speculative/verify_sampling.py:28 (MUSA): None
        "tree_speculative_sampling_target_only",
    }),
    f"{PACKAGE}.kvcacheio": frozenset({
        # mem_cache/pool_host/common.py:400: None -> raw host addresses (CUDA UVA) in the
        # host pool's kernel pointer tables, with a warning.
        "get_device_accessible_ptr",
        # mem_cache/embedding_cache_controller.py:15, pool_host/minimax_m3_nvfp4.py:27: None
        "transfer_embedding_ranges_direct",
    }),
}


def not_implemented(name: str, module: str = PACKAGE):
    """A callable standing for `module.name` that raises NotImplementedError when called."""
    qualified = name if module == PACKAGE else f"{module[len(PACKAGE) + 1:]}.{name}"

    def stub(*args, **kwargs):
        raise NotImplementedError(f"{TAG}: {qualified} is not implemented")

    stub.__name__ = name
    stub.__qualname__ = name
    stub.__module__ = module
    stub.__doc__ = f"Not implemented by the {TAG}; calling it raises NotImplementedError."
    stub._sgl_kernel_standin_stub = True
    return stub


def is_stub(obj) -> bool:
    return getattr(obj, "_sgl_kernel_standin_stub", False)


def module_getattr(module_name: str, implemented_submodules=()):
    """A module-level `__getattr__` for `module_name`: dunder and private names and absent
    names raise AttributeError; names of (stubbed) submodules import them; every other
    name is a stub, created once and kept in the module."""
    absent = ABSENT_NAMES.get(module_name, frozenset())

    def __getattr__(name: str):
        if name.startswith("_") or name in absent or (module_name == PACKAGE and name in ABSENT_SUBMODULES):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        if module_name == PACKAGE and (name in implemented_submodules or name in KNOWN_STUB_SUBMODULES):
            # `from sgl_kernel import spatial` and `sgl_kernel.flash_attn` mean the submodule.
            return importlib.import_module(f"{PACKAGE}.{name}")
        value = not_implemented(name, module_name)
        setattr(sys.modules[module_name], name, value)
        return value

    return __getattr__


# Submodules of the real sglang-kernel wheel that SGLang imports and the stand-in does not ship
# as files: they are made on import as stub modules (every public name a stub).
KNOWN_STUB_SUBMODULES = frozenset({
    "allreduce_rmsnorm", "attention", "cutlass_moe", "flash_attn", "flash_mla", "flashmla", "fused_moe",
    "gemm", "grammar", "hadamard", "mamba", "marlin", "moe", "quantization", "speculative", "spatial",
    "top_k", "infllm_v2", "mem_cache", "testing", "debug_utils",
})


class _StubModuleLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []  # a package, so `sgl_kernel.a.b` imports go through the finder too
        module.__doc__ = f"Stub module of the {TAG}: every public name raises NotImplementedError."
        module.__getattr__ = module_getattr(spec.name)
        module._sgl_kernel_standin_stub_module = True
        return module

    def exec_module(self, module):
        pass


class StubSubmoduleFinder(importlib.abc.MetaPathFinder):
    """Makes any `sgl_kernel.<sub>[.<subsub>...]` that is not a file of the package a stub
    module, except the absent submodules (ModuleNotFoundError, as when the wheel lacks them).
    It sits at the end of sys.meta_path, so the package's real modules are found first."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(PACKAGE + "."):
            return None
        parent, _, leaf = fullname.rpartition(".")
        if fullname.split(".")[1] in ABSENT_SUBMODULES or leaf in ABSENT_NAMES.get(parent, ()):
            # `from sgl_kernel import X` falls back to importing a submodule X when the
            # attribute is missing: an absent name must not come back as a stub module.
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubModuleLoader(), is_package=True)


def install_finder() -> None:
    if not any(isinstance(f, StubSubmoduleFinder) for f in sys.meta_path):
        sys.meta_path.append(StubSubmoduleFinder())
