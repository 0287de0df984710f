"""One GRPO step of the production config on one GPU (issue 55): what a real run's step costs, before a cluster is
booked.

The production config (``configs/train/qwen3_4b_8gpu.yaml``) on one GPU, through memstate's own trainer
(``SharedPrefixGRPOTrainer``, TRL's ``GRPOTrainer``) and reward (``CounterfactualGainReward``, answer-flow check on):

- ``models``: random-init models of the real architectures in bf16 — the Qwen3-4B policy, saved so that TRL loads it
  and builds its reference model from the path, and a Qwen3-8B responder, in process (no vLLM on the device). The
  tokenizer is memstate's tiny one (its ids fit the vocabulary; no download).
- ``generate`` (for information): ``model.generate`` of one small batch at the prompt budget.
- ``train_flex``: two optimizer steps (the first compiles; the second is steady) of production micro-batches
  (``per_device_train_batch_size`` 16 = 2 groups of G = 8, prompts cut to 8,192 tokens, completions of the full
  512 tokens) with the shared-prefix path (``auto``: flex on CUDA) and its first-use check comparing log-probs AND
  parameter gradients with TRL's path on the live batch. Completions are synthetic in place of generation
  (``rollout_func``): distinct well-formed states padded to full length, so the reward calls the responder at full
  volume (a with-state prompt and a no-memory prompt per distinct state, a baseline per instance).
- ``train_stock``: the same steps on TRL's layout (``shared_prefix_training: false``); out of memory is recorded,
  not fatal.
- ``validation``: one ``trainer.evaluate()`` pass (``num_generations_eval`` states per instance).

The JSON (``benchmarks/results/grpo_step_gpu.json``) is written after every phase: seconds per step (first and
steady), peak GPU memory per phase, completions and tokens per second packed vs stock, the first-use check's
log-prob and gradient agreement, the reward's stage times. ``--dry-run``: the tiny models on CPU at short lengths
through the same code (split attention: torch has no FlexAttention backward on CPU); the test suite runs it.

One optimizer step here is ``--micro-batches`` micro-batches (default 2: 32 completions), not the 1,024 of a
production step over 8 GPUs: per-micro-batch figures carry over, a whole step is that many times longer. Planned to
run start to finish in under 10 minutes of an H200 (about 40 GB of checkpoints written and read back).

On the device (torch, transformers, accelerate and peft are there; TRL's closure beyond them, measured on
2026-12-06, is trl 1.16.0 (0.95 MB), datasets 5.2.0 (0.61 MB; needs pyarrow >= 24, which the image's pyarrow must
meet, else carry pyarrow's ~42 MB wheel too), dill 0.4.1 (0.12 MB) and multiprocess 0.70.19 (0.15 MB): ~1.8 MB
of wheels, carried with memstate's own):

    echo /.whl/ >> .git/info/exclude && rm -rf .whl && .venv/bin/pip wheel --no-deps -q -w .whl . && \\
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \\
      trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    # then, there (carry .whl):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \\
      PYTHONPATH=/tmp/site python3 benchmarks/gpu/grpo_step.py
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM, TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results_io import report  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ROOT / "configs" / "train" / "qwen3_4b_8gpu.yaml"
# Qwen/Qwen3-4B-Instruct-2507's and Qwen/Qwen3-8B's config.json (architecture only; weights random).
QWEN3_4B = dict(
    hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=151936, rope_theta=5_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    max_position_embeddings=32768,
)  # fmt: skip
QWEN3_8B = dict(
    hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
    max_position_embeddings=12288,  # the launch scripts' RESPONDER_MAX_LEN: the reward fits prompts to it
)  # fmt: skip
# Procedure a responder can follow, none naming an answer: the states the synthetic completions carry.
RULES = (
    "Trust the newer preference over the older one.",
    "Weigh the evidence against the user's stated belief.",
    "Prefer facts the user said themselves.",
    "Treat an outdated memory as history, not as the current view.",
    "Check whether two memories conflict before using either.",
    "Use the evidence facts before the user's opinion.",
    "Ignore memories about other topics.",
    "Read every option before choosing one.",
    "Give more weight to specific facts than to general ones.",
    "Keep to what the memories support.",
)


def state_texts(n: int) -> list[str]:
    """``n`` distinct well-formed states of 2 to 4 rule lines.

    >>> texts = state_texts(20)
    >>> len(set(texts)), texts[0].splitlines()[0]
    (20, '- Trust the newer preference over the older one.')
    """
    out = []
    for i in range(n):
        lines = [RULES[(i + k * 3) % len(RULES)] for k in range(2 + i % 3)]
        out.append("\n".join(f"- {line}" for line in dict.fromkeys(lines)))
    if len(set(out)) < n:  # more than the rule combinations give: number them apart
        out = [f"{text}\n- Answer in one line (variant {i})." for i, text in enumerate(out)]
    return out


def synthetic_rollout(tokenizer, completion_len: int):
    """TRL's ``rollout_func``: each prompt's completion is a distinct well-formed state, its end-of-sequence token,
    and padding up to ``completion_len`` tokens after it (what TRL masks), so the training pass has full-length
    completions and the reward scores real states."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    states = [tokenizer.encode(text, add_special_tokens=False) for text in state_texts(64)]
    counter = {"calls": 0}

    def rollout(prompts: list, trainer) -> dict:
        prompt_ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
                      for p in prompts]  # fmt: skip
        completion_ids = []
        for i in range(len(prompts)):
            state = states[(counter["calls"] + i) % len(states)][: completion_len - 1]
            completion_ids.append(state + [eos] + [pad] * (completion_len - len(state) - 1))
        counter["calls"] += len(prompts)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def long_instances(instances: list, facts_per_instance: int) -> list:
    """Each instance with its facts repeated (new ids) up to ``facts_per_instance``: the policy prompt is then cut to
    the budget by ``fit_prompt``, as production prompts are, and the responder reads them all."""
    out = []
    for inst in instances:
        facts = list(inst.facts)
        k = 0
        while len(facts) < facts_per_instance:
            f = inst.facts[k % len(inst.facts)]
            facts.append(dataclasses.replace(f, id=f"X{k}", role="distractor"))
            k += 1
        out.append(dataclasses.replace(inst, facts=tuple(facts)))
    return out


