"""hardening/profile_guard: what a profile start is checked for, and what abandoning one leaves."""

from types import SimpleNamespace

import pytest

from sglang_mepic.hardening import profile_guard


def start(**fields):
    base = {"output_dir": None, "activities": None, "num_steps": None, "start_step": None}
    return SimpleNamespace(**{**base, **fields})


def test_a_writable_folder_is_made_and_left_empty(tmp_path):
    folder = tmp_path / "a" / "b"
    profile_guard.check_start(start(output_dir=str(folder), activities=["CPU"], num_steps=3))
    assert folder.is_dir() and list(folder.iterdir()) == []


@pytest.mark.parametrize("fields, said", [
    ({"output_dir": "/proc/no/such/dir"}, "traces cannot be written there"),
    ({"activities": ["NOPE"]}, "activities ['NOPE']"),
    ({"activities": "CPU"}, "a non-empty list"),
    ({"num_steps": -1}, "num_steps -1"),
    ({"start_step": True}, "start_step True"),
    ({"output_dir": ""}, "output_dir: a folder path"),
])
def test_a_start_that_cannot_work_is_refused(fields, said):
    with pytest.raises(profile_guard.ProfileRefused, match=None) as refused:
        profile_guard.check_start(start(**fields))
    assert said in str(refused.value) and refused.value.status_code == 400


def test_a_file_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(profile_guard.ProfileRefused, match="traces cannot be written"):
        profile_guard.check_start(start(output_dir=str(tmp_path / "f")))


def test_abandon_leaves_no_profile_and_no_step_behind():
    stopped = []
    manager = SimpleNamespace(torch_profiler=SimpleNamespace(stop=lambda: stopped.append(1)),
                              profile_in_progress=True, profile_by_stage=True, profiler_start_forward_ct=3,
                              profiler_target_forward_ct=5, profiler_target_prefill_ct=1,
                              profiler_target_decode_ct=1)
    profile_guard.abandon(manager, FileNotFoundError("no such dir"))
    assert stopped == [1] and manager.torch_profiler is None and not manager.profile_in_progress
    assert manager.profiler_target_forward_ct is None and manager.profiler_start_forward_ct is None
