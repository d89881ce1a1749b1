"""launch_cluster's settings, without starting anything."""

import os

import pytest

from sglang_mepic.launch.cluster import Cluster, share_of_cores


def test_each_instance_gets_an_equal_share_of_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    assert share_of_cores(1) == cores
    assert share_of_cores(2) == max(1, cores // 2)
    assert share_of_cores(cores * 4) == 1
    assert Cluster("m", instances=2, storage="none").threads == max(1, cores // 2)
    assert Cluster("m", instances=2, storage="none", threads=3).threads == 3


def test_a_thread_count_the_user_set_is_left_alone(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert share_of_cores(2) is None
    assert Cluster("m", instances=2, storage="none").threads is None


@pytest.mark.parametrize("kwargs, message", [
    ({"instances": 0}, "--instances"),
    ({"threads": 0}, "--threads-per-instance"),
    ({"storage": "file"}, "--storage-dir"),
    ({"policy": "nearest"}, "--policy nearest"),
])
def test_bad_settings_are_refused_before_anything_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Cluster("m", **{"storage": "none", **kwargs})