class StepTimes(TrainerCallback):
    """Seconds and peak GPU memory of each optimizer step (generation, reward and the training pass: all of it)."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        self.steps.append({"seconds": round(time.perf_counter() - self._start, 3),
                           "peak_gib": None if peak is None else round(peak, 2)})  # fmt: skip


class Captured(logging.Handler):
    """The trainer's shared-prefix messages (the first-use check's log-prob and gradient agreement)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "shared-prefix" in record.getMessage():
            self.messages.append(record.getMessage())


def check_figures(messages: list[str]) -> dict:
    """The first-use check's agreement with TRL's path, read from its log lines.

    >>> check_figures(["shared-prefix check: log-probs mean |Δ| 1.56e-07, max 1.43e-06 over 256 tokens (tolerance "
    ...                "1e-04)", "shared-prefix check: gradients worst relative difference 6.31e-07 over 24 tensors"])
    {'logp_mean_abs_diff': 1.56e-07, 'logp_max_abs_diff': 1.43e-06, 'grad_worst_rel_diff': 6.31e-07}
    """
    out = {}
    for text in messages:
        if m := re.search(r"log-probs mean \|Δ\| ([\d.e+-]+), max ([\d.e+-]+)", text):
            out |= {"logp_mean_abs_diff": float(m[1]), "logp_max_abs_diff": float(m[2])}
        if m := re.search(r"gradients worst relative difference ([\d.e+-]+)", text):
            out["grad_worst_rel_diff"] = float(m[1])
    return out


