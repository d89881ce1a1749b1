"""Review: the markup the server puts into chat messages (separator, auto-chunking) is the only
markup the server reads back from the rendered prompt.

chat_markup.process renders the messages with the server's markup in them and then re-splits
the whole rendered prompt at every marker. A chat template also renders what is not a message
content (Llama 3.1's and Qwen2.5's render the tool definitions and tool-call arguments), so a
marker a client wrote there was read as markup: under `--mepic-text-markup off`, where a
client's markers are text, the client's literal `<|chunk|>...<|/chunk|>` became a chunk (and
lost its text) whenever another message was long enough to be auto-chunked, and an unbalanced
one turned into a 400. The fake template below renders the tools as such templates do.
"""

import json
from types import SimpleNamespace

import pytest
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

from sglang_mepic import config
from sglang_mepic.frontend import chat_markup
from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID, MarkupError

SEP = " # # "
TOOL_TEXT = "pass <|chunk|>x<|/chunk|> to it literally"


def _serving(tok):
    # The limits the fit check reads (chat_markup._fits): a context far above these prompts.
    return SimpleNamespace(tokenizer_manager=SimpleNamespace(
        tokenizer=tok, server_args=SimpleNamespace(page_size=16), context_len=8192,
        model_config=SimpleNamespace(vocab_size=len(tok))))


def _render(serving, request):
    """A chat template that renders the tool definitions, then the messages."""
    text = "".join(f"Tools: {json.dumps(t.function.description)}\n" for t in request.tools or [])
    text += "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in request.messages)
    return SimpleNamespace(prompt_ids=serving.tokenizer_manager.tokenizer.encode(text, add_special_tokens=False))


def _request(doc: str, description: str = TOOL_TEXT) -> ChatCompletionRequest:
    return ChatCompletionRequest(model="m", messages=[
        {"role": "system", "content": doc},
        {"role": "user", "content": "What does it say?"},
    ], tools=[{"type": "function", "function": {"name": "f", "description": description}}])


def test_auto_chunking_does_not_read_a_clients_markers_outside_the_contents(tok, env):
    env(auto_chunk="messages", text_markup="off")
    serving = _serving(tok)
    out = chat_markup.process(_render, serving, _request("word " * 80))
    rendered = tok.decode([t for t in out.prompt_ids if t >= 0])
    assert "<|chunk|>x<|/chunk|>" in rendered, rendered  # the client's markers are text here
    # An unbalanced marker there is text too, not a 400.
    chat_markup.process(_render, serving, _request("word " * 80, description="a lone <|chunk|> marker"))


def test_auto_chunking_still_marks_when_nothing_else_holds_markers(tok, env):
    env(auto_chunk="messages", text_markup="off")
    out = chat_markup.process(_render, _serving(tok), _request("word " * 80, description="no markers"))
    assert out.prompt_ids.count(CHUNK_BEGIN_ID) == 1


def test_separator_next_to_markers_outside_the_contents_is_refused(tok, env):
    env(separator=SEP, text_markup="off")
    with pytest.raises(MarkupError):
        chat_markup.process(_render, _serving(tok), _request(f"sys{SEP}doc{SEP}q"))
    out = chat_markup.process(_render, _serving(tok), _request(f"sys{SEP}doc{SEP}q", description="no markers"))
    assert out.prompt_ids.count(CHUNK_BEGIN_ID) == 1
