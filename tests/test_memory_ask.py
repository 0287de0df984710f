"""``memstate memory ingest`` + ``memstate memory ask`` end to end on a MemSyco-Bench row, with the tiny models.

The whole deployed path runs for real: the rule-based extractor fills a SQLite store from the row's dialogue; `ask`
retrieves (MiniLM), calls the reasoning-state API (uvicorn, in a thread) in front of the tiny policy (a local
OpenAI-compatible server generating with transformers), and has the tiny responder answer. The tiny policy rarely
writes a well-formed state, so the test asserts what must hold either way, and a scripted policy pins the path where
the rules reach the responder's prompt.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from chat_server import ChatServer, TinyChatModel, live_app
from shipped_data import MEMSYCO

from memstate.cli import main
from memstate.errors import ServerUnavailable
from memstate.memory import MemoryStore, retrieve
from memstate.memory.answer import ask
from memstate.prompts import STATE_HEADER
from memstate.responders.local import TransformersResponder
from memstate.serve.api import ApiConfig, create_app
from memstate.serve.client import ReasoningStateClient
from memstate.serve.policy import free_port

ROOT = Path(__file__).resolve().parents[1]
VMS = MEMSYCO / "valid_memory_selection.jsonl"


def api_app(policy_url: str):
    return create_app(ApiConfig(policy_url=policy_url, auth="none", max_tokens=48))


@pytest.fixture()
def one_row(tmp_path) -> tuple[Path, dict]:
    line = VMS.read_text(encoding="utf-8").splitlines()[0]
    path = tmp_path / "row.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    shutil.copy(MEMSYCO / "schema.json", tmp_path / "schema.json")  # as released: the schema beside the rows
    return path, json.loads(line)


def test_ingest_then_ask_with_the_tiny_policy_behind_the_api(tiny_models, one_row, tmp_path, capsys):
    path, row = one_row
    store = tmp_path / "user.sqlite"
    assert main(["memory", "ingest", "--store", str(store), "--format", "memsyco", str(path)]) == 0
    totals = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert totals["sessions"] >= 1 and totals["facts"] > 0

    policy = TinyChatModel(tiny_models["policy"])
    with ChatServer(policy) as policy_server:
        with live_app(api_app(policy_server.url)) as api_url:
            argv = ["memory", "ask", "--store", str(store), row["question"], "--responder",
                    str(tiny_models["responder"]), "--api-url", api_url]  # fmt: skip
            assert main(argv) == 0
            out = capsys.readouterr().out
            assert main([*argv[:-2], "--no-state"]) == 0
            baseline = capsys.readouterr().out
    assert policy.generated_tokens > 0 and len(policy_server.requests) in (1, 2)  # one call, or one format retry
    assert "[F1] (" in out and "\nanswer: " in out and ("rules:\n- " in out or "no usable state" in out)
    assert "[F1] (" in baseline and "rules" not in baseline
    sent = policy_server.requests[0]["messages"][1]["content"]
    assert row["question"] in sent and "Memories:\n[F1]" in sent  # the policy saw the retrieved memories


def test_the_rules_reach_the_responder(tiny_models, one_row, tmp_path):
    path, row = one_row
    rules = "- Use the current preference F2, not the outdated one.\n- Recommend a technique-focused class."
    with ChatServer(lambda body: (200, rules)) as policy_server:
        with live_app(api_app(policy_server.url)) as api_url:
            seen = []

            class Recording(TransformersResponder):
                def answer(self, prompts, max_new_tokens=32):
                    seen.extend(prompts)
                    return super().answer(prompts, max_new_tokens=4)

            with MemoryStore(tmp_path / "s.sqlite") as store, ReasoningStateClient(api_url) as client:
                from memstate.memory import RuleExtractor
                from memstate.memory.ingest import read_sessions

                for session_id, turns in read_sessions(path, "memsyco"):
                    store.ingest_session(turns, RuleExtractor(), session_id=session_id)
                answer = ask(store, row["question"], Recording(str(tiny_models["responder"])), state_api=client)
                assert answer.retrieved.facts == retrieve(store, row["question"]).facts
    assert answer.state_format_ok and answer.rules == (
        "Use the current preference F2, not the outdated one.",
        "Recommend a technique-focused class.",
    )
    (prompt,) = seen
    assert f"{STATE_HEADER}\n- Use the current preference F2" in prompt[1]["content"]
    assert answer.answer is not None


def test_ask_without_an_api_url_says_so(tmp_path, capsys):
    assert main(["memory", "ask", "--store", str(tmp_path / "s.sqlite"), "q", "--responder", "x"]) == 2
    assert "memstate memory ask: error: give --api-url" in capsys.readouterr().err
    with pytest.raises(ServerUnavailable):  # a client against nothing fails loudly, not silently
        ReasoningStateClient(f"http://127.0.0.1:{free_port()}", timeout=2).reasoning_state({})
