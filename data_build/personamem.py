"""PersonaMem questions + shared contexts → preference Instances (multiple choice over a user's chat history).

The files (``questions_*.csv``, ``shared_contexts_*.jsonl``) are read and validated by the core reader,
``memstate.sources.personamem`` (the format is described there), which ``memory`` ingests the contexts with too. The
history of a question is the first ``end_index_in_shared_context`` messages of its context (as the official
evaluation slices it); of the (large) contexts file only the referenced contexts are kept.

Per question, the facts are user turns of its history (system and assistant turns dropped, ``User:`` prefixes
stripped, repeated texts kept once at their latest turn):

- **gold**: the ``max_facts`` turns most similar to the question (cosine of sentence embeddings; each context's
  user turns are embedded once and reused by all of its questions);
- **support**: the ``latest_mentions`` most recent user turns, when not already gold (what the user said last),
  and, for every kept turn, the later turn of the history that supersedes it (below) when it was not picked
  otherwise, so an instance never shows a stale statement without the statement that replaced it;
- **outdated**: a kept turn that a later kept turn supersedes, whatever it was picked as;
- **distractor**: a few user turns of the same history (so of the same persona, and from before the question)
  about something else: among the turns not kept and unlike every kept one (cosine < ``unlike_threshold``),
  the ``2 × max`` least similar to the question form a pool, shuffled with a seed derived from the instance id,
  from which ``randint(*distractors)`` mutually unlike turns are taken (fewer when the history is short).

All facts are ordered by turn and numbered F1..Fn in that order. ``turn`` is the message's 0-based index in the
shared context (so every fact's turn is < ``end_index``), ``time`` is ``"turn N"``.

Fact kind (``fact_kind``) is a keyword heuristic: **preference** when the turn states a like or dislike — a
first-person subject followed within three words by a liking verb (love, like, enjoy, prefer, adore, hate,
dislike, detest, loathe, appreciate; not "would/could/should like", which asks for something), or a phrase such
as "favourite", "fan of", "can't stand", "gone off", "fond of", "rather", "keen on", "into"; else **experience**
when it reports something the user did or went through (a first-person subject near a past-tense event verb, or
a time marker such as "last weekend", "yesterday", "recently"); else **fact**.

Relations (``relation_edges``) come from the memory pipeline's one relation rule (``memstate.memory.relation_rule``,
version in ``stats["relation_rule"]`` and the manifest), applied to the user turns of the history (one person, the
user; MiniLM cosine as its same-thing test): a turn that says the user's view changed ("I've gone off spicy food
lately …") SUPERSEDES the nearest earlier, still current turn about the same thing, and a one-sentence claim
CONFLICTS_WITH an earlier one it negates. The policy so learns from edges drawn as the memory pipeline serves them.
Edges point backwards in time and each turn is superseded at most once, so changes read as a chain F9 → F5 → F1.
Both ends of a SUPERSEDES state a stance: a turn the keyword heuristic calls an ``experience`` becomes a
``preference`` there (``relation_rule.stance_kinds``). An update stated without a change cue ("I've come to prefer
paper books") draws no edge: the rule misses it rather than guess (two alike preferences may be a restatement or two
tastes). ``stats["supersedes_edges"]``, ``stats["conflicts_edges"]`` and ``stats["instances_with_supersedes"]``
count how often it fires.

Superseded options (``meta["superseded_options"]``, ``superseded_options``): the wrong option letters whose text is
closer (cosine, same embedder) to an ``outdated`` fact of the instance than to any other fact of it, and at least
``SUPERSEDED_OPTION_FLOOR`` (0.3) close to it: the answers that follow a preference the user has since replaced, so the
evaluation can tell that mistake from any other. Empty without an outdated fact. ``stats["superseded_options"]``
and ``stats["instances_with_superseded_options"]`` count them.

Task mapping: ``TASK_BY_QUESTION_TYPE`` (the released 32k file also uses older names for some types; they map to
the same tasks). Split group key: the shared context (``meta["group"]``), so no history appears in two splits.

Every record read is either used or skipped with its file, 1-based line and a reason naming the column/field;
per file ``records_in == records_used + skipped``. Skip kinds: malformed rows and lines → ``invalid_record``; a
repeated (question_id, shared_context_id) or context id → ``duplicate_record``; a context id absent from the
contexts file, or an end index past the end of its context → ``unresolved_evidence``; a history with no user turn
→ ``no_user_history`` (not structural). A malformed question row stops a strict build before the (large)
contexts file is scanned; rows whose context is missing are reported after the scan.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memstate.data_build.records import SourceRead
from memstate.data_build.registry import DataSource, input_dir, register
from memstate.embedding import Embedder, SharedSentenceEmbedder
from memstate.errors import InputNotFound
from memstate.memory.relation_rule import RELATION_RULE_VERSION, Said, relate, stance_kinds
from memstate.schema import Fact, Instance, Relation, option_letters, stable_id
from memstate.sources.personamem import ContextError, QuestionRow, SharedContext, SharedContextFile, read_questions
from memstate.sources.skips import SKIP_DUPLICATE, SKIP_INVALID, SKIP_NO_HISTORY, SKIP_UNRESOLVED, SkipLog

SOURCE = "personamem"
# PersonaMem question type → memstate task. The three preference-state types map onto the design's preference
# tasks: "acknowledge latest" and "aligned recommendations" both need the *current* preference
# (preference_current), "track full evolution" needs the whole history (preference_history), "revisit reasons"
# needs why it changed (preference_update). The other three get their own tasks so they can be capped or dropped
# separately: recalling a stated fact (fact_recall), proposing something new that fits the user (idea_suggestion),
# and carrying a preference's reason to a new situation (preference_generalization). Older names found in the
# released files map like their current names.
TASK_BY_QUESTION_TYPE = {
    "recall_user_shared_facts": "fact_recall",
    "recalling_facts_mentioned_by_the_user": "fact_recall",
    "suggest_new_ideas": "idea_suggestion",
    "acknowledge_latest_user_preferences": "preference_current",
    "acknowledge_latest_preferences": "preference_current",
    "provide_preference_aligned_recommendations": "preference_current",
    "track_full_preference_evolution": "preference_history",
    "track_full_preference_updates": "preference_history",
    "revisit_reasons_behind_preference_updates": "preference_update",
    "recalling_the_reasons_behind_previous_updates": "preference_update",
    "generalize_to_new_scenarios": "preference_generalization",
    "generalizing_to_new_scenarios": "preference_generalization",
}
UNLIKE_THRESHOLD = 0.5  # distractors: a turn this alike (cosine) to a kept one is about the same thing
# A wrong option nearer an outdated fact than any other fact picks the superseded preference only if it is at least
# this near (cosine) to it: the "nearer than the current one" test tells old from new on the same topic (the two are
# >= relation_rule.COSINE alike by construction); the floor drops options about nothing in the facts, whose nearest
# fact is noise. MiniLM scores unrelated sentences about 0-0.2; in the fixtures, options echoing an outdated
# preference score 0.31-0.67 against it ("the scarier the better!" vs "I love horror films — the scarier the
# better": 0.31; an option is an assistant's reply, not a user's statement, so it sits below the 0.5 of two user
# statements on one topic), options about nothing in the facts 0.19-0.20 ("Because your phone broke").
SUPERSEDED_OPTION_FLOOR = 0.3
# Well-formed but unusable: the history before end_index holds no user turn, so there is nothing to remember.
# Not structural, so it never stops a strict build. (A candidate for memstate.data_build.records.)
EMBED_BATCH = 128


@dataclass
class PersonaMemConfig:
    dir: str = field(metadata={"help": "Directory holding questions_*.csv and shared_contexts_*.jsonl."})
    questions_file: str = field(default="questions_32k.csv", metadata={"help": "Questions CSV."})
    contexts_file: str = field(default="shared_contexts_32k.jsonl", metadata={"help": "Shared contexts JSONL."})
    max_questions: int | None = field(default=None, metadata={"help": "Stop reading after N usable questions."})
    max_facts: int = field(default=12, metadata={"help": "Most relevant user turns kept as facts."})
    latest_mentions: int = field(default=2, metadata={"help": "Most recent user turns always kept."})


_FIRST_PERSON = r"\b(?:i|i'm|i've|we|we're|we've)\s+"
_LIKING_VERB = (
    r"(?:lov(?:e|es|ed|ing)|lik(?:e|es|ed|ing)|enjoy(?:s|ed|ing)?|prefer(?:s|red|ring)?|ador(?:e|es|ed|ing)|"
    r"hat(?:e|es|ed|ing)|dislik(?:e|es|ed|ing)|detest(?:s|ed|ing)?|loath(?:e|es|ed|ing)|appreciat(?:e|es|ed|ing))\b"
)
# Up to three words may sit between subject and verb ("I really do love", "I've come to prefer", "I don't like"),
# but not "would/could/should" ("I would like to book…" asks for something) nor "feel/look/seem/sound" ("I feel
# like a change" compares): neither states a taste.
_LIKING = re.compile(
    _FIRST_PERSON
    + r"(?:(?!(?:would|could|should|feel|felt|look|looked|seem|seemed|sound|sounded)\b)[\w']+\s+){0,3}"
    + _LIKING_VERB
)
_PREFERENCE_PHRASE = re.compile(
    r"\b(?:favou?rites?|fan of|can'?t stand|cannot stand|gone off|fond of|keen on|sick of|tired of|"
    r"crazy about|passionate about|obsessed with|drawn to|(?:i'd|i would) rather|(?:i'm|i am) (?:really |not )?into)\b"
)
_EVENT_VERB = (
    r"(?:went|visited|tried|attended|started|finished|ran|joined|bought|moved|met|took|spent|saw|watched|read|"
    r"learned|learnt|cooked|made|got|had|travelled|traveled|won|lost|repainted|adopted|signed|booked|completed)\b"
)
_EXPERIENCE = re.compile(
    _FIRST_PERSON + r"(?:[\w']+\s+){0,2}" + _EVENT_VERB + r"|\b(?:last (?:week|weekend|month|year|night|summer|"
    r"winter|spring|autumn)|yesterday|recently|(?:days|weeks|months|years) ago)\b"
)


@dataclass
class Context:
    """The user turns of one shared context, with their embeddings (rows unit-normalized)."""

    n_messages: int
    indices: list[int]  # message index of each user turn, increasing
    texts: list[str]  # cleaned text of each user turn
    kinds: list[str]  # fact_kind of each user turn
    vectors: np.ndarray | None = None  # one row per user turn
    said: list[Said] = field(default_factory=list)  # each user turn for the relation rule (its cues read once)


def fact_kind(text: str) -> str:
    """``preference`` / ``experience`` / ``fact`` by the keyword heuristic in the module docstring.

    >>> [fact_kind(t) for t in ("I've gone off spicy food lately.", "I don't like horror films.",
    ...     "I would like to book a table.", "I feel like a change.", "I ran a half marathon last weekend.",
    ...     "My cat is called Pepper.", "I’m not a fan of crowds.")]
    ['preference', 'preference', 'fact', 'fact', 'experience', 'fact', 'preference']
    """
    low = text.lower().replace("’", "'")  # curly apostrophes (I’m, can’t) as straight ones
    if _LIKING.search(low) or _PREFERENCE_PHRASE.search(low):
        return "preference"
    if _EXPERIENCE.search(low):
        return "experience"
    return "fact"


def user_turns(context: SharedContext) -> Context:
    """The non-empty user turns of a context (speaker tags stripped, on one line), with their fact kinds."""
    turns = context.of_role("user")
    return Context(
        n_messages=context.n_messages,
        indices=[t.index for t in turns],
        texts=[t.text for t in turns],
        kinds=[fact_kind(t.text) for t in turns],
        said=[Said(str(t.index), "user", t.index, t.text) for t in turns],
    )


def read_contexts(path: Path, log: SkipLog, wanted: set[str]) -> tuple[dict[str, Context], int, int, str]:
    """Stream a contexts JSONL (``memstate.sources.personamem``) → (wanted contexts, lines read, lines parsed,
    sha256). Bad lines go to ``log``: a repeated shared_context_id as a duplicate, any other as invalid. Every line
    that parses counts as parsed, referenced or not, so the file balances as lines in = used + skipped; only the
    referenced ones are kept (the 1M file does not fit in memory as messages)."""

    def skip(e: ContextError) -> None:
        log.skip(e.file, e.line, e.detail, SKIP_DUPLICATE if e.duplicate else SKIP_INVALID)

    reader = SharedContextFile(path, context_ids=wanted, on_error=skip)
    contexts = {c.id: user_turns(c) for c in reader}
    return contexts, reader.lines, reader.parsed, reader.sha256


def embed(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Unit-normalized float32 embeddings, one row per text (unique texts are encoded once)."""
    unique = list(dict.fromkeys(texts))
    if not unique:
        return np.zeros((0, 0), dtype=np.float32)
    vecs = np.asarray(embedder.encode(unique), dtype=np.float32)
    # Normalize again: an embedder that ignores normalize_embeddings must still give cosines as dot products.
    vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    pos = {t: i for i, t in enumerate(unique)}
    return vecs[[pos[t] for t in texts]]


