"""``memstate eval``: does a checkpoint make the frozen responder use memories better than no state, than the
untrained policy, and than the previous checkpoint?

Conditions, all answered by the same responder (likelihood mode by default, or exact):

- **no_state**: facts and question only (the baseline);
- **self_guide**: states written by the base, untrained policy (the checkpoint's ``policy_model``, or
  ``--base-policy``);
- **checkpoint**: states written by CKPT, in-process or through the reasoning-state API (``--states-url``);
- **self_recheck** (optional): no policy; the responder is told to recheck its memories before answering
  (``memstate.prompts.SELF_RECHECK_RULES``, placed where a state would go).

States are sampled at the serve API's temperature (0.3 by default, seeded; tiny models degenerate under greedy
decoding). A state that fails ``parse_state`` cannot be used by a memory pipeline, so that instance is answered
without rules; a state that leaks the answer is used as written (at deployment nobody knows the answer) and counted
in the leak rate; each state that passed both gates also gets its answer-flow shift (``reward/answer_flow.py``: how
far the state alone, with no memory shown, moves the responder's answer), and the report lists the largest
(``answer_flow_top``; ``--no_answer_flow`` skips it). Every answer is parsed once into an option letter
(``reward.score.parse_choice``, the scorer's parser); accuracy and sycophancy compare that letter. Metric definitions
are in ``evaluate/report.py``; every difference between conditions gets a paired cluster-bootstrap 95% CI (resampling
the instances' split groups).
Writes ``report.json``, ``report.md`` and ``report.png``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from memstate.checkpoint import CheckpointMetadata
from memstate.data import load_split, manifest_sha256
from memstate.errors import ConfigError, InputNotFound
from memstate.evaluate.report import answer_flow_top, credit_split, render_markdown, render_png, summarize
from memstate.leak import leaks_answer
from memstate.parsing import StageParser
from memstate.prompts import (
    DEFAULT_MAX_PROMPT_TOKENS,
    PROMPT_VERSION,
    SELF_RECHECK_RULES,
    fit_prompt,
    responder_messages,
)
from memstate.responders import DTYPES, ResponderConfig, make_responder
from memstate.reward.answer_flow import AnswerFlowCheck
from memstate.reward.fit import facts_cut, fit_to_responder
from memstate.reward.responder_score import Judgement, judge, score_mode
from memstate.reward.score import parse_choice
from memstate.rules import CUT_OFF, FormatError, parse_completion
from memstate.schema import Instance, option_letters

logger = logging.getLogger("memstate.evaluate")


@dataclass(kw_only=True)
class EvalConfig(ResponderConfig):
    """What to evaluate, and how; the responder fields (``responder_model``, ``responder_url``, ``score_mode``, …)
    are ``ResponderConfig``'s, with ``responder_model`` defaulting to the checkpoint's training responder."""

    checkpoint: str = field(
        metadata={"help": "Policy checkpoint dir, or a training output dir (its best/, else its final/)."}
    )
    split: str = field(default="test", metadata={"help": "Split to evaluate."})
    data_dir: str | None = field(
        default=None, metadata={"help": "Dataset dir; default: the one it trained on.", "aliases": ["--data"]}
    )
    out_dir: str | None = field(
        default=None, metadata={"help": "Report dir; default: CHECKPOINT/eval-SPLIT.", "aliases": ["--out"]}
    )
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "Token limit of a state; default: the checkpoint's max_completion_length."}
    )
    temperature: float = field(
        default=0.3, metadata={"help": "Sampling temperature of the policy, as the serve API uses it; 0 = greedy."}
    )
    seed: int = field(default=0, metadata={"help": "Sampling seed (the same seed gives the same states)."})
    batch_size: int = field(default=16, metadata={"help": "Policy generation batch size."})
    max_instances: int | None = field(default=None, metadata={"help": "Evaluate only the first N instances."})
    base_policy: str | None = field(
        default=None, metadata={"help": "Untrained policy for self-guide; default: the checkpoint's policy_model."}
    )
    self_guide: bool = field(default=True, metadata={"help": "Evaluate the self-guide condition."})
    self_recheck: bool = field(default=False, metadata={"help": "Evaluate the self-recheck condition."})
    states_url: str | None = field(
        default=None, metadata={"help": "Reasoning-state API serving CKPT: checkpoint states come from it."}
    )
    states_api_key_env: str | None = field(
        default="MEMSTATE_API_KEY", metadata={"help": "Environment variable with the bearer token of --states-url."}
    )
    bootstrap_resamples: int = field(default=2000, metadata={"help": "Resamples of the paired bootstrap CIs."})
    answer_flow: bool = field(
        default=True,
        metadata={"help": "Measure the answer-flow shift of every policy state that passed the format and leak gates "
                  "(the responder with the state and no memory, against neither; reward/answer_flow.py) and list the "
                  "largest in the report."},
    )  # fmt: skip
    score_mode: str | None = field(  # ResponderConfig's, defaulting to the checkpoint's instead of likelihood
        default=None,
        metadata={"help": "A registered score mode (built in: likelihood, exact); default: the mode the checkpoint was "
                  "trained with (else likelihood)."},
    )  # fmt: skip
    max_prompt_tokens: int | None = field(
        default=None,
        metadata={"help": "Policy prompt budget (facts dropped from the end to fit, as in training); default: the "
                  "checkpoint's max_prompt_tokens (else 8192)."},
    )  # fmt: skip
    device: str = field(
        default="cpu", metadata={"help": "Device of the in-process models (policies, and the responder without a URL)."}
    )
    dtype: str = field(
        default="float32",
        metadata={"help": "Precision of the in-process models; bfloat16 on GPUs matches training's numerics.",
                  "choices": list(DTYPES)},
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score_mode is not None:  # None: resolved from the checkpoint by evaluate_checkpoint
            score_mode(self.score_mode)  # an unknown mode: ConfigError naming the registered ones
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ConfigError(f"max_prompt_tokens must be at least 1, got {self.max_prompt_tokens}")


def resolve_checkpoint(path: str | Path) -> Path:
    """A model directory as given; a training output directory: its ``best/`` (the checkpoint with the highest
    validation gain, else training reward: ``train/best.py``), else its ``final/``."""
    path = Path(path)
    for kept in ("best", "final"):
        if (path / kept / "config.json").is_file():
            logger.info("%s is a training run: evaluating its %s/", path, kept)
            return path / kept
    if not path.is_dir():
        raise InputNotFound(f"{path}: no such checkpoint directory")
    if not (path / "config.json").is_file():
        raise InputNotFound(f"{path}: not a model checkpoint (no config.json, no final/config.json)")
    return path


@torch.no_grad()
def generate_states(
    checkpoint: Path, instances: list[Instance], config: EvalConfig
) -> tuple[list[str], list[bool], int]:
    """Policy outputs, one per instance (batched, left-padded, seeded), from the prompts training used: cut to
    ``config.max_prompt_tokens`` by the same function (``memstate.prompts.fit_prompt``). Returns the outputs, whether
    each was cut off at ``max_new_tokens`` (no end-of-sequence token: not a state, as in training) and how many
    prompts had facts dropped."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, config.dtype)).to(config.device)
    model.eval()
    texts, cut, truncated = [], [], 0
    stop_ids = torch.tensor(
        [
            t
            for t in {*eos_token_ids(model.generation_config), tokenizer.eos_token_id, tokenizer.pad_token_id}
            if t is not None
        ]
    )
    torch.manual_seed(config.seed)
    sampling = (
        {"do_sample": True, "temperature": config.temperature, "top_k": 0}
        if config.temperature > 0
        else {"do_sample": False}
    )
    for start in tqdm(range(0, len(instances), config.batch_size), desc="policy states", unit="batch"):
        prompts = []
        for inst in instances[start : start + config.batch_size]:
            messages, dropped = fit_prompt(tokenizer, inst, config.max_prompt_tokens)
            truncated += dropped > 0
            prompts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(config.device)
        out = model.generate(
            **enc, max_new_tokens=config.max_new_tokens, pad_token_id=tokenizer.pad_token_id, **sampling
        )
        generated = out[:, enc["input_ids"].shape[1] :]
        texts += tokenizer.batch_decode(generated, skip_special_tokens=True)
        # generate() pads a finished row after its end-of-sequence token; a row without one ran out of tokens.
        cut += (~torch.isin(generated, stop_ids.to(generated.device)).any(dim=1)).tolist()
    return texts, cut, truncated


