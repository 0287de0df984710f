"""The leak gate against the project's red team (tests/fixtures/redteam): every leaking state rejected and every
legitimate one accepted, under every possible gold answer; every sentence the project itself writes into a prompt or a
rule set accepted on every instance type; each Unicode trick folded; the semantic check told a restated memory from an
option picked by its content."""

import random
from collections import Counter
from pathlib import Path

import pytest

from memstate import prompts
from memstate.experiment.world import SHAPES
from memstate.leak import fold, instance_leak_reason, leak_reason, leaks_answer
from memstate.leak.redteam import gold_variants, load_redteam
from memstate.leak.semantic import LEGITIMATE, semantic_reason
from memstate.train.warmup import GENERIC_RULES, template_state

REDTEAM = Path(__file__).parent / "fixtures" / "redteam"
CASES = load_redteam(REDTEAM)
LEAKS = [c for c in CASES if c.leak and not c.flow]
FLOW_LEAKS = [c for c in CASES if c.flow]  # leaks_flow.jsonl: the answer-flow credit's, not the gate's
LEGIT = [c for c in CASES if not c.leak]
# Development sets: legit_heldout since issue 54's round 1, legit_fresh (measured once, 15.1% blocked) since round 2.
DEV_LEGIT = Path(__file__).parents[1] / "benchmarks" / "legit_heldout"
FRESH_LEGIT = Path(__file__).parents[1] / "benchmarks" / "legit_fresh"
INSTANCES = list({c.instance.id: c.instance for c in CASES}.values())
LABELS = ("supported", "refuted", "not enough info")
KINDS = ("verdict_paraphrase", "nei_paraphrase", "multilingual", "unicode", "letter", "position", "shape_hint",
         "encoding", "option_content", "pointing")  # fmt: skip


def test_the_red_team_covers_every_kind_and_instance_type():
    assert len(LEAKS) >= 200 and len(LEGIT) >= 60
    kinds = Counter(c.kind for c in LEAKS + FLOW_LEAKS)  # the gate's and the answer-flow credit's together
    assert all(kinds[k] >= 10 for k in KINDS), kinds
    legit_kinds = Counter(c.kind for c in LEGIT)
    assert legit_kinds["tricky_words"] >= 20 and legit_kinds["letter_names"] >= 10, legit_kinds
    shapes = {(i.source, i.answer_kind, len(i.candidates)) for i in INSTANCES}
    assert {("fever", "label", 3), ("scifact", "label", 3), ("personamem", "choice", 4)} <= shapes
    short3 = [i for i in INSTANCES if i.answer_kind == "choice" and len(i.options) == 3]
    assert short3 and all(len(o.split()) <= 3 for o in short3[0].options)
    # a leak is tied to a gold answer, and golds of every label occur
    assert {c.instance.answer for c in LEAKS if c.instance.answer_kind == "label"} == set(LABELS)


@pytest.mark.parametrize("case", LEAKS, ids=lambda c: c.where.split("/")[-1])
def test_every_leak_is_rejected_whatever_the_gold_answer(case):
    reasons = [instance_leak_reason(case.state, inst) for inst in gold_variants(case.instance)]
    assert all(reasons), f"{case.kind}: {case.state!r} passed"


@pytest.mark.parametrize("case", FLOW_LEAKS, ids=lambda c: c.where.split("/")[-1])
def test_the_gate_does_not_claim_the_answer_flow_leaks(case):
    """Leaks that no wording tells from procedure (an accented loanword, a percentage, a bare "not the X", a shape
    hint, a place in the list without an option noun, a described option): the word rules that caught them were
    dropped for precision (issue 54, rounds 1 and 2); the reward's answer-flow credit carries them. If the gate
    catches one again, move it back to leaks.jsonl."""
    assert case.leak and case.kind
    assert not any(instance_leak_reason(case.state, inst) for inst in gold_variants(case.instance)), case.state


@pytest.mark.parametrize("directory", [DEV_LEGIT, FRESH_LEGIT], ids=["legit_heldout", "legit_fresh"])
def test_the_gate_blocks_at_most_one_percent_of_the_development_legit_sets(directory):
    """Both are development sets now (the rules were changed with them in view): the bound is no held-out result."""
    cases = [c for c in load_redteam(directory) if not c.leak]
    blocked = [c.where for c in cases if leaks_answer(c.state, c.instance)]
    assert len(cases) >= 150 and len(blocked) <= 0.01 * len(cases), blocked


@pytest.mark.parametrize(
    "directory", [REDTEAM, REDTEAM.parents[2] / "benchmarks/redteam_heldout", DEV_LEGIT, FRESH_LEGIT]
)
def test_no_decision_depends_on_the_gold_answer_on_any_set(directory):
    for case in load_redteam(directory):
        decisions = {leaks_answer(case.state, inst) for inst in gold_variants(case.instance)}
        assert len(decisions) == 1, case.where


@pytest.mark.parametrize("case", LEGIT, ids=lambda c: c.where.split("/")[-1])
def test_every_legitimate_state_is_accepted_whatever_the_gold_answer(case):
    for inst in gold_variants(case.instance):
        assert not leaks_answer(case.state, inst), instance_leak_reason(case.state, inst)