def relation_edges(ctx: Context, cand: Sequence[int]) -> list[tuple[int, str, int]]:
    """``(later, type, earlier)`` user-turn positions: the one relation rule over the turns ``cand`` (increasing)."""
    edges = relate([ctx.said[k] for k in cand], ctx.vectors[list(cand)])
    return [(cand[j], rel, cand[i]) for j, rel, i in edges]


def superseded_options(
    option_vecs: np.ndarray,
    answer: str,
    fact_vecs: np.ndarray,
    outdated: Sequence[bool],
    floor: float = SUPERSEDED_OPTION_FLOOR,
) -> list[str]:
    """Letters of the wrong options closest to an outdated fact rather than to any other fact, and ≥ ``floor`` to it.

    >>> facts = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=np.float32)   # F1 outdated by F2; F3 unrelated
    >>> opts = np.array([[0, 1, 0], [0.9, 0.44, 0], [0.6, 0.8, 0], [0.3, 0, 0.95]], dtype=np.float32)
    >>> superseded_options(opts, "A", facts, [True, False, False])   # C is nearer F2, D too far from F1
    ['B']
    >>> superseded_options(opts, "B", facts, [True, False, False]), superseded_options(opts, "A", facts, [False] * 3)
    ([], [])
    """
    old = np.asarray(outdated, dtype=bool)
    if not old.any():
        return []
    sims = option_vecs @ fact_vecs.T  # options × facts
    to_old = sims[:, old].max(axis=1)
    to_other = sims[:, ~old].max(axis=1) if (~old).any() else np.full(len(option_vecs), -np.inf)
    letters = option_letters(len(option_vecs))
    return [
        letter
        for letter, o, c in zip(letters, to_old, to_other, strict=True)
        if letter != answer and o >= floor and o > c
    ]


