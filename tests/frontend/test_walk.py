"""The tokenizer side's walk (sglang_mepic/README.md, "The walk of one request"): a `/generate` request
with two marked chunks meets each module once, in the README's order, and no module twice.

A step is a call into a module's work, traced as it runs. Not steps: reading data (a dataclass's
__init__, a property, a comprehension), reading state (`env`, `frontend/state`, `modes`: "reading
state is not a step"), and the modules that hand the request from step to step (`ids_and_hint`, the
hooks)."""

import sys
from types import SimpleNamespace

from sglang.srt.managers.io_struct import GenerateReqInput
from transformers import AutoTokenizer

from sglang_mepic import env as settings
from sglang_mepic.frontend import ids_and_hint
from sglang_mepic.lang import chunk
from sglang_mepic.patches.tokenizer import tokenizer_manager_validate_one_request as validation

HANDS_ON = ("frontend.ids_and_hint", "patches.")
STATE = ("env", "frontend.state", "modes")
DATA = {"__init__", "__post_init__", "<lambda>", "<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>", "chunks",
        "end", "size", "slot_tokens", "padded_tokens", "pad_runs", "real_tokens", "laid_out"}


def walk(calls: list[tuple[str, str]]) -> list[str]:
    """The modules of the steps, in order, a module's consecutive calls one step."""
    steps: list[str] = []
    for module, function in calls:
        if module.startswith(HANDS_ON) or module in STATE or function in DATA:
            continue
        if not steps or steps[-1] != module:
            steps.append(module)
    return steps


def traced(run) -> list[tuple[str, str]]:
    calls = []

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if event == "call" and module.startswith("sglang_mepic."):
            calls.append((module.removeprefix("sglang_mepic."), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls


def test_a_generate_request_meets_each_module_once(tiny_model, env):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    manager = SimpleNamespace(
        tokenizer=tokenizer, context_len=2048, max_req_input_len=None, num_reserved_tokens=0, mm_processor=None,
        model_config=SimpleNamespace(vocab_size=tokenizer.vocab_size + 64),
        server_args=SimpleNamespace(page_size=16, attention_backend="mepic", radix_cache_backend="mepic",
                                    allow_auto_truncate=False))
    text = ("Answer from the documents." + chunk("The first document says a thing. " * 5)
            + chunk("The second document says another thing. " * 5) + "Question: what?")
    obj = GenerateReqInput(text=text, sampling_params={"max_new_tokens": 4})
    obj.normalize_batch_and_arguments()
    settings.settings()  # read once, when the process starts

    def request():
        ids_and_hint.prepare(manager, obj)  # before SGLang tokenizes (the tokenize hook)
        validation.hook(manager, obj, obj.input_ids)  # SGLang's validation of the final ids

    steps = walk(traced(request))
    assert steps == ["frontend.auto_chunk", "frontend.markup", "wire.layout", "wire.hint",
                     "hardening.scheduler_fields", "frontend.limits", "frontend.intake"]
    assert obj.input_ids is not None and len(obj.kv_hints.actions) == 1  # it was laid out and hinted


def test_the_walk_names_a_module_met_twice():
    """The check fails on a planted violation: markup read again after the layout."""
    calls = [("frontend.auto_chunk", "text_pieces"), ("frontend.markup", "split_text"),
             ("frontend.ids_and_hint", "_tokenized"), ("frontend.markup", "tokenize_pieces"),
             ("wire.layout", "layout"), ("frontend.ids_and_hint", "strip_markup"), ("frontend.markup", "again")]
    steps = walk(calls)
    assert steps == ["frontend.auto_chunk", "frontend.markup", "wire.layout", "frontend.markup"]
    assert len(steps) != len(set(steps))
