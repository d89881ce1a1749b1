"""A weight update from disk whose `model_path` is no model folder is a 400 that leaves no file behind
(issue 85.6; sglang_mepic/hardening/weight_paths.py). SGLang took any path that is not a folder for a Hub
id and left an empty lock file named after it in the temp folder, one per request: files at a client's will."""

import os
import tempfile
import uuid

import pytest
import requests


def update(server, model_path: str) -> requests.Response:
    return requests.post(server.url + "/update_weights_from_disk", json={"model_path": model_path}, timeout=300)


def left_behind(token: str) -> list[str]:
    """Files named after a path holding `token` where SGLang's loader puts its locks: its temp folder (the
    server has the tests' environment, TMPDIR included)."""
    return [name for name in os.listdir(tempfile.gettempdir()) if token in name]


@pytest.mark.parametrize("case, said", [
    ("absolute", "is not a folder"), ("name", "is not a folder"), ("hub-id", "is not a folder"),
    ("dots", "is not a folder"), ("a-file", "is not a folder"), ("no-config", "holds no config.json"),
])
def test_a_model_path_that_is_no_model_folder_is_a_400_and_leaves_no_file(tiny_server, tmp_path, case, said):
    token = f"mepic-{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{token}.safetensors").write_text("x")
    (tmp_path / token).mkdir()
    path = {"absolute": f"/nonexistent/{token}", "name": token, "hub-id": f"someone/{token}",
            "dots": f"../../tmp/{token}", "a-file": str(tmp_path / f"{token}.safetensors"),
            "no-config": str(tmp_path / token)}[case]
    r = update(tiny_server, path)
    assert left_behind(token) == []
    assert r.status_code == 400, r.text
    assert r.json()["success"] is False and said in r.json()["message"], r.text


def test_a_model_folder_still_updates_the_weights(tiny_server):
    before = requests.post(tiny_server.url + "/generate", timeout=120, json={
        "text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).json()["output_ids"]
    r = update(tiny_server, tiny_server.model_path)  # the same weights again
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    after = requests.post(tiny_server.url + "/generate", timeout=120, json={
        "text": "Hello", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).json()["output_ids"]
    assert after == before
