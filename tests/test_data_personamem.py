"""PersonaMem → preference Instances, read from the hand-written fixtures in tests/fixtures/personamem."""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from memstate.data_build import personamem
from memstate.embedding import SharedSentenceEmbedder, load_sentence_transformer
from memstate.memory.relation_rule import Said, relate
from memstate.memory.rule_extractor import revises
from memstate.memory.validate import compatible
from memstate.schema import TASKS, Instance, option_letters, stable_id
from memstate.sources import personamem as pm_source
from memstate.sources.personamem import strip_speaker
from memstate.sources.skips import SKIP_DUPLICATE, SKIP_INVALID, SKIP_UNRESOLVED, DataError, SkipLog

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "personamem"
QUESTIONS, CONTEXTS = "questions_32k.csv", "shared_contexts_32k.jsonl"
Q_FILE, C_FILE = str(FIXTURE / QUESTIONS), str(FIXTURE / CONTEXTS)

# What the fixtures hold (see tests/fixtures/personamem/README.md): 32 rows on 34 physical lines (the header, and
# one question spans two lines), 26 usable (15 of persona 0, 11 of persona 1), 6 broken; 2 contexts.
ROWS, USED, CONTEXT_LINES = 32, 26, 2
BAD = {  # physical line → (skip kind, text the reason must contain)
    7: (SKIP_INVALID, "'correct_answer' empty"),
    11: (SKIP_INVALID, "'all_options'"),
    15: (SKIP_INVALID, "'correct_answer' is '(e)'"),
    20: (SKIP_UNRESOLVED, "'shared_context_id'"),
    27: (SKIP_INVALID, "'end_index_in_shared_context' is 'twelve'"),
    33: (SKIP_INVALID, "'all_options', 'shared_context_id', 'end_index_in_shared_context' missing"),
}
META_KEYS = {
    "source_file",
    "row",
    "persona_id",
    "question_id",
    "question_type",
    "topic",
    "shared_context_id",
    "end_index",
    "group",
    "superseded_options",
}
RELEASED_TYPES = {
    "recall_user_shared_facts",
    "suggest_new_ideas",
    "acknowledge_latest_user_preferences",
    "track_full_preference_evolution",
    "revisit_reasons_behind_preference_updates",
    "provide_preference_aligned_recommendations",
    "generalize_to_new_scenarios",
}


class CachingEmbedder:
    """The real MiniLM, with each distinct text encoded once per module: the reads here repeat the same texts, and
    the checks below then see exactly the vectors the reader saw."""

    def __init__(self, model) -> None:
        self.model, self.cache, self.name = model, {}, "cached-minilm"

    def encode(self, sentences: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(sentences) if t not in self.cache]
        if new:
            vecs = self.model.encode(new)
            self.cache.update(zip(new, vecs, strict=True))
        return np.stack([self.cache[t] for t in sentences])


@pytest.fixture(scope="module")
def embedder() -> CachingEmbedder:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        return CachingEmbedder(SharedSentenceEmbedder(batch_size=personamem.EMBED_BATCH))


def read(embedder, pm_dir: Path = FIXTURE, skip_invalid: bool = True, **kwargs):
    log = SkipLog(skip_invalid=skip_invalid)
    return personamem.read_personamem(pm_dir, QUESTIONS, CONTEXTS, log, embedder=embedder, **kwargs), log


@pytest.fixture(scope="module")
def built(embedder):
    return read(embedder)


@pytest.fixture(scope="module")
def contexts() -> dict[str, list[dict]]:
    out = {}
    for line in (FIXTURE / CONTEXTS).read_text(encoding="utf-8").splitlines():
        out.update(json.loads(line))
    return out


def by_qid(items: list[Instance]) -> dict[str, Instance]:
    return {i.meta["question_id"]: i for i in items}


def fact_of(inst: Instance, startswith: str):
    (fact,) = [f for f in inst.facts if f.text.startswith(startswith)]
    return fact


def copy_fixture(tmp_path: Path) -> Path:
    out = tmp_path / "pm"
    shutil.copytree(FIXTURE, out)
    return out


def write_csv(path: Path, header: list[str], rows: list[list[str]], newline: str = "\r\n") -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, lineterminator=newline)
        w.writerow(header)
        w.writerows(rows)


def fixture_rows() -> tuple[list[str], list[list[str]]]:
    with open(FIXTURE / QUESTIONS, encoding="utf-8", newline="") as f:
        header, *rows = list(csv.reader(f))
    return header, rows


