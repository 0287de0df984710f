"""Data-build throughput on inputs shaped like the full FEVER release.

    python benchmarks/bench_data_build.py [--wiki-lines 1000000] [--claims 145449] [--max-claims 20000]

Generates, in a temp dir, a wiki-pages dump of ``--wiki-lines`` pages in 109-file-like shards and a claim file of
``--claims`` claims in FEVER 1.0's format (a third NOT ENOUGH INFO, evidence citing random pages), then runs the
real ``build_data`` with ``max_claims`` (≈ 3 instances per claim) and reports wiki lines/s, instances/s, peak RSS,
and the extrapolated time of a full build (5.4M-page dump, 60k instances). Prints the figures and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import tempfile
import time
from pathlib import Path

from data_build import fever
from data_build.build import DataConfig, FeverConfig, build_data
from data_build.records import SkipLog

ROOT = Path(__file__).resolve().parents[1]
FULL_DUMP_LINES = 5_416_537  # pages in FEVER's wiki-pages dump
TARGET_INSTANCES = 60_000
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wiki-lines", type=int, default=1_000_000)
    parser.add_argument("--claims", type=int, default=145_449)
    parser.add_argument("--max-claims", type=int, default=20_000, help="Claims used (≈ 3 instances each).")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_data_build.json"))
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
        fever.scan_wiki(src / "wiki-pages", wanted, SkipLog(), progress=False)
        scan_s = time.perf_counter() - start

        config = DataConfig(
            fever=FeverConfig(dir=str(src), claim_files=["train.jsonl"], max_claims=args.max_claims), progress=False
        )
        start = time.perf_counter()
        manifest = build_data(config, Path(tmp) / "out")
        build_s = time.perf_counter() - start

    instances = manifest["instances_out"]
    wiki_lines_per_s = args.wiki_lines / scan_s
    # The build = one scan + claim reading + instance making + writing: the non-scan part scales with instances.
    instances_per_s = instances / max(build_s - scan_s, 1e-9)
    full_estimate_s = FULL_DUMP_LINES / wiki_lines_per_s + TARGET_INSTANCES / instances_per_s
    results = {
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
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "extrapolated_full_build_s": round(full_estimate_s, 1),
        "extrapolation": f"{FULL_DUMP_LINES} dump lines at wiki_lines_per_s + {TARGET_INSTANCES} instances at "
        "instances_per_s (FEVER part; PersonaMem embedding is measured separately)",
    }
    print(json.dumps(results, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
