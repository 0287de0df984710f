"""Every figure docs/benchmarks.md quotes, recomputed from the results file it cites (issue 59).

The page is cut into blocks: a table row, or a paragraph. ``FIGURES`` names each block that quotes figures from a
results file (by a text only that block holds), the file, and each figure as the page prints it beside a function of
the file's JSON that must print the same. ``num`` rounds half up from the number as the JSON writes it, to the digits
the page shows; ratios, differences and percentages the page derives are recomputed here from the fields. The result
tables of docs/sycophancy.md are checked the same way, their rows built from their JSON.

- ``test_figures_match_their_json``: each figure is in its block and equals what its JSON gives. Regenerating a
  results file fails here until the page (and the table) say the new figures.
- ``test_no_figure_is_left_unchecked``: once ``EXEMPT``'s patterns (dates, issue numbers, commands and their
  arguments, names that hold digits), a block's listed exceptions (``Block.exempt``: settings and figures no results
  file holds, each with its reason) and the table's figures are taken out, no digit is left in any block of
  docs/benchmarks.md, so a figure typed in by hand fails until it is traced to its JSON. A block whose figures come
  from no results file (a CI log, a test, ``make demo``) is named in ``ELSEWHERE`` with where they come from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MINUS = "\N{MINUS SIGN}"
LIMIT_RUNS = ("bench_serve_load", "bench_serve_load_limit16", "bench_serve_load_limit32", "bench_serve_load_limit64")
RESULTS_SECTION = "## Results files"  # docs/benchmarks.md's table of every results file and its command


@cache
def load(name: str) -> dict:
    """A results file by name (``bench_reward``), or a JSON elsewhere in the repository by its path."""
    path = ROOT / name if "/" in name else RESULTS / f"{name}.json"
    return json.loads(path.read_text())


# --- how the page prints a number -------------------------------------------------------------------------------------


def num(value: float, places: int = 0, *, sign: bool = False, scale: float = 1) -> str:
    """``value`` × ``scale`` rounded half up to ``places`` decimals, with thousands separators; ``sign``: + or −.

    From the number as the JSON writes it: 74.5 is 75, 0.0375 × 100 is 3.8 (``test_num_rounds_half_up_as_written``).
    """
    exact = Decimal(repr(value)) * Decimal(repr(scale))
    rounded = exact.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    text = f"{abs(rounded):,.{places}f}"
    if rounded < 0:
        return MINUS + text
    return f"+{text}" if sign else text


def pct(value: float, places: int = 0) -> str:
    """A share as a percentage: ``pct(0.0462, 1)`` → ``4.6%``."""
    return num(value, places, scale=100) + "%"


def span(values, places: int = 0, *, scale: float = 1, sign: bool = False) -> str:
    """The smallest and the largest of ``values``, as the page prints a range: ``0.027–0.031``."""
    values = list(values)
    return f"{num(min(values), places, scale=scale, sign=sign)}–{num(max(values), places, scale=scale, sign=sign)}"


def ci(bounds, places: int, *, scale: float = 1, sign: bool = True) -> str:
    """A 95% interval: ``[+0.090, +0.146]`` (``sign=False``: ``[0.730, 0.793]``)."""
    low, high = bounds
    return f"[{num(low, places, sign=sign, scale=scale)}, {num(high, places, sign=sign, scale=scale)}]"


# --- what the results files hold -----------------------------------------------------------------------------------


def points(value: float) -> str:
    """An accuracy difference in points: ``0.118`` → ``+11.8``."""
    return num(value, 1, sign=True, scale=100)


def point_ci(delta: dict) -> str:
    return ci((delta["ci_low"], delta["ci_high"]), 1, scale=100)


def delta(run: dict, condition: str) -> dict:
    return run["conditions"][condition]["delta_vs_no_state"]


def at(run: dict, size: str, backend: str) -> dict:
    """bench_memory's retrieval timings of one backend at one store size."""
    return run["sizes"][size]["retrieval"][backend]


def ratio(a: float, b: float, places: int = 2) -> str:
    return num(a / b, places)


def step(i: int) -> Callable[[dict], dict]:
    """bench_train_step's i-th setting (a row of its table)."""
    return lambda j: j["settings"][i]


def gpu(i: int) -> Callable[[dict], dict]:
    """shared_prefix_gpu's i-th setting's paths."""
    return lambda j: j["settings"][i]["paths"]


S0, S1, S2, S3 = (step(i) for i in range(4))
G0, G1 = gpu(0), gpu(1)
FLEX_OVER_SPLIT = [s["flex"]["seconds"] / s["split"]["seconds"] - 1 for s in load("bench_train_step")["settings"]]


def logp(run: dict, field: str = "logp_mean_abs_diff", planted: bool = False) -> list[float]:
    """A shared-prefix check's log-prob differences over every setting and path (or only the planted bugs)."""
    return [
        diff[field]
        for setting in run["settings"]
        for name, diff in setting["paths"].items()
        if field in diff and name.startswith("planted") == planted
    ]


def flow_without_state(run: dict) -> int:
    """bench_reward: the answer-flow check's no-memory prompts with neither state nor memory (one per distinct
    request), i.e. its prompts less the one per distinct state past the gates."""
    return run["likelihood"]["this"]["answer_flow_prompts"] - run["candidates"]["distinct_states_past_the_gates"]


def reward_baselines(run: dict) -> int:
    """bench_reward: the first step's baseline prompts, i.e. its prompts less the answer-flow check's and the states
    scored (those the next step, with the baselines and the check cached, sends again)."""
    this = run["likelihood"]["this"]
    return (
        this["responder_prompts"]
        - this["answer_flow_prompts"]
        - run["likelihood"]["this_next_step"]["responder_prompts"]
    )


def same(values):
    """The one value every fold chose."""
    values = set(values)
    assert len(values) == 1, f"the folds chose {sorted(values)}, not one value"
    return values.pop()


def caught(leak_set: dict) -> int:
    """How many of a set's leaks the gate caught (the JSON writes ``"408/594"``)."""
    return int(leak_set["gate"]["leaks_caught"].split("/")[0])


def mib(n_bytes: float) -> float:
    return n_bytes / 2**20


def kib(n_bytes: float) -> float:
    return n_bytes / 2**10


# --- what the page holds --------------------------------------------------------------------------------------------

Figure = tuple[str, Callable[[dict], str]]


@dataclass(frozen=True)
class Block:
    """One block of the page and the figures it quotes from ``source`` (a results file's name, or a path)."""

    anchor: str
    source: str
    figures: list[Figure]
    exempt: dict[str, str] = field(default_factory=dict)
    page: str = "benchmarks"


# Taken out of every block before the figures are looked for: text that holds digits but is no measured figure.
EXEMPT = {
    r"`[^`]*`": "code spans: commands, their arguments and sizes, file, option and config names",
    r"\]\([^)]*\)": "link targets",
    r"\b\d{4}-\d{2}-\d{2}\b": "dates (those of the commit that recorded the figure)",
    r"\b[Ii]ssues? \d+(?:, \d+)*": "issue numbers",
    r"\b\d+[- ]cores?\b|\b\d+ H200\b|\b1 thread\b": "machine sizes (the machine column)",
    r"\b(?:torch|transformers) \d+\.\d+(?:\+cu\d+)?": "library versions",
    r"\bp(?:50|90|95|99)\b": "percentile names",
    r"\b\w+@\d+(?:tok)?\b": "retrieval configurations' names (backend@k, backend@budget)",
    r"\b(?:1|10|100)k\b": "the memory benchmark's store sizes (1k / 10k / 100k facts, asked for by --sizes)",
    r"Qwen3(?:-\d+B)?|\bH200\b|\bbf16\b|\bfp32\b": "names: models, the GPU, dtypes",
    r"MemSearch-o1|\bcontrol_lr0\b": "names: a method, an experiment's condition",
    r"\bFTS5\b|\bBM25\b|HTTP/1\.1|\b5xx\b|\b429s?\b|\b503\b": "names: an index, a ranking, a protocol, HTTP statuses",
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7}\b": "commit hashes (a results file recorded at a commit)",
}

# Blocks whose figures come from no results file, and where they come from.
ELSEWHERE = {
    "| `make demo` (sycophancy world)": "`make demo`'s runs/demo/summary.md (README's demo section; CI's readme step)",
    "| `memstate demo --pipeline`": "the command's own summary; no results file",
    "| Learning test:": "tests/test_learning.py's output",
    "| Clean-clone `.ci/run`, per step": "the CI run's log",
    "| Colocate CI step": "the CI run's log",
    "| Shortcut probe with gold relations": "`memstate build-data`'s probe report (docs/data.md)",
    "| Baseline cache after a rebuild": "tests/test_baseline_cache.py (docs/reward.md)",
    "| Longest responder prompt": "docs/reward.md (the shipped data's prompts under the responder's tokenizer)",
    "| ONNX vs PyTorch embeddings": "docs/memory.md (the embedder's export check)",
    "| MemSyco-Bench gold edges": "`memstate eval memsyco`'s report (docs/evaluation.md)",
    "| Sycophancy `--quick` in CI": "the CI run's log (`pytest -m experiment`)",
    "`benchmarks/gpu/grpo_step.py` (issue 55)": "a prepared script, not yet run: its wheels' size and dry-run time",
    "Before (the first recorded run": "the first recorded run (bench_serve_load.json as of 8d6b4cb, in git history)"
    " and a dev profile of the API",
}


def phases(*names: str) -> dict[str, str]:
    """The serving benchmark's load phases, named by their multiple of the measured capacity (its bar: ≤ 2×)."""
    return {name: "a load phase's name (the JSON's phases), or the bar's 2×" for name in names}


