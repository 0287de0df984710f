"""The claim-verification label set shared by every claim source, and its question template."""

from __future__ import annotations

# The closed label set of every claim-verification instance (answer_kind="label"), in letter order A, B, C.
LABELS: tuple[str, ...] = ("supported", "refuted", "not enough info")

# Source spellings → LABELS. FEVER: SUPPORTS/REFUTES/NOT ENOUGH INFO; SciFact: SUPPORT/CONTRADICT/NEI.
_ALIASES = {
    "SUPPORTS": "supported",
    "SUPPORT": "supported",
    "SUPPORTED": "supported",
    "REFUTES": "refuted",
    "REFUTE": "refuted",
    "REFUTED": "refuted",
    "CONTRADICT": "refuted",
    "CONTRADICTS": "refuted",
    "NOT ENOUGH INFO": "not enough info",
    "NOT ENOUGH INFORMATION": "not enough info",
    "NEI": "not enough info",
    "NOINFO": "not enough info",
}

CLAIM_QUESTION = (
    "Is the following claim supported or refuted by the evidence, or is there not enough information? Claim: {claim}"
)


def normalize_label(label: str) -> str:
    """Map a source label onto LABELS.

    >>> normalize_label("SUPPORTS"), normalize_label("contradict"), normalize_label("NOT_ENOUGH_INFO")
    ('supported', 'refuted', 'not enough info')
    """
    key = " ".join(str(label).replace("_", " ").split()).upper()
    try:
        return _ALIASES[key]
    except KeyError:
        raise ValueError(f"unknown claim label {label!r}; known: {sorted(_ALIASES)}") from None


def opposite_label(label: str) -> str:
    """The label a conflicting user memory asserts: supported ↔ refuted.

    >>> opposite_label("supported")
    'refuted'
    """
    if label == "supported":
        return "refuted"
    if label == "refuted":
        return "supported"
    raise ValueError(f"label {label!r} has no opposite (only 'supported' and 'refuted' do)")


def claim_question(claim: str) -> str:
    """The request the responder answers for a claim-verification instance."""
    return CLAIM_QUESTION.format(claim=claim.strip())
