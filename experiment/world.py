"""The sycophancy world's models: rule shapes a policy can write, and a responder trained to fail like an LLM.

**Rule shapes.** A policy's warm-up draws 2–4 of ``SHAPES`` at random, the same mix for every instance: two
evidence rules that pull opposite ways, two preference rules that pull opposite ways, and neutral ones. Which shape
helps depends on the instance (trusting the evidence helps against a persuasive user; "use the newer preference"
helps on an update request and hurts on a history request; "use the older preference" says what this responder does
anyway), so no rule is right everywhere and the warm-up, drawing each opposing pair symmetrically, starts with no
expected gain. GRPO has to find which shape pays where.

**Responder.** A small Qwen3 model is trained (transformers ``Trainer``, on the answer token and the prompt's next
tokens) on responder prompts of the *train* split, each with no state and with three states of ``responder_state``
(a pair's lone rule in two thirds of them), to answer with the letter ``world_letter`` gives:

- no relevant rule (no state, neutral rules, or both rules of an opposing pair): the failure modes — on evidence
  instances it follows the user's stance when the user's memory is phrased persuasively (sycophancy) and the
  evidence otherwise; on a changed preference it picks the older one (anchoring on what it learnt first), so it
  gives an outdated preference on every update request and the right one on every history request;
- one rule of a pair: what the rule says (the evidence's stance, the user's stance, the newer or the older item).

The letter is computed from the instance's metadata (the evidence label, the user's stance, the persuasive marker,
which preference is older) only to write training targets; the frozen responder then reads its prompts like any
model, and its measured behaviour on held-out entities is what the experiment reports.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from accelerate.state import AcceleratorState, GradientState
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, Trainer, TrainingArguments

from memstate.prompts import policy_messages, responder_messages
from memstate.schema import Instance, option_letters
from memstate.tiny_models import build_tokenizer, tiny_config

TRUST_EVIDENCE = "Trust the evidence over the user's belief."
FOLLOW_USER = "Go with what the user believes."
# "newer"/"older", not "latest"/"earlier": the history question says "before my latest change", and a rule word the
# prompt also uses elsewhere is one the responder must first learn to tell apart by position.
USE_LATEST = "Use the newer preference."
USE_EARLIER = "Use the older preference."
NEUTRAL = ("Weigh all memories equally.", "Read every memory before answering.", "Keep the reply short.")
SHAPES = (TRUST_EVIDENCE, FOLLOW_USER, USE_LATEST, USE_EARLIER, *NEUTRAL)


def random_state(rng: random.Random) -> tuple[str, ...]:
    """2–4 distinct shapes in random order: the warm-up's label-independent mix.

    >>> random_state(random.Random(0))
    ('Keep the reply short.', 'Use the older preference.', "Trust the evidence over the user's belief.")
    """
    return tuple(rng.sample(SHAPES, k=rng.randint(2, 4)))


PAIRS = ((TRUST_EVIDENCE, FOLLOW_USER), (USE_LATEST, USE_EARLIER))


def responder_state(rng: random.Random) -> tuple[str, ...]:
    """A state the responder trains on: from each opposing pair neither rule, one, the other, or both (2:3:3:1), neutral
    rules up to 2–4 in all, sometimes one rule twice (GRPO policies repeat rules), in random order.

    ``random_state``'s uniform draw gives a state with exactly one rule of the pair an instance turns on in about
    half of the cases, and that rule changes the answer in only half of those: trained on it, this responder did
    what one relevant rule says on held-out users in ~25% of the cases where it should change its answer. Here a
    pair's lone rule comes in two thirds of the states, and neither draw reads the instance.

    >>> responder_state(random.Random(0))
    ('Go with what the user believes.', 'Use the older preference.', 'Weigh all memories equally.')
    """
    rules = []
    for pair in PAIRS:
        rules += rng.choices(((), pair[:1], pair[1:], pair), weights=(2, 3, 3, 1))[0]
    rules += rng.sample(NEUTRAL, k=min(max(0, rng.randint(2, 4) - len(rules)), len(NEUTRAL)))
    if rng.random() < 0.2:
        rules.append(rng.choice(rules))
    rng.shuffle(rules)
    return tuple(rules)


def world_letter(instance: Instance, rules: tuple[str, ...] | None) -> str:
    """The option letter the world's responder is trained to give for ``instance`` under ``rules``."""
    rules = set(rules or ())
    meta = instance.meta
    if instance.task.startswith("evidence_"):
        evidence = instance.answer_letter
        user = option_letters(len(instance.labels))[instance.labels.index(meta["user_label"])]
        trust, follow = TRUST_EVIDENCE in rules, FOLLOW_USER in rules
        if trust != follow:
            return evidence if trust else user
        return user if meta["persuasive"] else evidence
    if instance.task in ("preference_update", "preference_history"):
        latest, earlier = USE_LATEST in rules, USE_EARLIER in rules
        if latest != earlier:
            return meta["newer_option"] if latest else meta["older_option"]
        # Anchoring on the preference it learnt first. Measured (issue 16): a default of "the emphatic one, old or
        # new" left this responder two bindings of a kind to its memory to learn (emphasis and recency), and in 1,600
        # steps it learnt the one the default trained and followed "use the newer/older preference" in under 6% of
        # the cases where the rule should change its answer. Here the default and the rules read the same binding
        # (which kind is the older), and a lone newer rule flips it.
        return meta["older_option"]
    return instance.answer_letter  # preference_current: one preference, nothing to get wrong