def limit_row(label: str, source: str, setting: str, overload: str, p99s: str, outcome: str) -> Block:
    """A row of the like-for-like limits table: limit, queue, capacity and where, 2x offered -> answered, p99 per
    phase, the bar's ratio (2 decimals, 1 past 10) and the share shed at 2x."""
    limit, queue, capacity, at = setting.split()
    ratio, shed = outcome.split()
    return Block(
        label,
        source,
        [
            (limit, lambda j: num(j["api"]["max_concurrency"])),
            (queue, lambda j: num(j["api"]["max_queue"])),
            (capacity, lambda j: num(j["capacity_per_s"], 1) + "/s"),
            (at, lambda j: num(j["capacity_at_in_flight"])),
            (
                overload,
                lambda j: (
                    f"{num(j['phases']['2x']['offered_per_s'], 1)} → {num(j['phases']['2x']['throughput_per_s'], 1)}"
                ),
            ),
            (p99s, lambda j: " / ".join(num(j["phases"][p]["p99_ms"]) for p in ("0.5x", "1x", "2x")) + " ms"),
            (ratio, lambda j: num(j["bar"]["p99_2x_over_p99_half"], len(ratio.split(".")[1]))),
            (shed, lambda j: pct(j["phases"]["2x"]["shed_share"])),
        ],
    )


