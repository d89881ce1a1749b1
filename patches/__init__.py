"""HookRegistry hooks on SGLang internals, one module per upstream function (installed as sglang_mepic.patches)."""