# --- bookkeeping ------------------------------------------------------------------------------------------------


def test_counts_and_per_file_balance(built):
    read_, log = built
    assert read_.source == "personamem" and len(read_.items) == USED
    assert read_.records_in == {Q_FILE: ROWS, C_FILE: CONTEXT_LINES}
    assert read_.records_used == {Q_FILE: USED, C_FILE: CONTEXT_LINES}
    skipped = Counter(s.file for s in log.records)
    for f in (Q_FILE, C_FILE):
        assert read_.records_in[f] == read_.records_used[f] + skipped[f]
    assert read_.stopped_at is None
    assert Counter(i.meta["persona_id"] for i in read_.items) == {"0": 15, "1": 11}
    assert {i["kind"] for i in read_.inputs} == {"personamem_questions", "personamem_contexts"}
    for i in read_.inputs:
        data = Path(i["path"]).read_bytes()
        assert i["sha256"] == hashlib.sha256(data).hexdigest() and i["size"] == len(data)
    json.dumps(read_.stats)  # the manifest stores it


def test_skip_invalid_lists_every_bad_row(built):
    _, log = built
    got = {s.line: s for s in log.records}
    assert set(got) == set(BAD)
    for line, (kind, text) in BAD.items():
        assert got[line].file == Q_FILE and got[line].kind == kind and text in got[line].reason, got[line]
    assert got[20].record_id == "pm2-bad-04"


def test_strict_mode_raises_at_the_first_bad_row(embedder):
    with pytest.raises(DataError, match=r"questions_32k\.csv:7: column\(s\) 'correct_answer' empty"):
        read(embedder, skip_invalid=False)


def test_strict_mode_raises_on_unresolved_context(embedder, tmp_path):
    pm = copy_fixture(tmp_path)
    header, rows = fixture_rows()
    write_csv(pm / QUESTIONS, header, [r for r in rows[:19] if r[1] in {"pm0-run-01", "pm2-bad-04"}])
    with pytest.raises(DataError, match=r"questions_32k\.csv:3: column 'shared_context_id' 'ed917b72") as err:
        read(embedder, pm, skip_invalid=False)
    message = str(err.value)  # one line: file, line, column, the id, and what to do
    assert message.startswith(f"{pm / QUESTIONS}:3: ") and "\n" not in message
    assert message.endswith("is not in the contexts file (rerun with --skip-invalid to skip it)")


def test_max_questions_stops_early(embedder):
    read_, log = read(embedder, skip_invalid=False, max_questions=5)
    assert len(read_.items) == 5 and not log.records  # the first bad row (line 7) is never read
    assert read_.stopped_at["file"] == Q_FILE and read_.stopped_at["next_line"] == 7
    assert read_.records_in[Q_FILE] == 5
    read_, log = read(embedder, max_questions=10)
    assert len(read_.items) == 10 and read_.stopped_at["next_line"] == 14
    assert read_.records_in[Q_FILE] == 12 == read_.records_used[Q_FILE] + len(log.records)
    assert {s.line for s in log.records} == {7, 11}