def eos_token_ids(generation_config) -> list[int]:
    """The end-of-sequence ids of a generation config (an int, a list, or None)."""
    ids = generation_config.eos_token_id
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)


def api_states(url: str, api_key: str | None, instances: list[Instance]) -> tuple[list[str], list[bool]]:
    """Checkpoint states from a running reasoning-state API (``memstate serve api``): the deployed path. Returns the
    texts and whether the API found each cut off at its token limit."""
    from memstate.serve.client import ReasoningStateClient

    with ReasoningStateClient(url, api_key=api_key) as client:
        replies = [client.for_instance(inst) for inst in tqdm(instances, desc="states via API", unit="instance")]
    return [r.text for r in replies], [r.format_error == CUT_OFF for r in replies]


def instance_record(instance: Instance) -> dict:
    """The per-instance fields of a record: ids, its bootstrap group, y*, and what the metrics compare letters to.

    >>> from memstate.schema import Fact
    >>> inst = Instance("x", "fever", "evidence_conflict", "belief", "Claim?", (), "supported", "label",
    ...                 ("supported", "refuted", "not enough info"), (Fact("F1", "Some evidence.", "evidence"),), (),
    ...                 {"group": "fever:7", "user_label": "refuted"})
    >>> rec = instance_record(inst)
    >>> rec["group"], rec["answer_letter"], rec["user_label"], rec["user_letter"], rec["superseded_options"]
    ('fever:7', 'A', 'refuted', 'B', [])
    """
    labels, user_label = instance.labels, instance.meta.get("user_label")
    return {
        "id": instance.id,
        "source": instance.source,
        "task": instance.task,
        "perspective": instance.perspective,
        "group": instance.meta.get("group", instance.id),
        "answer": instance.answer,
        "answer_letter": instance.answer_letter if instance.candidates else None,
        "user_label": user_label,
        "user_letter": option_letters(len(labels))[labels.index(user_label)] if user_label in labels else None,
        "superseded_options": list(instance.meta.get("superseded_options", [])),
    }


