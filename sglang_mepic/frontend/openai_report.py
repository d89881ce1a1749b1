"""MEPIC figures in OpenAI-compatible responses (`/v1/chat/completions`, `/v1/completions`).

They go under the response's `metadata` (a free-form object SGLang already
returns; OpenAI clients keep unknown fields aside), as `metadata["mepic"]`:

    {"recomputed_tokens": int, "compiled_tokens": int, "chunk_hits": int, "chunk_misses": int,
     "residency": [str, ...], "chunks": [[start, end], ...]}

summed over the request's prompts (each prompt once, however many choices `n`
asks for); `chunks` (each prompt's chunk spans, response_report.py) and
`residency` are joined in prompt order. They come from `meta_info`, which carries every figure for every
request (`complete`): a request without chunk work (no chunk longer than a page,
a server in `full` mode or without the mepic cache) reports zero compiled
tokens, hits and misses and an empty residency, and as recomputed tokens those
it computed in context, as a chunked request does.
"""

from typing import Any, TypeVar

from sglang_mepic.wire.report import CHUNKS, COUNTS, key

R = TypeVar("R")


def complete(meta_info: dict[str, Any]) -> None:
    """Give `meta_info` every `mepic_*` figure: the scheduler reports only those of chunk work,
    and a client should not have to tell "no chunk work" from "not reported"."""
    if key("recomputed_tokens") not in meta_info:
        # Not zero: the figure counts tokens computed in context (docs/design.md, Reports), and
        # without chunk work that is every prompt token the prefix cache did not hold. Zero would
        # also tell eval.experiments.run and eval.experiments.fidelity that `full` and vanilla SGLang computed nothing.
        computed = _count(meta_info.get("prompt_tokens")) - _count(meta_info.get("cached_tokens"))
        meta_info[key("recomputed_tokens")] = max(0, computed)
    for name in COUNTS:
        meta_info.setdefault(key(name), 0)
    meta_info.setdefault(key("residency"), [])
    meta_info.setdefault(CHUNKS, [])


def _count(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) else 0


def summed(responses: list[dict[str, Any]], n_choices: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {name: 0 for name in COUNTS}
    out["residency"], out["chunks"] = [], []
    for response in responses[::max(n_choices, 1)]:
        meta = response.get("meta_info") or {}
        for name in COUNTS:
            out[name] += _count(meta.get(key(name), 0))
        out["residency"] += list(meta.get(key("residency")) or [])
        out["chunks"] += list(meta.get(CHUNKS) or [])
    return out


def attach(response: R, responses: list[dict[str, Any]], n_choices: int = 1) -> R:
    """Add the figures to a built response model; anything else (an error response) passes as it is."""
    if hasattr(response, "metadata") and hasattr(response, "usage"):
        response.metadata = {**(response.metadata or {}), "mepic": summed(responses, n_choices)}
    return response
