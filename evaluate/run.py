"""``memstate eval``: how much a checkpoint's reasoning states help the frozen responder on held-out instances.

Two conditions, answered by the same responder (likelihood mode by default, or exact): **no state** (baseline)
and **checkpoint** (one state sampled from the policy at the serve API's temperature, 0.3 by default, seeded; tiny
models degenerate under greedy decoding). A state that fails ``parse_state`` cannot be used by a memory pipeline, so
that instance is answered without rules; a state that leaks the answer is used as written (at deployment
nobody knows the answer) and counted in the leak rate.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from evaluate.report import render_markdown, summarize
from memstate.data import load_split, manifest_sha256
from memstate.prompts import PROMPT_VERSION, policy_messages
from memstate.responder import TransformersResponder
from memstate.rules import FormatError, parse_state
from memstate.schema import Instance
from reward.gates import leaks_answer
from reward.judge import judge

logger = logging.getLogger("memstate.evaluate")


@dataclass
class EvalConfig:
    checkpoint: str = field(metadata={"help": "Policy checkpoint dir (or a training output dir with final/)."})
    split: str = field(default="test", metadata={"help": "Split to evaluate."})
    data_dir: str | None = field(default=None, metadata={"help": "Dataset dir; default: the one it trained on."})
    responder_model: str | None = field(default=None, metadata={"help": "Responder; default: the training one."})
    out_dir: str | None = field(default=None, metadata={"help": "Report dir; default: CHECKPOINT/eval-SPLIT."})
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "Token limit of a state; default: the checkpoint's max_completion_length."}
    )
    temperature: float = field(
        default=0.3, metadata={"help": "Sampling temperature of the policy, as the serve API uses it; 0 = greedy."}
    )
    seed: int = field(default=0, metadata={"help": "Sampling seed (the same seed gives the same states)."})
    batch_size: int = field(default=16, metadata={"help": "Policy generation and responder batch size."})
    max_instances: int | None = field(default=None, metadata={"help": "Evaluate only the first N instances."})
    score_mode: str = field(default="likelihood", metadata={"help": "Responder score mode: likelihood or exact."})


def resolve_checkpoint(path: str | Path) -> Path:
    path = Path(path)
    if (path / "final" / "config.json").is_file():
        return path / "final"
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: not a model checkpoint (no config.json, no final/config.json)")
    return path


@torch.no_grad()
def generate_states(checkpoint: Path, instances: list[Instance], config: EvalConfig) -> list[str]:
    """Policy outputs, one per instance (batched, left-padded, seeded)."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    texts = []
    torch.manual_seed(config.seed)
    sampling = (
        {"do_sample": True, "temperature": config.temperature, "top_k": 0}
        if config.temperature > 0
        else {"do_sample": False}
    )
    for start in tqdm(range(0, len(instances), config.batch_size), desc="policy states", unit="batch"):
        chunk = instances[start : start + config.batch_size]
        prompts = [
            tokenizer.apply_chat_template(policy_messages(i), add_generation_prompt=True, tokenize=False) for i in chunk
        ]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **enc, max_new_tokens=config.max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling
        )
        texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


def evaluate_checkpoint(config: EvalConfig) -> Path:
    """Run the evaluation, write ``report.json`` and ``report.md``; return the report dir."""
    checkpoint = resolve_checkpoint(config.checkpoint)
    meta_path = checkpoint / "memstate.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if meta.get("prompt_version", PROMPT_VERSION) != PROMPT_VERSION:
        logger.warning(
            "checkpoint was trained with prompts %s, evaluating with %s", meta["prompt_version"], PROMPT_VERSION
        )
    data_dir = config.data_dir or meta.get("data_dir")
    responder_model = config.responder_model or meta.get("responder_model")
    if not data_dir or not responder_model:
        raise ValueError(f"{checkpoint}: no memstate.json naming data and responder; pass --data and --responder")
    if config.max_new_tokens is None:
        config.max_new_tokens = meta.get("grpo_config", {}).get("max_completion_length", 128)
    instances = load_split(data_dir, config.split)[: config.max_instances]
    logger.info("evaluating %s on %d %s instances", checkpoint, len(instances), config.split)

    texts = generate_states(checkpoint, instances, config)
    states = [parse_state(t) for t in texts]
    rules = [None if isinstance(s, FormatError) else s.rules for s in states]
    responder = TransformersResponder(responder_model, batch_size=config.batch_size)
    baseline = judge(responder, instances, [None] * len(instances), config.score_mode)
    with_state = judge(responder, instances, rules, config.score_mode)

    records = []
    for inst, text, state, base, ours in zip(instances, texts, states, baseline, with_state, strict=True):
        ok = not isinstance(state, FormatError)
        records.append(
            {
                "id": inst.id,
                "task": inst.task,
                "perspective": inst.perspective,
                "state": text,
                "format_ok": ok,
                "format_error": None if ok else state.reason,
                "leak": ok and leaks_answer(state.text, inst),
                "rule_words": state.words if ok else 0,
                "no_state": {"score": base.score, "correct": base.correct},
                "checkpoint": {"score": ours.score, "correct": ours.correct},
            }
        )
    report = {
        "checkpoint": str(checkpoint),
        "split": config.split,
        "prompt_version": PROMPT_VERSION,
        "checkpoint_prompt_version": meta.get("prompt_version"),
        "data_dir": str(data_dir),
        "data_manifest_sha256": manifest_sha256(data_dir),
        "responder_model": str(responder_model),
        "score_mode": config.score_mode,
        "policy_sampling": {
            "temperature": config.temperature,
            "seed": config.seed,
            "max_new_tokens": config.max_new_tokens,
        },
        "metrics": summarize(records),
        "records": records,
    }
    out_dir = Path(config.out_dir) if config.out_dir else checkpoint / f"eval-{config.split}"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2))
    (out_dir / "report.md").write_text(render_markdown(report))
    logger.info("report in %s: %s", out_dir, json.dumps(report["metrics"]["overall"]))
    return out_dir
