"""eval.experiments.scheduler_profile's reading of a py-spy raw profile: which samples are idle, forward, outside the forward."""

from eval.experiments import scheduler_profile as profile  # the eval package is registered by conftest.py

Split, classify, parse_raw, report, verdict = (profile.Split, profile.classify, profile.parse_raw, profile.report,
                                               profile.verdict)

SITE = "/venv/lib/python3.11/site-packages/sglang/srt"
LOOP = (f"run_scheduler_process ({SITE}/managers/scheduler.py:6368);"
        f"Scheduler.event_loop_overlap ({SITE}/managers/scheduler.py:2109)")
FORWARD = (f"Scheduler.run_batch ({SITE}/managers/scheduler.py:4704);"
           f"ModelRunner.forward ({SITE}/model_executor/model_runner.py:1860);"
           f"EagerRunner.execute ({SITE}/model_executor/runner/eager_runner.py:222)")
EXTEND = f"EagerRunner._execute_extend ({SITE}/model_executor/runner/eager_runner.py:250)"
DECODE = f"EagerRunner._execute_decode ({SITE}/model_executor/runner/eager_runner.py:268)"
NEXT = f"Scheduler.get_next_batch_to_run ({SITE}/managers/scheduler.py:3000)"
HOOK = "hook (/repo/sglang_mepic/patches/scheduler/scheduler_get_new_batch_prefill.py:40)"
MATCH = "MepicRadixCache.match_prefix (/repo/sglang_mepic/cache/radix_cache.py:120)"

RAW = "\n".join([
    f"{LOOP};{FORWARD};{EXTEND} 50",
    f"{LOOP};{FORWARD};{DECODE} 30",
    f"{LOOP};{NEXT};{HOOK};{MATCH};{MATCH} 12",  # recursion counts the function once
    f"{LOOP};{NEXT} 8",
    f"{LOOP};Scheduler.on_idle ({SITE}/managers/scheduler.py:5241);Poller.poll (/venv/zmq/sugar/poll.py:106) 400",
    "Thread._bootstrap (/py/threading.py:1002);WatchdogRaw._watchdog_thread "
    f"({SITE}/utils/watchdog.py:127) 500",
    "",
])


def test_classify_splits_main_thread_samples():
    split = classify(parse_raw(RAW))
    assert (split.other_threads, split.idle, split.prefill, split.decode, split.outside) == (500, 400, 50, 30, 20)
    assert split.busy == 100 and split.share(split.outside) == 0.2
    by_name = {f.function: n for f, n in split.outside_functions.items()}
    assert by_name == {"Scheduler.get_next_batch_to_run": 20, "hook": 12, "MepicRadixCache.match_prefix": 12}
    assert split.mepic_folders == {"/repo/sglang_mepic": 12}  # the hook and the cache: one folder, once a sample
    assert {f.function: n for f, n in split.own.items()} == {"MepicRadixCache.match_prefix": 12}


def test_report_marks_project_code_and_verdict_compares_shares():
    split = classify(parse_raw(RAW))
    text = "\n".join(report("mepic", split, top=5))
    assert "[mepic] MepicRadixCache.match_prefix  (sglang_mepic/cache/radix_cache.py)" in text
    assert "this project's own code outside the forward: 12.0% of busy samples" in text
    assert " 12.0% / 12.0%  MepicRadixCache.match_prefix" in text and " 12.0% /  0.0%  hook" in text
    assert "Scheduler.get_next_batch_to_run  (sglang/srt/managers/scheduler.py)" in text
    vanilla = Split(prefill=90, outside=10)
    pair = profile.labels(["vanilla", "mepic"])
    assert verdict(pair, {"vanilla": vanilla, "mepic": split})[-1].endswith("median 2.00x (target <= 1.2x: missed)")
    assert verdict(pair, {"vanilla": vanilla, "mepic": Split(prefill=89, outside=11)})[-1].endswith("(target <= 1.2x: met)")


def test_repeated_systems_are_paired_and_the_verdict_takes_their_median():
    runs = profile.labels(["vanilla", "mepic", "vanilla", "mepic", "vanilla", "mepic"])
    assert [label for label, _ in runs] == ["vanilla", "mepic", "vanilla#2", "mepic#2", "vanilla#3", "mepic#3"]
    splits = {"vanilla": Split(prefill=90, outside=10), "mepic": Split(prefill=80, outside=20),      # 2.00x
              "vanilla#2": Split(prefill=80, outside=20), "mepic#2": Split(prefill=80, outside=20),  # 1.00x
              "vanilla#3": Split(prefill=90, outside=10), "mepic#3": Split(prefill=88, outside=12)}  # 1.20x
    lines = verdict(runs, splits)
    assert lines[0].endswith("= 2.00x") and lines[1].endswith("= 1.00x") and lines[2].endswith("= 1.20x")
    assert lines[-1] == ("outside-forward share, mepic / vanilla: median 1.20x (range 1.00-2.00 over 3 pairs) "
                         "(target <= 1.2x: met)")
    pooled = profile.pooled(runs, splits)
    assert list(pooled) == ["vanilla", "mepic"] and pooled["vanilla"].outside == 40 and pooled["mepic"].busy == 300
