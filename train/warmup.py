"""Format warm-up for a random-init policy: a few supervised steps on template reasoning states.

Templates are built only from what the policy itself sees (fact ids, kinds and relations), never from the
answer or the fact roles, so the warm-up teaches the '- rule' format, not the task. GRPO does the rest.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from accelerate.state import AcceleratorState, GradientState
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from memstate.parsing import activation_checkpointing
from memstate.prompts import policy_messages
from memstate.schema import Instance

GENERIC_RULES = (
    "Answer from the evidence facts, not from the user's stance.",
    "Check whether the claim matches the evidence sentences exactly.",
    "Use only the memories that bear on this request.",
    "Do not let a stated belief or expertise override the evidence.",
    "Keep the user's own view separate from what the evidence shows.",
)


def template_state(instance: Instance, rng: random.Random) -> str:
    """A well-formed state that names the instance's facts and relations.

    >>> from memstate.schema import Fact, Relation
    >>> inst = Instance(id="x", source="fever", task="evidence_conflict", perspective="belief",
    ...     question="q", options=(), answer="refuted", answer_kind="label", labels=("supported", "refuted"),
    ...     facts=(Fact("F1", "e", "evidence"), Fact("F2", "b", "belief")),
    ...     relations=(Relation("F2", "CONFLICTS_WITH", "F1"),))
    >>> text = template_state(inst, random.Random(0))
    >>> text.splitlines()[0]
    "- Weigh the evidence in F1 against the user's belief in F2."
    >>> from memstate.rules import parse_state
    >>> isinstance(parse_state(text).rules, tuple)
    True
    """
    kinds = {f.id: f.kind for f in instance.facts}
    rules = []
    for rel in instance.relations:
        if rel.type == "CONFLICTS_WITH" and len(rules) < 2:
            rules.append(f"Weigh the evidence in {rel.dst} against the user's {kinds[rel.src]} in {rel.src}.")
    rules += rng.sample(GENERIC_RULES, k=rng.randint(1, 2))
    if len(rules) < 2:
        rules.append(GENERIC_RULES[0])
    return "\n".join(f"- {r}" for r in rules[:4])


StateWriter = Callable[[Instance, random.Random], str]


def warmup_dataset(instances: list[Instance], seed: int, state_writer: StateWriter = template_state) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_list(
        [
            {"prompt": policy_messages(i), "completion": [{"role": "assistant", "content": state_writer(i, rng)}]}
            for i in instances
        ]
    )


def format_warmup(
    policy_model: str,
    instances: list[Instance],
    out_dir: Path,
    *,
    steps: int,
    learning_rate: float,
    seed: int,
    use_cpu: bool,
    state_writer: StateWriter = template_state,
    lr_scheduler_type: str = "constant",
) -> Path:
    """Fine-tune ``policy_model`` on states from ``state_writer`` (default: ``template_state``) for ``steps`` steps
    with TRL's SFTTrainer; return its path."""
    config = SFTConfig(
        output_dir=str(out_dir),
        max_steps=steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=8,
        lr_scheduler_type=lr_scheduler_type,
        logging_steps=max(steps // 5, 1),
        save_strategy="no",
        report_to=[],
        use_cpu=use_cpu,
        # Recomputing activations in the backward pass saves memory a GPU run may need; on CPU (the tiny models) it
        # only costs time: ~a quarter of a training step.
        **activation_checkpointing(not use_cpu),
        seed=seed,
        bf16=False,
    )
    model = AutoModelForCausalLM.from_pretrained(policy_model)
    tokenizer = AutoTokenizer.from_pretrained(policy_model)
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=warmup_dataset(instances, seed, state_writer),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(str(out_dir))
    trainer.accelerator.wait_for_everyone()  # every rank loads out_dir next; only rank 0 wrote it
    # GRPOTrainer builds its own (DeepSpeed) Accelerator next; the process group itself stays up.
    AcceleratorState._reset_state()
    GradientState._reset_state()
    return out_dir