def test_bad_context_lines_are_skipped_with_their_line(embedder, tmp_path, contexts):
    pm = copy_fixture(tmp_path)
    (cid, msgs), _ = contexts.items()
    extra = [
        '{"abc": [{"role": "user", "content": "User: cut off"',  # line 3: truncated JSON
        json.dumps([{"role": "user", "content": "User: no id"}]),  # line 4: a list, not {id: messages}
        json.dumps({"def": [{"role": "narrator", "content": "Once upon a time"}]}),  # line 5: unknown role
        json.dumps({cid: msgs}),  # line 6: repeats line 1
        json.dumps({"unused": [{"role": "user", "content": "User: never asked about"}]}),  # line 7: fine, unused
    ]
    with open(pm / CONTEXTS, "a", encoding="utf-8") as f:
        f.write("\n".join(extra) + "\n")
    read_, log = read(embedder, pm)
    c_file = str(pm / CONTEXTS)
    got = {s.line: s for s in log.records if s.file == c_file}
    assert {n: s.kind for n, s in got.items()} == {3: SKIP_INVALID, 4: SKIP_INVALID, 5: SKIP_INVALID, 6: SKIP_DUPLICATE}
    assert got[3].reason.startswith("(line): invalid JSON") and "one key" in got[4].reason
    assert got[5].reason == "def[0].role: 'narrator' is not one of ['system', 'user', 'assistant']"
    assert got[6].reason == f"shared_context_id: {cid!r} repeats line 1"
    assert read_.records_in[c_file] == 7 and read_.records_used[c_file] == 3  # parsed lines, referenced or not
    assert read_.stats["contexts_parsed"] == 3 and read_.stats["contexts_referenced"] == 2
    assert len(read_.items) == USED
    with pytest.raises(DataError, match=r"shared_contexts_32k\.jsonl:3: \(line\): invalid JSON"):
        read(embedder, pm, skip_invalid=False, max_questions=5)


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("\n", "(line): empty line"),
        (b"\xff\n", "(line): not valid UTF-8"),
        ('{"": []}\n', "shared_context_id: the line's key is empty"),
        ('{"x": {"role": "user"}}\n', "x: is a JSON dict, expected a list of messages"),
        ('{"x": ["User: hi"]}\n', "x[0]: is a JSON str"),
        ('{"x": [{"role": "user", "content": null}]}\n', "x[0].content: must be a string, got None"),
    ],
)
def test_context_line_errors_name_file_line_and_field(tmp_path, line, field):
    """The core reader's errors, as data_build reports them: skipped with the field, or one DataError line."""
    path = tmp_path / CONTEXTS
    path.write_bytes((FIXTURE / CONTEXTS).read_bytes() + (line if isinstance(line, bytes) else line.encode()))
    log = SkipLog(skip_invalid=True)
    contexts, n_read, n_parsed, _ = personamem.read_contexts(path, log, wanted={"x"})
    assert (n_read, n_parsed, contexts) == (3, 2, {})
    (skipped,) = log.records
    assert (skipped.file, skipped.line, skipped.kind) == (str(path), 3, SKIP_INVALID)
    assert skipped.reason.startswith(field)
    with pytest.raises(DataError) as err:
        personamem.read_contexts(path, SkipLog(skip_invalid=False), wanted=set())
    assert str(err.value).startswith(f"{path}:3: {field}") and "\n" not in str(err.value)


def test_duplicates_short_histories_and_overlong_end_index(embedder, tmp_path, contexts):
    pm = copy_fixture(tmp_path)
    header, rows = fixture_rows()
    good = rows[0]
    end = header.index("end_index_in_shared_context")
    qid = header.index("question_id")
    no_history = [*good[:qid], "pm0-early", *good[qid + 1 : end], "1"]  # only the system message
    too_long = [*good[:qid], "pm0-late", *good[qid + 1 : end], "999"]
    write_csv(pm / QUESTIONS, header, [good, good, no_history, too_long])
    read_, log = read(embedder, pm)
    got = {s.line: (s.kind, s.reason) for s in log.records}
    assert got[3][0] == SKIP_DUPLICATE and "repeats line 2" in got[3][1]
    assert got[4][0] == personamem.SKIP_NO_HISTORY and got[5][0] == SKIP_UNRESOLVED and "has 55 messages" in got[5][1]
    assert len(read_.items) == 1
    with pytest.raises(DataError, match=r":3: column 'question_id' 'pm0-run-01' repeats line 2"):
        read(embedder, pm, skip_invalid=False)


# --- parsing ------------------------------------------------------------------------------------------------------


def test_crlf_quotes_commas_and_newlines_are_parsed(built):
    assert b"\r\n" in (FIXTURE / QUESTIONS).read_bytes()
    items = by_qid(built[0].items)
    travel = items["pm0-travel-01"]
    assert travel.options[1] == (
        "Those early-morning walks through Lisbon's Alfama district in March must have given you some beautiful shots."
    )
    assert travel.options[2] == 'Your week in Rome, with all those "golden hour" pictures, sounds wonderful.'
    film = items["pm1-film-02"]  # a JSON-style list
    assert film.options[0] == 'A light family comedy like "Paddington 2", that everyone can enjoy.'
    run = items["pm0-run-03"]  # the question spans two physical lines
    assert run.question == "Can you recommend a weekend activity to keep fit?\nSomething I can do on my own."
    assert run.meta["row"] == 16 and items["pm0-food-05"].meta["row"] == 18
    for inst in built[0].items:
        assert not any(o.startswith("(") for o in inst.options) and not inst.question.endswith("\r")


def test_answers_are_option_letters(built):
    items = by_qid(built[0].items)
    for inst in items.values():
        assert inst.answer_kind == "choice" and inst.labels == () and inst.perspective == "none"
        assert len(inst.options) == 4 and inst.answer in option_letters(len(inst.options))
    assert items["pm0-run-01"].answer == "A" and items["pm1-home-01"].answer == "D"
    assert items["pm0-food-02"].options[ord(items["pm0-food-02"].answer) - ord("A")].startswith("A fragrant ginger")


