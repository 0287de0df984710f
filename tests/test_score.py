import math

import pytest

from memstate.reward.score import (
    choice_score,
    continuation_probability,
    f1_score,
    option_probability,
    parse_choice,
)


@pytest.mark.parametrize(
    ("solution", "truth", "expected"),
    [
        ("B", "B", 1.0),
        ("(b)", "B", 1.0),
        ("B. coffee", "B", 1.0),
        ("A", "B", 0.0),
        ("Coffee!", "B", 1.0),
        ("juice", "B", 0.0),
        ("", "B", 0.0),
    ],
)
def test_choice_score(solution, truth, expected):
    assert choice_score(solution, truth, ["tea", "coffee", "water"]) == expected


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("B.", "B"),
        ("(B) refuted", "B"),
        ("b", "B"),
        ("refuted", "B"),
        ("  (c)", "C"),
        ("Not enough info.", "C"),
        ("D", None),  # no option D
        ("the claim is refuted", None),
        ("", None),
    ],
)
def test_parse_choice(text, letter):
    labels = ["supported", "refuted", "not enough info"]
    assert parse_choice(text, labels) == letter
    assert choice_score(text, "B", labels) == float(letter == "B")  # the score reads the same parse


def test_choice_text_matching_two_options_is_not_credited():
    assert parse_choice("tea", ["tea", "Tea"]) is None
    assert choice_score("tea", "A", ["tea", "Tea"]) == 0.0


def test_f1_score():
    assert f1_score("The Eiffel Tower", "eiffel tower") == 1.0
    assert f1_score("Paris", "London") == 0.0
    assert f1_score("Paris France", "Paris") == pytest.approx(2 / 3)


def test_option_probability_is_renormalized_and_bounded():
    lps = [math.log(0.01), math.log(0.03), math.log(0.01)]
    assert option_probability(lps, 1) == pytest.approx(0.6)
    assert sum(option_probability(lps, i) for i in range(3)) == pytest.approx(1.0)
    # numerically stable for very negative log-probs
    assert option_probability([-1000.0, -1001.0], 0) == pytest.approx(1 / (1 + math.exp(-1)))


def test_continuation_probability_is_length_normalized():
    assert continuation_probability(3 * math.log(0.5), 3) == pytest.approx(0.5)
    assert continuation_probability(math.log(0.5), 1) == pytest.approx(0.5)
