"""The leak gate: does a reasoning state name an answer? One gate for reward, evaluation and the serve API.

A state is rejected when it names **any** candidate answer, not only the reference one, so the decision is the same
whatever the gold answer is and a penalty tells the policy nothing about the label (a gate that fired only on the
gold answer would be an answer oracle: "mention supported; if not penalised, it is not supported"). Closed sets:

- a label, or a word that states a verdict like it (supported: true, correct, holds, confirmed, proves …; refuted:
  false, wrong, disproves, debunked …; not enough info: insufficient, cannot be determined, inconclusive …), and any
  verb of support or contradiction whose object is the claim itself ("F1 contradicts the claim");
- an option letter in any form: "(B)", "B)", "option b", "answer: B", "say B", a bare capital "B" (but not the
  article "A" or the pronoun "I" before a word), an ordinal ("the second option", "option two", "the longest
  choice"), or an answer's initial ("the one that starts with r");
- an option's text (normalized; for long options, most of its content words), or a candidate spelled out letter by
  letter ("s-u-p-p-o-r-t-e-d").

Free-text answers have no candidate set: the state must not contain the reference answer's span.
The gate is lexical on purpose: cheap, deterministic and the same in training and evaluation. It rejects some
harmless wording ("F2 supports F1") — the policy learns to say "F2 agrees with F1" or "rely on F2" instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memstate.schema import Instance, option_letters

_STOPWORDS = frozenset(
    "a an the of to in on at for with and or but not no is are was were be been it its this that these those "
    "i you your my me we our they them their he she his her as by from about into than then so do does did "
    "have has had will would should could can may might must just very more most some any all".split()
)


def normalize(text: str) -> str:
    """Lowercase, apostrophes dropped (``can't`` → ``cant``), other punctuation → spaces, whitespace collapsed.

    >>> normalize("It's NOT-enough  info, can't tell!")
    'its not enough info cant tell'
    """
    text = re.sub(r"['’`]", "", text.lower())
    return " ".join(re.sub(r"[^\w\s]|_", " ", text).split())


# Verdict vocabulary per known label (matched on normalized text). Each entry names that label in other words.
_VERDICTS: dict[str, tuple[str, ...]] = {
    "supported": (
        r"(un)?support\w*",
        r"true\w*",
        r"truth\w*",
        r"correct(ly|ness)?",
        r"accura\w+",
        r"valid(ly|ity|ated?|ates)?",
        r"(un)?confirm\w*",
        r"(un)?verified|(un)?verifiabl\w*|verifies",
        r"(un)?prov(e|en|es|ed|ing)",
        r"affirm\w*",
        r"upheld|upholds?",
        r"yes",
        r"checks? out",
        r"backed|backs up",
        r"(claim|statement|assertion|it|its|this|that)( still)?( does| doesnt| does not| do not| dont)? holds?",
        r"holds? (true|up|good)",
        r"(is|are|was|were|be|its|s) (right|factual)",
    ),
    "refuted": (
        r"refut\w*",
        r"rebut\w*",
        r"false\w*",
        r"untrue",
        r"incorrect\w*",
        r"wrong\w*",
        r"inaccura\w+",
        r"invalid\w*",
        r"mistaken\w*",
        r"erroneous\w*",
        r"bogus",
        r"fake",
        r"myth\w*",
        r"debunk\w*",
        r"disprov\w*",
        r"(is|are|was|were|be|its) contradicted",
    ),
    "not enough info": (
        r"not enough",
        r"enough (info|information|evidence|data)",
        r"insufficien\w*",
        r"inconclusive\w*",
        r"undetermin\w*|indetermina\w*|undecid\w*|undecidabl\w*",
        r"unknow\w*",
        r"abstain\w*",
        r"(cannot|cant|can not|unable to|impossible to|not possible to|no way to) (be )?"
        r"(tell|told|say|said|know|known|determined?|decided?|verif\w*|establish\w*|confirm\w*|settled?|resolved?)",
        r"no (clear |direct |relevant |deciding )?(evidence|information|info|data)",
        r"lacks?( of)? (evidence|information|info|data)",
    ),
}
# Any verb of (dis)agreement whose object is the claim states a verdict ("F1 contradicts the claim").
_CLAIM_VERDICT = (
    r"(support|refut|contradict|conflict|disagree|agree|oppose|undermin|weaken|strengthen|back|corroborat|den(y|ies|ied)"
    r"|disput|challeng|match|align|fit|consistent|inconsistent|prov|disprov|confirm|verif|validat|invalidat|rebut"
    r"|debunk|side|entail)\w* (up |with |to )?(the |this |that )?(claim|statement|assertion|it)"
    r"|(claim|statement|assertion) (still )?(stands|survives|fails|falls)|opposite of (the |this |that )?claim"
)
_ORDINALS = (
    r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|final|middle|top|bottom|former|latter"
    r"|longest|shortest|longer|shorter|1st|2nd|3rd|[4-9]th)"
)
_OPTION_NOUNS = r"(options?|choices?|answers?|candidates?|labels?|letters?|alternatives?|ones?|possibilit(y|ies))"
_NUMBERS = r"(one|two|three|four|five|six|seven|eight|nine|ten|\d+)"
_LETTER_CUES = (
    r"options?|answers?|letters?|choices?|candidates?|labels?|pick|choose|select|say|respond|reply|output|write"
    r"|go with|mark|return|give|is|not|except|exclude|than"
)
# After "A"/"I" (or "a"/"i"), a following word means the article/pronoun ("A newer memory", "pick a reply") — unless
# the word is one that follows a letter in a list or an elimination ("A or C", "A only").
_AFTER_LETTER_WORDS = r"(only|or|and|nor|instead|alone|is|was|wins)\b"


def _compile(patterns: Sequence[str]) -> re.Pattern:
    return re.compile(r"\b(" + "|".join(patterns) + r")\b")


_VERDICT_RES = {label: _compile(p) for label, p in _VERDICTS.items()}
_CLAIM_VERDICT_RE = _compile([_CLAIM_VERDICT])
# "starts with r", "begins with the letter s" — but not "start with a careful reading" (the article before a word).
_INITIAL_RE = re.compile(
    r"(?i)\b(start|begin)\w* with (the letter [\"'“‘]?[a-z]\b|[\"'“‘]?[a-z]\b[\"'”’]?(?!\s+[a-z]{2,}))"
)
_ORDINAL_RES = (
    _compile([rf"{_ORDINALS} {_OPTION_NOUNS}"]),
    _compile([rf"(option|choice|answer|candidate|alternative|label|number) {_NUMBERS}"]),
)


def _label_patterns(label: str) -> re.Pattern:
    """The label itself (every word form of a one-word label) and, for known labels, its verdict vocabulary."""
    norm = normalize(label)
    words = norm.split()
    own = [re.escape(norm)] + ([re.escape(words[0][: max(4, len(words[0]) - 2)]) + r"\w*"] if len(words) == 1 else [])
    return _compile(own + list(_VERDICTS.get(norm, ())))


def _names_letter(text: str, letters: Sequence[str]) -> str | None:
    """The option letter ``text`` names, if any (see the module docstring for the forms)."""
    allowed = "".join(letters)
    if not allowed:
        return None
    cls = f"[{allowed}{allowed.lower()}]"
    not_word = r"(?![\w'’-]|\.\w)"
    forms = (
        rf"\(\s*({cls})\s*\)",  # (B)
        rf"(?:^|[\s:;,])({cls})\)",  # B)
        rf"(?i:\b(?:{_LETTER_CUES}))\s*(?:is\s+|with\s+|:\s*)?[\"'“‘]?({cls}){not_word}",  # option b, say B, answer: B
        rf"(?<![\w'’.-])([{allowed}]){not_word}",  # a bare capital letter
    )
    for form in forms:
        for m in re.finditer(form, text, flags=re.MULTILINE):
            rest = text[m.end() :]
            if (
                m.group(1) in "AIai"
                and re.match(r"\s+[a-z]", rest)
                and not re.match(rf"\s+{_AFTER_LETTER_WORDS}", rest)
            ):
                continue  # the article "a"/"A" or the pronoun "I" before a word
            return m.group(1).upper()
    return None


def _content(text: str) -> list[str]:
    return [w.rstrip("s") for w in normalize(text).split() if w not in _STOPWORDS]


def _names_option_text(state_norm: str, option: str) -> bool:
    """The option's normalized text appears in the state, or (options of 3+ content words) 3/4 of its content
    words do; an option made only of stopwords ("No") counts only when answered outright ("answer no")."""
    norm = normalize(option)
    content = _content(option)
    if not content:
        return (
            re.search(
                rf"\b(answer|say|respond|reply|choose|pick|select|output)( with)? {re.escape(norm)}\b", state_norm
            )
            is not None
        )
    if re.search(rf"\b{re.escape(norm)}\b", state_norm):
        return True
    if len(content) < 3:
        return False
    state_words = {w.rstrip("s") for w in state_norm.split()}
    return sum(w in state_words for w in set(content)) >= 0.75 * len(set(content))


def _contains_span(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def leak_reason(state_text: str, candidates: Sequence[str], answer_kind: str, reference: str = "") -> str | None:
    """Why ``state_text`` names an answer (a short reason), or None. ``candidates``: the closed answer set (labels or
    options) shown to the responder as lettered options; ``reference``: the free-text answer (``answer_kind`` free).

    >>> labels = ("supported", "refuted", "not enough info")
    >>> leak_reason("- The claim is false.\\n- Use F1.", labels, "label")
    "names a candidate: 'refuted' (false)"
    >>> leak_reason("- Choose the second option.\\n- Use F1.", labels, "label")
    'names an option by position: second option'
    >>> leak_reason("- Respond with B only.\\n- Use F1.", labels, "label")
    'names option letter B'
    >>> leak_reason("- Trust the evidence over the user's belief.\\n- A newer memory replaces an older one.", labels,
    ...             "label") is None
    True
    """
    if answer_kind == "free":
        span = normalize(reference).split()
        return "contains the reference answer" if _contains_span(normalize(state_text).split(), span) else None
    norm = normalize(state_text)
    for label in candidates if answer_kind == "label" else ():
        m = _label_patterns(label).search(norm)
        if m:
            return f"names a candidate: {label!r} ({m.group(0)})"
    if answer_kind == "label" and (m := _CLAIM_VERDICT_RE.search(norm)):
        return f"states a verdict on the claim: {m.group(0)}"
    # Spelled out or split up ("s-u-p-p-o-r-t-e-d", "sup ported"): a long candidate's letters in a row.
    squashed = norm.replace(" ", "")
    for candidate in candidates:
        if len(letters := normalize(candidate).replace(" ", "")) >= 6 and letters in squashed:
            return f"spells out a candidate: {candidate!r}"
    if m := _INITIAL_RE.search(state_text):
        return f"names an answer by its initial: {m.group(0)}"
    letter = _names_letter(state_text, option_letters(len(candidates)))
    if letter:
        return f"names option letter {letter}"
    for ordinal in _ORDINAL_RES:
        if m := ordinal.search(norm):
            return f"names an option by position: {m.group(0)}"
    for option in candidates if answer_kind == "choice" else ():
        if _names_option_text(norm, option):
            return f"names an option's text: {option!r}"
    return None


def leaks_answer(state_text: str, instance: Instance) -> bool:
    """The gate on an instance: does the state name any of its candidate answers (or its free-text answer)?

    >>> from memstate.schema import Fact
    >>> inst = Instance(id="x", source="fever", task="evidence_conflict", perspective="belief",
    ...     question="Is it true?", options=(), answer="refuted", answer_kind="label",
    ...     labels=("supported", "refuted"), facts=(Fact("F1", "t", "evidence"),), relations=())
    >>> leaks_answer("- Decide whether the claim is supported or refuted.\\n- Ignore F2.", inst)
    True
    >>> leaks_answer("- Decide from the evidence, not the user's claim.\\n- Ignore F2.", inst)
    False
    """
    return leak_reason(state_text, instance.candidates, instance.answer_kind, instance.answer) is not None