def world_texts(instances: list[Instance]) -> list[str]:
    """Every prompt text of ``instances`` (the train split only: test entities stay unseen, even as merges), and as
    many states as the policy writes, so the rules' words get whole tokens as in a real model's vocabulary."""
    rng = random.Random("world_texts")
    texts = []
    for inst in instances:
        texts.append(random_state_text(inst, rng))
        texts += [m["content"] for m in responder_messages(inst, SHAPES[:2]) + policy_messages(inst)]
    return texts


def responder_config(tokenizer) -> Qwen3Config:
    """Qwen3 as ``memstate tiny-models`` builds it (``head_dim`` 64), wider, one layer deeper and with a key/value
    head per attention head, so it can learn to read evidence, stances and rules in a few CPU minutes."""
    base = tiny_config(tokenizer).to_dict()
    base.pop("layer_types", None)  # derived from the layer count
    # One key/value head per query head (tiny-models shares one): measured at 1,600 steps, with one shared head the
    # responder followed either "Use the newer preference" (0.94) or "Trust the evidence" (1.0), the other at <0.4;
    # with three it followed the preference rule 1.0 and the evidence rule 0.67, at ~15% more time per step.
    size = {"hidden_size": 192, "intermediate_size": 384, "num_hidden_layers": 3, "num_attention_heads": 3}
    return Qwen3Config(**(base | size | {"num_key_value_heads": 3}))


def build_world_models(train_instances: list[Instance], out_dir: Path, seed: int = 0) -> dict[str, Path]:
    """A tokenizer fitted to the world's train text, and random-init ``policy`` (the tiny-models architecture) and
    ``responder`` (``responder_config``) under ``out_dir``; the responder is trained next, the policy warmed up."""
    tokenizer = build_tokenizer(world_texts(train_instances))
    paths = {}
    for name, config in (("policy", tiny_config(tokenizer)), ("responder", responder_config(tokenizer))):
        torch.manual_seed(seed + (name == "responder"))
        model = Qwen3ForCausalLM(config)
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        paths[name] = out_dir / f"{name}-init"
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    return paths


def responder_examples(
    tokenizer, instances: list[Instance], states_per_instance: int, seed: int
) -> list[dict[str, list[int] | int]]:
    """Each instance with no state and with ``states_per_instance - 1`` random states: the responder's prompt ids
    (exactly as ``TransformersResponder`` builds them) and the token id of the letter ``world_letter`` gives."""
    rng = random.Random(f"responder:{seed}")

    def prompt_ids(inst, rules):
        return tokenizer.apply_chat_template(
            responder_messages(inst, rules), add_generation_prompt=True, tokenize=True, return_dict=False
        )

    rows = []
    for inst in instances:
        bare = prompt_ids(inst, None)
        for k in range(states_per_instance):
            rules = None if k == 0 else responder_state(rng)
            ids = bare if rules is None else prompt_ids(inst, rules)
            # The prompt's language-model loss stops where the state begins (see AnswerTokenTrainer).
            lm_len = next((n for n, (a, b) in enumerate(zip(ids, bare, strict=False)) if a != b), len(ids))
            label = tokenizer.convert_tokens_to_ids(world_letter(inst, rules))
            rows.append({"input_ids": ids, "label": label, "lm_len": lm_len})
    rng.shuffle(rows)
    return rows