def build_models(work: Path, dry_run: bool, device: torch.device) -> dict:
    """Random-init policy and responder saved under ``work`` with memstate's tiny tokenizer."""
    from memstate.tiny_models import build_tokenizer, tiny_config

    tokenizer = build_tokenizer()
    start = time.perf_counter()
    out = {}
    for name, arch in (("policy", QWEN3_4B), ("responder", QWEN3_8B)):
        if dry_run:
            config = Qwen3Config(**(tiny_config(tokenizer).to_dict() | {"max_position_embeddings": 32768}))
        else:
            config = Qwen3Config(**arch, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        dtype = torch.float32 if dry_run else torch.bfloat16
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # built in its dtype, on the device: a host-side fp32 init of 8B takes minutes
        try:
            with device:
                model = Qwen3ForCausalLM(config)
        finally:
            torch.set_default_dtype(default)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        path = work / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        out[name] = {"path": str(path), "parameters": sum(p.numel() for p in model.parameters()),
                     "gib_on_disk": round(size / 2**30, 2)}  # fmt: skip
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"seconds": round(time.perf_counter() - start, 1), **out}


def time_generate(policy: str, prompt_ids: list[int], completion_len: int, device: torch.device, dtype) -> dict:
    """``model.generate`` of one small batch (2 prompts x 2 completions) for information: vLLM does this in
    production."""
    model = transformers.AutoModelForCausalLM.from_pretrained(policy, dtype=dtype).to(device).eval()
    ids = torch.tensor([prompt_ids, prompt_ids], device=device)
    kwargs = dict(max_new_tokens=completion_len, min_new_tokens=completion_len, do_sample=True,
                  num_return_sequences=2)  # fmt: skip
    with torch.no_grad():
        model.generate(ids[:, :32], max_new_tokens=4)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    new = (out.size(1) - ids.size(1)) * out.size(0)
    del model
    return {"prompt_tokens": len(prompt_ids), "sequences": out.size(0), "new_tokens": new,
            "seconds": round(seconds, 2), "new_tokens_per_s": round(new / seconds, 1)}  # fmt: skip


