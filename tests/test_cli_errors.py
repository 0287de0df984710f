"""User mistakes through the real CLI: one line on stderr that names the file (and field), exit code 2, no
traceback, and nothing left behind (the output dir or store the command would have created does not exist)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from shipped_data import MEMSYCO

from memstate.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TRAIN_YAML = "policy_model: p\nresponder_model: r\ndata_dir: d\noutput_dir: {out}\nuse_cpu: true\n"


@dataclass
class Mistake:
    """``setup(tmp_path, request)`` writes the broken inputs and returns the argv, the text the error line must
    contain, and the path the command would create (which must not exist afterwards)."""

    name: str
    setup: Callable[[Path, pytest.FixtureRequest], tuple[list[str], str, Path]]


def _data_yaml(tmp: Path, body: str) -> Path:
    path = tmp / "data.yaml"
    path.write_text(body + "seed: 0\n")
    return path


def fever_without_wiki_dump(tmp, _):
    shutil.copytree(FIXTURES / "fever", tmp / "fever")
    shutil.rmtree(tmp / "fever" / "wiki-pages")
    cfg = _data_yaml(tmp, f"fever:\n  dir: {tmp / 'fever'}\n  claim_files: [train.jsonl]\nskip_invalid: true\n")
    return ["build-data", "--config", str(cfg), "--out", str(tmp / "out")], "wiki-pages", tmp / "out"


def scifact_without_corpus(tmp, _):
    shutil.copytree(FIXTURES / "scifact", tmp / "scifact")
    (tmp / "scifact" / "corpus.jsonl").unlink()
    cfg = _data_yaml(tmp, f"scifact:\n  dir: {tmp / 'scifact'}\n  claim_files: [claims_train.jsonl]\n")
    return ["build-data", "--config", str(cfg), "--out", str(tmp / "out")], "corpus.jsonl", tmp / "out"


def personamem_unknown_context(tmp, _):
    src, dst = FIXTURES / "personamem", tmp / "personamem"
    dst.mkdir()
    with open(src / "questions_32k.csv", newline="", encoding="utf-8") as f:
        header, first = list(csv.reader(f))[:2]
    first[header.index("shared_context_id")] = "no-such-context"
    with open(dst / "questions_32k.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, first])
    contexts = (src / "shared_contexts_32k.jsonl").read_text(encoding="utf-8").splitlines()
    (dst / "shared_contexts_32k.jsonl").write_text(contexts[0] + "\n", encoding="utf-8")
    cfg = _data_yaml(
        tmp,
        f"personamem:\n  dir: {dst}\n  questions_file: questions_32k.csv\n  contexts_file: shared_contexts_32k.jsonl\n",
    )
    return ["build-data", "--config", str(cfg), "--out", str(tmp / "out")], "no-such-context", tmp / "out"


def data_config_missing_dir(tmp, _):
    cfg = _data_yaml(tmp, f"fever:\n  dir: {tmp / 'nowhere'}\n  claim_files: [train.jsonl]\n")
    return ["build-data", "--config", str(cfg), "--out", str(tmp / "out")], "fever.dir", tmp / "out"


def data_config_unknown_field(tmp, _):
    cfg = _data_yaml(tmp, f"fever:\n  dir: {FIXTURES / 'fever'}\n  claim_files: [train.jsonl]\nshufle: true\n")
    return ["build-data", "--config", str(cfg), "--out", str(tmp / "out")], "shufle", tmp / "out"


# Hostile records (issue 56): each is one line naming the file, line and field, never a traceback.
DEEP_JSON = '{"id": 99002, "claim": ' + "[" * 100_000 + "]" * 100_000 + "}"
SURROGATE_CLAIM = (
    '{"id": 99001, "verifiable": "VERIFIABLE", "label": "SUPPORTS", "claim": "Tokyo \\ud800 is big.", '
    '"evidence": [[[1, 2, "Tokyo", 0]]]}'
)


def _fever_claims(tmp: Path, lines: list[str]) -> list[str]:
    shutil.copytree(FIXTURES / "fever" / "wiki-pages", tmp / "fever" / "wiki-pages")
    (tmp / "fever" / "claims.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    fever = f"fever:\n  dir: {tmp / 'fever'}\n  claim_files: [claims.jsonl]\n"
    cfg = _data_yaml(tmp, fever + "shortcut_probe: warn\nprogress: false\n")
    return ["build-data", "--config", str(cfg), "--out", str(tmp / "out")]


def _first_fever_claims(n: int) -> list[str]:
    return (FIXTURES / "fever" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:n]


def fever_deeply_nested_claim(tmp, _):
    argv = _fever_claims(tmp, [*_first_fever_claims(3), DEEP_JSON])
    return argv, "claims.jsonl:4: invalid JSON (nested too deeply", tmp / "out"


def fever_lone_surrogate_in_claim(tmp, _):
    argv = _fever_claims(tmp, [*_first_fever_claims(3), SURROGATE_CLAIM])
    return argv, "claims.jsonl:4: field 'claim': lone surrogate U+D800 at character 7", tmp / "out"


def fever_record_over_the_size_limit(tmp, request):
    request.getfixturevalue("monkeypatch").setenv("MEMSTATE_MAX_RECORD_BYTES", "4000")
    big = SURROGATE_CLAIM.replace("Tokyo \\ud800 is big.", "Tokyo is big" + " really" * 1000 + ".")
    argv = _fever_claims(tmp, [*_first_fever_claims(3), big])
    return argv, f"claims.jsonl:4: line of {len(big) + 1} bytes is over the 4000-byte limit", tmp / "out"


def fever_nei_claim_without_context(tmp, _):
    nei = [line for line in _first_fever_claims(20) if "NOT ENOUGH INFO" in line]
    argv = _fever_claims(tmp, nei)
    return argv, "fever claims.jsonl:1: label: NOT ENOUGH INFO claim 91006 has no context", tmp / "out"


def ingest_lone_surrogate(tmp, _):
    dialogue = tmp / "dialogue.jsonl"
    dialogue.write_text('{"role": "user", "content": "hi"}\n{"role": "user", "content": "x \\udfff y"}\n')
    store = tmp / "store.sqlite"
    argv = ["memory", "ingest", "--store", str(store), str(dialogue)]
    return argv, "dialogue.jsonl:2: content: lone surrogate U+DFFF at character 3", store


def ask_question_not_utf8(tmp, _):
    # A shell passes the bytes b"caf\xe9" (Latin-1): Python's argv holds them surrogate-escaped.
    question = b"caf\xe9?".decode("utf-8", "surrogateescape")
    store = tmp / "missing.sqlite"
    argv = ["memory", "ask", "--store", str(store), question, "--responder_model", "x", "--no-state"]
    return argv, "question: byte 0xe9 at character 4 is not valid UTF-8", store


def _store_with_embedder(tmp: Path, name: str) -> Path:
    import sqlite3

    from memstate.memory.embed import HashEmbedder
    from memstate.memory.store import MemoryStore

    path = tmp / "store.sqlite"
    MemoryStore(path, HashEmbedder(64)).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'embedder'", (name,))
    return path


def ask_store_embedder_hash_0(tmp, _):
    store = _store_with_embedder(tmp, "hash-0")
    argv = ["memory", "ask", "--store", str(store), "What do I like?", "--responder_model", "x", "--no-state"]
    return argv, f"{store}: meta.embedder: hash embedder dimension must be 1 to 65536, got 0", tmp / "never"


def ask_store_embedder_hash_huge(tmp, _):
    store = _store_with_embedder(tmp, "hash-100000000000")
    argv = ["memory", "ask", "--store", str(store), "What do I like?", "--responder_model", "x", "--no-state"]
    return argv, "meta.embedder: hash embedder dimension must be 1 to 65536, got 100000000000", tmp / "never"


def _ask(store: Path, question: str = "What do I like?") -> list[str]:
    return ["memory", "ask", "--store", str(store), question, "--responder_model", "x", "--no-state"]


def ask_store_random_bytes(tmp, _):
    store = tmp / "store.sqlite"
    store.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 64)
    return _ask(store), f"{store}: not a readable memstate store: file is not a database", tmp / "store.sqlite-wal"


def ask_store_empty_file(tmp, _):
    store = tmp / "store.sqlite"
    store.write_bytes(b"")
    return _ask(store), f"{store}: not a memstate store (an empty file", tmp / "store.sqlite-wal"


def ask_store_embedder_local_path(tmp, _):
    (tmp / "not-a-model").mkdir()
    store = _store_with_embedder(tmp, str(tmp / "not-a-model"))
    return _ask(store), f"{store}: meta.embedder: cannot load '{tmp / 'not-a-model'}'", tmp / "never"


def ask_question_too_long(tmp, _):
    store = _store_with_embedder(tmp, "hash-64")
    return _ask(store, "pasta " * 17_000), "question: 102000 characters, over the 4000", tmp / "never"


def ingest_into_a_corrupt_store(tmp, _):
    store, dialogue = tmp / "store.sqlite", tmp / "dialogue.jsonl"
    store.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 64)
    dialogue.write_text('{"role": "user", "content": "I like tea."}\n')
    argv = ["memory", "ingest", "--store", str(store), str(dialogue)]
    return argv, f"{store}: not a readable memstate store", tmp / "store.sqlite-wal"


def train_config_unknown_field(tmp, _):
    cfg = tmp / "train.yaml"
    cfg.write_text(TRAIN_YAML.format(out=tmp / "run") + "num_generationz: 4\n")
    return ["train", "--config", str(cfg)], "num_generationz", tmp / "run"


def train_config_malformed_yaml(tmp, _):
    cfg = tmp / "train.yaml"
    cfg.write_text(TRAIN_YAML.format(out=tmp / "run") + "lora_target_modules: [q_proj, k_proj\nlora_r: 8\n")
    return ["train", "--config", str(cfg)], "train.yaml:", tmp / "run"


def train_config_missing_file(tmp, _):
    return ["train", "--config", str(tmp / "nope.yaml")], "nope.yaml", tmp / "run"


# An unknown score mode is refused by every command that scores, naming the registered modes, before anything loads.
UNKNOWN_MODE = "unknown score_mode 'exakt'; known: likelihood, exact"


def train_unknown_score_mode(tmp, _):
    cfg = tmp / "train.yaml"
    cfg.write_text(TRAIN_YAML.format(out=tmp / "run") + "score_mode: exakt\n")
    return ["train", "--config", str(cfg)], UNKNOWN_MODE, tmp / "run"


def precompute_unknown_score_mode(tmp, _):
    cache = tmp / "baselines.sqlite"
    argv = ["reward", "precompute-baselines", "--data", str(tmp / "no-data"), "--cache", str(cache),
            "--responder-model", "r", "--score_mode", "exakt"]  # fmt: skip
    return argv, UNKNOWN_MODE, cache


def eval_unknown_score_mode(tmp, _):
    (tmp / "ckpt").mkdir()
    out = tmp / "report"
    return ["eval", "--checkpoint", str(tmp / "ckpt"), "--score_mode", "exakt", "--out", str(out)], UNKNOWN_MODE, out


def eval_checkpoint_trained_in_an_unknown_mode(tmp, _):
    from memstate.checkpoint import CheckpointMetadata

    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")  # not a model: loading it would fail otherwise
    CheckpointMetadata("v", str(tmp / "policy"), "r", "exakt", 100, 20, str(tmp / "data")).write(ckpt)
    out = tmp / "report"
    return ["eval", "--checkpoint", str(ckpt), "--out", str(out)], f"memstate.json: {UNKNOWN_MODE}", out


def experiment_unknown_score_mode(tmp, _):
    out = tmp / "experiment"
    return ["experiment", "sycophancy", "--out", str(out), "--score_mode", "exakt"], UNKNOWN_MODE, out


def ingest_locomo_json(tmp, _):
    locomo = tmp / "locomo10.json"
    conversation = {"speaker_a": "Caroline", "speaker_b": "Melanie", "session_1": [
        {"speaker": "Caroline", "dia_id": "D1:1", "text": "Hey Mel! Good to see you!"}]}  # fmt: skip
    locomo.write_text(json.dumps([{"sample_id": "conv-26", "conversation": conversation, "qa": []}], indent=2))
    store = tmp / "store.sqlite"
    return ["memory", "ingest", "--store", str(store), str(locomo)], "locomo10.json:1", store


def ask_missing_store(tmp, _):
    store = tmp / "missing.sqlite"
    argv = ["memory", "ask", "--store", str(store), "What do I like?", "--responder_model", "x", "--no-state"]
    return argv, "missing.sqlite", store


def precompute_unreachable_responder(tmp, request):
    data = request.getfixturevalue("fever_data")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cache = tmp / "baselines.sqlite"
    argv = ["reward", "precompute-baselines", "--data", str(data), "--cache", str(cache), "--responder-model", "r",
            "--responder-url", f"http://127.0.0.1:{port}", "--responder-max-retries", "0"]  # fmt: skip
    return argv, f"127.0.0.1:{port}", cache


def eval_non_checkpoint(tmp, _):
    (tmp / "ckpt").mkdir()
    out = tmp / "report"
    return ["eval", "--checkpoint", str(tmp / "ckpt"), "--out", str(out)], str(tmp / "ckpt"), out


def serve_policy_non_checkpoint(tmp, _):
    (tmp / "ckpt").mkdir()
    return ["serve", "policy", "--model", str(tmp / "ckpt")], str(tmp / "ckpt"), tmp / "ckpt" / "never"


def compare_non_report(tmp, _):
    (tmp / "a.json").write_text('{"checkpoint": "x"}')
    (tmp / "b.json").write_text('{"checkpoint": "y"}')
    out = tmp / "cmp"
    return ["eval", "compare", str(tmp / "a.json"), str(tmp / "b.json"), "--out", str(out)], "a.json", out


def memsyco_bad_row(tmp, _):
    source = MEMSYCO / "valid_memory_selection.jsonl"
    row = json.loads(source.read_text(encoding="utf-8").splitlines()[0])
    row["memory"]["items"][0]["status"] = "bogus"
    (tmp / "rows.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    shutil.copy(MEMSYCO / "schema.json", tmp / "schema.json")
    out = tmp / "memsyco"
    argv = ["eval", "memsyco", str(tmp / "rows.jsonl"), "--responder_model", "r", "--judge_url",
            "http://127.0.0.1:9", "--judge_model", "j", "--out", str(out)]  # fmt: skip
    return argv, "rows.jsonl:1", out


MISTAKES = [
    Mistake("fever-missing-wiki-dump", fever_without_wiki_dump),
    Mistake("scifact-missing-corpus", scifact_without_corpus),
    Mistake("personamem-unknown-context", personamem_unknown_context),
    Mistake("data-config-missing-dir", data_config_missing_dir),
    Mistake("data-config-unknown-field", data_config_unknown_field),
    Mistake("train-config-unknown-field", train_config_unknown_field),
    Mistake("train-config-malformed-yaml", train_config_malformed_yaml),
    Mistake("train-config-missing-file", train_config_missing_file),
    Mistake("train-unknown-score-mode", train_unknown_score_mode),
    Mistake("precompute-unknown-score-mode", precompute_unknown_score_mode),
    Mistake("eval-unknown-score-mode", eval_unknown_score_mode),
    Mistake("eval-checkpoint-trained-in-an-unknown-mode", eval_checkpoint_trained_in_an_unknown_mode),
    Mistake("experiment-unknown-score-mode", experiment_unknown_score_mode),
    Mistake("ingest-locomo-json", ingest_locomo_json),
    Mistake("ask-missing-store", ask_missing_store),
    Mistake("precompute-unreachable-responder", precompute_unreachable_responder),
    Mistake("eval-non-checkpoint", eval_non_checkpoint),
    Mistake("serve-policy-non-checkpoint", serve_policy_non_checkpoint),
    Mistake("compare-non-report", compare_non_report),
    Mistake("memsyco-bad-row", memsyco_bad_row),
    Mistake("fever-deeply-nested-claim", fever_deeply_nested_claim),
    Mistake("fever-lone-surrogate-in-claim", fever_lone_surrogate_in_claim),
    Mistake("fever-record-over-the-size-limit", fever_record_over_the_size_limit),
    Mistake("fever-nei-claim-without-context", fever_nei_claim_without_context),
    Mistake("ingest-lone-surrogate", ingest_lone_surrogate),
    Mistake("ask-question-not-utf8", ask_question_not_utf8),
    Mistake("ask-store-embedder-hash-0", ask_store_embedder_hash_0),
    Mistake("ask-store-embedder-hash-huge", ask_store_embedder_hash_huge),
    Mistake("ask-store-random-bytes", ask_store_random_bytes),
    Mistake("ask-store-empty-file", ask_store_empty_file),
    Mistake("ask-store-embedder-local-path", ask_store_embedder_local_path),
    Mistake("ask-question-too-long", ask_question_too_long),
    Mistake("ingest-into-a-corrupt-store", ingest_into_a_corrupt_store),
]


@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.name for m in MISTAKES])
def test_a_user_mistake_is_one_line_and_leaves_nothing_behind(mistake, tmp_path, request, capsys):
    argv, names, created = mistake.setup(tmp_path, request)
    capsys.readouterr()
    code = main(["--log-level", "ERROR", *argv])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    command = " ".join(a for a in argv[:2] if not a.startswith("-"))
    assert lines[0].startswith(f"memstate {command}: error: "), lines[0]
    assert names in lines[0], lines[0]
    assert not created.exists(), f"{created} was left behind"


def test_debug_shows_the_traceback(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(TRAIN_YAML.format(out=tmp_path / "run") + "num_generationz: 4\n")
    argv = [sys.executable, "-m", "memstate.cli", "--log-level", "ERROR", "train", "--config", str(cfg)]
    quiet = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert quiet.returncode == 2 and quiet.stderr.count("\n") == 1 and "Traceback" not in quiet.stderr
    assert "(hint: " in quiet.stderr
    debug = subprocess.run([*argv[:3], "--debug", *argv[3:]], capture_output=True, text=True, cwd=ROOT)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr
    env = {**os.environ, "MEMSTATE_DEBUG": "1"}
    assert "Traceback" in subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env).stderr