def answer_record(instance: Instance, judgement: Judgement) -> dict:
    """A condition's answer: ``letter`` parsed once by the scorer's parser (``parse_choice``; in likelihood mode the
    answer already is the argmax letter), ``correct`` from that letter, ``answer`` its option text, ``text`` raw.

    >>> from memstate.schema import Fact
    >>> inst = Instance("x", "fever", "evidence_conflict", "belief", "Claim?", (), "supported", "label",
    ...                 ("supported", "refuted", "not enough info"), (Fact("F1", "Some evidence.", "evidence"),), ())
    >>> [answer_record(inst, Judgement(0.0, False, t))["letter"] for t in ("B.", "(B) refuted", " Refuted ", "?")]
    ['B', 'B', 'B', None]
    >>> answer_record(inst, Judgement(1.0, True, "(A)"))
    {'score': 1.0, 'letter': 'A', 'correct': True, 'answer': 'supported', 'text': '(A)'}
    """
    cands, text = instance.candidates, judgement.answer
    if not cands:  # free text: no letter; the judge's verdict (None in likelihood mode) and its text
        answer = None if text is None else text.strip()
        return {"score": judgement.score, "letter": None, "correct": judgement.correct, "answer": answer, "text": text}
    letter = None if text is None else parse_choice(text, cands)
    answer = None if letter is None else cands[option_letters(len(cands)).index(letter)]
    correct = letter == instance.answer_letter
    return {"score": judgement.score, "letter": letter, "correct": correct, "answer": answer, "text": text}


def state_record(text: str, instance: Instance, cut_off: bool = False) -> tuple[tuple[str, ...] | None, dict]:
    state = parse_completion(text, cut_off=cut_off)
    ok = not isinstance(state, FormatError)
    return (state.rules if ok else None), {
        "state": text,
        "format_ok": ok,
        "format_error": None if ok else state.reason,
        "leak": ok and leaks_answer(state.text, instance),
        "rule_words": state.words if ok else 0,
    }