def build_instance(
    row: QuestionRow,
    ctx: Context,
    question_vec: np.ndarray,
    option_vecs: np.ndarray,
    *,
    source_file: str,
    max_facts: int,
    latest_mentions: int,
    distractors: tuple[int, int],
    unlike_threshold: float,
    seed: int,
) -> Instance | None:
    """The Instance of one question, or None when its history holds no user turn."""
    instance_id = stable_id(SOURCE, row.question_id, row.context_id)
    end = bisect.bisect_left(ctx.indices, row.end_index)  # user turns before end_index
    last: dict[str, int] = {}
    for k in range(end):
        last[ctx.texts[k]] = k  # a repeated text is kept once, at its latest turn
    cand = sorted(last.values())
    if not cand:
        return None
    sims = ctx.vectors[cand] @ question_vec
    # Positions in cand, most similar first; ties go to the later turn, so the order is total and deterministic.
    order = np.lexsort((-np.asarray(cand), -sims))
    gold = {cand[p] for p in order[:max_facts]}
    latest = set(cand[len(cand) - latest_mentions :]) if latest_mentions > 0 else set()
    drawn = relation_edges(ctx, cand)
    kept = sorted(_with_updates(gold | latest, drawn))
    edges = [e for e in drawn if {e[0], e[2]} <= set(kept)]
    outdated = {dst for _, rel, dst in edges if rel == "SUPERSEDES"}
    picked = _distractors(instance_id, cand, order, kept, ctx.vectors, distractors, unlike_threshold, seed)
    pos = {k: n for n, k in enumerate(kept)}
    kinds = stance_kinds(
        [(pos[a], rel, pos[b]) for a, rel, b in edges],
        [ctx.said[k] for k in kept],
        {ctx.said[k].ref: ctx.kinds[k] for k in kept},
    )

    roles = {k: "outdated" if k in outdated else "gold" if k in gold else "support" for k in kept}
    roles.update({k: "distractor" for k in picked})
    positions = sorted(roles)  # user-turn positions, so chronological
    fid = {k: f"F{n}" for n, k in enumerate(positions, 1)}
    facts = tuple(
        Fact(
            id=fid[k],
            text=ctx.texts[k],
            kind=kinds.get(ctx.said[k].ref, ctx.kinds[k]),
            scope="domain",
            turn=ctx.indices[k],
            time=f"turn {ctx.indices[k]}",
            role=roles[k],
        )
        for k in positions
    )
    relations = tuple(Relation(fid[src], rel, fid[dst]) for src, rel, dst in edges)
    stale = superseded_options(option_vecs, row.answer, ctx.vectors[positions], [k in outdated for k in positions])
    return Instance(
        id=instance_id,
        source=SOURCE,
        task=TASK_BY_QUESTION_TYPE[row.question_type],
        perspective="none",
        question=row.question,
        options=row.options,
        answer=row.answer,
        answer_kind="choice",
        labels=(),
        facts=facts,
        relations=relations,
        meta={
            "source_file": source_file,
            "row": row.line,
            "persona_id": row.persona_id,
            "question_id": row.question_id,
            "question_type": row.question_type,
            "topic": row.topic,
            "shared_context_id": row.context_id,
            "end_index": row.end_index,
            "group": f"{SOURCE}:{row.context_id}",
            "superseded_options": stale,
        },
    )


