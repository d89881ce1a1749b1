"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/frontend/test_auto_chunk.py."""

import os

import requests

from support.chunk_api import post


# --- On a server: the three forms of one prompt are one request to the model. ---

WORDS = open(os.__file__).read().split()


DOC_A = " ".join(WORDS[:70])       # several pages each


DOC_B = " ".join(WORDS[200:290])


GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def cold(server, ask, prompt):
    """`ask(server, prompt)` on an empty cache: two forms of one prompt then run the very same computation,
    so even their float32 logprobs must be equal."""
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    return ask(server, prompt)


def generated(server, text):
    out = post(server, "/generate", {"text": text, "sampling_params": GREEDY, "return_logprob": True,
                                     "top_logprobs_num": 2})
    meta = out["meta_info"]
    return {"ids": out["output_ids"], "logprobs": meta["output_token_logprobs"],
            "top": meta["output_top_logprobs"], "prompt_tokens": meta["prompt_tokens"], "chunks": meta["mepic_chunks"]}


def completed(server, prompt, **extra):
    out = post(server, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0,
                                           "logprobs": 2, **extra})
    choice = out["choices"][0]
    return {"text": choice["text"], "logprobs": choice["logprobs"], "prompt_tokens": out["usage"]["prompt_tokens"],
            "chunks": out["metadata"]["mepic"]["chunks"]}


def chatted(server, messages):
    out = post(server, "/v1/chat/completions", {"model": "tiny", "messages": messages, "max_tokens": 6,
                                                "temperature": 0, "logprobs": True, "top_logprobs": 2})
    choice = out["choices"][0]
    return {"text": choice["message"]["content"], "logprobs": choice["logprobs"],
            "prompt_tokens": out["usage"]["prompt_tokens"], "chunks": out["metadata"]["mepic"]["chunks"]}


SEP = " # # "