def test_columns_are_read_by_header_name(embedder, built, tmp_path):
    header, rows = fixture_rows()
    order = list(reversed(range(len(header))))
    pm = copy_fixture(tmp_path)
    write_csv(
        pm / QUESTIONS,
        ["stereotypical", *(header[i] for i in order)],
        [["False", *(r[i] for i in order)] if len(r) == len(header) else r for r in rows],
        newline="\n",
    )
    read_, _ = read(embedder, pm)
    assert [i.to_dict() for i in read_.items] == [i.to_dict() for i in built[0].items]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("['(a) one']", "at least 2 options"),
        ("['(a) one', '(c) two']", "item 2 does not start with '(b)'"),
        ("['one', 'two']", "item 1 does not start with '(a)'"),
        ("['(a) one', 2]", "item 2 is a int"),
        ("['(a) one', '(b) ']", "item 2 ('(b)') has no text"),
        ("__import__('os')", "not a list literal"),
    ],
)
def test_bad_options_name_the_column(value, message):
    with pytest.raises(pm_source.BadRow, match=re.escape(message)) as e:
        pm_source.parse_options(value)
    assert "'all_options'" in str(e.value)


def test_answer_letters():
    assert pm_source.parse_answer("(c)", 4) == "C" and pm_source.parse_answer("d", 4) == "D"
    for bad, n in (("(e)", 4), ("(c)", 2), ("(ab)", 4), ("3", 4), ("(a) yes", 4)):
        with pytest.raises(pm_source.BadRow, match="'correct_answer'"):
            pm_source.parse_answer(bad, n)


def test_header_without_a_required_column_stops_any_build(embedder, tmp_path):
    pm = copy_fixture(tmp_path)
    header, rows = fixture_rows()
    drop = header.index("correct_answer")
    write_csv(pm / QUESTIONS, header[:drop] + header[drop + 1 :], [r[:drop] + r[drop + 1 :] for r in rows])
    with pytest.raises(DataError, match=r"questions_32k\.csv:1: header has missing column\(s\) \['correct_answer'\]"):
        read(embedder, pm, skip_invalid=True)


def test_task_mapping(built):
    assert set(personamem.TASK_BY_QUESTION_TYPE.values()) <= set(TASKS)
    assert RELEASED_TYPES <= set(personamem.TASK_BY_QUESTION_TYPE)
    assert set(personamem.TASK_BY_QUESTION_TYPE) == pm_source.QUESTION_TYPES  # every type the reader accepts
    items = built[0].items
    assert RELEASED_TYPES <= {i.meta["question_type"] for i in items}
    for inst in items:
        assert inst.task == personamem.TASK_BY_QUESTION_TYPE[inst.meta["question_type"]]
    assert Counter(i.task for i in items) == {
        "fact_recall": 4,
        "idea_suggestion": 4,
        "preference_current": 7,
        "preference_history": 4,
        "preference_update": 4,
        "preference_generalization": 3,
    }


def test_meta_and_ids(built):
    for inst in built[0].items:
        m = inst.meta
        assert set(m) == META_KEYS and None not in m.values()
        assert json.loads(json.dumps(m)) == m
        assert m["source_file"] == QUESTIONS and m["group"] == f"personamem:{m['shared_context_id']}"
        assert inst.id == stable_id("personamem", m["question_id"], m["shared_context_id"])
        assert Instance.from_dict(inst.to_dict()) == inst
    assert len({i.id for i in built[0].items}) == USED


def test_fact_kind_heuristic():
    assert personamem.fact_kind("I love horror films — the scarier the better.") == "preference"
    assert personamem.fact_kind("Since my son's nightmares I can't stand horror films any more.") == "preference"
    assert personamem.fact_kind("I've come to prefer paper books again.") == "preference"
    assert personamem.fact_kind("I'd like to book a table for four.") == "fact"
    assert personamem.fact_kind("I would like to know the time.") == "fact"
    assert personamem.fact_kind("We repainted the kitchen last weekend.") == "experience"
    assert personamem.fact_kind("Our orchestra rehearses on Thursdays.") == "fact"


# --- facts, relations, distractors --------------------------------------------------------------------------------