def _with_updates(kept: set[int], edges: Sequence[tuple[int, str, int]]) -> set[int]:
    """``kept`` plus, for each kept turn, the later turn that supersedes it (and so on), so an instance never shows
    a stale statement without the statement that replaced it."""
    by = {dst: src for src, rel, dst in edges if rel == "SUPERSEDES"}
    out = set(kept)
    todo = list(kept)
    while todo:
        nxt = by.get(todo.pop())
        if nxt is not None and nxt not in out:
            out.add(nxt)
            todo.append(nxt)
    return out


def _distractors(
    instance_id: str,
    cand: list[int],
    order: np.ndarray,
    kept: list[int],
    vectors: np.ndarray,
    bounds: tuple[int, int],
    threshold: float,
    seed: int,
) -> list[int]:
    """Seeded draw of user turns that are least similar to the question and unlike every kept turn and each
    other (cosine < ``threshold``), i.e. about other topics than the kept facts and than one another."""
    lo, hi = bounds
    if hi <= 0:
        return []
    turns, kept_vecs = np.asarray(cand), vectors[kept]
    rev = order[::-1]  # least similar to the question first
    rev = rev[~np.isin(turns[rev], kept)]
    pool: list[int] = []
    for start in range(0, len(rev), 64):  # in blocks: a long history needs only its first few candidates checked
        block = turns[rev[start : start + 64]]
        pool += block[(vectors[block] @ kept_vecs.T).max(axis=1) < threshold].tolist()
        if len(pool) >= 2 * hi:
            break
    pool = pool[: 2 * hi]
    rng = random.Random(stable_id("personamem-distractors", seed, instance_id))
    n = rng.randint(lo, hi)
    rng.shuffle(pool)
    picked: list[int] = []
    for k in pool:
        if len(picked) == n:
            break
        if all(float(vectors[k] @ vectors[j]) < threshold for j in picked):
            picked.append(k)
    return sorted(picked)


