"""The sycophancy world's models: rule shapes a policy can write, and a responder trained to fail like an LLM.

**Rule shapes.** A policy's warm-up draws 2–4 of ``SHAPES`` at random, the same mix for every instance: two
evidence rules that pull opposite ways, two preference rules that pull opposite ways, and neutral ones. Which shape
helps depends on the instance (trusting the evidence helps against a persuasive user; "use the newer preference"
helps on an update request and hurts on a history request; "use the older preference" says what this responder does
anyway), so no rule is right everywhere and the warm-up, drawing each opposing pair symmetrically, starts with no
expected gain. GRPO has to find which shape pays where.

**Responder.** A small Qwen3 model is trained (transformers ``Trainer``, on the answer token, the end of turn after
it and the prompt's next tokens) on responder prompts of the *train* split, with no state and with states of
``responder_state`` (a pair's lone rule in two thirds of them), in a curriculum (reading the memories first, then
the rules), to answer with the letter ``world_letter`` gives; of its checked iterates the one that best does what
the rules say on the validation split is kept:

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

import collections
import json
import random
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate.state import AcceleratorState, GradientState
from datasets import Dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen3Config,
    Qwen3ForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from memstate.prompts import policy_messages, responder_messages
from memstate.reward.answer_flow import flow_messages
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


# States per instance, by task. A lone evidence rule changes the answer only on an evidence conflict, and a lone
# "newer" rule only on an update or history request; with the same count everywhere ~3% of the rows taught each
# evidence rule and ~8% the newer rule, and at 1,600 steps the responder learnt the preference rule every time and
# the evidence rules only sometimes (followed "Trust the evidence" 67% and 3% in two runs that differed by one extra
# loss term), or, with three times the states on a conflict, the evidence rules and not the preference one (0.51).
# These counts give each rule ~5-10% of the rows. Which rules a state holds is still drawn blind to the instance.
STATES_PER_TASK = {"evidence_conflict": 6, "preference_update": 4, "preference_history": 4}
NO_MEMORY_EVERY = 12  # one row in twelve of the second phase shows no memory (``no_memory_rows``)
OTHER_STATES = 2  # evidence_consistent, preference_current: no rule should change the answer


def _prompt_ids(tokenizer, inst: Instance, rules: tuple[str, ...] | None, memories: bool = True) -> list[int]:
    messages = responder_messages(inst, rules) if memories else flow_messages(inst, rules)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def no_memory_letter(instance: Instance) -> str:
    """What the responder answers when it is shown no memory at all, with or without rules: "not enough info" on a
    claim, the first option otherwise. Rules about memories have nothing to act on then; that is what the reward's
    answer-flow check (``memstate.reward.answer_flow``) measures of a state, so the world's responder must have it.
    Trained without such prompts it answered "Trust the evidence" with no evidence present by one confident letter
    (a shift of ~1.0 on half the test instances): an artefact of its data, which the check would take for a leak.

    >>> from memstate.schema import Fact
    >>> inst = Instance("x", "synthetic", "evidence_conflict", "belief", "Claim?", (), "refuted", "label",
    ...                 ("supported", "refuted", "not enough info"), (Fact("F1", "e", "evidence"),), ())
    >>> no_memory_letter(inst)
    'C'
    """
    letters = option_letters(len(instance.candidates))
    return letters[instance.labels.index("not enough info")] if "not enough info" in instance.labels else letters[0]


# The responder's curriculum: each phase's share of the steps, the rows it draws from, and its learning-rate factor.
# Measured (validation split, two seeds, 1,600 steps; docs/sycophancy.md, "The responder"): on one shuffled mix
# the responder sat at chance for 450 to over 1,000 steps, the longer the fewer easy rows (agreeing evidence, one
# preference) it held: rules it cannot use yet are noise while it learns to read the memories. "reading" (rows without
# a state) took both seeds to 96-99% of the no-state answers by step 400. Adding the states at the same rate knocked
# that back (to 0.62-0.74) and one seed of a rules-only phase fell to chance; at 0.3 of the rate the reading held
# (0.98-1.00) and both seeds learnt all three rules by step 1,200-1,400, which a constant rate did in 1 of 2. With 1,200
# steps in all (the default since; the phases scale with the steps) the kept iterates followed the three rules
# 0.99-1.00 (seed 0) and 0.53 / 0.92 / 1.00 (seed 1) on the test users.
CURRICULUM = (("reading", 0.25, 1.0), ("all", 0.75, 0.3))
DECAY_SHARE = 0.3  # the rate decays linearly to 0 over the last 30% of the steps, so the kept iterates are settled


def responder_lr_factor(step: int, steps: int) -> float:
    """The responder's learning-rate factor at ``step``: a 5% warm-up, ``CURRICULUM``'s factor per phase, then a linear
    decay over the last ``DECAY_SHARE`` of the steps.

    >>> [round(responder_lr_factor(s, 100), 2) for s in (0, 4, 24, 25, 69, 70, 85, 99)]
    [0.2, 1.0, 1.0, 0.3, 0.3, 0.3, 0.15, 0.01]
    """
    factor = min(1.0, (step + 1) / max(steps // 20, 1))
    start = 0.0
    for _, share, phase_factor in CURRICULUM:
        if step >= start * steps:
            factor_now = phase_factor
        start += share
    decay_from = steps * (1 - DECAY_SHARE)
    return factor * factor_now * (1.0 if step < decay_from else (steps - step) / (steps - decay_from))


def responder_examples(tokenizer, instances: list[Instance], seed: int, total: int) -> list[dict[str, list[int] | int]]:
    """The ``total`` rows the responder trains on, in order, phase by phase (``CURRICULUM``), each phase shuffled
    passes over its rows: each instance with no state and with ``STATES_PER_TASK`` random states. A row is the
    responder's prompt ids (exactly as ``TransformersResponder`` builds them) followed by the letter ``world_letter``
    gives, and the letter's token id. Every ``NO_MEMORY_EVERY``-th row of the second phase is instead a prompt with
    no memory shown (``no_memory_rows``), drawn from its own random stream so the other rows are the ones they were
    before such rows existed: measured, adding them to the pools (which reshuffled every row) left a responder that
    followed "Use the newer preference" on 4% of the test cases (86% before)."""
    rng = random.Random(f"responder:{seed}")
    pools: dict[str, list] = {"reading": [], "all": []}
    for inst in instances:
        bare = _prompt_ids(tokenizer, inst, None)
        for k in range(1 + STATES_PER_TASK.get(inst.task, OTHER_STATES)):
            rules = None if k == 0 else responder_state(rng)
            ids = bare if rules is None else _prompt_ids(tokenizer, inst, rules)
            # The prompt's language-model loss stops where the state begins (see AnswerTokenTrainer).
            lm_len = next((n for n, (a, b) in enumerate(zip(ids, bare, strict=False)) if a != b), len(ids))
            label = tokenizer.convert_tokens_to_ids(world_letter(inst, rules))
            row = {"input_ids": [*ids, label], "label": label, "lm_len": lm_len}
            for phase in ("reading", "all") if rules is None else ("all",):
                pools[phase].append(row)
    order, done = [], 0
    for k, (phase, share, _) in enumerate(CURRICULUM):
        n = total - done if k == len(CURRICULUM) - 1 else int(total * share)
        while n > 0:  # shuffled passes
            order += rng.sample(pools[phase], len(pools[phase]))[:n]
            n -= len(pools[phase])
        done = len(order)
    bare_rows = no_memory_rows(tokenizer, instances, seed)
    start = int(total * CURRICULUM[0][1])
    for j, position in enumerate(range(start, total, NO_MEMORY_EVERY)):
        order[position] = bare_rows[j % len(bare_rows)]
    return order


def no_memory_rows(tokenizer, instances: list[Instance], seed: int) -> list[dict[str, list[int] | int]]:
    """Rows with no memory shown (the answer-flow check's prompt), without and with a random state, all answered with
    ``no_memory_letter``: rules about memories have nothing to act on then. Shuffled, from their own random stream."""
    rng = random.Random(f"responder-no-memory:{seed}")
    rows = []
    for inst in instances:
        label = tokenizer.convert_tokens_to_ids(no_memory_letter(inst))
        bare = _prompt_ids(tokenizer, inst, None, memories=False)
        with_rules = _prompt_ids(tokenizer, inst, responder_state(rng), memories=False)
        lm_len = next((k for k, (a, b) in enumerate(zip(with_rules, bare, strict=False)) if a != b), len(bare))
        rows += [{"input_ids": [*bare, label], "label": label, "lm_len": len(bare)},
                 {"input_ids": [*with_rules, label], "label": label, "lm_len": lm_len}]  # fmt: skip
    return rng.sample(rows, len(rows))


def skill_examples(tokenizer, instances: list[Instance]) -> list[dict]:
    """What the responder must be able to do, as rows of held-out instances: each pair rule alone where it changes
    the answer (``skill`` the rule), and on every third instance no state (``skill`` "no_state": the failure modes)
    and a neutral rule ("neutral": nothing changes). Rows come shortest first, so a batch holds little padding.

    The third: no state and neutral rules are most of the rows and the easiest skills (the rules are the weakest, 43 to
    120 rows each on 60 users); with every instance they made 8 checks ~1/8 of the responder's training time."""
    rows = []
    for n, inst in enumerate(instances):
        neutral = (NEUTRAL[n // 3 % len(NEUTRAL)],)
        checks = [(r,) for pair in PAIRS for r in pair if world_letter(inst, (r,)) != world_letter(inst, None)]
        for rules in ([None, neutral] if n % 3 == 0 else []) + checks:
            ids = _prompt_ids(tokenizer, inst, rules)
            label = tokenizer.convert_tokens_to_ids(world_letter(inst, rules))
            skill = "no_state" if rules is None else "neutral" if rules == neutral else rules[0]
            rows.append({"input_ids": [*ids, label], "label": label, "lm_len": 0, "skill": skill})
        if n % 3 == 1:  # a pair's rule with no memory shown changes nothing
            ids = _prompt_ids(tokenizer, inst, (PAIRS[n // 3 % 2][n // 6 % 2],), memories=False)
            label = tokenizer.convert_tokens_to_ids(no_memory_letter(inst))
            rows.append({"input_ids": [*ids, label], "label": label, "lm_len": 0, "skill": "no_memory"})
    return sorted(rows, key=lambda row: len(row["input_ids"]))


class AnswerTokenTrainer(Trainer):
    """Supervised training on the one token the responder is scored on (the option letter right after the prompt) and
    the end of turn after it, plus next-token prediction on the prompt itself.

    The answer token alone is one bit per prompt of ~230 tokens: the model sits at chance until its heads find the few
    tokens that matter, and in this world that plateau outlasted a few CPU minutes (0.61 accuracy at 600 steps,
    preferences at chance). The prompt's own language-model loss forms the attention circuits (previous-token and
    copy heads) it needs first; with it the same 600 steps reach 0.91 on held-out users (most of it the no-state
    behaviour: learning to do what a rule says takes longer, see ``responder_state``).

    The language-model loss covers the prompt up to its state only. A state's rules are random draws, so after "Use
    the" the loss cannot predict "newer" from "older"; with the tied embeddings it pulled the two words' vectors
    together (cosine 0.97 after 1,600 steps) and the responder could not tell the two rules apart.

    The end of turn is what lets a responder that answers in words (exact mode) stop after its letter: trained on the
    letter alone it went on ("AA) cold…"), and 20 of 720 no-state replies and 83 of 720 self-guide ones were unreadable,
    which made readability, not the answer, what exact-mode GRPO rewarded."""

    prompt_lm_weight = 1.0
    micro_batches = 2

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels, lm_mask = inputs.pop("labels"), inputs.pop("lm_mask")
        soft = (inputs.pop("soft_ids"), inputs.pop("soft_p")) if "soft_ids" in inputs else None
        rows, n_lm = len(labels), lm_mask[:, 1:].sum().clamp(min=1)
        # Rows of similar length run together (``self.micro_batches`` forwards, each cut to its longest row): a fifth
        # of a batch's tokens were padding. The sums are divided by the whole batch's counts, so the loss and its
        # gradient are the batch's, only computed in parts.
        order = inputs["attention_mask"].sum(-1).argsort()
        loss, answer_logits = 0.0, []
        for part in order.tensor_split(min(self.micro_batches, rows)):
            width = int(inputs["attention_mask"][part].sum(-1).max())
            ids, mask, positions = (inputs[k][part, -width:] for k in ("input_ids", "attention_mask", "position_ids"))
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
            # Rows end with their letter (predicted one position earlier), then the end of turn.
            end = torch.full_like(labels[part], self.processing_class.eos_token_id)
            if soft is None:
                answer = F.cross_entropy(logits[:, -2], labels[part], reduction="sum")
            else:  # a distribution over the letters (a responder that follows a rule only part of the time)
                answer = -(soft[1][part] * logits[:, -2].log_softmax(-1).gather(1, soft[0][part])).sum()
            loss = loss + (answer + F.cross_entropy(logits[:, -1], end, reduction="sum")) / rows
            targets = ids[:, 1:].masked_fill(lm_mask[part, -width + 1 :] == 0, -100)
            prompt_lm = F.cross_entropy(logits[:, :-1].flatten(0, 1), targets.flatten(), reduction="sum")
            loss = loss + self.prompt_lm_weight * prompt_lm / n_lm
            answer_logits.append(logits[:, -2])
        return (loss, torch.cat(answer_logits)[order.argsort()]) if return_outputs else loss

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if self.lr_scheduler is None:  # the curriculum's rate (``responder_lr_factor``)
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer or self.optimizer, lambda step: responder_lr_factor(step, num_training_steps)
            )
        return self.lr_scheduler

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """How often the answer letter is ``world_letter``'s on ``skill_examples`` rows, per skill, and the worst of
        these (``worst_skill``): the iterate kept is the one whose weakest skill is strongest (``train_responder``)."""
        rows, hits = eval_dataset or self.eval_dataset, collections.defaultdict(list)
        self.model.eval()
        with torch.no_grad():
            for start in range(0, len(rows), self.args.per_device_eval_batch_size):
                batch = [rows[i] for i in range(start, min(start + self.args.per_device_eval_batch_size, len(rows)))]
                inputs = self.data_collator(batch)
                logits = self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                    position_ids=inputs["position_ids"]).logits  # fmt: skip
                for row, letter in zip(batch, logits[:, -2].argmax(-1).tolist(), strict=True):
                    hits[row["skill"]].append(letter == row["label"])
        self.model.train()
        metrics = {f"{metric_key_prefix}_{skill}": sum(h) / len(h) for skill, h in sorted(hits.items())}
        metrics[f"{metric_key_prefix}_worst_skill"] = min(metrics.values())
        self.log(metrics)
        return metrics


class ChecksFrom(TrainerCallback):
    """No evaluation (nor the save that follows it) before step ``first``."""

    def __init__(self, first: int):
        self.first = first

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step < self.first:  # runs after the default flow, which asks for a check every eval_steps
            control.should_evaluate = False
        return control


def left_pad_collator(pad_id: int):
    """Left-padded batches with explicit positions, so a padded row computes exactly what it would alone."""

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.tensor([[pad_id] * (width - len(r["input_ids"])) + r["input_ids"] for r in rows])
        mask = torch.tensor([[0] * (width - len(r["input_ids"])) + [1] * len(r["input_ids"]) for r in rows])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        labels = torch.tensor([r["label"] for r in rows])
        # The tokens the language-model loss predicts: the prompt up to its state (``lm_len``), from its second token
        # on (a row's first token would be predicted from padding).
        lm_mask = mask * (positions > 0) * (positions < torch.tensor([r["lm_len"] for r in rows])[:, None])
        batch = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "labels": labels,
                 "lm_mask": lm_mask}  # fmt: skip
        if "soft_ids" in rows[0]:  # soft targets: token ids and their probabilities, one list each a row
            batch["soft_ids"] = torch.tensor([r["soft_ids"] for r in rows])
            batch["soft_p"] = torch.tensor([r["soft_p"] for r in rows], dtype=torch.float)
        return batch

    return collate


def _reset_accelerate() -> None:
    # The next trainer in this process builds its own Accelerator.
    AcceleratorState._reset_state()
    GradientState._reset_state()


def train_responder(
    init_dir: str | Path,
    instances: list[Instance],
    validation: list[Instance],
    out_dir: Path,
    *,
    steps: int,
    batch_size: int = 16,
    learning_rate: float = 1e-3,
    seed: int = 0,
    checks_from: float = 1 - DECAY_SHARE,
    examples=responder_examples,
    skills=skill_examples,
) -> Path:
    """Train the world's responder from its random init on ``instances`` (the train split) and save to ``out_dir`` the
    iterate that follows its rules best on ``validation`` (its worst ``skill_examples`` accuracy, checked every eighth
    of the steps from ``checks_from`` of them, by default once the rate decays: at 900, 1,050 and 1,200 of 1,200).

    The rows come in ``CURRICULUM``'s order at its rates (``responder_lr_factor``). Why select: this responder wanders
    (one run followed "Trust the evidence" 0.97 at 1,600 steps and 0.46 after 800 more; one followed "Use the newer
    preference" 0.98 at step 1,200 and 0.47 at 1,400), so the last iterate is a draw. Why only while the rate decays:
    no earlier iterate was ever kept (the rules appear late: kept steps 1,200 and 1,200 of 1,200 in two seeds,
    1,200-1,400 of 1,600), and each check cost ~7 s.

    ``examples`` and ``skills`` build the training rows and the checks (another world's: ``memstate.experiment.leak``);
    a row may carry soft targets (``soft_ids``, ``soft_p``: letters and their probabilities) instead of one letter."""
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir)
    checks = max(steps // 8, 1)
    args = TrainingArguments(
        output_dir=str(out_dir / "checkpoints"),
        max_steps=steps,
        learning_rate=learning_rate,
        weight_decay=0.0,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=64,
        logging_steps=max(steps // 10, 1),
        eval_strategy="steps",
        eval_steps=checks,
        save_strategy="best",
        metric_for_best_model="worst_skill",
        load_best_model_at_end=True,
        save_only_model=True,
        save_total_limit=1,
        report_to=[],
        use_cpu=True,
        seed=seed,
        remove_unused_columns=False,
        train_sampling_strategy="sequential",  # responder_examples' order: its curriculum
    )
    trainer = AnswerTokenTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(examples(tokenizer, instances, seed, steps * batch_size)),
        eval_dataset=skills(tokenizer, validation),
        processing_class=tokenizer,
        data_collator=left_pad_collator(tokenizer.pad_token_id),
        callbacks=[ChecksFrom(int(steps * checks_from))],
    )
    trainer.train()
    trainer.save_model(str(out_dir))
    tokenizer.save_pretrained(out_dir)
    (out_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    kept = next(
        h for h in trainer.state.log_history if h["step"] == trainer.state.best_global_step and "eval_worst_skill" in h
    )
    (out_dir / "selection.json").write_text(json.dumps({"kept_step": kept["step"], "validation": kept}, indent=1))
    shutil.rmtree(out_dir / "checkpoints")  # the kept iterate is saved above
    _reset_accelerate()
    return out_dir


def random_state_text(instance: Instance, rng: random.Random) -> str:
    """The warm-up's state for any instance: ``random_state`` as '- ' lines; ``instance`` is never read."""
    return "\n".join(f"- {r}" for r in random_state(rng))
