"""Requests the TP server tests send (tests/scale_out/e2e/): a greedy /generate with its logprobs and the
reuse figures asked for, and the workload in turn from an empty cache with what rank 0's mepic totals grew by
(every rank plans alike: rank 0's are the server's)."""

import requests

from support.warm_alone import flush


def generate(server, ids, report, rid=None, timeout=120):
    """(output ids, their logprobs, the `report` fields of meta_info) of a 4-token greedy request."""
    body = {"input_ids": ids, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}
    if rid is not None:
        body["rid"] = rid
    r = requests.post(server.url + "/generate", timeout=timeout, json=body)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    return r.json()["output_ids"], [lp for lp, *_ in meta["output_token_logprobs"]], \
        {k: meta.get(k) for k in report}


def totals(server, keys) -> dict:
    state = requests.get(server.url + "/server_info", timeout=60).json()
    return {k: state["internal_states"][0]["mepic"][k] for k in keys}


def sequence(server, work, report, keys, timeout=120):
    """Each request in turn from an empty cache (so each meets what the ones before it left), and what the
    server's totals `keys` grew by."""
    flush(server.url)
    before = totals(server, keys)
    answers = [generate(server, ids, report, timeout=timeout) for ids in work]
    after = totals(server, keys)
    return answers, {k: after[k] - before[k] for k in keys}
