"""Hooks in the launching process, before SGLang starts its children."""

MODULES = (
    "engine_set_envs_and_config",
)
