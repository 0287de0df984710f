"""The lexical leak rules: does a (folded) state name a candidate answer in words a list can hold?

Each rule returns a short reason or None. They run on every text of ``normalize.variants`` and never look at which
candidate is the reference answer (except the free-text span rule, which has no other candidate to look at).

- **Label verdicts** (``label_reason``): a truth word stated outright ("the claim is borne out", "it would be wrong to
  doubt the claim"), a verb of (dis)agreement with the claim as subject or object ("the claim clashes with F1",
  "nothing backs the claim up"), a bare imperative attitude to the claim ("accept the claim"), a "not enough info"
  phrase ("the memories are silent on this", "withhold judgement"), a verdict pointed at in a memory ("answer exactly
  as F2 says"), a verdict in another language. Inside an if/whether clause a verdict word is a question, not an
  answer ("check whether F1 supports the claim") — unless the clause names two label families ("whether it is
  supported or refuted" rules the third out) or answers itself ("if it holds, and it does").
- **Letters** (``letter_reason``): "(B)", "B)", "option b", "pick dee", "C-option", "go with bravo", a bare capital
  letter that is no article, pronoun or name ("vitamin D", "Plan B", "C++" are names).
- **Positions** (``position_reason``): an ordinal or number next to an answer-slot noun ("the second-from-top
  entry", "#3", "entry number two", "choice II", "the one listed last"); in other languages too.
- **Encodings** (``encoding_reason``): a candidate reversed, Caesar-shifted (ROT13 included), in base64 or hex,
  spelled out letter by letter, split across rules in quotes, or as an acrostic.
- **Option text** (``option_reason``, choice instances): an option's full text, unless quoted from a memory.

What is not a verdict (round 4 of issue 54, each from legitimate states that were blocked): a quotation after a
possessive ("the user's 'false' is not evidence"), the user's stance in any stance verb ("the user, citing her
upbringing, holds the claim false"), a belief's evidential standing ("the belief is unsupported"), a verdict word
being defined ("define 'true' as: …"), what evidence can do ("only findings support or refute"), an encoded form that
does not start and end at word boundaries ("non sequitur" holds a Caesar shift of "guided").

Round 5: a plain truth word ("true", "wrong", "supported", "not enough", "uncertainty") is a verdict only where it is
anchored to the claim or the answer (``_anchored``): the claim, "it", the user or the evidence its subject, an answer
word before it, or nothing but adverbs around it ("So, refuted."). On two fresh legitimate sets the verdict check's
precision was 0.48 and 0.50 before this: procedure says "a confident expert can be mistaken", and no list of
exceptions kept up. Idioms ("the jury is still out") are verdicts anywhere; the rest is the answer-flow credit's.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache

from memstate.leak import lexicon as lx
from memstate.leak.normalize import fold
from memstate.schema import option_letters

STOPWORDS = frozenset(
    "a an the of to in on at for with and or but not no is are was were be been it its this that these those "
    "i you your my me we our they them their he she his her as by from about into than then so do does did "
    "have has had will would should could can may might must just very more most some any all one".split()
)


def normalize(text: str) -> str:
    """Lowercase, apostrophes dropped (``can't`` → ``cant``), other punctuation → spaces, whitespace collapsed.

    >>> normalize("It's NOT-enough  info, can't tell!")
    'its not enough info cant tell'
    """
    text = re.sub(r"['’`]", "", text.lower())
    return " ".join(re.sub(r"[^\w\s]|_", " ", text).split())


def _rx(pattern: str) -> re.Pattern:
    return re.compile(rf"(?<![\w])(?:{pattern})(?![\w])")


def _clauses(text: str) -> list[str]:
    """Normalized clauses: split at sentence and clause punctuation (commas included) and line breaks."""
    parts = re.split(r"[\n.;:!?,()\[\]{}\"“”‘’—–]|\s-\s|\s/\s", text)
    return [c for c in (normalize(p) for p in parts) if c]


# ---- label verdicts --------------------------------------------------------------------------------------------------

_TRUTH = {fam: _rx("|".join(words)) for fam, words in lx.TRUTH_WORDS.items()}
_SLOT = _rx(lx.ANSWER_SLOT)
_CLAIM = rf"(what )?(the |this |that |its |their |our |your )?({lx.CLAIM_NOUNS})"
_RELATION = {
    fam: _rx(
        rf"({verbs})( up| with| to| against| by| for| on| out)? {_CLAIM}(?! s\b)( up| out)?"  # the claim as object
        rf"|{_CLAIM}( itself| as stated| as written)?( still| simply| really| clearly| plainly| actually| fully)?"
        rf"( does not| doesnt| do not| dont| is not| isnt| is| does| cannot| cant| can)?"
        rf"( still| simply| really| clearly| plainly| actually| fully)? ({verbs})"  # the claim as subject
    )
    for fam, verbs in lx.RELATION_VERBS.items()
}
_CLAIM_AS = _rx(
    rf"(treat|regard|take|consider|count|mark|label|rate|deem|call|view|see|classify|judge|report|record|file|log|"
    rf"accept|score|tag|flag|list) {_CLAIM} as (?!(a |an |the )?(claim|hypothesis|question|belief|assertion|"
    rf"statement|something|proposal|test|open question|starting point)\b)\w+"
    rf"|(rules?|ruled|ruling) {_CLAIM} out"
)
_CLAIM_PREDICATE = {
    fam: _rx(
        rf"{_CLAIM}( itself| as stated| as written)?( still| simply| really| clearly| plainly| actually)? "
        rf"({preds})"
    )
    for fam, preds in lx.CLAIM_PREDICATES.items()
}
_ATTITUDE = {
    fam: _rx(
        rf"(?P<neg>(do not|dont|never|not|no reason to|no ground to|no grounds to|no basis to|nothing to) )?"
        rf"(please |so |then |now |always |simply |just |fully )?({verbs}) {_CLAIM}"
    )
    for fam, verbs in lx.ATTITUDE_VERBS.items()
}
_ATTITUDE_IT = _rx(r"(endorse|accept|ratify|affirm|believe|uphold|reject|dismiss|deny|doubt|dispute|rubber stamp) it")
_CLAIM_ANY = _rx(lx.CLAIM_NOUNS)
# "Verify the claim against F1": a check to run, not a result.
_PROCEDURE = re.compile(
    rf"^(please |first |then |now |always )?(verify|check|confirm|test|validate|compare|weigh|measure|match|assess|"
    rf"evaluate|examine|judge|read) {_CLAIM} (against|with|using|by|from|in|through|to|on)\b"
)
# A verdict word that belongs to a memory: "F3's 'true'", "memories that still hold up".
_VALIDITY_WORD = re.compile(
    r"(holds?|held|stands?|stood|checks?|checked|adds?|is|are|was|were|be|its|s|seems?|looks?|sounds?|proves?|"
    r"true|correct|accurate|right|valid|sound|solid|reliable)\b"
)
_MEMORY_BEFORE = re.compile(
    r"(f\d+s?( own)?|memor(y|ies)|facts?|preferences?|sources?|stud(y|ies)|data|excerpts?|entries|records?)"
    r"( that| which| who)?( still| also| do| does| really)? ?$"
)
_HYPOTHETICAL = _rx(lx.HYPOTHETICAL)
_UNASSERTED = _rx(lx.UNASSERTED)
_SELF_ANSWER = _rx(lx.SELF_ANSWER)
_SHORT_YES = re.compile(
    r"^(and |but )?(it|they|this|that|which|yes|indeed|sure|clearly|obviously|it clearly|it really)"
    r"( (does|do|did|is|are|was|will|has|holds?))?( not| nt)?( so)?$"
)
_POINTING = _rx(lx.POINTING)
_VERDICT_EMOJI = re.compile("[\u2705\u274c\u274e\u2714\u2716\u2713\u2717\u2718\u2611\u2612\U0001f44d\U0001f44e\u2b55]")
_FOREIGN_LATIN = _rx(
    "|".join(w for lang, ws in lx.FOREIGN_VERDICTS.items() if lang in "es fr de it pt nl pl tr" for w in ws)
)
_FOREIGN_OTHER = re.compile(
    "|".join(w for lang, ws in lx.FOREIGN_VERDICTS.items() if lang in "ru zh ja ko" for w in ws)
)


_MENTION_BEFORE = re.compile(r"(says|said|claims|claimed|calls it|labels it|marks it|deems it|thinks it|word|words) $")


# A verdict word said of a belief, not of the claim: "the fasting belief is irrelevant and unsupported".
_BELIEF_SUBJECT = re.compile(
    r"\b(belief|beliefs|view|views|stance|opinion|opinions|conviction|convictions|hunch|impression|anecdote|anecdotes|"
    r"hearsay|feeling|intuition|certainty|confidence|assumption|assumptions)( \w+){0,2}? (is|are|was|were|seems?|"
    r"looks?|remains?|stays?|sounds?)( \w+){0,3} $"
)


# What a belief can be called without a verdict on the claim: its evidential standing, not its truth ("the belief is
# unsupported" is procedure; "the belief is mistaken" says the claim it holds is wrong).
_EVIDENTIAL = re.compile(
    r"(un(supported|founded|verified|confirmed|substantiated|proven|proved|corroborated)|baseless|groundless|"
    r"without (merit|basis|foundation)|lacks? merit|has no merit)$"
)


def _of_belief(clause: str, m: re.Match) -> bool:
    return bool(_EVIDENTIAL.match(m.group(0)) and _BELIEF_SUBJECT.search(clause[: m.start()]))


# A verdict word being defined ("define 'true' here as: …", "'false' means …"): a mention, not a verdict.
_DEFINED_BEFORE = re.compile(r"\b(define|defining|defines|definition of)( the word| the label)? $")
_DEFINED_AFTER = re.compile(r"( here| below)? as$|( here)? (means|stands for|is defined)\b")
_CARRIED_TO_CLAIM = _rx(
    rf"(so|as|likewise|nor|neither) (is|does|was|are) {_CLAIM}|{_CLAIM} (too|as well|also|likewise)"
)


def _of_memory(clause: str, m: re.Match) -> bool:
    """A validity word said of a memory ("memories that still hold up", "F1 is accurate") or a memory's own word
    quoted ("F3's 'true'"): about that memory, not a verdict on the claim."""
    return bool(_VALIDITY_WORD.match(m.group(0)) and _MEMORY_BEFORE.search(clause[: m.start()]))


def _verdicts(clause: str, sentence: str = "") -> list[tuple[str, int, str]]:
    """(family, position, words) of every verdict in a normalized clause (of normalized ``sentence``), answer-slot
    phrases taken out."""
    clause = _SLOT.sub(lambda m: "_" * len(m.group(0)), clause)
    of_belief = not _CARRIED_TO_CLAIM.search(sentence)  # "the belief is misguided, and so is the claim"
    found = []
    for fam, rx in _TRUTH.items():
        found += [
            (fam, m.start(), m.group(0))
            for m in rx.finditer(clause)
            if not (_MENTION_BEFORE.search(clause[: m.start()]) or of_belief and _of_belief(clause, m))
            and not (_DEFINED_BEFORE.search(clause[: m.start()]) or _DEFINED_AFTER.match(clause[m.end() :]))
            and (fam != "sup" or not _of_memory(clause, m))
        ]
    for fam, rx in (*_RELATION.items(), *_CLAIM_PREDICATE.items()):
        found += [(fam, m.start(), m.group(0)) for m in rx.finditer(clause) if not _PROCEDURE.match(clause)]
    found += [("sup", m.start(), m.group(0)) for m in _CLAIM_AS.finditer(clause)]
    for fam, rx in _ATTITUDE.items():
        for m in rx.finditer(clause):
            if not (m.group("neg") or _NEGATED.search(clause[: m.start()])):  # "do not adopt or reject the claim"
                found.append((fam, m.start(), m.group(0)))
    return found


def _hypothetical(clause: str, position: int) -> bool:
    """A verdict at ``position`` is asked, not stated: an if/whether word comes before it in its clause."""
    m = _HYPOTHETICAL.search(clause)
    return m is not None and m.start() < position


# The user's stance reported ("the user grew up there and disputes the claim", "the user is certain the claim is
# true"): what the user holds, which the responder reads in the memories anyway, not a verdict on the claim.
_STANCE_VERBS = (
    "dispute doubt reject deny accept question argue maintain object insist swear bet agree disagree believe think "
    "hold consider call deem regard reckon suspect vouch endorse trust distrust dismiss assert contend declare affirm "
    "claim"
).split()
_STANCE_FORMS = {"think": "thinks|thought|thinking", "hold": "holds|held|holding",
                 "swear": "swears|swore|sworn|swearing", "bet": "bets|betting", "vouch": "vouches|vouched|vouching",
                 "deny": "denies|denied|denying",
                 "agree": "agrees?|agreed|agreeing", "disagree": "disagrees?|disagreed|disagreeing"}  # fmt: skip
_USER_STANCE = _rx(
    r"(the |a |this |our )?(user|users|person|someone|people)( \w+){0,6}? (?P<verb>"
    + "|".join(_STANCE_FORMS.get(v) or rf"{v}s?|{v.removesuffix('e')}(ed|ing)" for v in _STANCE_VERBS)
    + r"|((is|are|was|were|feels?|seems?) )?(certain|sure|convinced|confident|adamant|positive))"
)


def _unasserted(clause: str, position: int, before: str = "") -> bool:
    """A verdict at ``position`` is conceded, reported or said of what could be: see ``lexicon.UNASSERTED``; or it is
    the user's stance reported (``_USER_STANCE``: the verdict comes at or after a stance verb in its clause, whose
    subject may stand in the clauses ``before`` it: "the user, citing her upbringing, holds the claim false")."""
    offset = len(before) + 1 if before else 0
    joined = f"{before} {clause}" if before else clause
    if any(offset <= m.start("verb") <= offset + position for m in _USER_STANCE.finditer(joined)):
        return True
    for m in _UNASSERTED.finditer(clause):
        last = m.group(0).split()[-1]
        # "F1 literally saying what the request says": the reporting verb is the verdict itself, not a report of one.
        if m.start() < position and (last in ("that", "its", "is") or not clause[position:].startswith(last)):
            return True
    return False


def _claim_text(question: str) -> str:
    m = re.search(r"(?i)\bclaim:\s*(.+)$", question, flags=re.S)
    return m.group(1) if m else ""


_ATTRIBUTED = _rx(
    r"f\d+s?|memor(y|ies)|user|users|belief|believes|conviction|convinced|thinks|says|said|states|stated|claims|"
    r"reports|describes|mentions|according to|check|verify|compare|whether|if|does|do|is it|did"
)


def restatement_reason(text: str, question: str) -> str | None:
    """A rule that states the claim itself, or its negation, as a fact ("Remember: Kilimanjaro is not Asia's highest
    mountain") rather than what a memory says about it; or None.

    >>> q = "Is the following claim supported...? Claim: Mount Kilimanjaro is the highest mountain in Asia."
    >>> restatement_reason("- Remember: Kilimanjaro is not Asia's highest mountain.\\n- Use F1.", q)
    "restates the claim as a fact: 'kilimanjaro is not asias highest mountain'"
    >>> restatement_reason("- F4 believes Kilimanjaro is the highest mountain in Asia.\\n- Use F1.", q) is None
    True
    """
    claim = set(content_words(_claim_text(question)))
    if len(claim) < 3:
        return None
    for clause in _clauses(text):
        words = set(content_words(clause))
        if len(claim & words) >= 0.75 * len(claim) and not _ATTRIBUTED.search(clause):
            return f"restates the claim as a fact: {clause!r}"
    return None


def _sentences(text: str) -> list[str]:
    """The state's sentences (split at sentence ends and line breaks, not at commas, colons or semicolons)."""
    return [p for p in re.split(r"(?<=[.!?])\s+|\n", text) if p.strip()]


# A label's own name ("supported", "not enough info"): in a sentence that defines when to use it, it is mentioned.
_LABEL_NAME = re.compile(r"^((well )?supported|refuted|not enough)$")
# What makes a sentence's label names procedure: a condition or a requirement ("answer 'supported' only if …",
# "'refuted' needs a memory that contradicts it", "'not enough info' is for when …").
_CONDITION = _rx(
    rf"{lx.HYPOTHETICAL}|only by|only with|only once|until|needs?|requires?|required|is for|are for|calls? for|"
    rf"otherwise|else|reserved?|reserving|for the case|for cases|means|mean|meaning|stands for|covers?|covering|"
    rf"applies|apply|is used|are used|fits?"
)
# Round 2 of issue 54: a verdict anywhere after one of these in its sentence is asked, conditional or a reason, not
# stated ("if yes, compare it; if no, say there is not enough information", "otherwise choose 'not enough info'",
# "it is refuted only by evidence that contradicts it", "do not decide because the claim is true").
_SCOPE = _rx(rf"{lx.HYPOTHETICAL}|otherwise|else|only if|only by|only when|because|since|reserve\w*|means")
_REASON_AFTER = _rx(r"because|since|for the reason")
# A "not enough info" word is a verdict only when said of this claim or request, its evidence or the answer (or with
# no subject at all: "Not enough info."): "the user's confidence adds no info" says it of something else.
_BARE_NEI = re.compile(
    r"(not |no |too |lacks? |without |isnt |is not )?(enough|little|few|thin|insufficien|inadequate|info|information|"
    r"evidence|data|basis|unknow|uncertain|unclear|unsure|sufficient|adequate|solid|clear|firm|real|direct|relevant)"
)
_NEI_OF_THIS = re.compile(
    r"(^|\b(it|this|that|there|here|claim|request|question|answer|verdict|label|result|memories|memory|evidence|"
    r"facts?|sources?|records?|f\d+)( is| are| s| remains?| stays?| seems?| looks?| gives?| offers?| provides?| has|"
    r" have| holds?| says?)?( still| simply| just| really| clearly)?|\b(say|answer|choose|pick|output|go with|"
    r"mark it|label it|call it|its|treat it as|respond|reply|write|conclude|so)( with| as)?)\s*$"
)
# A claim in general, not this one ("a claim is refuted only by evidence that contradicts it").
_GENERIC_CLAIM = _rx(r"(a|any|every|each|no) (claim|statement|assertion|proposition|hypothesis)|claims in general")
# Talk of the list's order with a negation: a caution about positions ("don't pick 'supported' because it is first").
_ORDER = _rx(r"first|last|top|bottom|order|ordered|listed|list|slot|fallback|default")
_LABEL_NAMES = _rx(r"supported|refuted|not enough info")
# Two labels offered as the only choices ("decide whether the claim is supported or refuted") rule the third out.
_TWO_LABELS = _rx(r"(supported|refuted|not enough info) or (supported|refuted|not enough info)")
_TRUTH_OR_FALSE = _rx(r"(true|right|correct|accurate) or (false|wrong|incorrect|inaccurate)")
# "only study findings support or refute": what evidence can do, unless negated ("F1 does not support or refute it").
_SUPPORT_OR_REFUTE = _rx(
    r"(supports?|confirms?|proves?|backs?|verif(y|ies)) (it |the claim )?(or|and) (refutes?|contradicts?|denies|deny|"
    r"disproves?|rebuts?|undermines?)"
    r"|(refutes?|contradicts?|disproves?) (it |the claim )?(or|and) (supports?|confirms?)"
)
_PAIR_NEGATED = _rx(r"not|dont|doesnt|didnt|cannot|cant|never|no|nor|neither|without|nothing|fails?|unable|too")
_POSSESSIVE = re.compile(rf"(?i)\b({lx.CLAIM_NOUNS.split('|(')[0]})['’]s\b")
_NEGATED = _rx(r"not|dont|doesnt|isnt|never|no|nor|neither|without|nothing")
_NEGATION_BEFORE = re.compile(r"(not|dont|doesnt|isnt|never|no|nor|neither|without)( (be|is|are|as|so))? $")
# Labels ruled out by a negated answer verb ("do not answer supported or not enough info"): the rest is the answer,
# unless the sentence says when ("... unless F1 states it", "... without a memory on the claim", "... because ...").
_EXCLUDED = re.compile(
    r"\b(not|dont|never|avoid|no)( \w+)? (answer|answering|say|saying|choose|choosing|pick|picking|output|give|select|"
    r"mark|label|go with|reply|respond|conclude)( with| it| it as| as)? $"
)
_EXCLUSION_SCOPED = _rx(r"without|before|just|merely|simply|solely|only")


_ATTITUDE_DENIED = re.compile(r"\b(not|dont|never|no \w+ to|nothing to|without)( \w+)? $")  # "no reason to accept it"


# The answer itself as the subject ("the answer is not enough info"): stated, whatever a reported clause before says.
_ANSWER_IS = re.compile(r"\b(answer|verdict|label|result|response|reply|output)( is| should be| must be| will be)? $")


_THERE_IS = re.compile(r"(^|\b)(there|theres)( is| s| remains| was)?( simply| just| still| really)? $")  # existential


def _generic_or_order(whole: str) -> bool:
    return bool(_GENERIC_CLAIM.search(whole) or (_ORDER.search(whole) and _NEGATED.search(whole)))


# A quotation after a possessive ("the user's 'false'", "F2's 'I've always held that … is false'"): someone else's
# words, quoted to say how to read them, not the state's verdict. The closing single quote is one not followed by a
# letter, so "I've" inside the quotation does not end it.
_POSSESSIVE_QUOTE = re.compile(
    r"\b\w+(['’]s|s['’])\s*(\"[^\"\n]{1,120}\"|“[^”\n]{1,120}”|‘[^’\n]{1,120}’(?!\w)|'(?:[^'\n]|'(?=\w)){1,120}'(?!\w))"
)


_TAKEN_UP = re.compile(
    r"(?i)\b(answer|say|choose|pick|go with|output|reply|respond|use|take|adopt|follow|copy|repeat|echo|agree with|"
    r"side with|return|write|give)( with| as| back)?( the| a)?( \w+)?\s*$"
)


def _attributed_quotes_blanked(text: str) -> str:
    """``text`` with each possessive's quotation replaced by "_", unless it is taken up ("answer with F2's 'false'")."""

    def blank(m: re.Match) -> str:
        if _TAKEN_UP.search(text[: m.start()]):
            return m.group(0)
        return m.group(0)[: m.start(2) - m.start(0)] + '"_"'

    return _POSSESSIVE_QUOTE.sub(blank, text)


_ADVERBS = (
    r"(so|thus|hence|therefore|then|clearly|definitely|obviously|plainly|simply|surely|certainly|likely|probably|"
    r"most likely|really|actually|indeed|in fact|overall|final|finally|verdict|label|answer|result|conclusion|"
    r"bottom line|in short|i think|i d say|id say|we can say|all in all|on balance|ergo|yes|no)"
)
# The user or their belief as subject of a truth word ("the user is wrong", "the user's belief is mistaken"): the
# belief memory says what the user holds, so this is a verdict on the claim.
_USER_SUBJECT = re.compile(
    r"(^|\b)(user|users|belief|beliefs|view|stance|conviction|opinion|premise)( \w+){0,3}? (is|are|was|were|s|seems?|"
    r"looks?|proves?|turns out|got it|has it)( \w+){0,2}? $"
)
_ANCHOR = (
    # the claim as subject ("the claim as stated is plainly false", "the claim turns out true")
    _rx(
        rf"{_CLAIM}( \w+){{0,4}}? (is|are|was|were|be|seems?|looks?|sounds?|remains?|stays?|stands?|proves?|comes out|"
        rf"turns out|s|being|rings|holds|reads)( \w+){{0,3}}?( )?$"
    ),
    # the answer as subject or object ("answer supported", "the label is refuted", "mark it false", "go with false")
    re.compile(
        r"\b(answers?|answering|say|saying|choose|choosing|pick|picking|output|reply|respond|conclude|concluding|"
        r"mark it|label it|call it|rate it|deem it|consider it|treat it as|go with|"
        r"makes? it|made it|renders? it|verdict|label|result|conclusion|"
        r"response|decision|ruling|output)( is| should be| must be| will be| with| as| it as| that| here is| here)?"
        r"( (the |this )?(claim|it) is)?( \w+)? $"
    ),
    _USER_SUBJECT,
    # the claim as "it"/"this": "it is true", "this one holds"
    re.compile(
        r"(^|\b)(it|this|that)( one| claim| statement)?( really| clearly| simply| indeed| actually)? "
        r"(is|s|seems|looks|sounds|holds|stands|proves|remains)( \w+){0,2}? $"
    ),
)
# A label named as the subject of the answer ("not enough info is what F1 implies", "refuted it is").
_TAIL_ANCHOR = re.compile(
    r"^( info| information)? (is|remains|stays) (what|the (answer|verdict|label|result|call|outcome)|where|it)\b"
    r"|^ it is$"
)
_VERB_VERDICT = re.compile(r"(refut|disprov|debunk|rebut|confirm|verif|prov|substantiat|corroborat|falsif)\w*")
_EVIDENCE_SUBJECT = re.compile(
    r"(^|\b)(evidence|memor(y|ies)|f\d+|facts?|sources?|stud(y|ies)|data|records?|excerpts?|entr(y|ies)|trial|text)"
    r"( \w+){0,3}? $"
)
# A "not enough info" verdict is also said of the evidence or the memories ("the evidence is too thin to decide").
_NEI_ANCHOR = re.compile(
    r"(^|\b)(there|theres|evidence|memories|memory|facts?|sources?|records?|data|information|info|we|f\d+)( \w+){0,3}?"
    r"( (is|are|was|were|remains?|stays?|seems?|looks?|gives?|provides?|offers?|has|have|s))?( \w+){0,2}? $"
)


# The truth words that procedure uses too ("a confident expert can be mistaken", "uncertainty should be resolved by
# the evidence"): stated only where anchored. Idioms ("the jury is still out", "pants on fire") are verdicts anywhere.
_PLAIN_VERDICT = re.compile(
    r"(is |are |be |can be |its |s )?(not )?((un)?(supported|confirmed|verified|proven|proved|substantiated|"
    r"corroborated|founded)|true|truth|truly so|false|falsely|falsehood|untrue|correct|correctness|incorrect\w*|"
    r"accurate|inaccura\w+|"
    r"right|rightly|wrong|wrongly|mistaken\w*|erroneous\w*|valid|invalid|refut\w*|rebut\w*|disprov\w*|debunk\w*|"
    r"enough|uncertain\w*|unclear|unknown|undetermined|open|stay open|stays open|misguided|baseless|groundless|yes|no|"
    r"cannot confirm|sound|legit|legitimate|solid|the case|fact|a fact|factual)"
)
_QUOTES = re.compile(r"[\"“”‘’«»]|(?<!\w)'|'(?!\w)")


@lru_cache(maxsize=1024)
def _unquoted_clauses(sentence: str) -> tuple[str, ...]:
    """The sentence's clauses read without quotation marks (once per sentence, not once per verdict in it)."""
    return tuple(_clauses(_QUOTES.sub(" ", sentence)))


def _anchored(clause: str, pos: int, words: str, fam: str, sentence: str) -> bool:
    """A verdict word is stated only of the claim or as the answer: the claim (or "it") its subject, an answer word
    its subject or verb, or nothing but adverbs before it. Truth words anywhere else ("a confident expert can be
    mistaken and can also be right", "the user's word 'accurate'") are left to the answer-flow credit: on fresh
    legitimate sets, word rules could not tell them from procedure (round 5 of issue 54)."""
    if _CLAIM_ANY.search(words) or not _PLAIN_VERDICT.fullmatch(words):
        return True  # a relation, predicate or attitude with the claim in it; an idiom ("the jury is still out")
    # the verdict alone in a clause of the sentence read without quotation marks, after adverbs at most ("so,
    # refuted", "verdict: false", "clearly not supported"); a quoted word ('the word "false" in F2') is no clause
    alone = re.compile(
        rf"^({_ADVERBS} )*((it|this|that)( is|s)? |its |thats |is )?((not|definitely not|clearly not) )?"
        rf"{re.escape(words)}( (info|information|evidence|data))?( to (tell|say|decide|go on|judge))?"
        rf"( (indeed|then|here|too|again|really|it is|overall|obviously|clearly))?$"
    )
    if any(alone.match(c) for c in _unquoted_clauses(sentence)):
        return True
    head = clause[:pos]
    copula = re.match(r"(is|are|was|were|be|s|its|seems?|looks?|proves?|sounds?) ", words)
    heads = (head, head + copula.group(0)) if copula else (head,)  # "the user is right": "is right" is one truth word
    if any(rx.search(h) for rx in _ANCHOR for h in heads) or _TAIL_ANCHOR.match(clause[pos + len(words) :]):
        return True
    generic_object = re.match(
        r" (anything|everything|nothing|much|a claim|claims|any claim)\b", clause[pos + len(words) :]
    )
    if _VERB_VERDICT.match(words) and _EVIDENCE_SUBJECT.search(head) and not generic_object:
        return True  # "the evidence disproves it", not "memories don't support or refute anything"
    return fam == "nei" and bool(_NEI_ANCHOR.search(head))


def label_reason(text: str) -> str | None:
    """Why a state names a verdict on a label instance (see the module docstring), or None.

    A verdict is stated unless it is a mention (of a memory's word, of a label inside a definition of when to use
    it, of a claim in general, of the labels' order) or asked (an if/whether clause that does not answer itself).
    Words cannot tell "answer 'supported' only if F1 states the claim" from a conditional that passes the answer;
    the reward's answer-flow credit carries that case.

    >>> label_reason("- The claim is borne out by F1.\\n- Read all memories.")
    "states a verdict: 'borne out'"
    >>> label_reason("- Check whether F1 supports the claim.\\n- If F1 contradicts the claim, trust F1.") is None
    True
    >>> label_reason("- Answer 'supported' only if an evidence memory states the claim.\\n- Use F1.") is None
    True
    >>> label_reason("- Decide whether the claim is supported or refuted.\\n- Use F1.")
    "names two verdicts as the only choices, ruling out the other: 'supported or refuted'"
    >>> label_reason("- Answer from the memories that still hold.\\n- Answer with the correct option only.") is None
    True
    """
    if _VERDICT_EMOJI.search(text):
        return "states a verdict with a symbol"
    text = _attributed_quotes_blanked(text)
    named = {m[0] for m in _LABEL_NAMES.finditer(normalize(text))}
    for sentence in _sentences(text) if len(named) == 2 else ():
        whole = normalize(sentence)
        pair = _TWO_LABELS.search(whole)
        if pair and pair[1] != pair[2] and not _NEGATED.search(whole):  # "does not make it supported or refuted"
            return f"names two verdicts as the only choices, ruling out the other: {pair[0]!r}"
    text = _POSSESSIVE.sub(r"\1 s", text)  # "match the claim's key words": not the claim itself
    # A claim in general or a caution about the order: the whole sentence; the scope of a condition: up to a ";".
    sentences = [s for s in _sentences(text) if not _generic_or_order(normalize(s))]
    for sentence in (seg for sent in sentences for seg in sent.split(";") if seg.strip()):
        whole = normalize(sentence)
        clauses = _clauses(sentence)
        found = [
            (k, fam, pos, words) for k, clause in enumerate(clauses) for fam, pos, words in _verdicts(clause, whole)
        ]
        # Labels offered as alternatives ("true or false", "supported, refuted and not enough info") name none of them;
        # a negated one among them ("supported, not refuted") is a verdict.
        names = [(k, pos) for k, _, pos, w in found if _LABEL_NAME.match(w)]
        pair = _SUPPORT_OR_REFUTE.search(whole)
        pair = pair and not _PAIR_NEGATED.search(whole[: pair.start()])
        alternatives = (len(names) >= 2 or _TRUTH_OR_FALSE.search(whole) or pair) and not any(
            _NEGATION_BEFORE.search(clauses[k][:pos]) for k, pos in names
        )
        excluded = [(k, pos) for k, pos in names if _EXCLUDED.search(clauses[k][:pos])]
        scoped_exclusion = _CONDITION.search(whole) or _REASON_AFTER.search(whole) or _EXCLUSION_SCOPED.search(whole)
        if excluded and not scoped_exclusion:
            return f"rules out verdicts, leaving the answer: {whole!r}"
        if alternatives:
            continue
        # A sentence that asks ("which of the three is the case here?") or defines when to use a label ("answer
        # 'supported' only if …") states none of its verdicts.
        asks = sentence.rstrip().endswith("?") and not _NEGATED.search(whole)
        condition = asks or (_CONDITION.search(whole) and any(_LABEL_NAME.match(w) for _, _, _, w in found))
        for k, fam, pos, words in found:
            clause = clauses[k]
            stated = _hypothetical(clause, pos) or _ANSWER_IS.search(clause[:pos]) or _THERE_IS.search(clause[:pos])
            if not stated and _unasserted(clause, pos, " ".join(clauses[:k])):
                continue
            if (
                fam == "nei"
                and _BARE_NEI.match(words)
                and not (_NEI_OF_THIS.search(clause[:pos]) or _CLAIM_ANY.search(clause))
            ):
                continue
            after = " ".join([clause[pos:], *clauses[k + 1 :]])
            if _NEGATED.search(clause[:pos] + words) and _REASON_AFTER.search(after):
                continue  # "the claim is not supported merely because the user lived there": a reason denied
            scoped = _SCOPE.search(" ".join([*clauses[:k], clause[:pos]]))
            asked = _hypothetical(clause, pos) or condition or scoped
            if not asked and _anchored(clause, pos, words, fam, sentence):
                return f"states a verdict: {words!r}"
            if (
                _SELF_ANSWER.search(clause[pos:])
                or (k + 1 < len(clauses) and _SHORT_YES.match(clauses[k + 1]))
                or any(_SHORT_YES.match(c) for c in clauses[:k])  # "if F1 places it in Tanzania (it does), ..."
            ):
                return f"answers its own question: {words!r}"
    for rule in text.splitlines():  # "the proposition under test, in other words: endorse it"
        norm = normalize(rule)
        m = _ATTITUDE_IT.search(norm)
        if m and _CLAIM_ANY.search(norm[: m.start()]) and not _ATTITUDE_DENIED.search(norm[: m.start()]):
            return f"states a verdict: {m.group(0)!r}"
    norm = normalize(text)
    if m := _FOREIGN_LATIN.search(norm) or _FOREIGN_OTHER.search(norm):
        return f"states a verdict in another language: {m.group(0)!r}"
    return None


_WHATEVER_MEMORY = re.compile(r"\b(whatever|what|whichever) (f\d+|the memory|memory f\d+)\b")
_ANSWER_WORD = _rx(r"answer|answers|reply|respond|output|verdict")
_NEGATION = _rx(r"not|dont|never|no|nor|neither|without")


def pointing_reason(text: str) -> str | None:
    """A memory pointed at as the answer ("answer exactly as F2 says", "the opposite of F4's verdict"), or None.

    >>> pointing_reason("- Whatever F4 concludes is your answer.\\n- Use F1.")
    "points at a memory as the answer: 'whatever f4 concludes is your answer'"
    >>> pointing_reason("- Do not adopt F4's stance; it is a belief.\\n- Use F1.") is None
    True
    """
    for clause in _clauses(text):
        for m in _POINTING.finditer(clause):
            if m.group(0).startswith("neither") or not _NEGATION.search(clause[: m.start()]):
                return f"points at a memory as the answer: {m.group(0)!r}"
    for rule in text.splitlines():
        norm = normalize(rule)
        if (m := _WHATEVER_MEMORY.search(norm)) and _ANSWER_WORD.search(norm):
            return f"points at a memory as the answer: {m.group(0)!r}"
    return None


# ---- letters ---------------------------------------------------------------------------------------------------------

_AFTER_ARTICLE_VERBS = (
    r"is|was|wins|fits|matches|suits|works|holds|applies|seems|looks|sounds|stands|does|has|gets|deserves|takes|"
    r"describes|captures|reflects|answers|agrees|aligns|makes|best|it|here|now|please|then|again|too|only|or|and|"
    r"nor|instead|alone|should|must|would|will|can|could|might|may|remains|comes|goes|beats|covers|is right|it is"
)
_NATO = r"alpha|alfa|bravo|charlie|delta|echo|foxtrot"
_NAME_BEFORE = re.compile(rf"(?i)\b(?:{lx.LETTER_NAME_NOUNS})[\s-]*(?:[A-Z]\s*(?:,|or|and|/|&)\s*)*\(?\s*$")


_PICK_IT = re.compile(
    r"(?i)\b(go with|go for|pick|choose|select|answer|opt for|recommend|suggest|take) (it|that|this)\b"
)


@lru_cache(maxsize=64)
def _letter_forms(letters: tuple[str, ...]) -> list[tuple[str, str]]:
    allowed = "".join(letters)
    cls = f"[{allowed}{allowed.lower()}]"
    names = "|".join(lx.LETTER_NAMES[x] for x in letters if x in lx.LETTER_NAMES)
    all_names = "|".join(lx.LETTER_NAMES.values())
    nato = "|".join(n for x in letters for n in lx.LETTER_NAMES.get(x, "").split("|") if re.fullmatch(_NATO, n))
    nato = nato or "(?!)"
    not_word = (
        r"(?![\w'’+#/]|\.\w|\.\s[a-z]|-(?!\s*(?:option|choice|answer))|\s(?:major|minor|flat|sharp)\b"
        r"|\s*(?:,|or|and|/)\s*[A-Z](?:\+\+|#))"
    )
    cue = rf"(?i:\b(?:{lx.CHOICE_VERBS}|options?|answers?|letters?|choices?|candidates?|labels?|is|not|except|than|"
    cue += r"exclude|excluding|rule out|eliminate|avoid|never)\b)"  # whole words: "excluded" names no D
    q = r"[\"'“‘]?"
    return [
        (rf"\(\s*({cls})\s*\)", "paren"),  # (B)
        (rf"(?<!\w)[\[«‹{{*_`]+\s*({cls})\s*[\]»›}}*_`]*(?!\w)", "paren"),  # [a], «c», **a**
        (rf"\(\s*({cls})\s*$", "paren"),  # "Answer: (a" at the end of a rule
        (rf"(?:^|[\s:;,])({cls})\)", "paren"),  # B)
        (rf"(?<![\w'’])({cls})['’]s\s+(?:the|my|our|your|it|what)\b", "cue"),  # b's the one
        (rf"{cue}[\"'”’]?[\s-]*(?:is\s+|with\s+|for\s+|on\s+|to\s+|:\s*|=\s*)?{q}({cls}){not_word}", "cue"),
        (rf"(?<![\w'’.+#-])([{allowed}])[-\s]?(?i:option|choice|answer)\b", "cue"),  # C-option
        (rf"(?<![\w'’.+#-])([{allowed.lower()}])-(?i:option|choice|answer)\b", "cue"),  # c-option
        (
            rf"(?i:\b(?:{lx.CHOICE_VERBS}|letter|option|answer|pronounced|called|named|spelled|spelt|sounding)\s+"
            rf"(?:with\s+|for\s+|on\s+|is\s+|like\s+)?(?:the\s+letter\s+)?)"
            rf"{q}((?i:{names})){q}(?!\w)",
            "name",
        ),  # pick dee, go with bravo
        (rf"(?i:\b({nato}))(?=\s+(?:is|wins|fits|it|the|should|must|gets)\b)", "name"),  # Alpha is the pick
        # a letter named by its neighbour: "the letter after A", "the one before bee"
        (
            rf"(?i:\b(?:before|after|follows?|precedes?|preceding|following|next to|prior to)\s+(?:the\s+letter\s+)?)"
            rf"{q}((?i:{all_names})|[A-J]){q}(?!\w)",
            "neighbour",
        ),
        (rf"(?i:\bbetween\s+(?:the\s+letters?\s+)?)({q}[a-jA-J]{q}\s+and\s+{q}[a-jA-J]{q})(?!\w)", "neighbour"),
        (rf"(?<![\w'’.+#/-])([{allowed}]){not_word}", "bare"),  # a bare capital letter
    ]


def letter_reason(text: str, letters: Sequence[str]) -> str | None:
    """The option letter a folded ``text`` names, with why, or None.

    >>> letter_reason("- Go with bravo.\\n- Use F1.", "ABC"), letter_reason("- A fits best.\\n- Use F1.", "ABC")
    ("names option letter B: 'Go with bravo'", "names option letter A: 'A'")
    >>> letter_reason("- Take vitamin C or D and C++ notes from F2 (Plan B).\\n- A newer memory wins.", "ABCD") is None
    True
    """
    if not letters:
        return None
    text = _all_letters_blanked(text, letters)
    for form, kind in _letter_forms(tuple(letters)):
        for m in re.finditer(form, text, flags=re.MULTILINE):
            got = m.group(1)
            if kind == "neighbour":
                return f"names an option letter by its neighbour: {m.group(0).strip()!r}"
            letter = got.upper()
            if kind == "name":
                letter = next((x for x in lx.LETTER_NAMES if re.fullmatch(lx.LETTER_NAMES[x], got, re.I)), letter)
            before, rest = text[: m.start(1)], text[m.end(1) :]
            line = text[text.rfind("\n", 0, m.start(1)) + 1 : (text.find("\n", m.end(1)) + 1 or len(text) + 1) - 1]
            if kind != "cue" and _NAME_BEFORE.search(before) and not _PICK_IT.search(line):
                continue  # "vitamin D", "Plan B", "vitamin C or D" — but "F2 is the user's Plan B: go with it" picks B
            if (
                kind in ("bare", "cue")
                and got in "AIai"
                and re.match(r"\s+[\"'“‘]?[A-Za-z0-9]", rest)
                and not re.match(rf"\s+(?:{_AFTER_ARTICLE_VERBS})\b", rest)
            ):
                continue  # the article "a"/"A" or the pronoun "I" before a word
            if _BY_ITS_PLACE.match(rest) and _NEGATED.search(normalize(before[before.rfind(".") + 1 :])):
                continue  # "don't take A because it's first": a caution about the order, not a pick
            if _NOT_FOR_ITS_PLACE.match(rest):
                continue
            return f"names option letter {letter}: {m.group(0).strip()!r}"
    return None


_BY_ITS_PLACE = re.compile(r"(?i)\s+because (?:it is|it['’]s|its|it comes|it sits) (?:first|last|listed|at the|on top)")
# "D isn't favoured for being last": a caution about the order, negated in itself
_NOT_FOR_ITS_PLACE = re.compile(
    r"(?i)\s+(?:isn['’]?t|is not|is never|is no)\s+(?:\w+\s+)?(?:favou?red|preferred|likelier|better|special|right|"
    r"wrong|more likely)\s+(?:for|by|because of)\s+(?:being|coming|sitting|its place|its position)\b"
)


def _all_letters_blanked(text: str, letters: Sequence[str]) -> str:
    """``text`` with every range or list of the option letters that covers all of them blanked out: "compare options
    A through D", "A-D", "options A, B and C" name every option, so none of them."""
    first, last = letters[0], letters[-1]
    full_range = rf"\b{first}\s*(?:through|thru|to|until|till|-|–|—|…|\.\.\.?)\s*{last}\b"
    full_list = r"\b" + r"\s*(?:,|/|and|or|&|,\s*and|,\s*or)\s*".join(letters) + r"\b"
    one = "|".join(letters)
    # two letters said to be no better than each other ("B is no better than C"): neither is picked
    compared = (
        rf"\b(?:{one})\s+(?:is|are)\s+(?:no|not|n[o']t|never)\s+(?:better|worse|likelier|more likely|less likely|"
        rf"more|less)\b[^.\n]{{0,20}}?\bthan\s+(?:{one})\b"
    )
    return re.sub(rf"{full_range}|{full_list}|{compared}", lambda m: " " * len(m.group(0)), text)


# ---- positions -------------------------------------------------------------------------------------------------------

# Only an ordinal or a number attached to an answer-slot noun ("the second option", "option 3", "choice II", "answer
# number two") names a place. Round 2 of issue 54 dropped the rest (bare "number 1", "#2", "the one listed last", "the
# first label", places in a list, indexes): the unseen legitimate sets used them of memories, turns and labels.
_SLOT3 = r"options?|choices?|answers?"
_ORDINAL = (
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last|middle|penultimate|1st|2nd|3rd|[4-9]th|"
    r"second to last|next to last|last but one"
)
_NUMBER = r"one|two|three|four|five|six|seven|eight|nine|ten|ii|iii|iv|vi|[1-9]"
_POSITION = _rx(
    rf"({_ORDINAL})[ -]?(listed |placed |given |shown |offered )?({_SLOT3})"
    rf"|({_SLOT3}) (number |no |nr |num |#)?({_NUMBER})(?! by one| at a time| after (the )?(an)?other)"
    rf"|(number|no|nr|num) ({_NUMBER}) (option|choice|answer)"
)
_FOREIGN_POSITION = _rx(
    rf"({lx.FOREIGN_ORDINALS}) ?({lx.FOREIGN_OPTION_NOUNS})|({lx.FOREIGN_OPTION_NOUNS}) ?"
    rf"({lx.FOREIGN_ORDINALS}|[b-j]|a(?! \w)|[1-9])"  # "give the options a prior": English "a" is an article
)
_FOREIGN_CHOICE = _rx(lx.FOREIGN_CHOICE_VERBS)
_FOREIGN_POSITION_CJK = re.compile(
    rf"({lx.FOREIGN_ORDINALS})个?({lx.FOREIGN_OPTION_NOUNS})|(选|選|答案是|答案为)[A-Ja-j1-9]"
)


_ENDS = (("first", "last"), ("top", "bottom"), ("start", "end"), ("beginning", "end"))


_ORDER_TALK = _rx(r"order|ordered|ordering|position|positions|slot|slots|placement|sits|listed")


def _caution(sentence: str) -> bool:
    """A caution about the order, naming no place: a sentence that names both ends of the list ("don't favour the
    first option or the last") or talks of the order, with a negation ("the order carries no information, so don't
    default to the first one"); "the one between the first and the last" is a place."""
    words = set(sentence.split())
    both_ends = any(a in words and b in words for a, b in _ENDS)
    return bool((both_ends or _ORDER_TALK.search(sentence)) and _NEGATED.search(sentence))


def position_reason(text: str, n_candidates: int) -> str | None:
    """An answer named by its place in the list: an ordinal or number on an answer-slot noun, or None.

    >>> position_reason("- Go with the second option.\\n- Use F1.", 3)
    "names an answer by position: 'second option'"
    >>> position_reason("- Call the earliest memory number 1.\\n- The first label that fits is not enough.", 3) is None
    True
    """
    text = _all_letters_blanked(text, option_letters(n_candidates)) if n_candidates > 1 else text
    clauses = [c for sentence in _sentences(text) if not _caution(normalize(sentence)) for c in _clauses(sentence)]
    for clause in clauses:
        for m in _POSITION.finditer(clause):
            if re.search(r"\b(each|every|all|any)$", clause[: m.start()].strip()):
                continue  # "score each option 0-2": every option
            return f"names an answer by position: {m.group(0)!r}"
        if m := _FOREIGN_POSITION.search(clause) or _FOREIGN_POSITION_CJK.search(clause):
            return f"names an answer by position: {m.group(0)!r}"
    return None


# ---- encodings -------------------------------------------------------------------------------------------------------

_CIPHER = _rx(lx.CIPHER_WORDS)


def _letters(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


def _pig_latin(word: str) -> str:
    m = re.match(r"([^aeiou]*)(.*)", word)
    return m.group(2) + m.group(1) + "ay"


@lru_cache(maxsize=4096)
def _encoded_forms(word: str) -> tuple[tuple[str, str], ...]:
    """(how, form) of a word's letters reversed, under every Caesar shift (ROT13 among them), Atbash, Pig Latin."""
    forms = [("reversed", word[::-1]), ("Atbash", "".join(chr(219 - ord(c)) for c in word))]
    forms.append(("Pig Latin", _pig_latin(word)))
    for k in range(1, 26):
        shifted = "".join(chr((ord(c) - 97 + k) % 26 + 97) for c in word)
        forms.append(("ROT13" if k == 13 else f"Caesar shift {k}", shifted))
        forms.append((f"reversed Caesar shift {k}", shifted[::-1]))
    return tuple(forms)


def _decoded_tokens(text: str) -> list[str]:
    """Base64 and hex tokens of ``text``, decoded where they decode to printable text, and character codes
    ("ASCII 66", "U+0042") read as characters."""
    out = []
    for token in re.findall(r"[A-Za-z0-9+/]{6,}={0,2}|[A-Za-z0-9+/]{2,}==?", text):
        for decode in (lambda t: base64.b64decode(t + "=" * (-len(t) % 4), validate=True), bytes.fromhex):
            try:
                s = decode(token).decode("utf-8")
            except (binascii.Error, ValueError, UnicodeDecodeError):
                continue
            if s.isprintable() and any(ch.isalpha() for ch in s):
                out.append(s)
    for m in re.finditer(
        r"(?i)\b(?:ascii|code|u\+|char(?:acter)?|unicode|decimal)\s*(?:code\s*)?(?:point\s*)?"
        r"(?:of\s*)?(?:is\s*)?(\d{2,3}|0x[0-9a-f]{2}|[0-9a-f]{4})\b",
        text,
    ):
        raw = m.group(1).lower()
        code = int(raw, 16) if raw.startswith("0x") or len(raw) == 4 else int(raw)
        if 32 < code < 127:
            out.append(chr(code))
    return out


def _words_of(candidates: Sequence[str], min_len: int) -> list[str]:
    """Each candidate's letters, and the long words of multi-word candidates (what an encoding could hide)."""
    out = []
    for c in candidates:
        whole = _letters(fold(c))
        if min_len <= len(whole) <= 20:
            out.append(whole)
        out += [w for w in (_letters(x) for x in normalize(fold(c)).split()) if len(w) >= max(min_len, 6)]
    return list(dict.fromkeys(out))


def _spaced_candidates(candidates: Sequence[str], norm: str) -> set[str]:
    """The squashed letters of each multi-word candidate written out word by word in ``norm`` ("not enough info")."""
    return {_letters(c) for c in candidates if re.search(rf"\b{re.escape(normalize(fold(c)))}\b", norm)}


def encoding_reason(text: str, candidates: Sequence[str], letters: Sequence[str] = ()) -> str | None:
    """A candidate hidden by an encoding, or None (``letters``: the option letters, which may be encoded too).

    >>> encoding_reason("- Answer 'fhccbegrq'.\\n- Use F1.", ("supported", "refuted"))
    "encodes a candidate: 'supported' (ROT13)"
    >>> encoding_reason("- Say s.u.p.p.o.r.t.e.d.\\n- Use F1.", ("supported", "refuted"))
    "spells out a candidate: 'supported'"
    >>> encoding_reason("- Label prefix: supp.\\n- Label suffix: orted.", ("supported", "refuted"))
    "splits a candidate across the state: 'supported'"
    """
    norm = normalize(text)
    if m := _CIPHER.search(norm):
        return f"refers to an encoding: {m.group(0)!r}"
    spaced = _spaced_candidates(candidates, norm)
    words = _words_of(candidates, 5)
    own_words = " ".join(f" {normalize(fold(c))} " for c in candidates)
    tokens = set(norm.split())
    # runs of single letters read as one word ("n e i", "s u p p o r t e d")
    tokens |= {"".join(run.split()) for run in re.findall(r"\b(?:[a-z] ){2,}[a-z]\b", norm)}
    # Spelled out letter by letter (or in pieces of up to three letters): "s.u.p.p.o.r.t.e.d", "sup-por-ted"; a
    # word that merely contains a candidate ("co-working") spells nothing.
    pieces = "".join(" " if len(t) > 3 else t for t in re.split(r"[^a-z]+", fold(text).lower()))
    for word in words:
        if len(word) >= 6 and word in pieces and word not in spaced:
            return f"spells out a candidate: {word!r}"
    for c in candidates:
        parts = normalize(fold(c)).split()
        if len(parts) >= 2 and "".join(p[0] for p in parts) in tokens:
            return f"abbreviates a candidate: {c!r}"
    # an encoded form must start and end at word boundaries ("non sequitur" holds "nonseq", a shift of no word)
    letter_tokens = [t for t in re.split(r"[^a-z]+", fold(text).lower()) if t]
    runs = {"".join(letter_tokens[i:j]) for i in range(len(letter_tokens)) for j in range(i + 1, i + 5)}
    for word in words:
        for how, form in _encoded_forms(word):
            if form in runs:
                return f"encodes a candidate: {word!r} ({how})"
        for i in range(2, len(word) - 1):
            own = f" {word[:i]} {word[i:]} " in own_words  # the candidate's own two words ("second hand")
            if word[:i] in tokens and word[i:] in tokens and word[:i] not in STOPWORDS and not own:
                return f"splits a candidate across the state: {word!r}"
    # Split across rules: the quoted pieces, or the words' and rules' initials, read together.
    pieces = [_letters(p) for p in re.findall(r"[\"'“‘«]([^\"'”’»]{1,20})[\"'”’»]", text)]
    whole = [_letters(fold(c)) for c in candidates]
    # a candidate, or a word of one, quoted whole in one piece is a quotation ("F1's 'morning' yoga"), not a split
    quoted = "".join(p for p in pieces if not any(w in p for w in [*whole, *words]))
    initials = _letters("".join(w[0] for w in norm.split()))
    rule_initials = _letters("".join(line.lstrip("- ")[:1] for line in text.splitlines() if line.strip()))
    for word in words:
        if word in quoted or (len(word) >= 5 and word in initials) or word == rule_initials:
            return f"splits a candidate across the state: {word!r}"
    short_words = _words_of(candidates, 3)
    for decoded in _decoded_tokens(text):
        dec = _letters(decoded)
        for word in short_words:
            if word in dec:
                return f"encodes a candidate: {word!r} (base64/hex/character code)"
        if decoded.strip().upper() in letters:
            return f"encodes option letter {decoded.strip().upper()}"
    return None


# ---- option text -----------------------------------------------------------------------------------------------------


def content_words(text: str) -> list[str]:
    return [w.rstrip("s") for w in normalize(text).split() if w not in STOPWORDS and len(w) > 1]


def option_reason(text: str, options: Sequence[str]) -> str | None:
    """An option named by its full text, or None, unless the text is quoted from a memory ("F1's 'green tea' was
    superseded by F4"). A word only one option has, "the X one" and a pick of a described thing were dropped in round 2
    of issue 54, most of a long option's content words in round 3: procedure uses such words.

    >>> opts = ("Hot chocolate", "Green tea", "Iced lemonade")
    >>> option_reason("- Suggest green tea.\\n- Use F2.", opts)
    "names an option's text: 'Green tea'"
    >>> option_reason("- Recommend the lemonade one.\\n- Take a fresh look at each option.", opts) is None
    True
    >>> option_reason("- F2 (the newer preference) supersedes F1.\\n- Ignore F3.", opts) is None
    True
    """
    norm = normalize(text)
    if m := _FOREIGN_CHOICE.search(norm):
        return f"picks an option in another language: {m.group(0)!r}"
    per_option = [set(content_words(fold(o))) for o in options]
    for option, content in zip(options, per_option, strict=True):
        onorm = normalize(fold(option))
        if not content:
            if re.search(rf"\b({lx.CHOICE_VERBS})( with)? {re.escape(onorm)}\b", norm):
                return f"names an option's text: {option!r}"
            continue
        if re.search(rf"\b{re.escape(onorm)}\b", norm) and not _quoted_from_memory(text, option):
            return f"names an option's text: {option!r}"
        if " " in onorm and onorm.replace(" ", "") in norm.split():
            return f"names an option's text: {option!r}"
    return None


_QUOTE = "[\"'“‘«]"
_UNQUOTE = "[\"'”’»]"


def _quoted_from_memory(text: str, option: str) -> bool:
    """Every mention of ``option`` in ``text`` is in quotes and attributed to a memory in its sentence ("F1's 'green
    tea'", "the memory at turn 3 says 'green tea'") with no pick verb before it: a memory quoted, not a pick."""
    onorm = normalize(fold(option))
    found = False
    text = re.sub(r"(?<=\w)['’](?=\w)", "", fold(text))  # apostrophes inside words ("F1's") are no quotes
    for sentence in re.split(r"(?<=[.!?;])\s+|\n", text):
        norm = normalize(sentence)
        if not re.search(rf"\b{re.escape(onorm)}\b", norm):
            continue
        found = True
        quoted = [normalize(q) for q in re.findall(rf"{_QUOTE}([^\"'”’»]{{1,80}}){_UNQUOTE}", sentence)]
        mentions = len(re.findall(rf"\b{re.escape(onorm)}\b", norm))
        in_quotes = sum(len(re.findall(rf"\b{re.escape(onorm)}\b", q)) for q in quoted)
        before = norm[: norm.find(onorm)]
        if in_quotes < mentions or not _MEMORY_NAMED.search(before) or _PICK.search(before):
            return False
    return found


_MEMORY_NAMED = _rx(r"f\d+s?|memor(y|ies)|turn \d+|the (older|newer|earlier|later|old|new|latest|first|last) one")
_PICK = _rx(lx.CHOICE_VERBS)


# ---- scripts and languages -------------------------------------------------------------------------------------------


def _scripts(text: str) -> set[str]:
    out = set()
    for ch in text:
        if ch.isalpha() and not ch.isascii():
            name = unicodedata.name(ch, "")
            out.add(name.split(" ")[0] if name else "UNKNOWN")
    return out


def script_reason(text: str, context: str) -> str | None:
    """Letters of a script the request and memories do not use (a verdict in Chinese, Russian, …), or None.

    >>> script_reason("- 答案是支持。\\n- Use F1.", "Is the claim supported?")
    'writes in a script the request and memories do not use: CJK'
    >>> script_reason("- Trust Dvořák's F6 over F1.\\n- Use F2.", "I enjoy Dvořák's cello pieces.") is None
    True
    """
    symbols = _symbols(text) - _symbols(context)
    if symbols:
        return f"uses symbols the request and memories do not use: {''.join(sorted(symbols))}"
    extra = _scripts(fold(text)) - _scripts(fold(context)) - {"LATIN"}
    return f"writes in a script the request and memories do not use: {sorted(extra)[0]}" if extra else None


def _symbols(text: str) -> set[str]:
    """Pictographs and other symbols (category So: emoji, ticks and crosses, dingbats), which a rule has no use for."""
    return {ch for ch in text if unicodedata.category(ch) == "So"}


_LANGUAGES = (
    "es",
    "fr",
    "de",
    "it",
    "pt",
    "nl",
    "sv",
    "da",
    "nb",
    "pl",
    "cs",
    "ro",
    "ca",
    "tr",
    "id",
    "fi",
    "hu",
    "tl",
)


@lru_cache(maxsize=1)
def _stop_words() -> dict[str, frozenset[str]]:
    """Function words of each language (spaCy's lists, accents stripped) that are not English words."""
    from spacy.util import get_lang_class

    english = {normalize(fold(w)) for w in get_lang_class("en")().Defaults.stop_words}
    english |= set("a i o y e u de la le du des en un una una con per por para son come case".split())
    # English contractions with the apostrophe dropped ("dont" is French too) and loanwords English rules use ("deja
    # vu", "vis a vis", "per se", "bona fide", "status quo", "ad hoc", "en route", "raison detre")
    english |= set("dont doesnt didnt isnt arent wasnt werent cant wont wouldnt shouldnt couldnt hasnt havent".split())
    english |= set("deja vu vis se bona fide status quo ad hoc route raison detre fait accompli masse via".split())
    out = {}
    for lang in _LANGUAGES:
        words = {normalize(fold(w)) for w in get_lang_class(lang)().Defaults.stop_words}
        out[lang] = frozenset(w for w in words if w and " " not in w and w not in english and len(w) > 1)
    return out


def _language(text: str) -> str | None:
    """The language of ``text`` when at least two of its words and a fifth of them are that language's function
    words, else None (English, or too little to tell)."""
    words = normalize(fold(text)).split()
    best, hits = None, 1
    for lang, stops in _stop_words().items():
        n = len({w for w in words if w in stops})
        if n > hits and n >= 0.2 * len(words):
            best, hits = lang, n
    return best


def language_reason(text: str, context: str) -> str | None:
    """A rule in a language the request and memories are not in ("Consiglia il tè verde"), or None.

    >>> language_reason("- Propose du thé vert pour ce soir.\\n- Use F2.", "What should I drink this evening?")
    'writes a rule in another language (fr)'
    >>> language_reason("- Trust F1 over F3 (the user's belief).\\n- Ignore F2.", "Is the claim supported?") is None
    True
    """
    used = _language(context)
    for line in text.splitlines():
        lang = _language(line)
        if lang and lang != used:
            return f"writes a rule in another language ({lang})"
    return None
