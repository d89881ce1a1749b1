"""Workloads with a set reuse ratio (eval.lib.workloads.with_reuse), from the offline datasets."""

import importlib.util
from pathlib import Path

import pytest

# eval/ is run from the repository root and is not installed; the root is kept off sys.path
# in tests (its folders would become top-level import names), so the module is loaded by path.
_spec = importlib.util.spec_from_file_location(
    "eval_workloads", Path(__file__).resolve().parents[2] / "eval" / "lib" / "workloads.py")
workloads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workloads)
reuse_ratio, with_reuse = workloads.reuse_ratio, workloads.with_reuse


@pytest.mark.parametrize("dataset", ["squad", "hotpotqa"])
@pytest.mark.parametrize("reuse", [0.6, 0.85, 0.95])
def test_realised_reuse_is_near_the_target(dataset, reuse):
    reqs = with_reuse(dataset, 300, 6, reuse)
    assert len(reqs) == 300
    assert abs(reuse_ratio(reqs) - reuse) < 0.05
    assert all(len(r.docs) == len(set(r.docs)) == 6 for r in reqs)
    if dataset == "squad":  # the document that answers is among the chunks
        assert all(any(a in d for a in r.answers for d in r.docs) for r in reqs)


def test_more_reuse_means_fewer_distinct_documents_and_the_same_seed_the_same_requests():
    distinct = [len({d for r in with_reuse("hotpotqa", 200, 4, x) for d in r.docs}) for x in (0.3, 0.6, 0.9)]
    assert distinct[0] > distinct[1] > distinct[2]
    assert with_reuse("squad", 50, 4, 0.8, seed=3) == with_reuse("squad", 50, 4, 0.8, seed=3)


def test_impossible_shapes_are_refused_clearly():
    with pytest.raises(ValueError, match="reuse must be in"):
        with_reuse("squad", 10, 4, 1.0)
    with pytest.raises(ValueError, match="runs out of new documents"):
        with_reuse("squad", 1000, 16, 0.0)


def test_long_documents_group_consecutive_paragraphs_within_the_words_asked():
    paragraphs = ["w " * n for n in (200, 150, 100, 500, 90, 80, 300, 120, 40)]
    # 200+150 closes at 350; 100 is cut short by the 500 (over the most: left out, as the 100); 90+80 is cut
    # short by the 300, which closes alone; the 120+40 tail would take the 300 past the most: left out.
    assert workloads.long_documents(paragraphs, (300, 450)) == [[0, 1], [6]]
    assert workloads.long_documents(["w " * 100] * 9, (300, 450)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert workloads.long_documents(["w " * 100] * 7, (300, 450)) == [[0, 1, 2], [3, 4, 5, 6]]  # the tail joins


def test_the_long_prompt_workload_is_16_documents_of_400_to_600_tokens():
    """The paper's long-prompt case (issue 71): 16 documents of about 400-600 tokens, 8k-12k-token prompts."""
    from transformers import AutoTokenizer

    from sglang_mepic.launch import models

    tokenizer = AutoTokenizer.from_pretrained(str(models.build("smollm2-135m")))
    reqs = workloads.DATASETS["squad-long"](100, 16)
    docs = sorted({d for r in reqs for d in r.docs})
    tokens = [len(tokenizer(d)["input_ids"]) for d in docs]
    assert sum(400 <= t <= 600 for t in tokens) >= 0.8 * len(tokens) and min(tokens) >= 300, tokens
    prompts = [len(tokenizer(workloads.render(tokenizer, r))["input_ids"]) for r in reqs]
    assert all(len(r.docs) == 16 for r in reqs) and 7500 <= min(prompts) and max(prompts) <= 12000, prompts
    assert abs(reuse_ratio(reqs) - workloads.LONG_REUSE) < 0.05