def answer_flow_shifts(
    responder, instances: list[Instance], rules: dict[str, list], state_info: dict[str, list[dict]]
) -> int:
    """Add ``answer_flow_shift`` to every state record of ``state_info`` (None for a state that failed the format or
    leak gate, or that the responder could not score): the reward's answer-flow check, by the same module with the
    same responder, one prompt per distinct state and one per distinct no-memory request across conditions. Returns
    the prompts spent."""
    check = AnswerFlowCheck(responder)
    for cond, infos in state_info.items():
        passed = [i for i, info in enumerate(infos) if info["format_ok"] and not info["leak"]]
        shifts = dict(zip(passed, check.shifts([instances[i] for i in passed], [rules[cond][i] for i in passed]),
                          strict=True))  # fmt: skip
        for i, info in enumerate(infos):
            info["answer_flow_shift"] = shifts.get(i)
    return check.calls


def condition_records(
    responder,
    instances: list[Instance],
    conditions: list[str],
    rules: dict[str, list[tuple[str, ...] | None]],
    state_info: dict[str, list[dict]],
    score_mode: str,
) -> list[dict]:
    """One record per instance: its fields, then per condition the responder's judged answer under that condition's
    rules (``None``: no state) and the state's record (``state_info``, for conditions whose states a policy wrote).
    The responder is shown each instance as training's reward shows it: fitted to its context (``memstate.reward.fit``),
    the same facts in every condition."""
    shown = fit_to_responder(responder, instances)
    if cut := facts_cut(instances, shown):
        logger.info("responder: %d of %d instances shown with fewer facts, to fit its context", cut, len(instances))
    judged = {}
    for cond in conditions:
        logger.info("responder: %s", cond)
        judged[cond] = judge(responder, shown, rules[cond], score_mode)
    records = []
    for i, (inst, seen) in enumerate(zip(instances, shown, strict=True)):
        record = instance_record(inst)
        for cond in conditions:
            messages = responder_messages(seen, rules[cond][i])
            # Prompt length in tokens: known in-process; an HTTP responder does not report it.
            tokens = len(responder.prompt_ids(messages)) if hasattr(responder, "prompt_ids") else None
            record[cond] = {
                **answer_record(inst, judged[cond][i]),
                "tokens": tokens,
                **state_info.get(cond, [{}] * len(instances))[i],
            }
        records.append(record)
    return records