def _file_input(path: Path, kind: str, sha256: str | None = None) -> dict:
    if sha256 is None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        sha256 = digest.hexdigest()
    return {"path": str(path), "sha256": sha256, "size": path.stat().st_size, "kind": kind}


def read_personamem(
    pm_dir: Path,
    questions_file: str,
    contexts_file: str,
    log: SkipLog,
    *,
    embedder: Embedder | None = None,
    max_questions: int | None = None,
    max_facts: int = 12,
    latest_mentions: int = 2,
    distractors: tuple[int, int] = (2, 4),
    seed: int = 0,
    unlike_threshold: float = UNLIKE_THRESHOLD,
) -> SourceRead:
    """Read one PersonaMem questions CSV and its shared contexts → ``SourceRead`` whose items are Instances.

    ``embedder`` is a ``memstate.embedding.Embedder``; None is the packaged all-MiniLM-L6-v2 on the CPU
    (``memstate.embedding.SharedSentenceEmbedder``: loaded once per process, shared with ``memory``).
    ``max_questions`` stops reading the CSV after that many well-formed rows (``stopped_at``).
    """
    if max_facts < 1 or latest_mentions < 0:
        raise ValueError(f"max_facts must be ≥ 1 and latest_mentions ≥ 0, got {max_facts}, {latest_mentions}")
    if len(distractors) != 2 or not 0 <= distractors[0] <= distractors[1]:
        raise ValueError(f"distractors must be (min, max) with 0 ≤ min ≤ max, got {distractors}")
    pm_dir = Path(pm_dir)
    q_path, c_path = pm_dir / questions_file, pm_dir / contexts_file
    for p in (q_path, c_path):
        if not p.is_file():
            raise FileNotFoundError(f"PersonaMem file not found: {p}")
    q_file, c_file = str(q_path), str(c_path)

    rows, q_read, stopped_at = read_questions(q_path, log, max_questions)
    wanted = {r.context_id for r in rows}
    contexts, c_read, c_parsed, c_sha = read_contexts(c_path, log, wanted)

    rows_ok = _resolve(rows, contexts, q_file, log)
    embedder = embedder if embedder is not None else SharedSentenceEmbedder(batch_size=EMBED_BATCH)
    # One encode call for every user turn of the used contexts, every question and every option: a context's turns
    # are embedded once however many questions it has.
    used_ids = list(dict.fromkeys(r.context_id for r in rows_ok))
    texts = [t for cid in used_ids for t in contexts[cid].texts]
    options = [o for r in rows_ok for o in r.options]
    vecs = embed(embedder, texts + [r.question for r in rows_ok] + options)
    sizes = [len(contexts[cid].texts) for cid in used_ids] + [1] * len(rows_ok) + [len(r.options) for r in rows_ok]
    parts = np.split(vecs, np.cumsum(sizes)[:-1]) if sizes else []
    for cid, part in zip(used_ids, parts, strict=False):
        contexts[cid].vectors = part
    q_vecs = [p[0] for p in parts[len(used_ids) : len(used_ids) + len(rows_ok)]]
    o_vecs = parts[len(used_ids) + len(rows_ok) :]

    items: list[Instance] = []
    stats: Counter = Counter()
    for row, q_vec, opt_vecs in zip(rows_ok, q_vecs, o_vecs, strict=True):
        inst = build_instance(
            row,
            contexts[row.context_id],
            q_vec,
            opt_vecs,
            source_file=Path(questions_file).as_posix(),
            max_facts=max_facts,
            latest_mentions=latest_mentions,
            distractors=distractors,
            unlike_threshold=unlike_threshold,
            seed=seed,
        )
        if inst is None:
            reason = f"no user turn before end_index_in_shared_context={row.end_index}"
            log.skip(q_file, row.line, reason, SKIP_NO_HISTORY, row.question_id)
            continue
        items.append(inst)
        _count(stats, inst, lo=distractors[0])

    return SourceRead(
        source=SOURCE,
        items=items,
        records_in={q_file: q_read, c_file: c_read},
        records_used={q_file: len(items), c_file: c_parsed},
        inputs=[_file_input(q_path, "personamem_questions"), _file_input(c_path, "personamem_contexts", c_sha)],
        stats=_stats(stats, contexts, c_parsed),
        stopped_at=stopped_at,
    )


