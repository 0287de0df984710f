"""``memstate eval memsyco``: answer every row per condition, have each answer judged, write the report."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from memstate.checkpoint import CheckpointMetadata
from memstate.errors import ConfigError
from memstate.evaluate.memsyco.data import (
    GOLD_RELATIONS_LABEL,
    PIPELINE_RELATIONS_LABEL,
    relation_agreement,
    to_instance,
)
from memstate.evaluate.memsyco.judge import JUDGES, JUDGING_SOURCE, JudgeConfig, JudgeResult, check_judge, judge_answer
from memstate.parsing import StageParser
from memstate.prompts import DEFAULT_MAX_PROMPT_TOKENS, PROMPT_VERSION, Message, responder_messages
from memstate.responders import ResponderConfig, make_responder
from memstate.rules import FormatError, parse_completion, strip_think
from memstate.schema import Fact, Instance
from memstate.sources.memsyco import MemSycoRow, check_unique_ids, load_memsyco, memsyco_files

logger = logging.getLogger("memstate.evaluate.memsyco")

# ---- the evaluation -------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class MemSycoEvalConfig(ResponderConfig):
    """One MemSyco-Bench evaluation; the responder fields (``responder_model``, ``responder_url``, …) are
    ``ResponderConfig``'s, the judge a ``JudgeConfig`` (on the command line: ``JudgeArgs``' ``judge_*`` flags)."""

    data: list[str] = field(
        default_factory=list,
        metadata={"help": "MemSyco-Bench JSONL files and/or directories of them (or as positional arguments)."},
    )
    judge: JudgeConfig | None = field(default=None, metadata={"help": "The LLM judge.", "cli": False})
    out_dir: str = field(metadata={"help": "Report directory.", "aliases": ["--out"]})
    checkpoint: str | None = field(default=None, metadata={"help": "Policy checkpoint: adds the checkpoint condition."})
    schema: str | None = field(default=None, metadata={"help": "schema.json; default: the one beside each file."})
    max_rows: int | None = field(default=None, metadata={"help": "Use only the first N rows of each file."})
    seed: int = field(default=0, metadata={"help": "Policy sampling seed."})
    policy_temperature: float = field(default=0.3, metadata={"help": "Policy sampling temperature (serve API's)."})
    policy_max_new_tokens: int | None = field(
        default=None, metadata={"help": "Token limit of a state; default: the checkpoint's max_completion_length."}
    )
    answer_max_tokens: int = field(default=256, metadata={"help": "Token limit of a responder answer."})
    batch_size: int = field(default=8, metadata={"help": "Policy batch size, and prompts per responder call."})
    include_memory: bool = field(default=True, metadata={"help": "Show the gold memory items as facts (oracle)."})
    relations: str = field(
        default="pipeline",
        metadata={"help": "Relations between the memory items: 'pipeline' (the memory pipeline draws them from the "
                  "items' text) or 'gold' (from the benchmark's status: the answer key shown, an oracle).",
                  "choices": ["pipeline", "gold"]},
    )  # fmt: skip
    max_fact_chars: int = field(default=800, metadata={"help": "Characters per fact (cut at a word boundary)."})
    max_dialogue_facts: int = field(default=12, metadata={"help": "Latest dialogue facts kept per row."})
    memory_backend: str | None = field(
        default=None,
        metadata={"help": "A registered memory backend (memstate.memory.backends; built in: evomem, naive, clag, "
                  "memsearch): facts come from the memory pipeline run over the row's dialogue (ingested as `memory "
                  "ingest` does: its default extractor, one "
                  "store per row), not from the benchmark's gold memory items."},
    )  # fmt: skip
    memory_k: int = field(default=10, metadata={"help": "Seed facts the memory pipeline retrieves per question."})
    memory_embedder: str | None = field(
        default=None, metadata={"help": "Embedder of the per-row stores (default MiniLM; e.g. hash-384 for tests)."}
    )
    memory_llm_url: str | None = field(
        default=None,
        metadata={"help": "OpenAI-compatible endpoint for CLAG's routing/profiles/cluster choice and MemSearch-o1's "
                  "fragment extraction; without it both run rule-based (labelled in the report)."},
    )  # fmt: skip
    memory_llm_model: str | None = field(default=None, metadata={"help": "Model name at memory_llm_url."})
    clag_bootstrap_min: int = field(
        default=8,
        metadata={"help": "Facts before CLAG's k-means bootstrap (per-row stores hold ~10-40 facts; the released "
                  "code's 100 would leave CLAG as plain dense search here)."},
    )  # fmt: skip
    memory_options: dict = field(
        default_factory=dict,
        metadata={"help": "Settings of the backends by name, e.g. {'clag': {...}, 'memsearch': {...}} (fields of "
                  "the settings dataclass each backend registers).",
                  "cli": False},
    )  # fmt: skip


@dataclass
class JudgeArgs:
    """The judge on the command line (flat ``judge_*`` flags); ``to_config()`` is the ``JudgeConfig``."""

    judge_url: str = field(metadata={"help": "OpenAI-compatible server of the judge (e.g. vllm serve)."})
    judge_model: str = field(metadata={"help": "Model name the judge server serves."})
    judge_temperature: float = field(default=0.0, metadata={"help": "Judge temperature (the benchmark uses 0)."})
    judge_api_key_env: str | None = field(
        default="MEMSTATE_JUDGE_API_KEY", metadata={"help": "Environment variable with the judge's bearer token."}
    )
    judge_concurrency: int = field(default=8, metadata={"help": "Judge requests in flight at once."})
    judge_timeout: float = field(default=120.0, metadata={"help": "Seconds per judge request."})
    judge_retries: int = field(default=3, metadata={"help": "Retries per judge request."})

    def to_config(self) -> JudgeConfig:
        return JudgeConfig(
            url=self.judge_url,
            model=self.judge_model,
            temperature=self.judge_temperature,
            api_key=os.environ.get(self.judge_api_key_env) if self.judge_api_key_env else None,
            concurrency=self.judge_concurrency,
            timeout=self.judge_timeout,
            retries=self.judge_retries,
        )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _answers(responder: Any, prompts: list[list[Message]], config: MemSycoEvalConfig, desc: str) -> list[str | None]:
    out: list[str | None] = []
    for start in tqdm(range(0, len(prompts), config.batch_size), desc=desc, unit="batch"):
        batch = responder.answer(prompts[start : start + config.batch_size], max_new_tokens=config.answer_max_tokens)
        out += [None if a is None else strip_think(a).strip() for a in batch]
    return out


def _policy_states(
    config: MemSycoEvalConfig, instances: list[Instance]
) -> tuple[list[str], list[bool], dict[str, Any]]:
    from memstate.evaluate.run import EvalConfig, generate_states, resolve_checkpoint

    checkpoint = resolve_checkpoint(config.checkpoint)
    trained = CheckpointMetadata.read(checkpoint)
    sampling = EvalConfig(
        checkpoint=str(checkpoint),
        temperature=config.policy_temperature,
        seed=config.seed,
        batch_size=config.batch_size,
        max_new_tokens=config.policy_max_new_tokens or (trained.max_completion_length if trained else 128),
        # Prompts cut to the budget training cut them to.
        max_prompt_tokens=trained.max_prompt_tokens if trained else DEFAULT_MAX_PROMPT_TOKENS,
    )
    states, cut, truncated = generate_states(checkpoint, instances, sampling)
    info = {
        "checkpoint": str(checkpoint),
        "checkpoint_prompt_version": trained.prompt_version if trained else None,
        "temperature": config.policy_temperature,
        "seed": config.seed,
        "max_new_tokens": sampling.max_new_tokens,
        "max_prompt_tokens": sampling.max_prompt_tokens,
        "prompts_truncated": truncated,
    }
    return states, cut, info


def _rate(values: list[int | bool]) -> float | None:
    return sum(values) / len(values) if values else None


def group_metrics(records: list[dict[str, Any]], task: str | None = None) -> dict[str, Any]:
    """n, judged/unjudged counts, pass rate over judged answers (as upstream) and over all, per-label rates."""
    judged = [r for r in records if r["passed"] is not None]
    m: dict[str, Any] = {
        "n": len(records),
        "judged": len(judged),
        "unjudged": len(records) - len(judged),
        "unanswered": sum(r["answer"] is None for r in records),
        "pass_rate": _rate([r["passed"] for r in judged]),
        "pass_rate_all": _rate([bool(r["passed"]) for r in records]),
        "judge_warnings": sum(bool(r["judge_warnings"]) for r in records),
    }
    if task is not None:
        spec = JUDGES[task]
        m["pass_name"] = spec.pass_name
        m["labels"] = {name: _rate([r["labels"][name] for r in judged]) for name in spec.labels}
        m["paper_metrics"] = {metric: m["labels"][label] for metric, label in spec.paper}
    return m


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per condition: overall and per-task ``group_metrics``."""
    out: dict[str, Any] = {}
    for condition in dict.fromkeys(r["condition"] for r in records):
        by_task: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            if r["condition"] == condition:
                by_task[r["task"]].append(r)
        all_records = [r for rs in by_task.values() for r in rs]
        out[condition] = {
            "overall": group_metrics(all_records),
            "by_task": {t: group_metrics(rs, t) for t, rs in sorted(by_task.items())},
        }
    return out


