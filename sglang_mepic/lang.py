"""Chunk markup for SGLang frontend programs.

    import sglang as sgl
    from sglang_mepic.lang import chunk

    @sgl.function
    def rag(s, docs, question):
        s += "Answer from the documents.\\n"
        for doc in docs:
            s += chunk(doc)
        s += "Question: " + question + "\\nAnswer:" + sgl.gen("answer", max_tokens=32)
"""

from sglang_mepic.frontend.markup import CHUNK_CLOSE, CHUNK_OPEN, MarkupError, has_text_markup


def chunk(text: str) -> str:
    """Mark `text` as a reusable chunk: its KV is shared wherever it appears."""
    if not isinstance(text, str) or not text:
        raise MarkupError("chunk() needs a non-empty string")
    if has_text_markup(text):
        raise MarkupError("chunk() text must not itself contain chunk markers")
    return f"{CHUNK_OPEN}{text}{CHUNK_CLOSE}"
