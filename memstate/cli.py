"""``memstate`` command line: a list of commands, each implemented by its stage's module.

A command names the module that implements it; that module exposes ``make_parser(prog)`` (built from the stage's
config dataclasses, mostly ``memstate.parsing.StageParser``, which also reads ``--config FILE.yaml``) and
``run(parsed)``. The module is imported only when its command runs, so ``memstate --help`` stays fast.

User mistakes (a ``memstate.errors.MemstateError``: a missing file, a bad config field, a server that is down) print
one line, ``memstate <command>: error: <message> (hint: <hint>)``, and exit 2 (3: ``memstate train`` stopped because
the responder failed mid-run, after saving a checkpoint to ``--resume`` from; ``memstate.errors.ResponderFailure``);
``--debug`` or ``MEMSTATE_DEBUG=1`` shows the traceback instead. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Command:
    """``module`` implements it (``parser`` and ``run``: the names of its two functions); ``subcommands`` make it a
    group (``memstate memory ingest``); a group with a ``module`` also runs on its own (``memstate eval``)."""

    name: str
    help: str
    module: str | None = None
    parser: str = "make_parser"
    run: str = "run"
    subcommands: tuple[Command, ...] = field(default_factory=tuple)
    example: str = ""  # a copy-paste command line, shown in --help (tests/test_cli.py parses every one)


COMMANDS: tuple[Command, ...] = (
    Command("demo", "The method on CPU (make demo): the sycophancy world's data, GRPO against its shipped responder, "
            "evaluation on unseen users (no state, self-guide, checkpoint); --pipeline: tiny random models on the "
            "FEVER fixtures.", "memstate.experiment.demo",
            example="memstate demo --out runs/demo"),
    Command("tiny-models", "Build the tiny random-init policy, responder and tokenizer.", "memstate.cli",
            "tiny_models_parser", "tiny_models", example="memstate tiny-models --out runs/tiny-models"),
    Command("build-data", "Build the Instance dataset from raw source files.", "memstate.data_build.build",
            example="memstate build-data --config configs/data/fever_fixture.yaml --out runs/data/fever_fixture"),
    Command("data", "The released datasets: fetch them into the layout the data configs read.", subcommands=(
        Command("fetch", "Download datasets (fever, scifact, personamem, locomo, memsyco, all) as released, "
                "checksummed and resumable.", "memstate.fetch",
                example="memstate data fetch scifact memsyco --out data/raw"),
    )),
    Command("train", "GRPO-train the policy (TRL GRPOTrainer).", "memstate.train.cli",
            example="memstate train --config configs/train/tiny_cpu.yaml --max_steps 20"),
    Command("reward", "Reward utilities.", subcommands=(
        Command("precompute-baselines", "Fill the SQLite baseline cache for a dataset ahead of training "
                "(resumable).", "memstate.reward.precompute",
                example="memstate reward precompute-baselines --data runs/data/fever_fixture "
                "--cache runs/baselines.sqlite --responder-model runs/tiny-models/responder"),
    )),
    Command("eval", "Evaluate a checkpoint (no state / self-guide / checkpoint / self-recheck), or compare runs.",
            "memstate.evaluate.run", example="memstate eval --checkpoint runs/train/tiny_cpu --split test "
            "--temperature 1.0", subcommands=(
        Command("compare", "Compare evaluation runs: a Markdown table and a bar chart (PNG).",
                "memstate.evaluate.compare", example="memstate eval compare runs/a/final/eval-test "
                "runs/b/final/eval-test --out runs/compare"),
        Command("memsyco", "MemSyco-Bench: the responder answers each row (no state / checkpoint states); an LLM "
                "judge labels it.", "memstate.evaluate.memsyco.run",
                example="memstate eval memsyco third_party/data/memsyco --responder-model Qwen/Qwen3-8B "
                "--responder-url http://resp:8000 --judge-url http://judge:8000 --judge-model Qwen/Qwen3-32B "
                "--out runs/memsyco"),
        Command("sweep", "The policy on every memory backend: MemSyco-Bench with and without the checkpoint's "
                "states per backend.", "memstate.evaluate.sweep",
                example="memstate eval sweep third_party/data/memsyco --checkpoint runs/train/tiny_cpu/final "
                "--responder-model Qwen/Qwen3-8B --responder-url http://resp:8000 --judge-url http://judge:8000 "
                "--judge-model Qwen/Qwen3-32B --out runs/sweep"),
        Command("retrieval", "Evidence recall, tokens and latency of every memory backend at each k on LoCoMo, "
                "against BM25 over raw turns and naive at equal facts.", "memstate.evaluate.retrieval",
                example="memstate eval retrieval third_party/data/locomo/locomo_dev5.json --out runs/retrieval"),
    )),
    Command("memory", "The memory pipeline: ingest dialogues into a store, ask it questions.", subcommands=(
        Command("ingest", "Induce facts, concepts and relations from dialogues into a store.", "memstate.memory.cli",
                "ingest_parser", "ingest", example="memstate memory ingest --store-dir runs/locomo --format locomo "
                "third_party/data/locomo/locomo_dev5.json"),
        Command("ask", "Retrieve, get a reasoning state from the API, ask the responder.", "memstate.memory.cli",
                "ask_parser", "ask", example="memstate memory ask --store runs/locomo/conv-26.sqlite "
                "'Where did Caroline move from?' --responder-model runs/tiny-models/responder --no-state"),
    )),
    Command("experiment", "End-to-end experiments with small models trained here.", subcommands=(
        Command("sycophancy", "Synthetic world: train a sycophantic responder, GRPO-train the policy and two "
                "controls, evaluate on unseen users.", "memstate.experiment.sycophancy",
                example="memstate experiment sycophancy --out runs/sycophancy --quick"),
        Command("world", "Build the sycophancy world's frozen responder and warmed-up policy (shipped for make demo).",
                "memstate.experiment.world_models", example="memstate experiment world --out runs/world"),
        Command("leak", "A world where leaking pays: GRPO under the word gate alone, + the answer-flow threshold, "
                "+ the no-cliff credit; code rates and gains per arm.", "memstate.experiment.leak",
                example="memstate experiment leak --out runs/leak --world examples/leak_world --quick"),
    )),
    Command("serve", "Serve the policy (vLLM) and the reasoning-state API.", subcommands=(
        Command("policy", "Serve a checkpoint with vLLM's OpenAI-compatible server; stops it on SIGINT/SIGTERM.",
                "memstate.serve.cli", "policy_parser", "policy",
                example="memstate serve policy --model runs/train/tiny_cpu/final --port 8000"),
        Command("api", "The reasoning-state HTTP API (FastAPI) in front of a served policy.", "memstate.serve.cli",
                "api_parser", "api", example="memstate serve api --config configs/serve/api.yaml"),
    )),
)  # fmt: skip


# ---- tiny-models (core: no stage to live in) ------------------------------------------------------------------------


def tiny_models_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Build the tiny random-init policy, responder and tokenizer.")
    p.add_argument("--out", required=True, help="Output dir; writes OUT/policy and OUT/responder.")
    p.add_argument("--print-sha256", action="store_true", help="Print the sha256 of every file written.")
    return p


def tiny_models(args: argparse.Namespace) -> None:
    from memstate.tiny_models import build_tiny_models, tree_sha256

    paths = build_tiny_models(args.out)
    for name, path in paths.items():
        print(f"{name}: {path}")
    if args.print_sha256:
        for rel, digest in tree_sha256(args.out).items():
            print(f"{digest}  {rel}")


# ---- dispatch -------------------------------------------------------------------------------------------------------


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the help (as HfArgumentParser shows them), the subcommand listing as written."""