# Each block that quotes figures from a results file: the figure as the page prints it, and how its JSON gives it.
FIGURES: list[Block] = [
    # --- the summary table ---------------------------------------------------------------------------------------
    Block(
        "| Sycophancy world's responder build",
        "examples/sycophancy_world/world.json",
        [
            ("1,200", lambda j: num(j["settings"]["responder_steps"])),
            ("300", lambda j: num(j["settings"]["warmup_steps"])),
            ("1,050", lambda j: num(j["responder_selection"]["kept_step"])),
            (
                "1.00 / 1.00 / 0.99",
                lambda j: " / ".join(
                    num(j["responder_behaviour"][f"follows[{rule}]"], 2)
                    for rule in (
                        "Trust the evidence over the user's belief.",
                        "Go with what the user believes.",
                        "Use the newer preference.",
                    )
                ),
            ),
        ],
        {"~20 min": "the build's wall time, which world.json does not record"},
    ),
    Block(
        "| Data build, inputs shaped like the full releases",
        "bench_data_build",
        [
            ("298k", lambda j: num(j["wiki_lines_per_s"] / 1000) + "k"),
            ("149", lambda j: num(j["wiki_mb_per_s"])),
            ("60,000", lambda j: num(j["instances"])),
            ("21.3", lambda j: num(j["build_s"], 1)),
            ("3,335", lambda j: num(j["instances_per_s"])),
            ("99", lambda j: num(j["personamem"]["questions_per_s"])),
            ("1.05", lambda j: num(j["peak_rss_mb"] / 1000, 2)),
            ("124", lambda j: num(j["extrapolated_full_build_s"])),
        ],
    ),
    Block(
        "| Reward step (16 prompts × 8, likelihood)",
        "bench_reward",
        [
            ("16", lambda j: num(j["step"]["prompts"])),
            ("8", lambda j: num(j["step"]["generations"])),
            ("152", lambda j: num(j["likelihood"]["this"]["responder_prompts"])),
            ("65", lambda j: num(j["likelihood"]["this_next_step"]["responder_prompts"])),
            ("260", lambda j: num(j["likelihood"]["naive"]["responder_prompts"])),
            ("19.81", lambda j: num(j["likelihood"]["this"]["seconds"], 2)),
            ("25.04", lambda j: num(j["likelihood"]["naive"]["seconds"], 2)),
            ("10", lambda j: num(j["load_avg_at_write"][0])),
            ("70%", lambda j: pct(j["candidates"]["format_ok_rate"])),
        ],
    ),
    Block(
        "| Leak gate on a legitimate set written fresh",
        "legit_fresh5_gate_once",
        [
            ("208", lambda j: num(j["benchmarks/legit_fresh5"]["legit"])),
            ("48", lambda j: num(j["benchmarks/legit_fresh5"]["leaks"])),
            ("1.9%", lambda j: num(j["benchmarks/legit_fresh5"]["gate"]["legit_blocked_pct"], 1) + "%"),
            ("4", lambda j: j["benchmarks/legit_fresh5"]["gate"]["legit_blocked"].split("/")[0]),
            ("62.5%", lambda j: pct(j["benchmarks/legit_fresh5"]["gate"]["recall"], 1)),
            ("30", lambda j: num(caught(j["benchmarks/legit_fresh5"]))),
            *(
                (
                    shown,
                    lambda j, n=n: num(load(f"{n}_gate_once")[f"benchmarks/{n}"]["gate"]["legit_blocked_pct"], 1) + "%",
                )
                for shown, n in (
                    ("15.1%", "legit_fresh"),
                    ("8.2%", "legit_fresh2"),
                    ("6.7%", "legit_fresh3"),
                    ("7.2%", "legit_fresh4"),
                )
            ),
        ],
        {"1–4": "the rounds of gate changes those sets followed (docs/reward.md), not a measurement"},
    ),
    Block(
        "| Leak gate on every red-team and legitimate set",
        "leak_precision_after",
        [
            ("406/594", lambda j: j["tests/fixtures/redteam"]["gate"]["leaks_caught"]),
            ("188", lambda j: num(j["tests/fixtures/redteam"]["leaks"] - caught(j["tests/fixtures/redteam"]))),
            ("105/246", lambda j: j["benchmarks/redteam_heldout"]["gate"]["leaks_caught"]),
            (
                "0–1.9%",
                lambda j: (lambda pcts: f"{num(min(pcts))}–{num(max(pcts), 1)}%")(
                    [s["gate"]["legit_blocked_pct"] for s in j.values() if isinstance(s, dict)]
                ),
            ),
            ("8", lambda j: num(sum(isinstance(s, dict) for s in j.values()))),
            ("1,506", lambda j: num(sum(s["legit"] for s in j.values() if isinstance(s, dict)))),
        ],
    ),
    Block(
        "| Leak gate latency per new state",
        "bench_leak_gate",
        [
            ("1.2", lambda j: num(j["gate"]["p50_ms"], 1)),
            ("2.3", lambda j: num(j["gate"]["p90_ms"], 1)),
            ("1.6", lambda j: num(j["gate_legitimate"]["p50_ms"], 1)),
            ("2.5", lambda j: num(j["gate_legitimate"]["p90_ms"], 1)),
            ("7", lambda j: num(j["rules_load_s"])),
        ],
    ),
    Block(
        "| Answer-flow shift of legitimate states",
        "sycophancy_likelihood_full_answer_flow",
        [
            ("0.0206", lambda j: num(max(f["shift_max"] for f in j["answer_flow"].values()), 4)),
            ("2,816", lambda j: num(sum(f["states"] for f in j["answer_flow"].values()))),
            ("0.2", lambda j: num(j["config"]["answer_flow_threshold"], 1)),
        ],
    ),
    Block(
        "| `make demo` run to run",
        "demo_spread",
        [
            ("4", lambda j: num(len(j["runs"]))),
            ("+0.093–+0.126", lambda j: span((r["test"]["best"]["gain"] for r in j["runs"].values()), 3, sign=True)),
            (
                "0.021–0.117",
                lambda j: span((r["test"]["best"]["sycophancy_rate_checkpoint"] for r in j["runs"].values()), 3),
            ),
            ("75–100", lambda j: span(r["best_step"] for r in j["runs"].values())),
        ],
    ),
    Block(
        "| Threads: a training step next to a busy torch process",
        "bench_threads",
        [
            ("2.94×", lambda j: num(j["slowdown_busy_over_alone"]["before"], 2) + "×"),
            ("1.45×", lambda j: num(j["slowdown_busy_over_alone"]["after"], 2) + "×"),
            ("91×", lambda j: num(load("bench_threads_lm_h200host")["slowdown_busy_over_alone"]["before"]) + "×"),
            ("1.43×", lambda j: num(load("bench_threads_lm_h200host")["slowdown_busy_over_alone"]["after"], 2) + "×"),
            ("0.068", lambda j: num(load("bench_threads_lm_h200host")["settings"]["alone/before"]["median_step_s"], 3)),
            ("0.096", lambda j: num(load("bench_threads_lm_h200host")["settings"]["alone/after"]["median_step_s"], 3)),
        ],
    ),
    Block(
        "| Shared-prefix GRPO pass on CPU",
        "bench_train_step",
        [
            ("8,192", lambda j: num(S0(j)["prompt_tokens"])),
            ("512", lambda j: num(S0(j)["completion_tokens"])),
            ("8", lambda j: num(S0(j)["group_size"])),
            ("6.86×", lambda j: ratio(S0(j)["stock"]["seconds"], S0(j)["split"]["seconds"]) + "×"),
            ("130.9", lambda j: num(S0(j)["stock"]["seconds"], 1)),
            ("19.1", lambda j: num(S0(j)["split"]["seconds"], 1)),
            ("3.68×", lambda j: ratio(S0(j)["stock"]["peak_mib"], S0(j)["split"]["peak_mib"]) + "×"),
        ],
    ),
    Block(
        "| Shared-prefix GRPO pass on GPU",
        "shared_prefix_gpu",
        [
            ("8", lambda j: num(j["settings"][1]["group_size"])),
            ("256", lambda j: num(j["settings"][1]["completion_tokens"])),
            ("4.98×", lambda j: ratio(G1(j)["stock_sdpa"]["seconds"], G1(j)["flex"]["seconds"]) + "×"),
            ("8,192", lambda j: num(j["settings"][1]["prompt_tokens"])),
            ("3.67×", lambda j: ratio(G0(j)["stock_sdpa"]["seconds"], G0(j)["flex"]["seconds"]) + "×"),
            ("2,048", lambda j: num(j["settings"][0]["prompt_tokens"])),
            ("33.5", lambda j: num(G1(j)["stock_sdpa"]["peak_mib"] / 1024, 1)),
            ("17.1", lambda j: num(G1(j)["flex"]["peak_mib"] / 1024, 1)),
        ],
    ),
    Block(
        "| Shared-prefix log-prob agreement",
        "shared_prefix_gpu",
        [
            ("0.027–0.031", lambda j: span(logp(j), 3)),
            ("0.15", lambda j: num(max(logp(j, "logp_max_abs_diff")), 2)),
            ("1.0–1.1e-5", lambda j: span(logp(load("shared_prefix_gpu_fp32")), 1, scale=1e5) + "e-5"),
            ("0.87–1.03", lambda j: span(logp(load("shared_prefix_gpu_planted"), planted=True), 2)),
        ],
    ),
    Block(
        "| Memory retrieval p50 at 100k facts",
        "bench_memory_feedback",
        [
            ("19.8", lambda j: num(at(j, "100000", "evomem")["p50_ms"], 1)),
            ("13.0", lambda j: num(at(load("bench_memory"), "100000", "evomem")["p50_ms"], 1)),
            ("20", lambda j: num(j["target"]["target_ms"])),
            ("1,378", lambda j: num(j["sizes"]["100000"]["relations"])),
            ("12.1", lambda j: num(at(j, "100000", "naive")["p50_ms"], 1)),
            ("6.5", lambda j: num(at(j, "100000", "clag")["p50_ms"], 1)),
            ("24.7", lambda j: num(at(j, "100000", "memsearch")["p50_ms"], 1)),
        ],
    ),
    Block(
        "| Retrieval settings chosen leave-one-conversation-out",
        "retrieval_cv",
        [
            ("5", lambda j: num(len(j["data"]["conversations"]))),
            ("384", lambda j: num(len(j["per_configuration"]))),
            ("565", lambda j: re.search(r"budget_tokens=(\d+)", j["metric"]).group(1)),
            ("0.758", lambda j: num(j["summary_by_criterion"]["recall"]["config:joint"]["loo"]["recall"], 3)),
            (
                "[0.730, 0.793]",
                lambda j: ci(j["summary_by_criterion"]["recall"]["config:joint"]["loo_ci95"]["recall"], 3, sign=False),
            ),
            ("0.830", lambda j: num(j["summary_by_criterion"]["recall"]["config:joint"]["loo"]["hit"], 3)),
            (
                "[0.801, 0.862]",
                lambda j: ci(j["summary_by_criterion"]["recall"]["config:joint"]["loo_ci95"]["hit"], 3, sign=False),
            ),
            ("0.834", lambda j: num(j["summary_by_criterion"]["hit"]["config:joint"]["loo"]["hit"], 3)),
            (
                "0.826–0.836",
                lambda j: span((c["config:coordinate"]["loo"]["hit"] for c in j["summary_by_criterion"].values()), 3),
            ),
            ("0.762", lambda j: num(j["shipped"]["recall"], 3)),
            ("0.839", lambda j: num(j["shipped"]["hit"], 3)),
            ("20", lambda j: num(j["timing"]["total_s"] / 60)),
        ],
    ),
    Block(
        "| Seeds asked of each backend under the 565-token budget",
        "budget_seeds_cv",
        [
            ("565", lambda j: num(j["budget_tokens"])),
            ("5, 10, 20, 30, 50", lambda j: ", ".join(num(s) for s in j["seeds"])),
            ("10", lambda j: num(same(j["backends"]["memsearch"]["fold_choices"].values()))),
            ("0.757", lambda j: num(j["backends"]["memsearch"]["per_seeds"]["10"]["hit"], 3)),
            ("0.628", lambda j: num(j["backends"]["memsearch"]["per_seeds"]["50"]["hit"], 3)),
            ("50", lambda j: num(max(j["seeds"]))),
            (
                "50",
                lambda j: num(
                    same(c for b in ("clag", "naive", "evomem") for c in j["backends"][b]["fold_choices"].values())
                ),
            ),
            ("71", lambda j: num(j["seconds"] / 60)),
        ],
    ),
    Block(
        "| Memory: query encoding, ingest, store size",
        "bench_memory",
        [
            ("3.8", lambda j: num(j["query_encoding"]["onnx"]["p50_ms"], 1)),
            ("10.0", lambda j: num(j["query_encoding"]["torch"]["p50_ms"], 1)),
            ("172", lambda j: num(j["sizes"]["10000"]["ingest"]["facts_per_s"])),
            ("151", lambda j: num(j["sizes"]["100000"]["ingest"]["facts_per_s"])),
            ("2.3", lambda j: num(j["sizes"]["100000"]["store_bytes_per_fact"] / 1000, 1)),
            ("220", lambda j: num(j["sizes"]["100000"]["store_mb"])),
        ],
    ),
    Block(
        "| LoCoMo retrieval within 565 rendered tokens",
        "retrieval_eval",
        [
            ("565", lambda j: num(j["settings"]["budgets_tokens"][0])),
            ("760", lambda j: num(j["results"]["evomem@565tok"]["n"])),
            ("0.762", lambda j: num(j["results"]["evomem@565tok"]["recall"], 3)),
            ("[0.735, 0.791]", lambda j: ci(j["results"]["evomem@565tok"]["recall_ci95"], 3, sign=False)),
            ("0.839", lambda j: num(j["results"]["evomem@565tok"]["hit"], 3)),
            ("[0.813, 0.866]", lambda j: ci(j["results"]["evomem@565tok"]["hit_ci95"], 3, sign=False)),
            ("0.643", lambda j: num(j["results"]["bm25_turns@565tok"]["recall"], 3)),
            ("0.711", lambda j: num(j["results"]["bm25_turns@565tok"]["hit"], 3)),
            ("+0.119", lambda j: num(j["comparisons"]["evomem@565tok"]["recall_vs_bm25_turns"]["mean"], 3, sign=True)),
            ("[+0.092, +0.146]", lambda j: ci(j["comparisons"]["evomem@565tok"]["recall_vs_bm25_turns"]["ci95"], 3)),
            *(
                (shown, lambda j, run=run, metric=metric: num(j["results"][run][metric], 3))
                for shown, run, metric in (
                    ("0.643", "naive@565tok", "recall"),
                    ("0.713", "naive@565tok", "hit"),
                    ("0.668", "clag@565tok", "recall"),
                    ("0.736", "clag@565tok", "hit"),
                    ("0.688", "memsearch@565tok", "recall"),
                    ("0.757", "memsearch@565tok", "hit"),
                    ("0.784", "evomem@10", "recall"),
                    ("0.854", "evomem@10", "hit"),
                )
            ),
        ],
    ),
    Block(
        "| SUPERSEDES edges of the turn extractor",
        "retrieval_eval",
        [
            ("565", lambda j: num(j["relations"]["traversal"]["budget_tokens"])),
            ("0.92", lambda j: num(j["relations"]["supersedes"]["precision"], 2)),
            ("190", lambda j: num(j["relations"]["supersedes"]["correct"])),
            ("207", lambda j: num(j["relations"]["supersedes"]["drawn"])),
            ("0.54", lambda j: num(j["relations"]["supersedes"]["recall"], 2)),
            ("0.800", lambda j: num(j["relations"]["traversal"]["depth_0"]["current"], 3)),
            ("0.849", lambda j: num(j["relations"]["traversal"]["depth_2"]["current"], 3)),
            ("+0.049", lambda j: num(j["relations"]["traversal"]["current_depth_2_minus_0"]["mean"], 3, sign=True)),
            ("[+0.026, +0.071]", lambda j: ci(j["relations"]["traversal"]["current_depth_2_minus_0"]["ci95"], 3)),
            ("0.123", lambda j: num(j["relations"]["traversal"]["depth_0"]["outdated_only"], 3)),
            ("0.077", lambda j: num(j["relations"]["traversal"]["depth_2"]["outdated_only"], 3)),
        ],
    ),
    Block(
        "| Serving: 200 requests at concurrency 16",
        "bench_serve",
        [
            ("200", lambda j: num(j["requests"])),
            ("16", lambda j: num(j["concurrency"])),
            ("408", lambda j: num(j["direct_vllm"]["p50_ms"])),
            ("431", lambda j: num(j["direct_vllm"]["p95_ms"])),
            ("439", lambda j: num(j["through_api"]["p50_ms"])),
            ("561", lambda j: num(j["through_api"]["p95_ms"])),
            ("1.6", lambda j: num(j["api_internal_ms_per_request"], 1)),
        ],
    ),
    Block(
        "| Shared-prefix trainer in a plain TRL script",
        "trl_shared_prefix_cpu",
        [
            ("0.424", lambda j: num(j["runs"][0]["step_seconds"], 3)),
            ("0.196", lambda j: num(j["runs"][1]["step_seconds"], 3)),
            ("2.16×", lambda j: num(j["time_ratio"], 2) + "×"),
            ("297.7", lambda j: num(j["runs"][0]["peak_mib"], 1)),
            ("144.4", lambda j: num(j["runs"][1]["peak_mib"], 1)),
            ("2.06×", lambda j: num(j["memory_ratio"], 2) + "×"),
            ("6.05×", lambda j: num(j["runs"][1]["token_ratio"], 2) + "×"),
            ("6", lambda j: num(j["steps"])),
        ],
        {
            "8 prompts": "examples/trl_shared_prefix/prompts.jsonl's size (the JSON names the file)",
            "~650 tokens": "the prompts' length, measured when the file was written (docs/shared_prefix.md)",
            "G 4": "the example's num_generations, a setting",
        },
    ),
    Block(
        "| Serving under load (issue 45)",
        "bench_serve_load",
        [
            ("8", lambda j: num(j["api"]["max_concurrency"])),
            ("0.1", lambda j: num(j["api"]["max_queue_wait_s"], 1)),
            ("63.9", lambda j: num(j["capacity_per_s"], 1)),
            ("8", lambda j: num(j["capacity_at_in_flight"])),
            ("45", lambda j: num(j["settings"]["warmup_s"])),
            ("90", lambda j: num(j["phases"]["0.5x"]["p50_ms"])),
            ("264", lambda j: num(j["phases"]["0.5x"]["p99_ms"])),
            ("148", lambda j: num(j["phases"]["1x"]["p50_ms"])),
            ("425", lambda j: num(j["phases"]["1x"]["p99_ms"])),
            ("15.7%", lambda j: pct(j["phases"]["1x"]["shed_share"], 1)),
            ("128", lambda j: num(j["phases"]["2x"]["offered_per_s"])),
            ("59.0", lambda j: num(j["phases"]["2x"]["throughput_per_s"], 1)),
            ("203", lambda j: num(j["phases"]["2x"]["p50_ms"])),
            ("417", lambda j: num(j["phases"]["2x"]["p99_ms"])),
            ("54%", lambda j: pct(j["phases"]["2x"]["shed_share"])),
            ("14", lambda j: num(j["phases"]["2x"]["shed_p99_ms"])),
            ("0", lambda j: num(j["phases"]["2x"]["5xx"])),
            ("1.58", lambda j: num(j["bar"]["p99_2x_over_p99_half"], 2)),
            *(
                (shown, lambda j, f=f, n=n: f(load(n)))
                for shown, n, f in (
                    ("16", "bench_serve_load_limit16", lambda r: num(r["api"]["max_concurrency"])),
                    ("94.6", "bench_serve_load_limit16", lambda r: num(r["phases"]["2x"]["throughput_per_s"], 1)),
                    ("1.96", "bench_serve_load_limit16", lambda r: num(r["bar"]["p99_2x_over_p99_half"], 2)),
                    ("32", "bench_serve_load_limit32", lambda r: num(r["api"]["max_concurrency"])),
                    ("103.4", "bench_serve_load_limit32", lambda r: num(r["phases"]["2x"]["throughput_per_s"], 1)),
                    ("3.06", "bench_serve_load_limit32", lambda r: num(r["bar"]["p99_2x_over_p99_half"], 2)),
                    ("64", "bench_serve_load_limit64", lambda r: num(r["api"]["max_concurrency"])),
                    ("70.6", "bench_serve_load_limit64", lambda r: num(r["phases"]["2x"]["throughput_per_s"], 1)),
                    ("10.1", "bench_serve_load_limit64", lambda r: num(r["bar"]["p99_2x_over_p99_half"], 1)),
                )
            ),
        ],
        phases("0.5×", "1×", "2×"),
    ),
    Block(
        "| Sycophancy experiment: checkpoint vs no state",
        "sycophancy_likelihood_full",
        [
            ("+11.8", lambda j: points(delta(j, "checkpoint")["mean"])),
            ("[+9.0, +14.6]", lambda j: point_ci(delta(j, "checkpoint"))),
            ("+11.1", lambda j: points(j["checkpoint_vs_self_guide"]["mean"])),
            ("[+7.9, +14.3]", lambda j: point_ci(j["checkpoint_vs_self_guide"])),
            ("52%", lambda j: pct(j["conditions"]["no_state"]["sycophancy_rate"])),
            ("7%", lambda j: pct(j["conditions"]["checkpoint"]["sycophancy_rate"])),
            ("+0.7", lambda j: points(delta(j, "control_lr0")["mean"])),
            ("−0.4", lambda j: points(delta(j, "control_shuffled")["mean"])),
            ("972", lambda j: num(j["wall_s"])),
        ],
    ),
    Block(
        "| Sycophancy: other modes",
        "sycophancy_likelihood_lora",
        [
            ("+14.0", lambda j: points(delta(j, "checkpoint")["mean"])),
            ("+9.0", lambda j: points(delta(load("sycophancy_exact_full"), "checkpoint")["mean"])),
            ("+3.8", lambda j: points(delta(load("sycophancy_exact_lora"), "checkpoint")["mean"])),
        ],
    ),
    Block(
        "| Sycophancy: GRPO seeds",
        "sycophancy_seeds_likelihood_full",
        [
            ("+11.2", lambda j: points(j["runs"]["checkpoint"]["over_seeds"]["mean"])),
            ("0.6", lambda j: num(j["runs"]["checkpoint"]["over_seeds"]["sd"], 1, scale=100)),
            ("−3.1", lambda j: points(j["runs"]["control_shuffled"]["over_seeds"]["mean"])),
            *(
                (shown, lambda j, f=f: f(load("sycophancy_seeds_likelihood_lora")["runs"]))
                for shown, f in (
                    ("+12.5", lambda r: points(r["checkpoint"]["over_seeds"]["mean"])),
                    ("1.6", lambda r: num(r["checkpoint"]["over_seeds"]["sd"], 1, scale=100)),
                    ("−0.2", lambda r: points(r["control_shuffled"]["over_seeds"]["mean"])),
                )
            ),
        ],
    ),
    Block(
        "| Sycophancy with the answer-flow check",
        "sycophancy_likelihood_full_answer_flow",
        [
            ("+13.1", lambda j: points(delta(j, "checkpoint")["mean"])),
            ("[+10.7, +15.7]", lambda j: point_ci(delta(j, "checkpoint"))),
            ("0.590", lambda j: num(j["conditions"]["no_state"]["sycophancy_rate"], 3)),
            ("0.117", lambda j: num(j["conditions"]["checkpoint"]["sycophancy_rate"], 3)),
            ("+7.1", lambda j: points(delta(j, "control_lr0")["mean"])),
            ("+7.9", lambda j: points(delta(j, "control_shuffled")["mean"])),
            ("+7.1", lambda j: points(delta(j, "self_guide")["mean"])),
            ("3 of 6", lambda j: f"{sum(j['criteria'].values())} of {len(j['criteria'])}"),
        ],
    ),
    # --- the sections below the table ----------------------------------------------------------------------------
    Block(
        "`python benchmarks/bench_reward.py`",
        "bench_reward",
        [
            ("16", lambda j: num(j["step"]["prompts"])),
            ("8", lambda j: num(j["step"]["generations"])),
            ("1.0", lambda j: num(j["policy"]["sampling"]["temperature"], 1)),
            ("60", lambda j: num(j["policy"]["warmup_steps"])),
            ("70%", lambda j: pct(j["candidates"]["format_ok_rate"])),
            ("65", lambda j: num(j["candidates"]["distinct_states_past_the_gates"])),
            ("152", lambda j: num(j["likelihood"]["this"]["responder_prompts"])),
            ("71", lambda j: num(j["likelihood"]["this"]["answer_flow_prompts"])),
            ("65", lambda j: num(j["candidates"]["distinct_states_past_the_gates"])),  # the states alone
            ("6", lambda j: num(flow_without_state(j))),
            ("16", lambda j: num(j["step"]["prompts"])),
            ("6", lambda j: num(flow_without_state(j))),
            ("16", lambda j: num(reward_baselines(j))),
            ("65", lambda j: num(j["likelihood"]["this_next_step"]["responder_prompts"])),  # the states scored
            ("65", lambda j: num(j["likelihood"]["this_next_step"]["responder_prompts"])),
            ("260", lambda j: num(j["likelihood"]["naive"]["responder_prompts"])),
            ("4", lambda j: num(j["likelihood"]["naive"]["responder_prompts"] / j["candidates"]["past_the_gates"])),
            ("10", lambda j: num(j["load_avg_at_write"][0])),
        ],
        {"3.4×": "an earlier version's figure, named as superseded"},
    ),
    Block(
        "`python benchmarks/bench_threads.py`",
        "bench_threads",
        [
            ("1.4–2.9", lambda j: span((r["load_1min_after"] for runs in j["runs"].values() for r in runs), 1)),
            ("2.94×", lambda j: num(j["slowdown_busy_over_alone"]["before"], 2) + "×"),
            (
                "3.07×",
                lambda j: (
                    ratio(
                        max(j["settings"]["busy/before"]["run_medians_s"]),
                        j["settings"]["alone/before"]["median_step_s"],
                    )
                    + "×"
                ),
            ),
            (
                "3.3–4.4",
                lambda j: span((s for r in j["runs"]["busy/before"] for s in r["step_seconds"][1:]), 1),
            ),
            ("1.36", lambda j: num(j["settings"]["alone/before"]["median_step_s"], 2)),
            ("1.45×", lambda j: num(j["slowdown_busy_over_alone"]["after"], 2) + "×"),
            (
                "1.36, 1.49",
                lambda j: ", ".join(
                    num(j["settings"][f"alone/{when}"]["median_step_s"], 2) for when in ("before", "after")
                ),
            ),
            (
                "1.06 and 1.41",
                lambda j: " and ".join(num(m, 2) for m in j["settings"]["alone/before"]["run_medians_s"]),
            ),
            *(
                (shown, lambda j, f=f: f(load("bench_threads_lm_h200host")["settings"]))
                for shown, f in (
                    (
                        "91×",
                        lambda s: num(s["busy/before"]["median_step_s"] / s["alone/before"]["median_step_s"]) + "×",
                    ),
                    ("0.068", lambda s: num(s["alone/before"]["median_step_s"], 3)),
                    ("6.2", lambda s: num(s["busy/before"]["median_step_s"], 1)),
                    (
                        "1.43×",
                        lambda s: ratio(s["busy/after"]["median_step_s"], s["alone/after"]["median_step_s"]) + "×",
                    ),
                    ("41%", lambda s: pct(s["alone/after"]["median_step_s"] / s["alone/before"]["median_step_s"] - 1)),
                    ("0.068", lambda s: num(s["alone/before"]["median_step_s"], 3)),
                    ("0.096", lambda s: num(s["alone/after"]["median_step_s"], 3)),
                )
            ),
        ],
    ),
    Block(
        "`python benchmarks/bench_data_build.py`",
        "bench_data_build",
        [
            ("1M", lambda j: num(j["inputs"]["wiki_lines"] / 1e6) + "M"),
            ("20k", lambda j: num(j["inputs"]["max_claims"] / 1000) + "k"),
            ("37", lambda j: num(j["personamem"]["contexts"])),
            ("400", lambda j: num(j["personamem"]["messages_per_context"])),
            ("9,000", lambda j: num(j["personamem"]["questions"])),
        ],
    ),
    Block(
        "`python benchmarks/bench_train_step.py`",
        "bench_train_step",
        [
            ("512", lambda j: num(j["model"]["hidden_size"])),
            ("4", lambda j: num(j["model"]["num_hidden_layers"])),
            ("1,024", lambda j: num(j["model"]["vocab_size"])),
        ],
        {"±15%": "peak memory's spread from run to run, seen over runs the JSON does not keep"},
    ),
    Block(
        "| 8,192 | 512 | 8 |",
        "bench_train_step",
        [
            ("8,192", lambda j: num(S0(j)["prompt_tokens"])),
            ("512", lambda j: num(S0(j)["completion_tokens"])),
            ("8", lambda j: num(S0(j)["group_size"])),
            ("5.67×", lambda j: ratio(S0(j)["stock"]["tokens"], S0(j)["split"]["tokens"]) + "×"),
            ("6.86×", lambda j: ratio(S0(j)["stock"]["seconds"], S0(j)["split"]["seconds"]) + "×"),
            ("130.9", lambda j: num(S0(j)["stock"]["seconds"], 1)),
            ("19.1", lambda j: num(S0(j)["split"]["seconds"], 1)),
            ("3.68×", lambda j: ratio(S0(j)["stock"]["peak_mib"], S0(j)["split"]["peak_mib"]) + "×"),
            ("13.9", lambda j: num(S0(j)["stock"]["peak_mib"] / 1024, 1)),
            ("3.76", lambda j: num(S0(j)["split"]["peak_mib"] / 1024, 2)),
            ("37.3", lambda j: num(S0(j)["dense"]["seconds"], 1)),
            ("144", lambda j: num(mib(S0(j)["dense"]["mask_bytes"]))),
            ("4.3", lambda j: num(mib(S0(j)["split"]["mask_bytes"]), 1)),
            ("146", lambda j: num(kib(S0(j)["flex"]["mask_bytes"]))),
        ],
    ),
    Block(
        "| 8,192 | 128 | 8 |",
        "bench_train_step",
        [
            ("8,192", lambda j: num(S1(j)["prompt_tokens"])),
            ("128", lambda j: num(S1(j)["completion_tokens"])),
            ("8", lambda j: num(S1(j)["group_size"])),
            ("7.22×", lambda j: ratio(S1(j)["stock"]["tokens"], S1(j)["split"]["tokens"]) + "×"),
            ("8.92×", lambda j: ratio(S1(j)["stock"]["seconds"], S1(j)["split"]["seconds"]) + "×"),
            ("110.5", lambda j: num(S1(j)["stock"]["seconds"], 1)),
            ("12.4", lambda j: num(S1(j)["split"]["seconds"], 1)),
            ("4.70×", lambda j: ratio(S1(j)["stock"]["peak_mib"], S1(j)["split"]["peak_mib"]) + "×"),
            ("19.4", lambda j: num(S1(j)["dense"]["seconds"], 1)),
            ("81", lambda j: num(mib(S1(j)["dense"]["mask_bytes"]))),
            ("1.0", lambda j: num(mib(S1(j)["split"]["mask_bytes"]), 1)),
            ("82", lambda j: num(kib(S1(j)["flex"]["mask_bytes"]))),
        ],
    ),
    Block(
        "| 2,048 | 512 | 8 |",
        "bench_train_step",
        [
            ("2,048", lambda j: num(S2(j)["prompt_tokens"])),
            ("512", lambda j: num(S2(j)["completion_tokens"])),
            ("8", lambda j: num(S2(j)["group_size"])),
            ("3.33×", lambda j: ratio(S2(j)["stock"]["tokens"], S2(j)["split"]["tokens"]) + "×"),
            ("3.62×", lambda j: ratio(S2(j)["stock"]["seconds"], S2(j)["split"]["seconds"]) + "×"),
            ("18.6", lambda j: num(S2(j)["stock"]["seconds"], 1)),
            ("5.1", lambda j: num(S2(j)["split"]["seconds"], 1)),
            ("2.35×", lambda j: ratio(S2(j)["stock"]["peak_mib"], S2(j)["split"]["peak_mib"]) + "×"),
            ("9.1", lambda j: num(S2(j)["dense"]["seconds"], 1)),
            ("36", lambda j: num(mib(S2(j)["dense"]["mask_bytes"]))),
            ("1.3", lambda j: num(mib(S2(j)["split"]["mask_bytes"]), 1)),
            ("37", lambda j: num(kib(S2(j)["flex"]["mask_bytes"]))),
        ],
    ),
    Block(
        "| 2,048 | 128 | 8 |",
        "bench_train_step",
        [
            ("2,048", lambda j: num(S3(j)["prompt_tokens"])),
            ("128", lambda j: num(S3(j)["completion_tokens"])),
            ("8", lambda j: num(S3(j)["group_size"])),
            ("5.67×", lambda j: ratio(S3(j)["stock"]["tokens"], S3(j)["split"]["tokens"]) + "×"),
            ("6.47×", lambda j: ratio(S3(j)["stock"]["seconds"], S3(j)["split"]["seconds"]) + "×"),
            ("14.9", lambda j: num(S3(j)["stock"]["seconds"], 1)),
            ("2.3", lambda j: num(S3(j)["split"]["seconds"], 1)),
            ("3.65×", lambda j: ratio(S3(j)["stock"]["peak_mib"], S3(j)["split"]["peak_mib"]) + "×"),
            ("3.1", lambda j: num(S3(j)["dense"]["seconds"], 1)),
            ("9.0", lambda j: num(mib(S3(j)["dense"]["mask_bytes"]), 1)),
            ("281", lambda j: num(kib(S3(j)["split"]["mask_bytes"]))),
            ("9.4", lambda j: num(kib(S3(j)["flex"]["mask_bytes"]), 1)),
        ],
    ),
    Block(
        "The dense mask costs L² bytes a row",
        "bench_train_step",
        [
            ("8,192", lambda j: num(S0(j)["prompt_tokens"])),
            ("512", lambda j: num(S0(j)["completion_tokens"])),
            ("2.0×", lambda j: num(S0(j)["dense"]["seconds"] / S0(j)["split"]["seconds"], 1) + "×"),
            ("18–27%", lambda j: span(FLEX_OVER_SPLIT, scale=100) + "%"),
            ("27.0%", lambda j: num(FLEX_OVER_SPLIT[0], 1, scale=100) + "%"),
            ("8,192", lambda j: num(S0(j)["prompt_tokens"])),
            ("512", lambda j: num(S0(j)["completion_tokens"])),
            ("1.6–1.9", lambda j: span((s["load_avg"][0] for s in j["settings"]), 1)),
            ("0.03", lambda j: num(max(logp(load("shared_prefix_gpu"))), 2)),
        ],
        {
            "~2k": "the production workload's prompt length (configs/train), not a measurement",
            "≤ 150": "the production workload's state length (configs/train), not a measurement",
            "about 19 min": "the run's wall time, from its log (the JSON keeps when each row finished)",
            "×4": "a setting of the bf16 comparison",
            "0.006–0.009": "the CPU bf16 comparison, run in a session; no results file keeps it",
            "0.06": "the CPU bf16 comparison, run in a session; no results file keeps it",
            "0.74": "the CPU bf16 comparison, run in a session; no results file keeps it",
            "0.32": "the CPU bf16 comparison, run in a session; no results file keeps it",
            "36 layers": "Qwen3-4B's depth (its config), not in shared_prefix_gpu.json",
            "0.02": "the first-use check's old bf16 tolerance (train/shared_prefix.py), a setting",
            "0.1": "the first-use check's bf16 tolerance (train/shared_prefix.py), a setting",
        },
    ),
    Block(
        "`benchmarks/gpu/shared_prefix_check.py` is the prepared GPU check",
        "shared_prefix_gpu",
        [
            ("8", lambda j: num(j["settings"][0]["group_size"])),
            ("256", lambda j: num(j["settings"][0]["completion_tokens"])),
        ],
    ),
    Block(
        "| 2,048 | 1.51 s |",
        "shared_prefix_gpu",
        [
            ("2,048", lambda j: num(j["settings"][0]["prompt_tokens"])),
            ("1.51", lambda j: num(G0(j)["stock_sdpa"]["seconds"], 2)),
            ("0.54", lambda j: num(G0(j)["dense"]["seconds"], 2)),
            ("2.78×", lambda j: ratio(G0(j)["stock_sdpa"]["seconds"], G0(j)["dense"]["seconds"]) + "×"),
            ("0.41", lambda j: num(G0(j)["flex"]["seconds"], 2)),
            ("3.67×", lambda j: ratio(G0(j)["stock_sdpa"]["seconds"], G0(j)["flex"]["seconds"]) + "×"),
            ("0.56", lambda j: num(G0(j)["split"]["seconds"], 2)),
            ("2.71×", lambda j: ratio(G0(j)["stock_sdpa"]["seconds"], G0(j)["split"]["seconds"]) + "×"),
            ("18.7", lambda j: num(G0(j)["stock_sdpa"]["peak_mib"] / 1024, 1)),
            ("16.6", lambda j: num(G0(j)["flex"]["peak_mib"] / 1024, 1)),
        ],
    ),
    Block(
        "| 8,192 | 6.45 s |",
        "shared_prefix_gpu",
        [
            ("8,192", lambda j: num(j["settings"][1]["prompt_tokens"])),
            ("6.45", lambda j: num(G1(j)["stock_sdpa"]["seconds"], 2)),
            ("2.13", lambda j: num(G1(j)["dense"]["seconds"], 2)),
            ("3.03×", lambda j: ratio(G1(j)["stock_sdpa"]["seconds"], G1(j)["dense"]["seconds"]) + "×"),
            ("1.29", lambda j: num(G1(j)["flex"]["seconds"], 2)),
            ("4.98×", lambda j: ratio(G1(j)["stock_sdpa"]["seconds"], G1(j)["flex"]["seconds"]) + "×"),
            ("1.32", lambda j: num(G1(j)["split"]["seconds"], 2)),
            ("4.88×", lambda j: ratio(G1(j)["stock_sdpa"]["seconds"], G1(j)["split"]["seconds"]) + "×"),
            ("33.5", lambda j: num(G1(j)["stock_sdpa"]["peak_mib"] / 1024, 1)),
            ("17.1", lambda j: num(G1(j)["flex"]["peak_mib"] / 1024, 1)),
        ],
    ),
    Block(
        "Log-prob agreement with stock",
        "shared_prefix_gpu",
        [
            ("0.027–0.031", lambda j: span(logp(j), 3)),
            ("0.15", lambda j: num(max(logp(j, "logp_max_abs_diff")), 2)),
            ("1.0–1.1e-5", lambda j: span(logp(load("shared_prefix_gpu_fp32")), 1, scale=1e5) + "e-5"),
            ("5e-5", lambda j: num(max(logp(load("shared_prefix_gpu_fp32"), "logp_max_abs_diff")), scale=1e5) + "e-5"),
            ("2,048", lambda j: num(load("shared_prefix_gpu_fp32")["settings"][0]["prompt_tokens"])),
            ("8,192", lambda j: num(j["settings"][1]["prompt_tokens"])),
            ("0.87–1.03", lambda j: span(logp(load("shared_prefix_gpu_planted"), planted=True), 2)),
        ],
        {
            "68 GiB": "an estimate of fp32 attention scores at 8,192, worked out, not measured",
            "0.02": "the first-use check's old bf16 tolerance (train/shared_prefix.py), a setting",
            "36 layers": "Qwen3-4B's depth (its config), not in the JSON",
            "0.1": "the first-use check's bf16 tolerance (train/shared_prefix.py), a setting",
            "2e-7": "the gradient comparison's CPU dry run; no results file keeps it (not yet run on a GPU)",
            "0.25–0.82": "the gradient comparison's CPU dry run; no results file keeps it (not yet run on a GPU)",
        },
    ),
    Block(
        "`python benchmarks/bench_memory.py`",
        "bench_memory",
        [
            ("0.48", lambda j: num(j["machine"]["loadavg_start"][0], 2)),
            ("1.08", lambda j: num(j["machine"]["loadavg_end"][0], 2)),
            *(
                (shown, lambda j, size=size, backend=backend, q=q: num(at(j, size, backend)[q], 1))
                for shown, size, backend, q in (
                    ("6.6", "10000", "evomem", "p50_ms"),
                    ("7.3", "10000", "evomem", "p95_ms"),
                    ("13.0", "100000", "evomem", "p50_ms"),
                    ("16.0", "100000", "evomem", "p95_ms"),
                    ("5.9", "10000", "naive", "p50_ms"),
                    ("6.5", "10000", "naive", "p95_ms"),
                    ("11.5", "100000", "naive", "p50_ms"),
                    ("12.9", "100000", "naive", "p95_ms"),
                    ("4.9", "10000", "clag", "p50_ms"),
                    ("5.6", "10000", "clag", "p95_ms"),
                    ("5.9", "100000", "clag", "p50_ms"),
                    ("7.5", "100000", "clag", "p95_ms"),
                    ("11.5", "10000", "memsearch", "p50_ms"),
                    ("13.1", "10000", "memsearch", "p95_ms"),
                    ("24.4", "100000", "memsearch", "p50_ms"),
                    ("34.9", "100000", "memsearch", "p95_ms"),
                )
            ),
            ("3", lambda j: num(j["setup"]["memsearch"]["config"]["rounds"])),
            ("17", lambda j: num(at(j, "100000", "memsearch")["modes"]["dense fallback"])),
            ("200", lambda j: num(j["setup"]["queries"])),
            ("3.8", lambda j: num(j["query_encoding"]["onnx"]["p50_ms"], 1)),
            ("10.0", lambda j: num(j["query_encoding"]["torch"]["p50_ms"], 1)),
            ("176 / 172 / 151", lambda j: " / ".join(num(s["ingest"]["facts_per_s"]) for s in j["sizes"].values())),
            (
                "168 / 147 / 107",
                lambda j: " / ".join(num(s["ingest_facts_per_s"]["clag"]) for s in j["sizes"].values()),
            ),
            ("2.3", lambda j: num(j["sizes"]["100000"]["store_bytes_per_fact"] / 1000, 1)),
            ("220", lambda j: num(j["sizes"]["100000"]["store_mb"])),
            ("20", lambda j: num(j["target"]["target_ms"])),
            ("13.0", lambda j: num(j["target"]["evomem_retrieval_p50_ms_at_largest"], 1)),
            ("19.8", lambda j: num(load("bench_memory_feedback")["target"]["evomem_retrieval_p50_ms_at_largest"], 1)),
        ],
        {"15.6 min": "the run's wall time, which bench_memory.json does not record"},
    ),
    Block(
        "**With pseudo-relevance feedback and the date ranking**",
        "bench_memory_feedback",
        [
            ("102 / 126 / 79", lambda j: " / ".join(num(s["ingest"]["facts_per_s"]) for s in j["sizes"].values())),
            ("~2", lambda j: "~" + num(j["machine"]["loadavg_end"][0])),
            *(
                (
                    shown,
                    lambda j, size=size: (
                        f"{num(at(j, size, 'evomem')['p50_ms'], 1)} / {num(at(j, size, 'evomem')['p95_ms'], 1)}"
                    ),
                )
                for shown, size in (("6.6 / 7.7", "1000"), ("9.2 / 11.0", "10000"), ("19.8 / 23.2", "100000"))
            ),
            (
                "+6.8",
                lambda j: num(
                    at(j, "100000", "evomem")["p50_ms"] - at(load("bench_memory"), "100000", "evomem")["p50_ms"],
                    1,
                    sign=True,
                ),
            ),
            ("12.1", lambda j: num(at(j, "100000", "naive")["p50_ms"], 1)),
            ("6.5", lambda j: num(at(j, "100000", "clag")["p50_ms"], 1)),
            ("24.7", lambda j: num(at(j, "100000", "memsearch")["p50_ms"], 1)),
            ("1,378", lambda j: num(j["sizes"]["100000"]["relations"])),
        ],
    ),
    Block(
        "**Changes of view**",
        "bench_memory",
        [
            *(
                (shown, lambda j, p=p: num(j["setup"]["changes_of_view"][p], 1, scale=100).removesuffix(".0") + " %")
                for shown, p in (
                    ("3 %", "p_view"),
                    ("2.5 %", "p_change"),
                    ("1 %", "p_claim"),
                    ("0.5 %", "p_contradict"),
                )
            ),
            ("27 / 179 / 1,378", lambda j: " / ".join(num(s["relations"]) for s in j["sizes"].values())),
            ("1,097", lambda j: num(j["sizes"]["100000"]["relations_by_type"]["SUPERSEDES"])),
            ("2,466", lambda j: num(j["sizes"]["100000"]["sentences_stated"]["change"])),
            ("281", lambda j: num(j["sizes"]["100000"]["relations_by_type"]["CONFLICTS_WITH"])),
            ("505", lambda j: num(j["sizes"]["100000"]["sentences_stated"]["contradiction"])),
            ("10", lambda j: num(j["setup"]["k"])),
            (
                "0.65 / 0.36 / 0.12",
                lambda j: " / ".join(num(s["retrieval"]["evomem"]["mean_relations"], 2) for s in j["sizes"].values()),
            ),
            (
                "0–0.09",
                lambda j: (lambda r: f"{num(min(r))}–{num(max(r), 2)}")(
                    [
                        s["retrieval"][b]["mean_relations"]
                        for s in j["sizes"].values()
                        for b in ("naive", "clag", "memsearch")
                    ]
                ),
            ),
        ],
        {
            "≥ 4": "the relation rule's threshold (memory/), a setting",
            "0 edges": "the 2026-12-04 run (bench_memory.json as of 4e2cdb6, in git history)",
            "12.7": "the 2026-12-04 run (bench_memory.json as of 4e2cdb6, in git history)",
            "5 facts per turn": "the store's context search (memory/), a setting",
            "249": "a side run with --no-changes at 1k, kept in no results file",
            "177": "the same side run's rate with changes (this JSON's 1k run: 176)",
            "256 → 200": "the 2026-12-04 run (bench_memory.json as of 4e2cdb6, in git history)",
            "12.0": "the run beside CI (bench_memory.json as of 2df17af, in git history)",
        },
    ),
    Block(
        "`python benchmarks/bench_serve.py --requests 200",
        "bench_serve",
        [
            ("64", lambda j: num(j["max_tokens"])),
            ("408 / 431", lambda j: f"{num(j['direct_vllm']['p50_ms'])} / {num(j['direct_vllm']['p95_ms'])}"),
            ("439 / 561", lambda j: f"{num(j['through_api']['p50_ms'])} / {num(j['through_api']['p95_ms'])}"),
            ("1.6", lambda j: num(j["api_internal_ms_per_request"], 1)),
        ],
    ),
    Block(
        "`python benchmarks/bench_serve_load.py`",
        "bench_serve_load",
        [
            ("3 min 15 s", lambda j: f"{int(j['total_s'] // 60)} min {num(j['total_s'] % 60)} s"),
            ("8", lambda j: num(j["api"]["max_concurrency"])),
            ("8", lambda j: num(j["api"]["max_queue"])),
            ("0.1", lambda j: num(j["api"]["max_queue_wait_s"], 1)),
            ("30", lambda j: num(j["api"]["queue_timeout_s"])),
            ("1024", lambda j: str(j["api"]["max_prompt_tokens"])),
            ("64", lambda j: num(j["api"]["max_tokens"])),
            ("720", lambda j: num(load("examples/sycophancy_world/world.json")["test_instances"])),
            ("45", lambda j: num(j["settings"]["warmup_s"])),
            ("12", lambda j: num(j["settings"]["capacity_s"])),
            ("4 → 46.5/s", lambda j: f"4 → {num(j['capacity_ramp']['4']['throughput_per_s'], 1)}/s"),
            ("8 → **63.9/s**", lambda j: f"8 → **{num(j['capacity_ramp']['8']['throughput_per_s'], 1)}/s**"),
            ("123", lambda j: num(j["capacity_ramp"]["8"]["p50_ms"])),
            ("30", lambda j: num(j["settings"]["phase_s"])),
            ("60", lambda j: num(j["client"]["timeout_s"])),
        ],
        {"7–14 ms": "httpx's cost, profiled while the load generator was written; no results file keeps it"},
    ),
    Block(
        "| 0.5× | 32.0 |",
        "bench_serve_load",
        [
            ("32.0", lambda j: num(j["phases"]["0.5x"]["offered_per_s"], 1)),
            ("32.6", lambda j: num(j["phases"]["0.5x"]["throughput_per_s"], 1)),
            ("90 / 264", lambda j: f"{num(j['phases']['0.5x']['p50_ms'])} / {num(j['phases']['0.5x']['p99_ms'])}"),
            ("1", lambda j: num(j["phases"]["0.5x"]["shed"])),
            ("0", lambda j: num(j["phases"]["0.5x"]["5xx"])),
        ],
        phases("0.5×"),
    ),
    Block(
        "| 1× | 63.9 |",
        "bench_serve_load",
        [
            ("63.9", lambda j: num(j["phases"]["1x"]["offered_per_s"], 1)),
            ("53.5", lambda j: num(j["phases"]["1x"]["throughput_per_s"], 1)),
            ("148 / 425", lambda j: f"{num(j['phases']['1x']['p50_ms'])} / {num(j['phases']['1x']['p99_ms'])}"),
            ("301 of 1,913", lambda j: f"{num(j['phases']['1x']['shed'])} of {num(j['phases']['1x']['sent'])}"),
            ("15.7%", lambda j: pct(j["phases"]["1x"]["shed"] / j["phases"]["1x"]["sent"], 1)),
            ("0", lambda j: num(j["phases"]["1x"]["5xx"])),
        ],
        phases("1×"),
    ),
    Block(
        "| 2× | 127.9 |",
        "bench_serve_load",
        [
            ("127.9", lambda j: num(j["phases"]["2x"]["offered_per_s"], 1)),
            ("59.0", lambda j: num(j["phases"]["2x"]["throughput_per_s"], 1)),
            ("203 / 417", lambda j: f"{num(j['phases']['2x']['p50_ms'])} / {num(j['phases']['2x']['p99_ms'])}"),
            ("2,050 of 3,830", lambda j: f"{num(j['phases']['2x']['shed'])} of {num(j['phases']['2x']['sent'])}"),
            ("54%", lambda j: pct(j["phases"]["2x"]["shed"] / j["phases"]["2x"]["sent"])),
            ("1 s", lambda j: num(j["phases"]["2x"]["retry_after_s"]["max"]) + " s"),
            ("14", lambda j: num(j["phases"]["2x"]["shed_p99_ms"])),
            ("0", lambda j: num(j["phases"]["2x"]["5xx"])),
        ],
        phases("2×"),
    ),
    Block(
        "**The issue's bar at 2× is met**",
        "bench_serve_load",
        [
            ("2,050", lambda j: num(j["phases"]["2x"]["shed"])),
            ("2,024", lambda j: num(j["phases"]["2x"]["api_counted"]["shed_by_reason"]["predicted_wait"])),
            ("26", lambda j: num(j["phases"]["2x"]["api_counted"]["shed_by_reason"]["queue_full"])),
            ("1.58×", lambda j: num(j["bar"]["p99_2x_over_p99_half"], 2) + "×"),
            ("1.5", lambda j: num(j["phases"]["2x"]["api_counted"]["loop_lag_mean_ms"], 1)),
            ("0.8", lambda j: num(j["phases"]["2x"]["client_loop_lag_ms"]["mean"], 1)),
            ("80", lambda j: num(j["phases"]["2x"]["api_counted"]["queue_wait_mean_ms"])),
        ],
        phases("0.5×", "2×"),
    ),
    Block(
        "**The limit, like for like**",
        "bench_serve_load",
        [
            ("64", lambda j: num(load("bench_serve_load_limit64")["api"]["max_concurrency"])),
            ("0.2–2.2", lambda j: span((load(n)["load_avg_before"][0] for n in LIMIT_RUNS), 1)),
            ("45 s", lambda j: num(j["settings"]["warmup_s"]) + " s"),
            ("12 s", lambda j: num(j["settings"]["capacity_s"]) + " s"),
            ("30 s", lambda j: num(j["settings"]["phase_s"]) + " s"),
            ("8,000", lambda j: num(j["settings"]["max_requests"])),
        ],
        phases("0.5×", "1×", "2×"),
    ),
    limit_row(
        "| 8 (8), shipped |", "bench_serve_load", "8 8 63.9/s 8", "127.9 → 59.0", "264 / 425 / 417 ms", "1.58 54%"
    ),
    limit_row(
        "| 16 (16) |", "bench_serve_load_limit16", "16 16 96.7/s 16", "193.4 → 94.6", "259 / 431 / 509 ms", "1.96 51%"
    ),
    limit_row(
        "| 32 (32) |", "bench_serve_load_limit32", "32 32 107.9/s 32", "215.8 → 103.4", "279 / 657 / 852 ms", "3.06 52%"
    ),
    limit_row(
        "| 64 (0) |",
        "bench_serve_load_limit64",
        "64 0 120.1/s 32",
        "240.2 → 70.6",
        "282 / 2,345 / 2,850 ms",
        "10.1 69%",
    ),
    Block(
        "16 at work answers 60% more under overload",
        "bench_serve_load_limit16",
        [
            (
                "60%",
                lambda j: pct(
                    j["phases"]["2x"]["throughput_per_s"] / load("bench_serve_load")["phases"]["2x"]["throughput_per_s"]
                    - 1
                ),
            ),
            ("1.96", lambda j: num(j["bar"]["p99_2x_over_p99_half"], 2)),
            ("2.8 s", lambda j: num(load("bench_serve_load_limit64")["phases"]["2x"]["p99_ms"] / 1000, 1) + " s"),
            ("~0.5 s", lambda j: "~" + num(j["phases"]["2x"]["p99_ms"] / 1000, 1) + " s"),
        ],
        {
            "16 at work": "the limit tried",
            "past 16": "the limit tried",
            "64 without": "the limit tried",
            "than 16": "the limit tried",
            "shipped 8": "the shipped limit",
            "run 16": "the limit tried",
            "four runs": "the runs of the table",
            "than 8": "the shipped limit",
            **phases("2×"),
        },
    ),
]


