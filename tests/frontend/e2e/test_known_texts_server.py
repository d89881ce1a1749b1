"""Registered documents found in prompts nobody marked (`--mepic-auto-chunk known`, POST /mepic/chunks):
on a real server, an unmarked prompt is the marked one, token for token and logprob for logprob, on
`/generate`, `/v1/completions` and `/v1/chat/completions`; tenants never see each other's texts; bad
registrations are a 400 and register nothing."""

import pytest
import requests

from sglang_mepic.lang import chunk
from sglang_mepic.process.server_process import ServerProcess
from support.auto_chunk import DOC_A, DOC_B, WORDS, chatted, cold, completed, generated
from support.chunk_api import post

DOC_C = " ".join(WORDS[400:480])
WORDS_D = " ".join(WORDS[600:680])


@pytest.fixture(scope="module")
def server(tiny_model):
    with ServerProcess(tiny_model, "--dtype", "float32", "--mepic-auto-chunk", "known") as s:
        yield s


def register(server, texts, expect=200, **fields):
    r = requests.post(server.url + "/mepic/chunks", json={"texts": texts, **fields}, timeout=120)
    assert r.status_code == expect, r.text
    return r.json()


def test_registered_documents_are_found_in_unmarked_prompts_as_if_marked(server, tok):
    first = register(server, [DOC_A, DOC_B])["texts"]
    assert [t["registered"] for t in first] == ["new", "new"] and [t["chunk"] for t in first] == ["absent"] * 2
    again = register(server, [DOC_A])["texts"]
    assert again == [{"index": 0, "registered": "known", "chunk": "device"}]  # warmed: stored on the device

    plain = "Use the documents.\n" + DOC_B + "\n\n" + DOC_A + "\nQuestion: what is os?"
    marked = "Use the documents.\n" + chunk(DOC_B) + "\n\n" + chunk(DOC_A) + "\nQuestion: what is os?"
    unmarked = cold(server, generated, plain)
    assert unmarked == cold(server, generated, marked) and len(unmarked["chunks"]) == 2
    start = len(tok.encode("Use the documents.\n"))
    assert unmarked["chunks"][0] == [start, start + len(tok.encode(DOC_B, add_special_tokens=False))]
    assert cold(server, completed, plain) == cold(server, completed, marked)

    def conversation(content):
        return [{"role": "system", "content": "Answer from the files."}, {"role": "user", "content": content}]

    chat = cold(server, chatted, conversation(plain))
    assert chat == cold(server, chatted, conversation(marked)) and len(chat["chunks"]) == 2
    # Warm (after register, the chunks are stored): reused, same answer as computed cold.
    register(server, [DOC_A, DOC_B])
    warm = post(server, "/generate", {"text": plain, "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                                          "ignore_eos": True}})
    assert warm["meta_info"]["mepic_residency"] == ["device", "device"]
    assert warm["output_ids"] == unmarked["ids"]


def test_a_text_registered_by_one_tenant_is_never_found_for_another(server):
    assert register(server, [DOC_C], cache_salt="tenant-a")["texts"][0]["registered"] == "new"
    prompt = "Read this:\n" + DOC_C + "\nWhat does it say?"
    other = post(server, "/generate", {"text": prompt, "cache_salt": "tenant-b",
                                       "sampling_params": {"max_new_tokens": 2}})
    assert other["meta_info"]["mepic_chunks"] == [] and other["meta_info"]["mepic_residency"] == []
    own = post(server, "/generate", {"text": prompt, "cache_salt": "tenant-a", "sampling_params": {"max_new_tokens": 2}})
    assert len(own["meta_info"]["mepic_chunks"]) == 1 and own["meta_info"]["mepic_residency"] == ["device"]
    # Tenant b registering the same text learns nothing of tenant a's: new to it, computed for it.
    assert register(server, [DOC_C], cache_salt="tenant-b")["texts"] == [
        {"index": 0, "registered": "new", "chunk": "absent"}]



def test_a_text_registered_with_an_empty_extra_key_is_found_where_sglang_keys_that_tenant(server):
    """SGLang reads an empty extra_key as none: a text registered with "" is the tenant's without one, found
    for its requests and already known to it (issue 72: one namespace rule for both processes)."""
    doc = " ".join(WORDS[480:560])
    assert register(server, [doc], extra_key="")["texts"][0]["registered"] == "new"
    prompt = "Read this:\n" + doc + "\nWhat does it say?"
    for fields in ({}, {"extra_key": ""}):
        out = post(server, "/generate", {"text": prompt, **fields, "sampling_params": {"max_new_tokens": 2}})
        assert len(out["meta_info"]["mepic_chunks"]) == 1 and out["meta_info"]["mepic_residency"] == ["device"]
    assert register(server, [doc])["texts"] == [{"index": 0, "registered": "known", "chunk": "device"}]
    other = post(server, "/generate", {"text": prompt, "extra_key": "t", "sampling_params": {"max_new_tokens": 2}})
    assert other["meta_info"]["mepic_chunks"] == []

BAD = [
    ({"texts": []}, "non-empty list"),
    ({"texts": "a document"}, "non-empty list"),
    ({"texts": [DOC_A, 5]}, "texts[1] is a int"),
    ({"texts": ["too short"]}, "at least 64"),
    ({"texts": ["   " * 40]}, "at least 64"),
    ({"texts": [DOC_A] * 257}, "more than the 256"),
    ({"texts": [chunk(DOC_A)]}, "chunk markup"),
    ({"texts": [DOC_A], "cache_salt": 3}, '"cache_salt" must be a string'),
    ({"texts": [DOC_A], "warm": "yes"}, '"warm" must be true or false'),
    ({"texts": [DOC_A], "tenant": "a"}, "unknown field"),
    ([DOC_A], "JSON object"),
]


@pytest.mark.parametrize("body, message", BAD, ids=[m for _, m in BAD])
def test_bad_registrations_are_a_400_and_register_nothing(server, body, message):
    salt = "bad-input"
    if isinstance(body, dict):
        body = {**body, "cache_salt": body.get("cache_salt", salt)}
    r = requests.post(server.url + "/mepic/chunks", json=body, timeout=60)
    assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
    if message.startswith("texts["):  # the text it is about, for a client to name (launch.warm names the file)
        assert r.json()["error"]["index"] == int(message[len("texts["):].split("]")[0]), r.text
    out = post(server, "/generate", {"text": "x\n" + DOC_A, "cache_salt": salt, "sampling_params": {"max_new_tokens": 1}})
    assert out["meta_info"]["mepic_chunks"] == []  # nothing of a refused request was registered


def test_without_the_flag_the_route_says_how_to_turn_it_on(tiny_server):
    r = requests.post(tiny_server.url + "/mepic/chunks", json={"texts": [DOC_A]}, timeout=60)
    assert r.status_code == 400 and "--mepic-auto-chunk known" in r.text
    out = post(tiny_server, "/generate", {"text": "x\n" + DOC_A, "sampling_params": {"max_new_tokens": 1}})
    assert out["meta_info"]["mepic_chunks"] == []


def test_the_warm_command_registers_a_folder_and_a_jsonl_file(server, tmp_path, capsys):
    import json

    from sglang_mepic.launch import warm

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(DOC_A)
    (tmp_path / "docs" / "b.md").write_text(DOC_B)
    (tmp_path / "docs" / "skip.bin").write_text("not a document")
    lines = tmp_path / "more.jsonl"
    lines.write_text(json.dumps({"text": DOC_C}) + "\n\n" + json.dumps({"text": WORDS_D}) + "\n")
    assert warm.main([str(tmp_path / "docs"), str(lines), "--url", server.url, "--cache-salt", "warm-cli"]) == 0
    out = capsys.readouterr().out
    assert "4 documents: 4 new, 0 known already; chunks 4 absent" in out, out
    assert warm.main([str(lines), "--url", server.url, "--cache-salt", "warm-cli"]) == 0
    assert "2 documents: 0 new, 2 known already; chunks 2 device" in capsys.readouterr().out
    (tmp_path / "short.txt").write_text("too short")
    assert warm.main([str(tmp_path / "short.txt"), "--url", server.url]) == 1
    err = capsys.readouterr().err
    assert "refused (400)" in err and "short.txt" in err and "at least 64" in err


# Issue 68: what a newcomer/attacker battery did with registered texts.


def test_a_prompt_too_long_for_the_context_is_refused_before_any_lookup(server):
    """Eight texts sharing one start, then a 2 M-character prompt of "a"s: the lookup took 7.2 s and 2.4 GB of
    the tokenizer process (every tenant stalled) before SGLang refused the prompt by its tokens."""
    register(server, ["a" * (100 + i) for i in range(8)], warm=False, cache_salt="flood")
    r = requests.post(server.url + "/generate", json={"text": "a" * 2_000_000, "cache_salt": "flood",
                                                      "sampling_params": {"max_new_tokens": 1}}, timeout=120)
    assert r.status_code == 400 and "characters" in r.text, r.text


def test_another_clients_registration_leaves_a_session_turn_served(server):
    """A session turn holding a text another client registered in the shared namespace was a 400 ("chunk
    markup cannot be used in a session"), though it marked nothing."""
    doc = " ".join(WORDS[800:880])
    register(server, [doc], warm=False)
    sid = requests.post(server.url + "/open_session", json={"capacity_of_str_len": 100_000}, timeout=60).json()
    out = post(server, "/generate", {"text": "Read:\n" + doc + "\nWhy?", "session_params": {"id": sid},
                                     "sampling_params": {"max_new_tokens": 2}})
    assert out["meta_info"]["mepic_chunks"] == []  # the plain prompt it was


def test_a_registration_never_turns_a_served_prompt_into_a_400(server, tok):
    """An unmarked prompt holding 8 registered texts fits the context (4,096 tokens) as plain text, not once each
    text is padded to whole pages (past the 4,089 slots this server takes): it was refused in the namespace that
    registered them, served in any other."""
    docs = [" ".join(WORDS[1000 + 300 * i:1240 + 300 * i]) for i in range(8)]
    register(server, docs, warm=False, cache_salt="fit")

    def filled(count):  # the documents and as many more words as keep `count` within 4,080 tokens
        prompt = "Use these.\n" + "\n".join(docs) + "\n"
        for word in WORDS[3800:]:
            if count(prompt + word) > 4_080:
                break
            prompt += word + " "
        assert 4_060 < count(prompt) <= 4_080
        return prompt

    prompt = filled(lambda text: len(tok.encode(text)))
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 1}}
    assert post(server, "/generate", {**body, "cache_salt": "other"})["meta_info"]["mepic_chunks"] == []
    out = post(server, "/generate", {**body, "cache_salt": "fit"})
    assert len(out["meta_info"]["mepic_chunks"]) < 8  # the last found texts stay prompt text
    # In chat the rendered prompt, laid out at the found texts, is checked the same way: served plain.
    content = filled(lambda text: len(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                              add_generation_prompt=True)["input_ids"]))
    chat = post(server, "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": content}],
                                                 "max_tokens": 1, "cache_salt": "fit"})
    assert chat["metadata"]["mepic"]["chunks"] == []


def test_a_text_too_long_for_the_context_is_refused_and_not_registered(server):
    """It was answered 400 "registered, but not warmed", and stayed registered: a 400 registers nothing."""
    long = " ".join(WORDS[:3000]) * 2
    r = requests.post(server.url + "/mepic/chunks", json={"texts": [DOC_A, long], "cache_salt": "long"}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["index"] == 1 and "registered" not in r.text, r.text
    r = requests.post(server.url + "/mepic/chunks", json={"texts": [long], "cache_salt": "long", "warm": False},
                      timeout=120)
    assert r.status_code == 400, r.text  # refused again, not "known"
    assert register(server, [DOC_A], warm=False, cache_salt="long")["texts"][0]["registered"] == "new"
