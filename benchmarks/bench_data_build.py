"""Data-build throughput on inputs shaped like the full FEVER release.

    python benchmarks/bench_data_build.py [--wiki-lines 1000000] [--claims 145449] [--max-claims 20000]
    python benchmarks/bench_data_build.py --smoke --out /tmp/bench_data_build.json  # seconds: inputs below (SMOKE)

Generates, in a temp dir, a wiki-pages dump of ``--wiki-lines`` pages in 50k-page shards and a claim file of
``--claims`` claims in FEVER 1.0's format (a third NOT ENOUGH INFO, evidence citing random pages), then runs the
real ``build_data`` with ``max_claims`` (≈ 3 instances per claim); then PersonaMem-shaped inputs (37 contexts of
400 messages, 9000 questions) through the real reader with the MiniLM embedder. Reports wiki lines/s,
instances/s, PersonaMem questions/s, peak RSS, and the extrapolated time of a full build (5.4M-page dump, 60k
instances). Prints the figures and writes JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import random
import resource
import tempfile
import time
from pathlib import Path

from results_io import report

from memstate.data_build.build import DataConfig, build_data
from memstate.data_build.fever import FeverConfig
from memstate.data_build.personamem import read_personamem
from memstate.sources import fever as fever_source
from memstate.sources.skips import SkipLog

ROOT = Path(__file__).resolve().parents[1]
FULL_DUMP_LINES = 5_416_537  # pages in FEVER's wiki-pages dump
TARGET_INSTANCES = 60_000
# --smoke's sizes (each unless given): the same code on inputs that take seconds
SMOKE = {"wiki_lines": 2000, "claims": 300, "max_claims": 100, "pm_contexts": 2, "pm_messages": 24, "pm_questions": 20}
WORDS = (
    "the of and in to was is for on as by with from at his an were are which this that be first its also new had "
    "film album river city born team season series league county village species party state king war music"
).split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + " ."


def write_inputs(root: Path, wiki_lines: int, claims: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    wiki = root / "wiki-pages"
    wiki.mkdir(parents=True)
    per_file = 50_000  # the real dump has ~50k pages per file
    for start in range(0, wiki_lines, per_file):
        with open(wiki / f"wiki-{start // per_file + 1:03d}.jsonl", "w", encoding="utf-8") as f:
            if start == 0:
                f.write(json.dumps({"id": "", "text": "", "lines": ""}) + "\n")
            for n in range(start, min(start + per_file, wiki_lines)):
                sents = [sentence(rng, rng.randint(8, 20)) for _ in range(rng.randint(1, 5))]
                lines = "\n".join(f"{i}\t{s}\tanchor\tTarget_{i}" for i, s in enumerate(sents))
                f.write(json.dumps({"id": f"Page_{n}", "text": " ".join(sents), "lines": lines}) + "\n")
    with open(root / "train.jsonl", "w", encoding="utf-8") as f:
        for n in range(claims):
            label = rng.choice(("SUPPORTS", "REFUTES", "NOT ENOUGH INFO"))
            if label == "NOT ENOUGH INFO":
                evidence = [[[n, None, None, None]]]
            else:
                page = rng.randrange(wiki_lines)
                evidence = [[[n, n, f"Page_{page}", 0]]]
            record = {"id": n, "verifiable": "NOT VERIFIABLE" if label == "NOT ENOUGH INFO" else "VERIFIABLE"}
            record |= {"label": label, "claim": sentence(rng, 9), "evidence": evidence}
            f.write(json.dumps(record) + "\n")


def write_personamem(root: Path, contexts: int, messages: int, questions: int, seed: int = 0) -> None:
    """PersonaMem-shaped inputs: ``contexts`` shared contexts of ``messages`` turns and a questions CSV."""
    rng = random.Random(seed)
    root.mkdir(parents=True)
    topics = ("food", "music", "travel", "sport", "books", "films", "work", "pets")
    ids = [f"ctx{n:04d}" for n in range(contexts)]
    with open(root / "shared_contexts_32k.jsonl", "w", encoding="utf-8") as f:
        for cid in ids:
            turns = [{"role": "system", "content": "Current user persona: " + sentence(rng, 30)}]
            for n in range(1, messages):
                topic = rng.choice(topics)
                if n % 2:
                    verb = rng.choice(("I love", "I can't stand", "Lately I prefer", "Last weekend I tried"))
                    text = f"User: {verb} {topic}: {sentence(rng, rng.randint(8, 30))}"
                else:
                    text = f"Assistant: {sentence(rng, rng.randint(15, 40))}"
                turns.append({"role": "user" if n % 2 else "assistant", "content": text})
            f.write(json.dumps({cid: turns}) + "\n")
    header = (
        "persona_id,question_id,question_type,topic,user_question_or_message,correct_answer,all_options,"
        "shared_context_id,end_index_in_shared_context"
    )
    types = ("acknowledge_latest_user_preferences", "track_full_preference_evolution", "recall_user_shared_facts")
    with open(root / "questions_32k.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, lineterminator="\r\n")
        writer.writerow(header.split(","))
        for n in range(questions):
            cid = rng.randrange(contexts)
            options = [f"({letter}) {sentence(rng, 12)}" for letter in "abcd"]
            row = [cid, f"q{n}", rng.choice(types), rng.choice(topics), sentence(rng, 14), "(b)", str(options)]
            writer.writerow(row + [ids[cid], rng.randrange(messages // 4, messages)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wiki-lines", type=int, default=1_000_000)
    parser.add_argument("--claims", type=int, default=145_449)
    parser.add_argument("--max-claims", type=int, default=20_000, help="Claims used (≈ 3 instances each).")
    parser.add_argument("--pm-contexts", type=int, default=37, help="PersonaMem shared contexts.")
    parser.add_argument("--pm-messages", type=int, default=400, help="Messages per shared context.")
    parser.add_argument("--pm-questions", type=int, default=9000, help="PersonaMem questions.")
    parser.add_argument("--smoke", action="store_true", help="seconds, the same code: the sizes of SMOKE")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_data_build.json"))
    args = parser.parse_args()
    if args.smoke:  # SMOKE's sizes as the defaults: a size given on the command line still wins
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "fever"
        start = time.perf_counter()
        write_inputs(src, args.wiki_lines, args.claims)
        generate_s = time.perf_counter() - start
        dump_bytes = sum(p.stat().st_size for p in (src / "wiki-pages").iterdir())

        # The wiki scan alone: every page is read; only the cited ones are parsed.
        wanted = {f"Page_{n}" for n in range(0, args.wiki_lines, 7)}
        start = time.perf_counter()
        fever_source.scan_wiki(src / "wiki-pages", wanted, SkipLog(), progress=False)
        scan_s = time.perf_counter() - start

        config = DataConfig(
            sources={"fever": FeverConfig(dir=str(src), claim_files=["train.jsonl"], max_claims=args.max_claims)},
            progress=False,
        )
        start = time.perf_counter()
        manifest = build_data(config, Path(tmp) / "out")
        build_s = time.perf_counter() - start

        # PersonaMem: every user turn of the referenced contexts and every question is embedded (MiniLM, CPU).
        pm = Path(tmp) / "personamem"
        write_personamem(pm, args.pm_contexts, args.pm_messages, args.pm_questions)
        start = time.perf_counter()
        pm_read = read_personamem(pm, "questions_32k.csv", "shared_contexts_32k.jsonl", SkipLog())
        pm_s = time.perf_counter() - start

    instances = manifest["instances_out"]
    wiki_lines_per_s = args.wiki_lines / scan_s
    # The build = one scan + claim reading + instance making + writing: the non-scan part scales with instances.
    instances_per_s = instances / max(build_s - scan_s, 1e-9)
    pm_questions_per_s = len(pm_read.items) / pm_s
    # ~48k FEVER + ~3k SciFact claim instances at instances_per_s, ~9k PersonaMem questions at its own rate.
    full_estimate_s = (
        FULL_DUMP_LINES / wiki_lines_per_s + (TARGET_INSTANCES - args.pm_questions) / instances_per_s + pm_s
    )
    results = {"smoke": True} if args.smoke else {}
    results |= {
        "machine": {"python": platform.python_version(), "cpus": len(__import__("os").sched_getaffinity(0))},
        "inputs": {
            "wiki_lines": args.wiki_lines,
            "wiki_bytes": dump_bytes,
            "claims_in_file": args.claims,
            "max_claims": args.max_claims,
        },
        "generate_inputs_s": round(generate_s, 1),
        "wiki_scan_s": round(scan_s, 2),
        "wiki_lines_per_s": round(wiki_lines_per_s),
        "wiki_mb_per_s": round(dump_bytes / scan_s / 2**20, 1),
        "build_s": round(build_s, 2),
        "instances": instances,
        "instances_per_s": round(instances_per_s, 1),
        "personamem": {
            "contexts": args.pm_contexts,
            "messages_per_context": args.pm_messages,
            "questions": args.pm_questions,
            "instances": len(pm_read.items),
            "seconds": round(pm_s, 1),
            "questions_per_s": round(pm_questions_per_s, 1),
        },
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "extrapolated_full_build_s": round(full_estimate_s, 1),
        "extrapolation": f"{FULL_DUMP_LINES} dump lines at wiki_lines_per_s + the claim instances of a "
        f"{TARGET_INSTANCES}-instance build at instances_per_s + the measured PersonaMem read",
    }
    report(results, args.out)


if __name__ == "__main__":
    main()
