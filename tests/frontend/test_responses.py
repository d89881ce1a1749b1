"""What a client reads back: echoed prompts carry no chunk markers, and every response The unit half: the whole description, and the tests on a server, are in
e2e/test_responses_server.py."""


from sglang_mepic import config, env
from sglang_mepic.frontend import echo
from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END
from sglang_mepic.lang import chunk


def test_unmarked_removes_markers_from_every_prompt_shape(monkeypatch):
    monkeypatch.delenv(config.TEXT_MARKUP.env, raising=False)
    assert echo.unmarked("a " + chunk("doc") + " b") == "a doc b"
    assert echo.unmarked(["x", chunk("y")]) == ["x", "y"]
    assert echo.unmarked([1, BEG, 2, 3, END, 4]) == [1, 2, 3, 4]
    assert echo.unmarked([[BEG, 2, END], [5]]) == [[2], [5]]
    monkeypatch.setenv(config.TEXT_MARKUP.env, "off")  # typed markers are then text the model saw
    env.reload()
    assert echo.unmarked("a " + chunk("doc")) == "a " + chunk("doc")
    assert echo.unmarked([BEG, 2, END]) == [2]  # id markers always mark


def test_without_markers_leaves_requests_without_echo_alone():
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest

    plain = CompletionRequest(model="m", prompt=chunk("doc"))
    assert echo.without_markers(plain) is plain
    echoed = CompletionRequest(model="m", prompt=chunk("doc"), echo=True, n=2)
    copy = echo.without_markers(echoed)
    assert copy.prompt == "doc" and copy.n == 2 and echoed.prompt == chunk("doc")


def test_streamed_echo_hook_hands_sglang_the_unmarked_prompt():
    """The hook on SGLang's own `_get_echo_text` (a server test covers it once it is registered)."""
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

    from sglang_mepic.patches.tokenizer import serving_completions_get_echo_text as patch

    request = CompletionRequest(model="m", prompt=["Docs: " + chunk("doc") + " Q:", "plain"], echo=True)
    assert patch.hook(OpenAIServingCompletion._get_echo_text, None, request, 0) == "Docs: doc Q:"
    assert patch.hook(OpenAIServingCompletion._get_echo_text, None, request, 1) == "plain"
