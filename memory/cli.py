"""``memstate memory ingest`` and ``memstate memory ask``: their parsers and run functions, for ``memstate.cli``.

A store holds one user or one benchmark sample: ``--store FILE`` takes a file of one sample (a dialogue file, one
MemSyco row, one LoCoMo conversation), ``--store-dir DIR`` writes ``DIR/<sample id>.sqlite`` for each. A failed
``ingest`` leaves no store behind that it created: the whole input is read and validated before any store is
opened, and every store (and the directory) this command created is removed if ingesting fails later (an extractor
server that is down). Records the reader skipped (LoCoMo's broken evidence ids) are counted in the printed totals
and each is logged with its file, sample and field.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import re
from pathlib import Path

from tqdm.auto import tqdm

from memstate.data import text_problem
from memstate.errors import ConfigError, InputNotFound
from memstate.memory.extract import DEFAULT_EXTRACTOR, EXTRACTORS
from memstate.parsing import StageParser
from memstate.responders import ResponderConfig, make_responder

logger = logging.getLogger("memstate.memory")


def ingest_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from memstate.memory.ingest import INPUT_FORMATS

    p = argparse.ArgumentParser(
        prog=prog, description="Induce facts, concepts and relations from dialogues into memory stores."
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="SQLite store file for an input of one sample (created if missing).")
    where.add_argument("--store-dir", "--store_dir", help="Directory of stores, <sample id>.sqlite per sample.")
    p.add_argument(
        "dialogue_file", help="JSONL turns, MemSyco-Bench rows, PersonaMem shared contexts, or LoCoMo's JSON array."
    )
    p.add_argument("--format", choices=INPUT_FORMATS, default="dialogue", help="Input format (default: dialogue).")
    p.add_argument(
        "--extractor",
        choices=EXTRACTORS,
        default=DEFAULT_EXTRACTOR,
        help="turns: every turn of every speaker is a fact, a stated change of view SUPERSEDES the speaker's "
        "earlier statement on it (default); rule: first-person cue sentences of user turns, with "
        "SUPERSEDES/CONFLICTS_WITH; llm: an OpenAI-compatible model.",
    )
    p.add_argument("--extractor-url", "--extractor_url", help="OpenAI-compatible endpoint of the LLM extractor.")
    p.add_argument("--extractor-model", "--extractor_model", help="Model name of the LLM extractor.")
    return p


def _remove_store(path: Path) -> None:
    for p in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        p.unlink(missing_ok=True)


def store_name(sample_id: str) -> str:
    """A file name for a sample's store: characters other than letters, digits, ``.``, ``_`` and ``-`` become ``_``.

    >>> store_name("conv-26"), store_name("pm:ab/cd")
    ('conv-26.sqlite', 'pm_ab_cd.sqlite')
    """
    return re.sub(r"[^A-Za-z0-9._-]", "_", sample_id) + ".sqlite"


def _store_paths(args: argparse.Namespace, ids: list[str | None]) -> list[Path]:
    """One store path per sample; refuses a single ``--store`` for several samples and names that collide."""
    if args.store:
        if len(ids) > 1:
            shown = ", ".join(str(i) for i in ids[:3]) + (", …" if len(ids) > 3 else "")
            raise ConfigError(
                f"{args.dialogue_file}: {len(ids)} samples ({shown}) would share one store: "
                "give --store-dir DIR for one store per sample"
            )
        return [Path(args.store)]
    paths = [Path(args.store_dir) / store_name(i or Path(args.dialogue_file).stem) for i in ids]
    seen: dict[Path, str | None] = {}
    for path, sid in zip(paths, ids, strict=True):
        if path in seen:
            raise ConfigError(f"{args.dialogue_file}: samples {seen[path]!r} and {sid!r} both map to {path.name}")
        seen[path] = sid
    return paths


def _extractor(args: argparse.Namespace):
    from memstate.memory.extract import make_extractor

    return make_extractor(args.extractor, args.extractor_url, args.extractor_model)


def ingest(args: argparse.Namespace) -> None:
    from memstate.memory.ingest import read_samples
    from memstate.memory.store import MemoryStore, readable

    if not Path(args.dialogue_file).is_file():
        raise InputNotFound(f"{args.dialogue_file}: no such dialogue file")
    read = read_samples(args.dialogue_file, args.format)  # the whole input is valid before any store exists
    paths = _store_paths(args, [sid for sid, _ in read.samples])
    for skipped in read.skipped:
        logger.warning("skipped %s", skipped)
    extractor = _extractor(args)
    store_dir = Path(args.store_dir) if args.store_dir else None
    dir_created = store_dir is not None and not store_dir.exists()
    created: list[Path] = []
    totals = {"stores": len(paths), "sessions": 0, "split": 0, "facts": 0, "relations": 0, "rejected": 0}
    totals["skipped"] = len(read.skipped)
    progress = tqdm(total=sum(len(sessions) for _, sessions in read.samples), unit="session", desc="ingest",
                    disable=None)  # fmt: skip
    try:
        for n, (path, (_, sessions)) in enumerate(zip(paths, read.samples, strict=True), 1):
            if not path.exists():
                created.append(path)
            with MemoryStore(path) as store, readable(path):
                for session in sessions:
                    report = store.ingest_session(list(session.turns), extractor, session_id=session.id,
                                                  time=session.time, where=session.where)  # fmt: skip
                    totals["sessions"] += 1
                    totals["split"] += bool(report.parts)
                    totals["facts"] += report.facts
                    totals["relations"] += report.relations
                    totals["rejected"] += len(report.rejected)
                    progress.set_postfix(store=f"{n}/{len(paths)}", facts=totals["facts"], refresh=False)
                    progress.update()
                    for rejected in report.rejected:
                        logger.warning("%s session %s: rejected %s", path.name, report.session_id, rejected)
    except BaseException:
        for path in created:
            _remove_store(path)
        if dir_created and store_dir is not None and store_dir.is_dir() and not any(store_dir.iterdir()):
            store_dir.rmdir()
        raise
    finally:
        progress.close()
    print(json.dumps(totals))


def ask_parser(prog: str | None = None) -> StageParser:
    p = StageParser(
        (ResponderConfig,),
        prog=prog,
        description="Retrieve facts from a store, get a reasoning state from the API, ask the responder.",
    )
    p.add_argument("--store", required=True, help="SQLite store file (memstate memory ingest).")
    from memstate.memory.search import MAX_QUERY_CHARS

    p.add_argument("question", help=f"The request (at most {MAX_QUERY_CHARS} characters).")
    p.add_argument("--api-url", "--api_url", help="Reasoning-state API (memstate serve api).")
    p.add_argument(
        "--api-key-env", "--api_key_env", default="MEMSTATE_API_KEY", help="Env var with the API's bearer token."
    )
    p.add_argument("--no-state", "--no_state", action="store_true", help="Baseline: answer without a state.")
    from memstate.memory.backends import backend_names

    p.add_argument("--backend", choices=backend_names(), default="evomem", help="A registered retrieval backend.")
    p.add_argument("-k", type=int, default=10, help="Seed facts retrieved (without --budget-tokens).")
    p.add_argument("--budget-tokens", "--budget_tokens", type=int, metavar="N",
                   help="Facts in the backend's order while their prompt lines fit in N tokens (565: the budget "
                   "measured in docs/memory.md) instead of k seeds.")  # fmt: skip
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="The tokenizer that counts --budget-tokens, e.g. the responder's (default: MiniLM's).",
    )
    return p


# C0 and C1 control characters (ESC starts the terminal's escape sequences), DEL, lone surrogates (print cannot
# encode them), and the bidirectional overrides that reorder what a terminal shows.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


def shown(text: str, *, newlines: bool = True) -> str:
    """Stored or remote text as ``memory ask`` prints it: control characters escaped visibly (``\\x1b``), so a
    stored escape sequence cannot clear the screen or retitle the window; tabs kept, and newlines too unless the
    line format forbids them.

    >>> shown("a\\x1b[2Jb\\x1b]0;t\\x07c\\td\\ne\\x9b")
    'a\\\\x1b[2Jb\\\\x1b]0;t\\\\x07c\\td\\ne\\\\x9b'
    >>> shown("one\\ntwo", newlines=False)
    'one\\\\ntwo'
    """

    def escape(m: re.Match) -> str:
        code = ord(m.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    text = _UNPRINTABLE.sub(escape, str(text))
    return text if newlines else text.replace("\n", "\\n")


def ask(parsed: tuple[ResponderConfig, argparse.Namespace]) -> None:
    import os

    from memstate.memory.answer import ask as answer_question
    from memstate.memory.search import MAX_QUERY_CHARS
    from memstate.memory.store import MemoryStore, readable
    from memstate.serve.client import ReasoningStateClient

    responder_config, args = parsed
    problem = text_problem(args.question)
    if problem is not None:  # bytes that are not UTF-8 arrive from argv as surrogate escapes
        raise ConfigError(f"question: {problem}; give the question as UTF-8 text")
    if len(args.question) > MAX_QUERY_CHARS:  # the responder would read every token of it (minutes on a CPU)
        raise ConfigError(f"question: {len(args.question)} characters, over the {MAX_QUERY_CHARS} a question may have")
    if not args.no_state and not args.api_url:
        raise ConfigError("give --api-url (the reasoning-state API) or --no-state (answer without a reasoning state)")
    if not Path(args.store).is_file():
        raise InputNotFound(f"{args.store}: no such memory store (create it with `memstate memory ingest`)")
    # opened first (never created: an empty file or another database is refused as it is), so that a damaged store
    # fails before a model loads; a table found damaged later is the same one-line error
    with MemoryStore(args.store, create=False) as store, readable(args.store):
        store.embedder.dim  # noqa: B018 -- the store's model loads (or fails in one line) before the responder's
        responder = make_responder(responder_config)
        api = None
        if not args.no_state:
            key = os.environ.get(args.api_key_env) if args.api_key_env else None
            api = ReasoningStateClient(args.api_url, api_key=key)
        answer = answer_question(store, args.question, responder, state_api=api, backend=args.backend, k=args.k,
                                   budget_tokens=args.budget_tokens, tokenizer=args.tokenizer)  # fmt: skip
    if api is not None:
        api.close()
    one = functools.partial(shown, newlines=False)  # one fact, relation or rule per line
    for fact in answer.retrieved.facts:
        print(f"[{one(fact.id)}] ({one(fact.kind)}, {one(fact.role)}) {one(fact.text)}")
    for rel in answer.retrieved.relations:
        print(f"{one(rel.src)} {one(rel.type)} {one(rel.dst)}")
    if answer.rules:
        print("rules:\n" + "\n".join(f"- {one(r)}" for r in answer.rules))
    elif api is not None:
        print("rules: (the policy wrote no usable state; answered without one)")
    print(f"answer: {shown(answer.answer)}")
