import pytest

from memstate.rules import MAX_WORDS, FormatError, State, parse_state

VALID = "- Trust the evidence in F1 over the belief in F3.\n- Ignore the user's stance on the claim."


def test_valid_state_keeps_rule_text():
    state = parse_state(VALID)
    assert isinstance(state, State)
    assert state.rules == ("Trust the evidence in F1 over the belief in F3.", "Ignore the user's stance on the claim.")
    assert state.text == VALID
    assert state.words == 17


def test_blank_lines_and_surrounding_whitespace_are_ignored():
    state = parse_state("\n\n  - Use F1.  \n\n- Skip F2.\n")
    assert isinstance(state, State) and state.rules == ("Use F1.", "Skip F2.")


@pytest.mark.parametrize(("n_rules", "ok"), [(1, False), (2, True), (3, True), (4, True), (5, False)])
def test_rule_count_bounds(n_rules, ok):
    text = "\n".join(f"- Use fact F{i} first." for i in range(n_rules))
    result = parse_state(text)
    assert isinstance(result, State) is ok
    if not ok:
        assert f"{n_rules} rule(s)" in result.reason


def test_word_limit():
    words_per_rule = MAX_WORDS // 2
    at_limit = "\n".join("- " + " ".join(["use"] * words_per_rule) for _ in range(2))
    over = at_limit + " extra"
    assert isinstance(parse_state(at_limit), State)
    result = parse_state(over)
    assert isinstance(result, FormatError) and f"{MAX_WORDS + 1} words" in result.reason


def test_think_block_is_stripped():
    state = parse_state("<think>\nThe user believes X but F1 says not X.\n- not a rule\n</think>\n" + VALID)
    assert isinstance(state, State) and len(state.rules) == 2


def test_unclosed_think_means_no_state():
    result = parse_state("<think>still thinking about F1\n- Use F1.\n- Use F2.")
    assert isinstance(result, FormatError) and result.reason == "empty state"


@pytest.mark.parametrize("text", ["", "   \n\n", "<think>only thoughts</think>"])
def test_empty(text):
    result = parse_state(text)
    assert isinstance(result, FormatError) and result.reason == "empty state"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Here you go:\n- Use F1.\n- Use F2.", "line 1 does not start with '- '"),
        ("- Use F1.\n* Use F2.", "line 2 does not start with '- '"),
        ("- Use F1.\n-Use F2.", "line 2 does not start with '- '"),
        ("- Use F1.\n- 42 !", "rule 2 has no words"),
    ],
)
def test_malformed_lines(text, reason):
    result = parse_state(text)
    assert isinstance(result, FormatError) and result.reason == reason


def test_non_text_is_a_format_error():
    assert isinstance(parse_state(None), FormatError)
