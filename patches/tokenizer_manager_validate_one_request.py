"""Refuse an empty prompt or a client-made layout hint before SGLang's own checks (intake.py).

Every tokenization path (single, batch, n > 1, OpenAI) ends here with the
request's final input_ids, markup already removed.
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import intake

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
HOOK_TYPE = HookType.BEFORE


def hook(manager, obj, input_ids, *args, **kwargs):
    intake.check(obj, input_ids)