def _listing(commands: tuple[Command, ...]) -> str:
    width = max(len(c.name) for c in commands)
    return "\n".join(f"  {c.name:<{width}}  {c.help}" for c in commands)


def _examples(commands: tuple[Command, ...]) -> str:
    """Every runnable command's example, subcommands' included."""
    lines = []
    for c in commands:
        lines += [f"  {c.example}"] if c.example else []
        lines += [f"  {s.example}" for s in c.subcommands if s.example]
    return "examples:\n" + "\n".join(lines)


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memstate",
        description="memstate: train and evaluate a reasoning-state policy. `memstate COMMAND --help` for a command.",
        epilog="commands:\n" + _listing(COMMANDS) + "\n\n" + _examples(COMMANDS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO).")
    parser.add_argument(
        "--debug", action="store_true", help="Show the traceback of user errors too (or set MEMSTATE_DEBUG=1)."
    )
    parser.add_argument("command", choices=[c.name for c in COMMANDS], metavar="COMMAND", help="See below.")
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _resolve(top: argparse.ArgumentParser, name: str, argv: list[str]) -> tuple[Command, str, list[str]]:
    """The command to run, its prog ("memstate eval memsyco") and its own arguments."""
    command, prog = next(c for c in COMMANDS if c.name == name), f"memstate {name}"
    while command.subcommands:
        sub = {c.name: c for c in command.subcommands}
        if argv and argv[0] in sub:
            command, prog, argv = sub[argv[0]], f"{prog} {argv[0]}", argv[1:]
            continue
        if command.module is not None:  # a group that also runs on its own (eval)
            if not argv:
                sys.stderr.write(f"{prog} also has subcommands: {', '.join(sub)} (`{prog} --help`)\n")
            break
        usage = f"usage: {prog} {{{','.join(sub)}}} ...\n\n{command.help}\n\nsubcommands:\n"
        listing = _listing(command.subcommands) + "\n\n" + _examples(command.subcommands)
        if argv[:1] in (["-h"], ["--help"]):
            print(usage + listing)
            raise SystemExit(0)
        sys.stderr.write(usage + listing + "\n")
        top.exit(2, f"{prog}: error: choose a subcommand: {', '.join(sub)}\n")
    return command, prog, argv