# --- docs/sycophancy.md's result tables -------------------------------------------------------------------------------
# Their rows are built from the JSON: each figure is what the JSON gives, and the row must say it.


def from_json(source: str, anchor: str, *computes: Callable[[dict], str]) -> Block:
    data = load(source)
    return Block(anchor, source, [(compute(data), compute) for compute in computes], page="sycophancy")


def three(value: float, sign: bool = False) -> str:
    return num(value, 3, sign=sign)


def ci3(result: dict) -> str:
    return ci((result["ci_low"], result["ci_high"]), 3)


def condition_row(condition: str) -> Block:
    """A row of the result table: one condition of the likelihood, full run."""
    run = load("sycophancy_likelihood_full")["conditions"][condition]
    computes = [lambda j: three(j["conditions"][condition]["accuracy"])]
    if run["delta_vs_no_state"] is not None:
        computes += [lambda j: three(delta(j, condition)["mean"], sign=True), lambda j: ci3(delta(j, condition))]
    computes += [
        lambda j: three(j["conditions"][condition]["sycophancy_rate"]),
        lambda j: three(j["conditions"][condition]["outdated_preference_rate"]),
    ]
    if run["late_training_gain"] is not None:
        computes.append(lambda j: three(j["conditions"][condition]["late_training_gain"], sign=True))
    return from_json("sycophancy_likelihood_full", f"| {condition} | 0.", *computes)