def _resolve(rows: list[QuestionRow], contexts: dict[str, Context], file: str, log: SkipLog) -> list[QuestionRow]:
    """Rows whose context exists and is long enough; the others are skipped as unresolved."""
    ok = []
    for row in rows:
        ctx = contexts.get(row.context_id)
        if ctx is None:
            reason = f"column 'shared_context_id' {row.context_id!r} is not in the contexts file"
        elif row.end_index > ctx.n_messages:
            reason = (
                f"column 'end_index_in_shared_context' is {row.end_index} but context {row.context_id!r} "
                f"has {ctx.n_messages} messages"
            )
        else:
            ok.append(row)
            continue
        log.skip(file, row.line, reason, SKIP_UNRESOLVED, row.question_id)
    return ok


def _count(stats: Counter, inst: Instance, lo: int) -> None:
    roles = Counter(f.role for f in inst.facts)
    stats["instances"] += 1
    stats["facts"] += len(inst.facts)
    stats["distractors"] += roles["distractor"]
    stats["outdated_facts"] += roles["outdated"]
    stats["supersedes_edges"] += sum(r.type == "SUPERSEDES" for r in inst.relations)
    stats["conflicts_edges"] += sum(r.type == "CONFLICTS_WITH" for r in inst.relations)
    stats["instances_with_supersedes"] += any(r.type == "SUPERSEDES" for r in inst.relations)
    stats["instances_short_of_distractors"] += roles["distractor"] < lo
    stats["superseded_options"] += len(inst.meta["superseded_options"])
    stats["instances_with_superseded_options"] += bool(inst.meta["superseded_options"])
    stats[f"task/{inst.task}"] += 1
    stats[f"question_type/{inst.meta['question_type']}"] += 1
    for f in inst.facts:
        stats[f"fact_kind/{f.kind}"] += 1


