"""Claim labels as the claim sources spell them (FEVER: ``SUPPORTS`` / ``REFUTES`` / ``NOT ENOUGH INFO``; SciFact:
``SUPPORT`` / ``CONTRADICT``), read onto the one claim-label set ``supported`` / ``refuted`` / ``not enough info``
(``memstate.data_build.labels.LABELS``)."""

from __future__ import annotations

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