def mode_row(source: str, label: str) -> Block:
    """A row of the table of score modes and variants: one run's JSON."""
    return from_json(
        source,
        f"| {label} |",
        lambda j: three(j["conditions"]["no_state"]["accuracy"]),
        lambda j: three(j["conditions"]["self_guide"]["accuracy"]),
        lambda j: three(j["conditions"]["checkpoint"]["accuracy"]),
        lambda j: three(delta(j, "checkpoint")["mean"], sign=True),
        lambda j: ci3(delta(j, "checkpoint")),
        lambda j: three(j["checkpoint_vs_self_guide"]["mean"], sign=True),
        lambda j: ci3(j["checkpoint_vs_self_guide"]),
        lambda j: three(j["conditions"]["control_shuffled"]["accuracy"]),
        lambda j: three(delta(j, "control_shuffled")["mean"], sign=True),
        lambda j: ci3(delta(j, "control_shuffled")),
        lambda j: " / ".join(
            num(j["conditions"]["checkpoint"][rate], 2) for rate in ("sycophancy_rate", "outdated_preference_rate")
        ),
        lambda j: f"{sum(j['criteria'].values())} of {len(j['criteria'])}",
    )


def seeds_row(source: str, label: str, run: str) -> Block:
    """A row of the seeds table: each seed's Δ vs no state, then the mean (sd) and t-interval over seeds."""
    seeds = load(source)["runs"][run]["per_seed"]
    return from_json(
        source,
        f"| {label} |",
        *(lambda j, s=s: three(j["runs"][run]["per_seed"][s]["delta_vs_no_state"]["mean"], sign=True) for s in seeds),
        lambda j: three(j["runs"][run]["over_seeds"]["mean"], sign=True),
        lambda j: f"({three(j['runs'][run]['over_seeds']['sd'])})",
        lambda j: ci3(j["runs"][run]["over_seeds"]),
    )