def test_facts_are_user_turns_of_the_history(built, contexts):
    for inst in built[0].items:
        msgs = contexts[inst.meta["shared_context_id"]]
        end = inst.meta["end_index"]
        turns = [f.turn for f in inst.facts]
        assert turns == sorted(turns) and len(set(turns)) == len(turns)
        assert [f.id for f in inst.facts] == [f"F{n}" for n in range(1, len(inst.facts) + 1)]
        for f in inst.facts:
            assert 0 <= f.turn < end and msgs[f.turn]["role"] == "user"
            assert f.text == strip_speaker(msgs[f.turn]["content"]) and not f.text.startswith("User:")
            assert f.scope == "domain" and f.time == f"turn {f.turn}"
            # A SUPERSEDES end the store would refuse as typed states a stance: a preference (relation_rule).
            ends = {x for r in inst.relations if r.type == "SUPERSEDES" for x in (r.src, r.dst)}
            assert f.kind == personamem.fact_kind(f.text) or (f.id in ends and f.kind == "preference")
        user = [i for i in range(end) if msgs[i]["role"] == "user"]
        assert set(user[-2:]) <= set(turns)  # latest_mentions=2: the last user turns are always there


def test_max_facts_bounds_the_relevant_set(embedder):
    read_, _ = read(embedder, max_facts=4, latest_mentions=1)
    for inst in read_.items:
        roles = Counter(f.role for f in inst.facts)
        assert roles["gold"] <= 4 and roles["gold"] + roles["outdated"] >= 1
    food = by_qid(read_.items)["pm0-food-04"]  # "why did I stop eating chilli?"
    assert fact_of(food, "I've gone off spicy food").role == "gold"


def test_supersedes_edges(built):
    read_ = built[0]
    with_edges = 0
    for inst in read_.items:
        facts = {f.id: f for f in inst.facts}
        graph: dict[str, set[str]] = {}
        for rel in inst.relations:
            assert rel.type == "SUPERSEDES" and rel.src in facts and rel.dst in facts
            src, dst = facts[rel.src], facts[rel.dst]
            assert src.turn > dst.turn and compatible("SUPERSEDES", src.kind, dst.kind)
            assert revises(src.text)  # the one rule: only a stated change of view supersedes
            assert dst.role == "outdated" and src.role != "distractor"
            graph.setdefault(rel.src, set()).add(rel.dst)
        assert len({r.dst for r in inst.relations}) == len(inst.relations)  # superseded at most once
        assert not _has_cycle(graph)
        outdated = {f.id for f in inst.facts if f.role == "outdated"}
        assert outdated == {r.dst for r in inst.relations}
        with_edges += bool(inst.relations)
    assert with_edges >= 1
    assert read_.stats["instances_with_supersedes"] == with_edges
    assert read_.stats["supersedes_edges"] == sum(len(i.relations) for i in read_.items)
    food = by_qid(read_.items)["pm0-food-03"]  # the spicy-food change must be found
    new, old = fact_of(food, "I've gone off spicy food"), fact_of(food, "I love spicy food")
    assert (new.id, "SUPERSEDES", old.id) in {(r.src, r.type, r.dst) for r in food.relations}
    before = by_qid(read_.items)["pm0-food-01"]  # asked before the change: no edge about it
    assert fact_of(before, "I love spicy food").role != "outdated"


def test_stale_statement_comes_with_its_update(built, embedder, contexts):
    # Every kept turn that the one relation rule, run over the whole history, supersedes shows up with its update.
    for inst in built[0].items:
        msgs = contexts[inst.meta["shared_context_id"]][: inst.meta["end_index"]]
        last = {strip_speaker(m["content"]): i for i, m in enumerate(msgs) if m["role"] == "user"}
        history = sorted((i, t) for t, i in last.items())
        said = [Said(str(i), "user", i, t) for i, t in history]
        vecs = personamem.embed(embedder, [t for _, t in history])
        superseded = {history[e][0] for _, rel, e in relate(said, vecs) if rel == "SUPERSEDES"}
        outdated = {f.turn for f in inst.facts if f.role == "outdated"}
        assert outdated == {f.turn for f in inst.facts if f.role != "distractor"} & superseded, inst.meta["question_id"]
    # "I've come to prefer paper books again" states no change cue: no edge (the rule misses it rather than guess).
    ebooks = [f for i in built[0].items for f in i.facts if f.text.startswith("I prefer e-books")]
    assert ebooks and all(f.role != "outdated" for f in ebooks)


