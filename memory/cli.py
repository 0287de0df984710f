"""``memstate memory ingest`` and ``memstate memory ask``: their parsers and run functions, for ``memstate.cli``.

A failed ``ingest`` leaves no store behind that it created: the input is read and validated before the store is
opened, and a store this command created is removed if ingesting fails later (an extractor server that is down).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from memstate.errors import ConfigError, InputNotFound
from memstate.parsing import StageParser
from memstate.responder_config import ResponderConfig, make_responder

logger = logging.getLogger("memstate.memory")


def ingest_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from memstate.memory.ingest import INPUT_FORMATS

    p = argparse.ArgumentParser(
        prog=prog, description="Induce facts, concepts and relations from dialogues into a memory store."
    )
    p.add_argument("--store", required=True, help="SQLite store file (created if missing; one per user/sample).")
    p.add_argument("dialogue_file", help="Dialogues: JSONL turns, MemSyco-Bench rows, or PersonaMem shared contexts.")
    p.add_argument("--format", choices=INPUT_FORMATS, default="dialogue", help="Input format (default: dialogue).")
    p.add_argument("--extractor", choices=["rule", "llm"], default="rule", help="Rule-based (no model) or LLM.")
    p.add_argument("--extractor-url", "--extractor_url", help="OpenAI-compatible endpoint of the LLM extractor.")
    p.add_argument("--extractor-model", "--extractor_model", help="Model name of the LLM extractor.")
    return p


def _remove_store(path: Path) -> None:
    for p in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        p.unlink(missing_ok=True)


def ingest(args: argparse.Namespace) -> None:
    from memstate.memory.extract import LLMExtractor, RuleExtractor
    from memstate.memory.ingest import read_sessions
    from memstate.memory.store import MemoryStore

    if not Path(args.dialogue_file).is_file():
        raise InputNotFound(f"{args.dialogue_file}: no such dialogue file")
    sessions = list(read_sessions(args.dialogue_file, args.format))  # the whole input is valid before the store
    extractor = LLMExtractor(args.extractor_url, args.extractor_model) if args.extractor == "llm" else RuleExtractor()
    store_path = Path(args.store)
    created = not store_path.exists()
    totals = {"sessions": 0, "facts": 0, "relations": 0, "rejected": 0}
    try:
        with MemoryStore(store_path) as store:
            for session_id, turns in sessions:
                report = store.ingest_session(turns, extractor, session_id=session_id)
                totals["sessions"] += 1
                totals["facts"] += report.facts
                totals["relations"] += report.relations
                totals["rejected"] += len(report.rejected)
                for rejected in report.rejected:
                    logger.warning("session %s: rejected %s", session_id, rejected)
    except BaseException:
        if created:
            _remove_store(store_path)
        raise
    print(json.dumps(totals))


def ask_parser(prog: str | None = None) -> StageParser:
    p = StageParser(
        (ResponderConfig,),
        prog=prog,
        description="Retrieve facts from a store, get a reasoning state from the API, ask the responder.",
    )
    p.add_argument("--store", required=True, help="SQLite store file (memstate memory ingest).")
    p.add_argument("question", help="The request.")
    p.add_argument("--api-url", "--api_url", help="Reasoning-state API (memstate serve api).")
    p.add_argument(
        "--api-key-env", "--api_key_env", default="MEMSTATE_API_KEY", help="Env var with the API's bearer token."
    )
    p.add_argument("--no-state", "--no_state", action="store_true", help="Baseline: answer without a state.")
    from memstate.memory.backends import backend_names

    p.add_argument("--backend", choices=backend_names(), default="evomem", help="A registered retrieval backend.")
    p.add_argument("-k", type=int, default=10, help="Seed facts retrieved.")
    return p


def ask(parsed: tuple[ResponderConfig, argparse.Namespace]) -> None:
    import os

    from memstate.memory.answer import ask as answer_question
    from memstate.memory.store import MemoryStore
    from memstate.serve.client import ReasoningStateClient

    responder_config, args = parsed
    if not args.no_state and not args.api_url:
        raise ConfigError("give --api-url (the reasoning-state API) or --no-state (answer without a reasoning state)")
    if not Path(args.store).is_file():
        raise InputNotFound(f"{args.store}: no such memory store (create it with `memstate memory ingest`)")
    responder = make_responder(responder_config)
    api = None
    if not args.no_state:
        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        api = ReasoningStateClient(args.api_url, api_key=key)
    with MemoryStore(args.store) as store:
        answer = answer_question(store, args.question, responder, state_api=api, backend=args.backend, k=args.k)
    if api is not None:
        api.close()
    for fact in answer.retrieved.facts:
        print(f"[{fact.id}] ({fact.kind}, {fact.role}) {fact.text}")
    for rel in answer.retrieved.relations:
        print(f"{rel.src} {rel.type} {rel.dst}")
    if answer.rules:
        print("rules:\n" + "\n".join(f"- {r}" for r in answer.rules))
    elif api is not None:
        print("rules: (the policy wrote no usable state; answered without one)")
    print(f"answer: {answer.answer}")