class AnswerTokenTrainer(Trainer):
    """Supervised training on the one token the responder is scored on (the option letter right after the prompt),
    plus next-token prediction on the prompt itself.

    The answer token alone is one bit per prompt of ~230 tokens: the model sits at chance until its heads find the few
    tokens that matter, and in this world that plateau outlasted a few CPU minutes (0.61 accuracy at 600 steps,
    preferences at chance). The prompt's own language-model loss forms the attention circuits (previous-token and
    copy heads) it needs first; with it the same 600 steps reach 0.91 on held-out users (most of it the no-state
    behaviour: learning to do what a rule says takes longer, see ``responder_state``).

    The language-model loss covers the prompt up to its state only. A state's rules are random draws, so after "Use
    the" the loss cannot predict "newer" from "older"; with the tied embeddings it pulled the two words' vectors
    together (cosine 0.97 after 1,600 steps) and the responder could not tell the two rules apart."""

    prompt_lm_weight = 1.0

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels, lm_mask = inputs.pop("labels"), inputs.pop("lm_mask")
        logits = model(**inputs).logits.float()
        answer_logits = logits[:, -1]
        loss = torch.nn.functional.cross_entropy(answer_logits, labels)
        targets = inputs["input_ids"][:, 1:].masked_fill(lm_mask[:, 1:] == 0, -100)
        prompt_lm = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), targets.flatten(), ignore_index=-100
        )
        loss = loss + self.prompt_lm_weight * prompt_lm
        return (loss, answer_logits) if return_outputs else loss


def left_pad_collator(pad_id: int):
    """Left-padded batches with explicit positions, so a padded row computes exactly what it would alone."""

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.tensor([[pad_id] * (width - len(r["input_ids"])) + r["input_ids"] for r in rows])
        mask = torch.tensor([[0] * (width - len(r["input_ids"])) + [1] * len(r["input_ids"]) for r in rows])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        labels = torch.tensor([r["label"] for r in rows])
        # The prompt up to its state (``lm_len``): what the language-model loss covers.
        lm_mask = mask * (positions < torch.tensor([r["lm_len"] for r in rows])[:, None])
        return {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "labels": labels,
                "lm_mask": lm_mask}  # fmt: skip

    return collate


def _reset_accelerate() -> None:
    # The next trainer in this process builds its own Accelerator.
    AcceleratorState._reset_state()
    GradientState._reset_state()


def train_responder(
    init_dir: str | Path,
    instances: list[Instance],
    out_dir: Path,
    *,
    steps: int,
    states_per_instance: int = 4,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    seed: int = 0,
) -> Path:
    """Train the world's responder from its random init on ``instances`` (the train split); save it to ``out_dir``."""
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir)
    args = TrainingArguments(
        output_dir=str(out_dir),
        max_steps=steps,
        learning_rate=learning_rate,
        # Constant: these small models learn each skill after a plateau (reading the stance, then binding a
        # preference's kind to its date); a decaying rate would stall the later ones.
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=max(steps // 20, 1),
        weight_decay=0.0,
        per_device_train_batch_size=batch_size,
        logging_steps=max(steps // 10, 1),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=seed,
        remove_unused_columns=False,
    )
    trainer = AnswerTokenTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(responder_examples(tokenizer, instances, states_per_instance, seed)),
        data_collator=left_pad_collator(tokenizer.pad_token_id),
    )
    trainer.train()
    trainer.save_model(str(out_dir))
    tokenizer.save_pretrained(out_dir)
    _reset_accelerate()
    return out_dir


def random_state_text(instance: Instance, rng: random.Random) -> str:
    """The warm-up's state for any instance: ``random_state`` as '- ' lines; ``instance`` is never read."""
    return "\n".join(f"- {r}" for r in random_state(rng))
