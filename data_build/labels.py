"""The claim-verification label set shared by every claim source, and its question template. The sources' own
spellings of the labels are read by ``memstate.sources.labels.normalize_label``."""

from __future__ import annotations

# The closed label set of every claim-verification instance (answer_kind="label"), in letter order A, B, C.
LABELS: tuple[str, ...] = ("supported", "refuted", "not enough info")

CLAIM_QUESTION = (
    "Is the following claim supported or refuted by the evidence, or is there not enough information? Claim: {claim}"
)


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