FIGURES += [
    *(condition_row(c) for c in load("sycophancy_likelihood_full")["conditions"]),
    mode_row("sycophancy_likelihood_full", "likelihood, full"),
    mode_row("sycophancy_likelihood_lora", "likelihood, LoRA"),
    mode_row("sycophancy_exact_full", "exact, full"),
    mode_row("sycophancy_exact_lora", "exact, LoRA"),
    seeds_row("sycophancy_seeds_likelihood_full", "likelihood, full — checkpoint", "checkpoint"),
    seeds_row("sycophancy_seeds_likelihood_full", "likelihood, full — shuffled control", "control_shuffled"),
    seeds_row("sycophancy_seeds_likelihood_lora", "likelihood, LoRA — checkpoint", "checkpoint"),
    seeds_row("sycophancy_seeds_likelihood_lora", "likelihood, LoRA — shuffled control", "control_shuffled"),
]


# --- the page, cut into blocks --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A block of a page as it reads, and the heading of its section."""

    text: str
    section: str


def blocks(page: str) -> list[Text]:
    """Each table row, and each paragraph (its lines joined by spaces); headings and table rules are left out."""
    out, paragraph, section = [], [], ""
    for line in page.splitlines() + [""]:
        if not line.strip() or line.startswith(("|", "#")):
            if paragraph:
                out.append(Text(" ".join(paragraph), section))
                paragraph = []
            if line.startswith("#"):
                section = line
            elif line.startswith("|") and not re.fullmatch(r"[|\-: ]+", line):
                out.append(Text(line, section))
        else:
            paragraph.append(line.strip())
    return out


