import json

import pytest
from pydantic import TypeAdapter, ValidationError

from memstate.schema import Fact, Instance, Relation, SchemaError


def make_instance(**overrides) -> Instance:
    fields = dict(
        id="abc",
        source="fever",
        task="evidence_conflict",
        perspective="belief",
        question="Is the claim supported or refuted by the evidence? Claim: X.",
        options=(),
        answer="refuted",
        answer_kind="label",
        labels=("supported", "refuted", "not enough info"),
        facts=(
            Fact("F1", "Page: evidence sentence.", "evidence", role="gold"),
            Fact("F2", "I'm convinced that X.", "belief", turn=3, time="2024-01-02", role="conflict"),
        ),
        relations=(Relation("F2", "CONFLICTS_WITH", "F1"),),
        meta={"source_file": "train.jsonl", "line": 7},
    )
    fields.update(overrides)
    return Instance(**fields)


def test_dict_round_trip_is_lossless_and_json_compatible():
    inst = make_instance()
    d = inst.to_dict()
    assert Instance.from_dict(json.loads(json.dumps(d))) == inst
    assert d["facts"][1] == {
        "id": "F2",
        "text": "I'm convinced that X.",
        "kind": "belief",
        "scope": "global",
        "turn": 3,
        "time": "2024-01-02",
        "role": "conflict",
    }


def test_answer_letter():
    assert make_instance().answer_letter == "B"
    choice = make_instance(answer_kind="choice", options=("tea", "coffee", "water"), answer="C", labels=())
    assert choice.answer_letter == "C" and choice.candidates == ("tea", "coffee", "water")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": "Wiki pedia"}, "field 'source' is 'Wiki pedia', expected a source name"),
        ({"task": "qa"}, "field 'task' is 'qa'"),
        ({"answer": "true"}, "field 'answer' 'true' is not in labels"),
        ({"answer_kind": "choice", "options": ("a",), "answer": "A"}, "field 'options' needs at least 2"),
        ({"answer_kind": "choice", "options": ("a", "b"), "answer": "C"}, "must be an option letter"),
        ({"question": "  "}, "field 'question' must not be empty"),
        ({"facts": ()}, "field 'facts' must not be empty"),
        ({"relations": (Relation("F2", "CONFLICTS_WITH", "F9"),)}, "unknown fact id 'F9'"),
        ({"relations": (Relation("F2", "CONTRADICTS", "F1"),)}, "relations[0]: field 'type' is 'CONTRADICTS'"),
        ({"facts": (Fact("F1", "a", "evidence"), Fact("F1", "b", "belief"))}, "duplicate ids"),
        ({"facts": (Fact("F1", "a", "opinion"),)}, "facts[0]: field 'kind' is 'opinion'"),
        ({"facts": (Fact("F1", "a", "evidence", role="hidden"),)}, "field 'role' is 'hidden'"),
        ({"facts": (Fact("F1", "a", "evidence", turn="3"),)}, "field 'turn' must be an int or null"),
    ],
)
def test_validation_errors_name_the_field(overrides, message):
    if "facts" in overrides and "relations" not in overrides:
        overrides["relations"] = ()
    with pytest.raises(
        SchemaError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        make_instance(**overrides)


def test_from_dict_reports_missing_and_unknown_fields_with_location():
    d = make_instance().to_dict()
    del d["answer"]
    with pytest.raises(SchemaError, match=r"train.parquet row 4: missing field\(s\) \['answer'\]"):
        Instance.from_dict(d, "train.parquet row 4")
    d = make_instance().to_dict()
    d["facts"][0]["colour"] = "red"
    with pytest.raises(SchemaError, match=r"facts\[0\]: unknown field\(s\) \['colour'\]"):
        Instance.from_dict(d)
    d = make_instance().to_dict()
    d["facts"] = "F1"
    with pytest.raises(SchemaError, match="field 'facts' must be a list"):
        Instance.from_dict(d)


def test_meta_nulls_from_parquet_are_dropped():
    d = make_instance().to_dict()
    d["meta"] = {"source_file": "train.jsonl", "line": 7, "persona_id": None}
    assert Instance.from_dict(d).meta == {"source_file": "train.jsonl", "line": 7}


VALID = {Fact: {"id": "F1", "text": "t", "kind": "evidence"}, Relation: {"src": "F2", "type": "SUPPORTS", "dst": "F1"}}
GONE = object()  # the field is left out


def accepts(check) -> bool:
    try:
        check()
    except (SchemaError, ValidationError):
        return False
    return True


@pytest.mark.parametrize(
    ("cls", "change", "ok"),
    [
        (Fact, {}, True),
        (Fact, {"id": "  "}, False),
        (Fact, {"id": 1}, False),
        (Fact, {"text": ""}, False),
        (Fact, {"text": None}, False),
        (Fact, {"kind": "opinion"}, False),
        (Fact, {"kind": GONE}, False),
        (Fact, {"scope": "domain", "turn": 3, "time": "2024-01-02", "role": "conflict"}, True),
        (Fact, {"scope": "local"}, False),
        (Fact, {"turn": "3"}, False),
        (Fact, {"turn": True}, False),
        (Fact, {"turn": 2.0}, False),
        (Fact, {"time": " "}, False),
        (Fact, {"role": "hidden"}, False),
        (Fact, {"colour": "red"}, False),
        (Relation, {}, True),
        (Relation, {"type": "REPLACES"}, False),
        (Relation, {"src": ""}, False),
        (Relation, {"dst": 5}, False),
        (Relation, {"dst": GONE}, False),
        (Relation, {"weight": 1}, False),
    ],
)
def test_the_api_reads_the_same_rules_as_the_data(cls, change, ok):
    """The API validates with pydantic, which reads the field annotations; data code with ``from_dict``/``validate``
    (the checks written out). Both must accept and reject the same values."""
    data = {k: v for k, v in (VALID[cls] | change).items() if v is not GONE}
    assert accepts(lambda: cls.from_dict(data)) is ok
    assert accepts(lambda: TypeAdapter(cls).validate_python(data)) is ok