def command_parser(command: Command, prog: str) -> argparse.ArgumentParser:
    """The command's own parser, its help ending with its subcommands (if any) and its example."""
    parser = getattr(importlib.import_module(command.module), command.parser)(prog)
    epilog = [parser.epilog] if parser.epilog else []
    epilog += ["subcommands:\n" + _listing(command.subcommands)] if command.subcommands else []
    epilog += [f"example:\n  {command.example}"] if command.example else []
    parser.epilog = "\n\n".join(epilog)
    parser.formatter_class = _Formatter
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]):
    if hasattr(parser, "parse_args_and_config"):  # a StageParser: dataclasses (+ a namespace of the extra flags)
        return parser.parse_args_and_config(argv)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    top = _top_parser()
    args = top.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(args.log_level.upper())
    debug = args.debug or os.environ.get("MEMSTATE_DEBUG", "") not in ("", "0")
    from memstate.threads import configure_threads

    # Before any stage imports torch: thread counts from the cores this process has, and OpenMP threads that sleep
    # instead of spinning when they wait (two torch processes on 2 cores ran 30-60x slower; benchmarks/bench_threads).
    configure_threads(import_torch=False)
    prog = f"memstate {args.command}"
    from memstate.errors import MemstateError

    try:
        command, prog, rest = _resolve(top, args.command, args.args)
        module = importlib.import_module(command.module)
        parser = command_parser(command, prog)
        code = getattr(module, command.run)(_parse(parser, rest))
    except MemstateError as e:
        if debug:
            raise
        message = " ".join(str(e).split())
        hint = f" (hint: {e.hint.replace('memstate <command>', prog)})" if e.hint else ""
        sys.stderr.write(f"{prog}: error: {message}{hint}\n")
        return e.exit_code
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