PAGES = {page: blocks((ROOT / "docs" / f"{page}.md").read_text()) for page in ("benchmarks", "sycophancy")}


def the_block(anchor: str, page: str = "benchmarks") -> Text:
    found = [b for b in PAGES[page] if anchor in b.text and b.section != RESULTS_SECTION]  # that one names commands
    assert len(found) == 1, f"docs/{page}.md: {len(found)} blocks hold {anchor!r} (an anchor names exactly one)"
    return found[0]


def strip_exempt(text: str, exempt: dict[str, str] | None = None) -> str:
    """``text`` less ``EXEMPT``'s patterns and, where given, every occurrence of a block's own exceptions."""
    for pattern in EXEMPT:
        text = re.sub(pattern, "·", text)
    for shown in exempt or {}:
        text = re.sub(whole(shown), "·", text)
    return text


def whole(figure: str) -> str:
    """``figure`` as a whole number: not a piece of a longer one (``1.0`` is not in ``11.05``)."""
    return rf"(?<![\w.,+{MINUS}-]){re.escape(figure)}(?![\w]|[.,]\d)"


def test_num_rounds_half_up_as_written() -> None:
    """A JSON's 74.5 is 75 and its 0.0375 is 3.8 points, though the floats would print 74 and 3.7."""
    assert (num(74.5), num(5.55, 1), num(0.0375, 1, scale=100)) == ("75", "5.6", "3.8")
    assert (num(1378), num(0.118055, 1, sign=True, scale=100), num(-0.053, 3, sign=True)) == (
        "1,378",
        "+11.8",
        "−0.053",
    )
    assert (pct(0.3985), span([0.0312, 0.0265], 3), ci([0.09, 0.1458], 3)) == ("40%", "0.027–0.031", "[+0.090, +0.146]")