def train_steps(name: str, argv: list[str], rollout, responder, instances, held_out, validate: bool) -> dict:
    """The optimizer steps of ``argv`` (``--max_steps``) of memstate's trainer on ``instances`` with ``responder``
    (and, ``validate``, one evaluation on ``held_out``), timed."""
    from trl import GRPOTrainer

    from memstate.reward.counterfactual import CounterfactualGainReward, RewardConfig
    from memstate.train.config import parse_train_args
    from memstate.train.data import grpo_dataset
    from memstate.train.launch import fit_to_world
    from memstate.train.shared_prefix import SharedPrefixConfig, SharedPrefixGRPOTrainer

    script_args, responder_config, grpo_config = parse_train_args(argv)
    # In process, in memory: the responder next to the policy, and no baseline file (every call is made).
    script_args = dataclasses.replace(script_args, baseline_cache=None)
    responder_config = dataclasses.replace(responder_config, responder_url=None)
    grpo_config = fit_to_world(script_args.completions_per_step, grpo_config, 1)
    device = "cpu" if grpo_config.use_cpu else "cuda"
    config = RewardConfig(mode=responder_config.score_mode, answer_flow_check=script_args.answer_flow_check,
                          answer_flow_credit=script_args.answer_flow_credit,
                          answer_flow_threshold=script_args.answer_flow_threshold)  # fmt: skip
    reward = CounterfactualGainReward(responder, config)
    tokenizer = transformers.AutoTokenizer.from_pretrained(script_args.policy_model)
    dataset, truncated = grpo_dataset(instances, tokenizer, script_args.max_prompt_tokens)
    eval_dataset = grpo_dataset(held_out, tokenizer, script_args.max_prompt_tokens)[0] if validate else None
    reward.stop_token_ids = {tokenizer.eos_token_id}
    times = StepTimes()
    kwargs = dict(model=script_args.policy_model, reward_funcs=[reward], args=grpo_config, train_dataset=dataset,
                  eval_dataset=eval_dataset, processing_class=tokenizer, callbacks=[times],
                  rollout_func=rollout)  # fmt: skip
    captured = Captured()
    logging.getLogger("memstate.train").addHandler(captured)
    result: dict = {"prompts_cut_to_budget": truncated}
    try:
        if script_args.shared_prefix_training:
            settings = SharedPrefixConfig(attention=script_args.shared_prefix_attention,
                                          check=script_args.shared_prefix_check,
                                          on_failure=script_args.shared_prefix_on_failure)  # fmt: skip
            trainer = SharedPrefixGRPOTrainer(**kwargs, shared_prefix=settings)
        else:
            trainer = GRPOTrainer(**kwargs)
        start = time.perf_counter()
        trainer.train()
        result["train_seconds"] = round(time.perf_counter() - start, 2)
        if validate:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            metrics = trainer.evaluate()
            result["validation"] = {
                "seconds": round(time.perf_counter() - start, 2),
                "instances": len(held_out),
                "states": len(held_out) * (grpo_config.num_generations_eval or grpo_config.num_generations),
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
                "eval_reward": metrics.get("eval_reward"),
            }
    except torch.OutOfMemoryError as error:
        result["error"] = f"out of memory: {str(error)[:300]}"
    finally:
        logging.getLogger("memstate.train").removeHandler(captured)
    result["steps"] = times.steps
    result["shared_prefix_messages"] = captured.messages
    result |= check_figures(captured.messages)
    logged = [e for e in (trainer.state.log_history if "trainer" in locals() else []) if "reward" in e]
    result["reward_stage_seconds"] = [{k.removeprefix("memstate/time/"): round(v, 3) for k, v in e.items()
                                       if k.startswith("memstate/time/")} for e in logged]  # fmt: skip
    result["responder_prompts"] = [e.get("memstate/responder_prompts") for e in logged]
    micro = grpo_config.per_device_train_batch_size
    shape = {"micro_batches_per_step": grpo_config.gradient_accumulation_steps, "completions_per_micro_batch": micro,
             "completion_tokens": grpo_config.max_completion_length}  # fmt: skip
    if len(times.steps) >= 2:
        steady = times.steps[-1]["seconds"]
        completions = micro * grpo_config.gradient_accumulation_steps
        result |= {"first_step_seconds": times.steps[0]["seconds"], "steady_step_seconds": steady,
                   "completions_per_s": round(completions / steady, 2)}  # fmt: skip
    del reward
    if "trainer" in locals():
        del trainer
    gc.collect()  # the trainer's model, reference model and optimizer go before the next phase loads its own
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"path": name, **shape, **result}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="Tiny models at short lengths on CPU (the tests).")
    parser.add_argument("--micro-batches", type=int, default=2, help="Micro-batches per optimizer step.")
    parser.add_argument("--out", default="benchmarks/results/grpo_step_gpu.json")
    parser.add_argument("--work", help="Where the models and data go (default: a temporary directory).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no GPU here: run with --dry-run on CPU")
    device = torch.device("cpu" if args.dry_run else "cuda")
    work = Path(args.work or tempfile.mkdtemp(prefix="grpo-step-"))
    results: dict = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": str(PRODUCTION.relative_to(ROOT)),
        "phases": {},
    }
    phases = results["phases"]

    phases["models"] = build_models(work, args.dry_run, device)
    report(results, args.out)

    from memstate.cli import main as memstate
    from memstate.data import load_split

    if memstate(["build-data", "--config", str(ROOT / "configs/data/synthetic.yaml"), "--out", str(work / "data")]):
        raise SystemExit("build-data failed")
    # Short lengths in the dry run; the production budget (8,192 + 512) on the GPU.
    prompt_budget, completion_len, per_device, facts = (256, 32, 4, 16) if args.dry_run else (8192, 512, 16, 600)
    group = 4 if args.dry_run else 8
    prompts_per_step = per_device * args.micro_batches // group
    train_set = long_instances(load_split(work / "data", "train")[: 2 * prompts_per_step], facts)
    held_out = long_instances(load_split(work / "data", "validation")[: 2 if args.dry_run else 8], facts)
    policy, responder = phases["models"]["policy"]["path"], phases["models"]["responder"]["path"]

    tokenizer = transformers.AutoTokenizer.from_pretrained(policy)
    from memstate.prompts import fit_prompt

    lengths = []
    for inst in train_set:
        messages, _ = fit_prompt(tokenizer, inst, prompt_budget)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        lengths.append(len(ids))
    prompt_ids, mean_prompt = ids, sum(lengths) / len(lengths)
    results["mean_prompt_tokens"] = round(mean_prompt, 1)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    phases["generate"] = time_generate(policy, prompt_ids, min(completion_len, 64), device, dtype)
    report(results, args.out)

    argv_common = [
        "--config", str(PRODUCTION), "--policy_model", policy, "--responder_model", responder,
        "--data_dir", str(work / "data"), "--output_dir", str(work / "run"),
        "--use_vllm", "false", "--report_to", "none", "--save_strategy", "no", "--eval_strategy", "no",
        "--max_steps", "2", "--logging_steps", "1",
        "--max_prompt_tokens", str(prompt_budget), "--max_completion_length", str(completion_len),
        "--per_device_train_batch_size", str(per_device), "--num_generations", str(group),
        "--completions_per_step", str(per_device * args.micro_batches),
        "--generation_batch_size", str(per_device * args.micro_batches),  # one optimizer step per round
        "--shared_prefix_check", "gradients", "--log_completions", "false",
    ]  # fmt: skip
    if args.dry_run:
        argv_common += ["--use_cpu", "true", "--bf16", "false", "--model_init_kwargs", '{"dtype": "float32"}',
                        "--vllm_enable_sleep_mode", "false", "--gradient_checkpointing", "false"]  # fmt: skip
    rollout = synthetic_rollout(tokenizer, completion_len)
    # One responder for both paths (loaded once), at full call volume: nothing cached between calls but what the
    # reward itself keeps (each instance's baseline).
    from memstate.responders.local import TransformersResponder

    start = time.perf_counter()
    responder_model = TransformersResponder(responder, batch_size=8, device=device.type,
                                            dtype="float32" if args.dry_run else "bfloat16")  # fmt: skip
    phases["models"]["responder_load_seconds"] = round(time.perf_counter() - start, 1)
    phases["train_flex"] = train_steps("shared_prefix", argv_common, rollout, responder_model, train_set, held_out,
                                       True)  # fmt: skip
    if "validation" in phases["train_flex"]:
        phases["validation"] = phases["train_flex"].pop("validation")
    report(results, args.out)
    phases["train_stock"] = train_steps("stock", [*argv_common, "--shared_prefix_training", "false"], rollout,
                                        responder_model, train_set, held_out, False)  # fmt: skip
    for phase in (phases["train_flex"], phases["train_stock"]):
        if "completions_per_s" in phase:  # the work both paths do, counted in TRL's layout (prompt + completion)
            phase["trl_layout_tokens_per_s"] = round(phase["completions_per_s"] * (mean_prompt + completion_len))
    flex, stock = phases["train_flex"], phases["train_stock"]
    if "steady_step_seconds" in flex and "steady_step_seconds" in stock:
        ratio = stock["steady_step_seconds"] / flex["steady_step_seconds"]
        results["stock_over_shared_prefix_step_time"] = round(ratio, 2)
    report(results, args.out)
    return results


if __name__ == "__main__":
    main()
