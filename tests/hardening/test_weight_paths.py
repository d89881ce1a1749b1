"""A weight update from disk names a model folder, or is refused before SGLang's loader runs (issue 85.6;
sglang_mepic/hardening/weight_paths.py). The unit half: the server's answer and the files it leaves are
in e2e/test_weight_paths_server.py."""

import asyncio
from types import SimpleNamespace

import pytest

from sglang_mepic.hardening.weight_paths import path_error
from sglang_mepic.patches.hardening import tokenizer_manager_update_weights_from_disk as guard


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_a_model_folder_is_taken(model):
    assert path_error(str(model)) is None


@pytest.mark.parametrize("name, said", [
    ("missing", "is not a folder"), ("a-file", "is not a folder"), ("no-config", "holds no config.json"),
    ("", "must name a model folder"), ("nul", "is not a folder"), ("hub-id", "is not a folder"),
])
def test_anything_else_is_refused_with_why(tmp_path, name, said):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "no-config").mkdir()
    path = {"missing": str(tmp_path / "missing"), "a-file": str(tmp_path / "a-file"),
            "no-config": str(tmp_path / "no-config"), "": "", "nul": str(tmp_path) + "\x00",
            "hub-id": "HuggingFaceTB/SmolLM2-135M"}[name]
    why = path_error(path)
    assert why is not None and said in why


def test_a_long_path_is_shown_cut():
    why = path_error("/x" * 5000)
    assert why is not None and len(why) < 400


def update(model_path: str):
    calls = []

    async def original(manager, obj, *args, **kwargs):
        calls.append(obj.model_path)
        return True, "Succeeded to update model weights.", 0

    result = asyncio.run(guard.hook(original, object(), SimpleNamespace(model_path=model_path), None))
    return result, calls


def test_the_hook_answers_a_bad_path_as_a_failed_update_without_calling_sglang(tmp_path):
    (success, message, paused), calls = update(str(tmp_path / "nowhere"))
    assert (success, paused, calls) == (False, 0, []) and "is not a folder" in message


def test_the_hook_hands_a_model_folder_to_sglang(model):
    assert update(str(model)) == ((True, "Succeeded to update model weights.", 0), [str(model)])