def evaluate_checkpoint(config: EvalConfig) -> Path:
    """Run the evaluation, write ``report.json``, ``report.md`` and ``report.png``; return the report dir."""
    checkpoint = resolve_checkpoint(config.checkpoint)
    trained = CheckpointMetadata.read(checkpoint)
    if trained and trained.prompt_version != PROMPT_VERSION:
        logger.warning(
            "checkpoint was trained with prompts %s, evaluating with %s", trained.prompt_version, PROMPT_VERSION
        )
    data_dir = config.data_dir or (trained and trained.data_dir)
    responder_model = config.responder_model or (trained and trained.responder_model)
    if not data_dir or not responder_model:
        raise ConfigError(
            f"{checkpoint}: no memstate.json naming data and responder; pass --data_dir and --responder_model"
        )
    # Unless told otherwise, evaluate as the checkpoint was trained: its score mode, its prompt and state budgets.
    mode = config.score_mode or (trained.score_mode if trained else "likelihood")
    try:
        scoring = score_mode(mode)  # eval's own was checked with its config; the checkpoint's may not be registered
    except ConfigError as e:
        raise ConfigError(f"{checkpoint}: memstate.json: {e}; pass --score_mode to evaluate in another") from None
    config = replace(
        config,
        score_mode=mode,
        max_prompt_tokens=config.max_prompt_tokens
        or (trained.max_prompt_tokens if trained else DEFAULT_MAX_PROMPT_TOKENS),
        max_new_tokens=config.max_new_tokens or (trained.max_completion_length if trained else 128),
    )
    base_policy = config.base_policy or (trained and trained.policy_model)
    if config.self_guide and not base_policy:
        raise ConfigError(
            f"{checkpoint}: no memstate.json naming the base policy; pass --base_policy or --no_self_guide"
        )
    conditions = ["no_state", *(["self_guide"] if config.self_guide else []), "checkpoint"]
    conditions += ["self_recheck"] if config.self_recheck else []
    try:
        instances = load_split(data_dir, config.split)[: config.max_instances]
    except FileNotFoundError as e:
        raise InputNotFound(f"data_dir: {e}") from None
    logger.info("evaluating %s on %d %s instances: %s", checkpoint, len(instances), config.split, conditions)

    states_api_key = os.environ.get(config.states_api_key_env) if config.states_api_key_env else None
    texts, cut, truncated = {}, {}, {}
    if config.states_url:  # the API cuts prompts itself (to the checkpoint's budget when given the checkpoint)
        texts["checkpoint"], cut["checkpoint"] = api_states(config.states_url, states_api_key, instances)
        truncated["checkpoint"] = None
    else:
        texts["checkpoint"], cut["checkpoint"], truncated["checkpoint"] = generate_states(checkpoint, instances, config)
    if config.self_guide:
        texts["self_guide"], cut["self_guide"], truncated["self_guide"] = generate_states(
            Path(base_policy), instances, config
        )
    rules = {"no_state": [None] * len(instances), "self_recheck": [SELF_RECHECK_RULES] * len(instances)}
    state_info: dict[str, list[dict]] = {}
    for cond, outputs in texts.items():
        parsed = [state_record(*args) for args in zip(outputs, instances, cut[cond], strict=True)]
        rules[cond] = [r for r, _ in parsed]
        state_info[cond] = [info for _, info in parsed]

    # The answer-flow shift is a likelihood whatever the score mode: the server must serve those requests too.
    responder = make_responder(
        replace(config, responder_model=responder_model),
        config.device,
        config.dtype,
        likelihood=scoring.likelihood or config.answer_flow,
    )
    if config.answer_flow:
        spent = answer_flow_shifts(responder, instances, rules, state_info)
        logger.info("responder: answer flow of the states that passed the gates (%d prompts)", spent)
    records = condition_records(responder, instances, conditions, rules, state_info, config.score_mode)
    report = {
        "checkpoint": str(checkpoint),
        "split": config.split,
        "conditions": conditions,
        "prompt_version": PROMPT_VERSION,
        "checkpoint_prompt_version": trained.prompt_version if trained else None,
        "data_dir": str(data_dir),
        "data_manifest_sha256": manifest_sha256(data_dir),
        "responder_model": str(responder_model),
        "responder_url": config.responder_url,
        "base_policy": str(base_policy) if config.self_guide else None,
        "score_mode": config.score_mode,
        "states_source": config.states_url or "in-process",
        "policy_sampling": {
            "temperature": config.temperature,
            "seed": config.seed,
            "max_new_tokens": config.max_new_tokens,
            "max_prompt_tokens": config.max_prompt_tokens,
            "prompts_truncated": truncated,
        },
        "bootstrap_resamples": config.bootstrap_resamples,
        "config": asdict(config),
        "metrics": summarize(records, conditions, config.bootstrap_resamples),
        # The states that passed the gates yet moved the answer most with no memory shown: leak attempts to read.
        "answer_flow_top": answer_flow_top(records, conditions) if config.answer_flow else None,
        # What training's reward would credit each policy's states: gain, no-memory shift, gain − shift.
        "credit_split": credit_split(records, conditions) if config.answer_flow else None,
        "records": records,
    }
    out_dir = Path(config.out_dir) if config.out_dir else checkpoint / f"eval-{config.split}"
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.json").write_text(json.dumps(report, indent=2))
        (out_dir / "report.md").write_text(render_markdown(report))
        render_png(report, out_dir / "report.png")
    except BaseException:
        if created:  # no half-written report left behind
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    overall = report["metrics"]["overall"]["conditions"]
    logger.info("report in %s: %s", out_dir, json.dumps({c: overall[c]["accuracy"] for c in conditions}))
    return out_dir


# ---- memstate eval ---------------------------------------------------------------------------------------------------


def make_parser(prog: str | None = None) -> StageParser:
    return StageParser(
        (EvalConfig,),
        prog=prog,
        description="Evaluate a checkpoint: memstate eval --checkpoint CKPT [--field value ...] (or --config "
        "FILE.yaml of the same flat fields). Writes report.json, report.md and report.png.",
    )


def run(parsed: tuple[EvalConfig]) -> None:
    (config,) = parsed
    out = evaluate_checkpoint(config)
    print(f"report: {out / 'report.md'} (and report.json, report.png)")
    print((out / "report.md").read_text())
