"""eval.lib.scoring: SQuAD's answer normalisation, F1, exact match and containment."""

import pytest

from eval.lib.scoring import contains, exact_match, f1, normalize  # the eval package is registered by conftest.py


def test_normalize_drops_case_punctuation_and_articles():
    assert normalize("The  Eiffel Tower, in Paris!") == ["eiffel", "tower", "in", "paris"]
    assert normalize("an apple a day") == ["apple", "day"]


@pytest.mark.parametrize("prediction, golds, expected", [
    ("Gustave Eiffel", ["Gustave Eiffel"], 1.0),
    ("the engineer Gustave Eiffel", ["Gustave Eiffel", "Eiffel"], 2 * (2 / 3) * 1 / (2 / 3 + 1)),  # best gold
    ("Paris", ["Gustave Eiffel"], 0.0),
    ("", ["the"], 1.0),  # both empty after normalisation
    ("", ["Paris"], 0.0),
])
def test_f1_is_the_best_over_the_golds(prediction, golds, expected):
    assert f1(prediction, golds) == pytest.approx(expected)


def test_exact_match_and_contains():
    assert exact_match("The Eiffel Tower.", ["eiffel tower"]) == 1.0
    assert exact_match("Eiffel Tower in Paris", ["eiffel tower"]) == 0.0
    assert contains("It is the Eiffel Tower in Paris", ["eiffel tower"]) == 1.0
    assert contains("Eiffelish towers", ["eiffel tower"]) == 0.0  # whole words only
    assert contains("anything", ["the"]) == 0.0  # a gold that normalises to nothing is never contained