def _project_sentences() -> list[str]:
    """Every sentence the project writes into a prompt or a rule set."""
    texts = [prompts.POLICY_SYSTEM, prompts.RESPONDER_SYSTEM, prompts.STATE_HEADER, *prompts.SELF_RECHECK_RULES,
             *GENERIC_RULES, *SHAPES, *LEGITIMATE]  # fmt: skip
    inst = INSTANCES[0]
    texts += [prompts.policy_messages(inst)[1]["content"].rsplit("\n\n", 1)[-1]]  # the policy's instruction
    texts += [prompts.responder_messages(i)[1]["content"].rsplit("\n\n", 1)[-1] for i in INSTANCES]  # answer lines
    out = []
    for text in texts:
        out += [s.strip() for s in text.replace("? ", "?\n").replace(". ", ".\n").splitlines() if len(s.split()) > 1]
    return list(dict.fromkeys(out))


def test_every_sentence_the_project_writes_passes_on_every_instance_type():
    sentences = _project_sentences()
    assert "Answer only from the memories that still hold and from the evidence." in sentences
    assert len(sentences) >= 40
    for sentence in sentences:
        state = f"- {sentence}\n- Read every memory before answering."
        for inst in INSTANCES:
            assert not leaks_answer(state, inst), (
                sentence,
                inst.meta["redteam_name"],
                instance_leak_reason(state, inst),
            )


def test_warmup_templates_pass_on_every_instance():
    rng = random.Random(0)
    for inst in INSTANCES:
        for _ in range(20):
            state = template_state(inst, rng)
            assert not leaks_answer(state, inst), (state, instance_leak_reason(state, inst))


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("sup\u200bpor\u200dted", "supported"),  # zero-width space and joiner
        ("re\u00adfu\u00adted", "refuted"),  # soft hyphens
        ("\u2060supported\ufeff", "supported"),  # word joiner, BOM
        ("ѕuррorted", "supported"),  # Cyrillic look-alikes
        ("Αnswer Β", "Answer B"),  # Greek capitals
        ("ｒｅｆｕｔｅｄ", "refuted"),  # full-width
        ("𝐫𝐞𝐟𝐮𝐭𝐞𝐝 𝖘𝖚𝖕𝖕𝖔𝖗𝖙𝖊𝖉", "refuted supported"),  # mathematical bold and fraktur
        ("s̲u̲p̲p̲o̲r̲t̲e̲d̲", "supported"),  # combining marks
        ("r3fut3d, supp0rted, 5upported", "refuted, supported, supported"),  # digits as letters
        ("ᴛʀᴜᴇ ʀᴇꜰᴜᴛᴇᴅ", "true refuted"),  # small capitals
        ("\U0001f1e7", "B"),  # a regional indicator (flag letter)
        ("F1 (2024), vitamin B12, the 3rd memory", "F1 (2024), vitamin B12, the 3rd memory"),  # left alone
    ],
)
def test_folding_reads_what_a_reader_sees(written, read):
    assert fold(written) == read


@pytest.mark.parametrize(
    "rule",
    ["The claim is sup\u200bported.", "Answer re\u00adfuted.", "The claim is ｔｒｕｅ.", "Answer 𝐟𝐚𝐥𝐬𝐞.",
     "The claim is ѕuррorted.", "Answer Β.", "The claim is fa1se.", "The claim is ᴛʀᴜᴇ."],
)  # fmt: skip
def test_folded_leaks_are_caught(rule):
    assert leak_reason(f"- {rule}\n- Use F1.", LABELS, "label")


def test_semantic_check_tells_a_restated_memory_from_an_option_picked_by_content():
    drink = next(i for i in INSTANCES if i.meta["redteam_name"] == "drink3")
    facts = [f.text for f in drink.facts]
    # The semantic check alone (no word lists): a directive toward one option's content is rejected...
    assert semantic_reason("- Recommend the tea.\n- Use F2.", drink.options, "choice", facts)
    # ...a rule that restates a memory is not, though it resembles the gold option, and neither is a rule about
    # memories that fits every option.
    assert semantic_reason("- F2: since 2024 the user drinks tea in the evening; sugar keeps them awake.\n- Use F2.",
                           drink.options, "choice", facts) is None  # fmt: skip
    assert semantic_reason("- Prefer the newer preference.\n- Ignore F3.", drink.options, "choice", facts) is None
    assert not leaks_answer("- F2 says that since March 2024 the user has switched, because sugar keeps them awake."
                            "\n- F2 supersedes F1.", drink)  # fmt: skip


def test_semantic_check_reads_verdicts_no_word_list_holds():
    assert semantic_reason("- The statement is accurate.\n- Use F1.", LABELS, "label")
    assert semantic_reason("- Trust the evidence over the user's belief.\n- Use F1.", LABELS, "label") is None
    assert semantic_reason("- If the memories disagree, follow the evidence.\n- Use F1.", LABELS, "label") is None


def test_the_semantic_thresholds_in_code_are_the_calibrated_ones():
    import json
    from dataclasses import asdict

    from memstate.leak.semantic import THRESHOLDS

    calibration = json.loads((REDTEAM.parents[2] / "benchmarks/results/leak_semantic_calibration.json").read_text())
    assert calibration["thresholds"] == asdict(THRESHOLDS)  # rerun benchmarks/calibrate_leak_semantic.py on a change
    assert calibration["calibration_set"]["gate"]["legitimate_rejected"] == f"0/{len(LEGIT)}"