def _stats(counts: Counter, contexts: dict[str, Context], parsed: int) -> dict:
    """JSON-compatible stats: flat counts plus per-task / question type / fact kind tables."""
    out: dict[str, Any] = {
        "contexts_parsed": parsed,
        "contexts_referenced": len(contexts),
        "relation_rule": RELATION_RULE_VERSION,
    }
    tables: dict[str, dict[str, int]] = {"tasks": {}, "question_types": {}, "fact_kinds": {}}
    names = {"task": "tasks", "question_type": "question_types", "fact_kind": "fact_kinds"}
    for key in sorted(counts):
        head, _, name = key.partition("/")
        if name:
            tables[names[head]][name] = counts[key]
        else:
            out[key] = counts[key]
    for key in ("instances", "facts", "distractors", "outdated_facts", "supersedes_edges", "conflicts_edges"):
        out.setdefault(key, 0)
    out.setdefault("instances_with_supersedes", 0)
    out.setdefault("instances_short_of_distractors", 0)
    out.setdefault("superseded_options", 0)
    out.setdefault("instances_with_superseded_options", 0)
    return out | tables


def _read(c: PersonaMemConfig, config, log: SkipLog) -> SourceRead:
    try:
        return read_personamem(
            input_dir(c.dir, "PersonaMem"),
            c.questions_file,
            c.contexts_file,
            log,
            max_questions=c.max_questions,
            max_facts=c.max_facts,
            latest_mentions=c.latest_mentions,
            distractors=tuple(config.distractors),
            seed=config.seed,
        )
    except FileNotFoundError as e:  # a questions/contexts file named in the config that is not there
        if isinstance(e, InputNotFound):
            raise
        raise InputNotFound(f"{e} (personamem.questions_file / contexts_file)") from None


register(DataSource(SOURCE, "PersonaMem inputs.", PersonaMemConfig, _read, order=30))
