"""HookRegistry hooks on SGLang internals, grouped by the process each runs in.

One module per upstream function, in the folder of the process it runs in: `tokenizer/`, `scheduler/`,
`launcher/`, `dp_controller/` (SGLang's data-parallel controller), and `hardening/` for the guards against
SGLang's own mishandling (either process). Each module names the function it hooks (`TARGET`), how
(`HOOK_TYPE`), the hook itself (`hook`), and the
SGLang release it was written against (`WRITTEN_FOR`); `register_all` refuses to hook any other
release, because the upstream function may have changed under it. A group's `MODULES` lists its hooks
in the order they are registered.
"""

import importlib

from sglang.srt.plugins.hook_registry import HookRegistry

GROUPS = ("tokenizer", "scheduler", "launcher", "dp_controller", "hardening")


def modules() -> list[str]:
    """Every hook module, `group.name`, group by group."""
    return [f"{group}.{name}" for group in GROUPS
            for name in importlib.import_module(f"{__name__}.{group}").MODULES]


def register_all(sglang_version: str) -> None:
    for name in modules():
        module = importlib.import_module(f"{__name__}.{name}")
        if module.WRITTEN_FOR != sglang_version:
            raise RuntimeError(f"patch {name} was written for sglang {module.WRITTEN_FOR}, "
                               f"not {sglang_version}; it must be re-checked against the new code")
        HookRegistry.register(module.TARGET, module.hook, module.HOOK_TYPE)