def _fmt(value: float | int | None) -> str:
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _relations_line(info: dict[str, Any]) -> str:
    a = info["pipeline_vs_gold"]
    agreement = (
        f"the memory pipeline's SUPERSEDES edges vs the gold current→outdated pairs on these rows: precision "
        f"{_fmt(a['precision'])}, recall {_fmt(a['recall'])} ({a['true_positives']} of {a['pipeline_supersedes']} "
        f"edges right, {a['gold_pairs']} gold pairs)"
    )
    label = f"**{info['label']}**" if info["answer_key_shown"] else info["label"]
    return f"{label}; {agreement}"


def render_markdown(report: dict[str, Any]) -> str:
    judge = report["judge"]
    files = ", ".join(f"{Path(f['path']).name} ({f['rows_used']}/{f['rows']} rows)" for f in report["data"]["files"])
    lines = [
        "# MemSyco-Bench evaluation",
        "",
        f"- judge: `{judge['model']}` at {judge['url']}, temperature {judge['temperature']}, "
        f"max_tokens {judge['max_tokens']} (prompts: MemSyco-Bench's, verbatim; in `memsyco_report.json`)",
        f"- responder: `{report['responder']['model']}`; prompts {report['prompt_version']}",
        f"- data: {files}",
        f"- relations: {_relations_line(report['data']['relations'])}",
        "- rates are over judged answers (as the benchmark's); `pass (all)` counts unjudged answers as failures",
        "",
        "| condition | task | n | judged | unjudged | pass | pass (all) | labels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for condition, block in report["metrics"].items():
        for task, m in [*block["by_task"].items(), ("all", block["overall"])]:
            labels = ", ".join(f"{k} {_fmt(v)}" for k, v in m.get("labels", {}).items())
            row = [condition, task, m["n"], m["judged"], m["unjudged"], m["pass_rate"], m["pass_rate_all"]]
            lines.append("| " + " | ".join(_fmt(v) if not isinstance(v, str) else v for v in row) + f" | {labels} |")
    if report["unjudged"]:
        lines += ["", f"{len(report['unjudged'])} answer(s) unjudged; the reasons are listed in memsyco_report.json."]
    return "\n".join(lines) + "\n"


def memory_settings(config: MemSycoEvalConfig) -> Any:
    """The settings of ``config.memory_backend`` this evaluation runs with (None for a backend without settings)."""
    from memstate.memory.backends import get_backend

    options = dict(config.memory_options.get(config.memory_backend, {}))
    if config.memory_backend == "clag":
        options.setdefault("bootstrap_min", config.clag_bootstrap_min)
    return get_backend(config.memory_backend).make_settings(options)


def memory_llm(config: MemSycoEvalConfig) -> Any:
    """The memory backends' LLM client (None: rule-based)."""
    if not config.memory_llm_url:
        return None
    if not config.memory_llm_model:
        raise ValueError("memory_llm_url needs memory_llm_model (the model name the server serves)")
    from memstate.memory import ChatJSON

    return ChatJSON(config.memory_llm_url, config.memory_llm_model)


_TRACE_KEYS = ("mode", "selector", "router", "profiles", "clusters", "n_clusters", "seed_pipeline", "extractor",
               "seeds", "sub_queries", "fallback", "rejected_fragments", "llm_failures")  # fmt: skip


def pipeline_instance(
    row: MemSycoRow,
    instance: Instance,
    config: MemSycoEvalConfig,
    out_dir: Path,
    llm: Any = None,
    settings: Any = None,
) -> Instance:
    """``instance`` with the facts and relations the memory pipeline retrieves for its question after ingesting the
    row's dialogue (its own SQLite store under ``OUT/stores/``); the gold memory items are not given to it.
    ``meta["memory"]`` records the backend, the stored fact ids and how the backend decided (its trace, abridged).
    ``settings``: the backend's, made once per evaluation (default: ``memory_settings(config)``)."""
    from memstate.memory import MemoryStore, memsyco_sessions, retrieve
    from memstate.memory.embed import embedder_from_name
    from memstate.memory.extract import make_extractor

    path = out_dir / "stores" / f"{instance.id}.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = memory_settings(config) if settings is None else settings
    embedder = embedder_from_name(config.memory_embedder) if config.memory_embedder else None
    with MemoryStore(path, embedder) as store:
        store.ingest(memsyco_sessions(row), make_extractor())  # as `memory ingest --format memsyco` does
        got = retrieve(store, row.question, k=config.memory_k, backend=config.memory_backend, llm=llm,
                       settings=settings)  # fmt: skip
        n_stored = len(store)
    trace = {k: got.trace[k] for k in _TRACE_KEYS if k in got.trace}
    if "path" in got.trace:
        trace["fragments"], trace["path_length"] = len(got.trace.get("fragments", [])), len(got.trace["path"])
    meta = instance.meta | {"memory": {"backend": config.memory_backend, "stored_facts": n_stored,
                                       "store_ids": list(got.store_ids), "trace": trace}}  # fmt: skip
    if not got.facts:  # nothing extracted: an Instance needs a fact; say so to the responder
        return replace(instance, facts=(Fact("F1", "No memories were found.", "fact"),), relations=(), meta=meta)
    return replace(instance, facts=got.facts, relations=got.relations, meta=meta)


def relations_info(config: MemSycoEvalConfig, rows: list[MemSycoRow], pipeline_drawn=None) -> dict[str, Any]:
    """Where the instances' relations came from, labelled, and how the pipeline's compare with the gold ones on
    ``rows`` (measured whatever the source, so an oracle run says what the answer key added). ``pipeline_drawn``:
    the rows' pipeline relations when the instances already hold them (not drawn a second time)."""
    if config.memory_backend:
        source, label = "memory_backend", f"memory pipeline ({config.memory_backend} retrieval over the dialogue)"
    elif not config.include_memory:
        source, label = "none", "none (memory items left out)"
    else:
        source = config.relations
        label = GOLD_RELATIONS_LABEL if source == "gold" else PIPELINE_RELATIONS_LABEL
    return {
        "source": source,
        "label": label,
        "answer_key_shown": source == "gold",
        "pipeline_vs_gold": relation_agreement(rows, pipeline_drawn),
    }


def evaluate_memsyco(config: MemSycoEvalConfig) -> Path:
    """Answer, judge and report (see the module docstring); return the report dir."""
    files = memsyco_files(config.data)
    loaded = [(f, load_memsyco(f, config.schema)) for f in files]
    rows = [r for _, rs in loaded for r in rs[: config.max_rows]]
    check_unique_ids(rows)
    if config.relations == "gold" and config.memory_backend:
        raise ConfigError("gold relations and a memory backend exclude each other: the backend's retrieval replaces "
                         "the memory items and their relations")  # fmt: skip
    instances = [
        to_instance(
            r,
            include_memory=config.include_memory,
            max_fact_chars=config.max_fact_chars,
            max_dialogue_facts=config.max_dialogue_facts,
            relations=config.relations,
        )
        for r in rows
    ]
    pipeline_drawn = (
        [i.relations for i in instances] if config.include_memory and config.relations == "pipeline" else None
    )
    memory_info = None
    if config.memory_backend:
        from memstate.memory.backends import get_backend
        from memstate.memory.extract import DEFAULT_EXTRACTOR
        from memstate.memory.relation_rule import RELATION_RULE_VERSION

        backend = get_backend(config.memory_backend)  # an unknown name fails here, before any store is built
        settings = memory_settings(config)
        out_dir = Path(config.out_dir)
        llm = memory_llm(config)
        instances = [
            pipeline_instance(r, inst, config, out_dir, llm, settings) for r, inst in tqdm(
                list(zip(rows, instances, strict=True)), desc=f"memory ({config.memory_backend})", unit="row")
        ]  # fmt: skip
        memory_info = {
            "backend": config.memory_backend,
            "k": config.memory_k,
            "embedder": config.memory_embedder or "all-MiniLM-L6-v2",
            "extractor": DEFAULT_EXTRACTOR,
            "relation_rule": RELATION_RULE_VERSION,
            "llm": llm.describe() if llm is not None else None,
            "decisions": backend.decisions[llm is not None],
            "settings": asdict(settings) if settings is not None else None,
        }
        if llm is not None:
            memory_info["llm_calls"], memory_info["llm_failures"] = llm.calls, llm.failures
            llm.close()
    check_judge(config.judge)  # fail before hours of answering, not after
    logger.info("MemSyco-Bench: %d rows from %d file(s)", len(rows), len(files))

    policy_info = None
    states: list[str] = []
    cut: list[bool] = []
    if config.checkpoint:  # states first: the policy is freed before the responder loads
        states, cut, policy_info = _policy_states(config, instances)
    responder = make_responder(config)
    conditions: dict[str, list[tuple[str, ...] | None]] = {"no_state": [None] * len(instances)}
    parsed = [parse_completion(t, cut_off=c) for t, c in zip(states, cut, strict=True)]
    if config.checkpoint:
        conditions["checkpoint"] = [None if isinstance(s, FormatError) else s.rules for s in parsed]

    records: list[dict[str, Any]] = []
    for condition, rules in conditions.items():
        prompts = [responder_messages(inst, r) for inst, r in zip(instances, rules, strict=True)]
        answers = _answers(responder, prompts, config, f"answers ({condition})")
        for i, (row, inst, answer) in enumerate(zip(rows, instances, answers, strict=True)):
            record = {"condition": condition, "id": row.id, "instance_id": inst.id, "task": row.task}
            record |= {"where": row.where, "answer": answer}
            if "memory" in inst.meta:
                record["memory"] = inst.meta["memory"]
            if condition == "checkpoint":
                ok = not isinstance(parsed[i], FormatError)
                record["state"] = {"text": states[i], "format_ok": ok, "format_error": None if ok else parsed[i].reason}
            records.append(record)

    def run_judge(record: dict[str, Any], row: MemSycoRow, client: httpx.Client) -> JudgeResult:
        if record["answer"] is None:
            return JudgeResult({}, None, error="the responder gave no answer")
        return judge_answer(config.judge, row, record["answer"], client=client)

    row_of = {r.id: r for r in rows}
    with config.judge.client() as client, ThreadPoolExecutor(config.judge.concurrency) as pool:
        futures = [pool.submit(run_judge, rec, row_of[rec["id"]], client) for rec in records]
        for rec, future in zip(records, tqdm(futures, desc="judge", unit="answer"), strict=True):
            result = future.result()
            rec |= {"labels": result.labels, "passed": result.passed, "rationale": result.rationale}
            rec |= {"judge_error": result.error, "judge_warnings": result.warnings, "judge_reply": result.reply[:2000]}

    first_of_task = {r.task: r for r in reversed(rows)}
    schemas = sorted({str(Path(config.schema) if config.schema else f.parent / "schema.json") for f in files})
    report = {
        "benchmark": "MemSyco-Bench",
        "judging_source": JUDGING_SOURCE,
        "prompt_version": PROMPT_VERSION,
        "judge": {
            "url": config.judge.url,
            "model": config.judge.model,
            "temperature": config.judge.temperature,
            "max_tokens": config.judge.max_tokens,
            "extra_body": config.judge.extra_body,
            "prompts": {
                t: {
                    "system": JUDGES[t].prompt,
                    "system_sha256": hashlib.sha256(JUDGES[t].prompt.encode()).hexdigest(),
                    "user": "json.dumps(payload, ensure_ascii=False, indent=2) with keys "
                    + ", ".join(JUDGES[t].payload(row, "")),
                    "labels": list(JUDGES[t].labels),
                    "pass": f"{JUDGES[t].pass_name} = "
                    + " and ".join(f"{k} == {v}" for k, v in JUDGES[t].require.items()),
                }
                for t, row in sorted(first_of_task.items())
            },
        },
        "responder": {
            "model": config.responder_model,
            "url": config.responder_url,
            "max_new_tokens": config.answer_max_tokens,
            "decoding": "greedy",
        },
        "policy": policy_info,
        "data": {
            "files": [
                {"path": str(f), "sha256": _sha256(f), "rows": len(rs), "rows_used": len(rs[: config.max_rows])}
                for f, rs in loaded
            ],
            "schema": [{"path": s, "sha256": _sha256(Path(s))} for s in schemas],
            "max_rows": config.max_rows,
            "include_memory": config.include_memory,
            "max_fact_chars": config.max_fact_chars,
            "max_dialogue_facts": config.max_dialogue_facts,
            "memory_backend": config.memory_backend,
            "memory_k": config.memory_k if config.memory_backend else None,
            "memory": memory_info,
            "relations": relations_info(config, rows, pipeline_drawn),
        },
        "metrics": summarize(records),
        "unjudged": [
            {k: r[k] for k in ("condition", "id", "task", "where", "judge_error")} | {"reply": r["judge_reply"][:300]}
            for r in records
            if r["passed"] is None
        ],
        "records": records,
    }
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memsyco_report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (out / "memsyco_report.md").write_text(render_markdown(report))
    logger.info("MemSyco-Bench report in %s", out)
    return out


# ---- memstate eval memsyco ------------------------------------------------------------------------------------------


class MemSycoParser(StageParser):
    """MemSyco-Bench files may also come as positional arguments; ``--gold-relations`` is ``--relations gold``."""

    def parse_args_and_config(self, args: list[str] | None = None, **kwargs) -> tuple:  # type: ignore[override]
        *configs, options = super().parse_args_and_config(args, **kwargs)
        evaluation = configs[0]
        evaluation.data = [*evaluation.data, *options.data_files]
        if not evaluation.data:
            self.error("give MemSyco-Bench .jsonl files or directories (positional, or --data)")
        if options.gold_relations:
            evaluation.relations = "gold"
        judge_args = next(c for c in configs if isinstance(c, JudgeArgs))
        evaluation.judge = judge_args.to_config()
        return (*configs, options)


def add_memsyco_arguments(parser: StageParser) -> None:
    parser.add_argument("data_files", nargs="*", help="MemSyco-Bench .jsonl files or directories of them.")
    parser.add_argument(
        "--gold-relations", "--gold_relations", action="store_true", help="Same as --relations gold (an oracle)."
    )


def make_parser(prog: str | None = None) -> MemSycoParser:
    parser = MemSycoParser(
        (MemSycoEvalConfig, JudgeArgs),
        prog=prog,
        description="MemSyco-Bench rows (validated against its schema.json) answered by the responder with no state "
        "and, with --checkpoint, with the checkpoint's states; the judge follows the benchmark's published prompts "
        "and pass rules (evaluate/memsyco/). Writes OUT/memsyco_report.json and .md.",
    )
    add_memsyco_arguments(parser)
    return parser


def remove_if_created(out_dir: str | Path):
    """A context manager: on failure, remove ``out_dir`` if it did not exist before (nothing half-written left)."""
    from contextlib import contextmanager

    @contextmanager
    def guard():
        out = Path(out_dir)
        created = not out.exists()
        try:
            yield out
        except BaseException:
            if created:
                shutil.rmtree(out, ignore_errors=True)
            raise

    return guard()


def run(parsed: tuple[MemSycoEvalConfig, JudgeArgs, argparse.Namespace]) -> None:
    config = parsed[0]
    if not config.responder_model:
        raise ConfigError("responder_model is required (the responder that answers the rows)")
    with remove_if_created(config.out_dir):
        out = evaluate_memsyco(config)
    print((out / "memsyco_report.md").read_text())