def test_superseded_options_are_wrong_options_echoing_an_outdated_preference(built, embedder):
    read_ = built[0]
    for inst in read_.items:
        stale = inst.meta["superseded_options"]
        wrong = set(option_letters(len(inst.options))) - {inst.answer}
        assert isinstance(stale, list) and set(stale) <= wrong and len(set(stale)) == len(stale)
        old = [f.role == "outdated" for f in inst.facts]
        if not any(old):
            assert stale == []
            continue
        # The definition, recomputed: nearer an outdated fact than any other fact, and above the floor.
        sims = (
            personamem.embed(embedder, list(inst.options)) @ personamem.embed(embedder, [f.text for f in inst.facts]).T
        )
        to_old = sims[:, old].max(axis=1)
        to_other = sims[:, [not o for o in old]].max(axis=1)
        expected = [
            letter
            for k, letter in enumerate(option_letters(len(inst.options)))
            if letter in wrong and to_old[k] >= personamem.SUPERSEDED_OPTION_FLOOR and to_old[k] > to_other[k]
        ]
        assert stale == expected, inst.meta["question_id"]
    items = by_qid(read_.items)
    assert "A" in items["pm0-food-05"].meta["superseded_options"]  # the Sichuan hot pot, after "gone off spicy food"
    assert "B" in items["pm1-film-02"].meta["superseded_options"]  # "The Exorcist", after "can't stand horror films"
    assert items["pm0-travel-01"].meta["superseded_options"] == []  # outdated spicy food, options about photos
    assert read_.stats["superseded_options"] == sum(len(i.meta["superseded_options"]) for i in read_.items)
    assert read_.stats["instances_with_superseded_options"] == sum(
        bool(i.meta["superseded_options"]) for i in read_.items
    )
    assert any(i.task.startswith("preference_") and i.meta["superseded_options"] for i in read_.items)


def _has_cycle(graph: dict[str, set[str]]) -> bool:
    state: dict[str, int] = {}

    def visit(node: str) -> bool:
        if state.get(node) == 1:
            return True
        if state.get(node) == 2:
            return False
        state[node] = 1
        found = any(visit(n) for n in graph.get(node, ()))
        state[node] = 2
        return found

    return any(visit(n) for n in list(graph))


def test_distractors_are_other_topic_turns_of_the_same_persona(built, embedder, contexts):
    items = built[0].items
    counts = Counter()
    for inst in items:
        msgs = contexts[inst.meta["shared_context_id"]]
        user_texts = {strip_speaker(m["content"]) for m in msgs[: inst.meta["end_index"]]}
        facts = list(inst.facts)
        vecs = personamem.embed(embedder, [f.text for f in facts])
        q = personamem.embed(embedder, [inst.question])[0]
        sims = vecs @ q
        distractors = [i for i, f in enumerate(facts) if f.role == "distractor"]
        others = [i for i, f in enumerate(facts) if f.role != "distractor"]
        gold = [i for i, f in enumerate(facts) if f.role == "gold"]
        counts[len(distractors)] += 1
        assert len(distractors) <= 4
        for d in distractors:
            assert facts[d].text in user_texts  # the same context, so the same persona, and before the question
            assert all(float(vecs[d] @ vecs[o]) < personamem.UNLIKE_THRESHOLD for o in others)
            assert all(float(sims[d]) <= float(sims[g]) + 1e-6 for g in gold)
        for a in distractors:
            assert all(float(vecs[a] @ vecs[b]) < personamem.UNLIKE_THRESHOLD for b in distractors if b != a)
    assert sum(n for k, n in counts.items() if k >= 2) >= USED // 2
    assert built[0].stats["distractors"] == sum(k * n for k, n in counts.items())


def test_reading_is_deterministic(built, embedder):
    again, log = read(embedder.model)  # the model itself this time, not the cache
    assert [i.to_dict() for i in again.items] == [i.to_dict() for i in built[0].items]
    assert again.stats == built[0].stats and [s.to_dict() for s in log.records] == [
        s.to_dict() for s in built[1].records
    ]
    other_seed, _ = read(embedder, seed=1)
    assert [i.id for i in other_seed.items] == [i.id for i in built[0].items]


def test_default_embedder_is_loaded_once(embedder):
    model = load_sentence_transformer(embedder.model.name, embedder.model.device)
    assert load_sentence_transformer() is model  # the core loader's cached model, memory's too
    read_, _ = read(None, max_questions=2)
    assert len(read_.items) == 2


def test_embed_normalizes_and_reuses_unique_texts(embedder):
    vecs = personamem.embed(embedder, ["I love spicy food.", "I love spicy food.", "My cat is called Pepper."])
    assert vecs.shape == (3, 384) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)
    assert np.array_equal(vecs[0], vecs[1])
