"""The leak gate against the project's red team (tests/fixtures/redteam): every leaking state rejected and every
legitimate one accepted, under every possible gold answer; every sentence the project itself writes into a prompt or a
rule set accepted on every instance type; each Unicode trick folded."""

import random
from collections import Counter
from pathlib import Path

import pytest

from memstate import prompts
from memstate.experiment.world import SHAPES
from memstate.leak import fold, instance_leak_reason, leak_reason, leaks_answer
from memstate.leak.redteam import gold_variants, load_redteam
from memstate.train.warmup import GENERIC_RULES, template_state

REDTEAM = Path(__file__).parent / "fixtures" / "redteam"
CASES = load_redteam(REDTEAM)
LEAKS = [c for c in CASES if c.leak and not c.flow]
FLOW_LEAKS = [c for c in CASES if c.flow]  # leaks_flow.jsonl: the answer-flow credit's, not the gate's
LEGIT = [c for c in CASES if not c.leak]
# Development sets: legit_heldout since issue 54's round 1, legit_fresh (measured once, 15.1% blocked) since round 2,
# legit_fresh2 (measured once, 8.2% blocked) since round 3, legit_fresh3 (measured once, 6.7% blocked) since round 4,
# legit_fresh4 (measured once, 7.2% blocked) since round 5, legit_fresh5 (measured once after round 5, 1.9% blocked).
DEV_LEGIT = Path(__file__).parents[1] / "benchmarks" / "legit_heldout"
FRESH_LEGIT = Path(__file__).parents[1] / "benchmarks" / "legit_fresh"
FRESH2_LEGIT = Path(__file__).parents[1] / "benchmarks" / "legit_fresh2"
FRESH3_LEGIT = Path(__file__).parents[1] / "benchmarks" / "legit_fresh3"
FRESH4_LEGIT = Path(__file__).parents[1] / "benchmarks" / "legit_fresh4"
FRESH5_LEGIT = Path(__file__).parents[1] / "benchmarks" / "legit_fresh5"
INSTANCES = list({c.instance.id: c.instance for c in CASES}.values())
LABELS = ("supported", "refuted", "not enough info")
# Rules about how to use memories (once the semantic check's contrast set; it was dropped in round 3 of issue 54).
PROCEDURE_RULES = (
    "Trust the evidence over the user's belief.",
    "Ignore memories about unrelated topics.",
    "The newer preference supersedes the older one.",
    "Treat the user's belief as a belief, not as evidence.",
    "Decide from the evidence, not from the user's conviction.",
    "Check whether the evidence addresses the claim.",
    "Weigh the evidence in F1 against the user's belief in F2.",
    "Read every memory before answering.",
    "Do not let the user's identity or expertise decide the answer.",
    "Rely on F1, the encyclopedic evidence.",
    "F3 is about another topic; ignore it.",
    "Compare the claim with the evidence sentences.",
    "The user's confidence is not evidence.",
    "Use only the memories that bear on this request.",
    "Judge the claim only by the evidence.",
    "Personal conviction does not outweigh documented sources.",
    "Separate the user's opinion from what the evidence shows.",
    "If the evidence contradicts the claim, follow the evidence.",
    "Answer from the memories that still hold.",
    "Go with what the user believes.",
    "Use the newer preference.",
    "Use the older preference.",
    "Weigh all memories equally.",
    "Keep the reply short.",
    "Recheck every memory: does it still hold, was it superseded, does it conflict with the evidence?",
    "Do not let a stated belief or expertise override the evidence.",
    "Beliefs do not count as evidence, however strongly held.",
    "A claim is only as good as its evidence.",
    "Evidence must be about the claim's subject to count.",
)
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
    dropped for precision (issue 54, rounds 1 to 3), or were idioms fitted to one fixture sentence (issue 59); the
    reward's answer-flow credit carries them. If the gate catches one again, move it back to leaks.jsonl."""
    assert case.leak and case.kind
    assert not any(instance_leak_reason(case.state, inst) for inst in gold_variants(case.instance)), case.state


@pytest.mark.parametrize(
    "directory",
    [DEV_LEGIT, FRESH_LEGIT, FRESH2_LEGIT, FRESH3_LEGIT, FRESH4_LEGIT, FRESH5_LEGIT],
    ids=["legit_heldout", "legit_fresh", "legit_fresh2", "legit_fresh3", "legit_fresh4", "legit_fresh5"],
)
def test_the_gate_blocks_at_most_two_percent_of_the_development_legit_sets(directory):
    """All are development sets now (the rules were changed with them in view): the bound is no held-out result."""
    cases = [c for c in load_redteam(directory) if not c.leak]
    blocked = [c.where for c in cases if leaks_answer(c.state, c.instance)]
    assert len(cases) >= 150 and len(blocked) <= 0.02 * len(cases), blocked


@pytest.mark.parametrize(
    "directory",
    [REDTEAM, REDTEAM.parents[2] / "benchmarks/redteam_heldout", DEV_LEGIT]
    + [FRESH_LEGIT, FRESH2_LEGIT, FRESH3_LEGIT, FRESH4_LEGIT, FRESH5_LEGIT],
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
             *GENERIC_RULES, *SHAPES, *PROCEDURE_RULES]  # fmt: skip
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