def test_anchors_name_one_block_each() -> None:
    named = [(b.page, the_block(b.anchor, b.page).text) for b in FIGURES]
    named += [("benchmarks", the_block(anchor).text) for anchor in ELSEWHERE]
    assert len(named) == len(set(named)), "two entries name the same block"


def test_figures_match_their_json() -> None:
    wrong = []
    for block in FIGURES:
        data = load(block.source)
        text = strip_exempt(the_block(block.anchor, block.page).text, block.exempt)
        for shown, compute in block.figures:
            given = compute(data)
            where = f"docs/{block.page}.md, {block.anchor!r}"
            if given != shown:
                wrong.append(f"{where}: the table says {shown!r}, {block.source} gives {given!r}")
            elif re.search(whole(shown), text) is None:
                wrong.append(f"{where}: the page does not say {shown!r} ({block.source} gives it)")
    assert not wrong, "the pages and their results files disagree:\n" + "\n".join(wrong)


@pytest.mark.parametrize("block", FIGURES, ids=lambda b: b.anchor[:40])
def test_block_cites_its_source(block: Block) -> None:
    """The file a block's figures come from is named in the block or above it in its section (globs count)."""
    page = PAGES[block.page]
    here = the_block(block.anchor, block.page)
    above = page[: page.index(here) + 1]
    cited = {c for b in above if b.section == here.section for c in re.findall(r"[\w*.-]+\.json", b.text)}
    name = Path(block.source).name if "/" in block.source else f"{block.source}.json"
    assert any(fnmatch(name, c) for c in cited), f"{block.anchor!r} cites no {name} (it cites {sorted(cited)})"


def test_no_figure_is_left_unchecked() -> None:
    """Every block of docs/benchmarks.md, and every block of another page that the table names."""
    left = []
    for page, texts in PAGES.items():
        by_block = {the_block(b.anchor, page).text: b for b in FIGURES if b.page == page}
        elsewhere = {the_block(anchor).text for anchor in ELSEWHERE} if page == "benchmarks" else set()
        for here in texts if page == "benchmarks" else [t for t in texts if t.text in by_block]:
            if here.text in elsewhere:
                continue
            block = by_block.get(here.text)
            rest = strip_exempt(here.text, block.exempt if block else None)
            for shown, _ in block.figures if block else ():
                match = re.search(whole(shown), rest)
                if match:
                    rest = rest[: match.start()] + "·" + rest[match.end() :]
            digits = re.findall(r"[^\s·]*\d[^\s·]*", rest)
            if digits:
                left.append(f"docs/{page}.md, {here.text[:70]!r}…: {digits}")
    assert not left, "figures no table entry covers (add them to FIGURES, or to a block's exempt):\n" + "\n".join(left)


def test_exemptions_are_on_the_page() -> None:
    """An exception the page no longer holds is dropped from the table, so the table says what the page holds."""
    stale = [
        f"{block.anchor!r}: {shown!r}"
        for block in FIGURES
        for shown in block.exempt
        if re.search(whole(shown), strip_exempt(the_block(block.anchor, block.page).text)) is None
    ]
    assert not stale, "exempt texts the page no longer holds:\n" + "\n".join(stale)


def results_table() -> dict[str, str]:
    """docs/benchmarks.md's "Results files" table: each file it names, and the command (its first code span after)."""
    rows = [b.text for b in PAGES["benchmarks"] if b.section == RESULTS_SECTION and b.text.startswith("| `")]
    out = {}
    for row in rows:
        files, command = row.split(" | ")[0], row.split(" | ", 1)[1]
        for name in re.findall(r"`([\w.-]+\.json)`", files):
            assert name not in out, f"the Results files table names {name} twice"
            out[name] = re.search(r"`([^`]+)`", command).group(1)
    return out


def test_every_results_file_is_named_with_the_command_that_writes_it() -> None:
    """Every file under benchmarks/results/ has a row in docs/benchmarks.md's "Results files" (and every row a file);
    the command runs a script or an entry point this repository has, and matches the one the file recorded."""
    table = results_table()
    files = sorted(p.name for p in RESULTS.glob("*.json"))
    assert sorted(table) == files, (
        f"not in the table: {sorted(set(files) - set(table))}; no such file: {sorted(set(table) - set(files))}"
    )
    for name, command in table.items():
        words = [w for w in command.split() if "=" not in w or w.startswith("--")]
        if words[0] == "python":
            assert (ROOT / words[1]).is_file(), f"{name}: {command!r} runs {words[1]}, which does not exist"
        else:
            assert words[0] == "memstate", f"{name}: {command!r} is neither a script nor a memstate command"
        recorded = json.loads((RESULTS / name).read_text()).get("command")
        if recorded and recorded.startswith("python "):  # written by a script that records its own command line
            script = recorded.split()[1]
            assert script in command.split(), f"{name} records {recorded!r}, the table says {command!r}"
