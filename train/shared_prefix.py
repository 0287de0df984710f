"""Shared-prefix GRPO: each group's prompt is encoded once per forward/backward and its completions attend to it.

TRL's GRPOTrainer scores every completion with its own copy of the prompt: a group of G completions costs
G·(P + R) tokens in the training forward/backward, the old-policy log-probs and the reference forward. The prompt
is the same across the group, so ``pack_groups`` (``train/packing.py``) lays a micro-batch out as one row per
distinct prompt::

    [prompt[:-1] | prompt[-1], c1[:-1] | prompt[-1], c2[:-1] | ...]

with a 4-D attention mask in which every completion segment sees the prompt and itself (causally) and nothing
of the other completions, and position ids that continue after the prompt for every segment, exactly as in the
stock layout (Prefix Grouper, arXiv 2506.05433). Each segment starts with a copy of the prompt's last token so
that every completion's first token has a position of its own to be predicted from; TRL's fused LM head then
scores the packed rows with pre-shifted labels (``shift_labels``), so temperature, fp32 head and entropy are
TRL's own. The forward outputs, and so the gradients, equal the stock path's up to floating-point reordering.

``SharedPrefixGRPOTrainer`` plugs this in at ``_get_per_token_logps_and_entropies`` (training, old-policy and
reference log-probs alike) and keeps each group's completions in the same micro-batch. It is built like TRL's
``GRPOTrainer`` (same arguments, any reward functions, any prompt dataset) plus an optional ``SharedPrefixConfig``;
docs/shared_prefix.md is its user guide. Before anything loads it checks that the TRL methods it overrides have the
signatures it was written for (``SUPPORTED_TRL``), and refuses in one line when they do not. What it cannot pack is
decided at construction where the arguments show it (Liger kernels, padding-free or sequence-parallel batches, image
datasets, the MoE load-balancing loss, sliding-window layers, attention kernels that take no 4-D mask): TRL's path
for the whole run, logged, or a one-line refusal (``on_failure="fail"``). On first use it compares the packed path
with TRL's on the live batch and falls back the same way on any mismatch, or on inputs only a call shows (token-type
ids, images in a later prompt).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
import trl
from trl import GRPOTrainer

from memstate.errors import MemstateError
from memstate.train.packing import FLEX_BLOCK, Unsupported, install_packed_attention, pack_groups, prompt_groups

logger = logging.getLogger("memstate.train")

# Attention kernels that take a custom 4-D mask as it is (transformers' masking utils return a 4-D mask unchanged).
MASKED_ATTENTION = ("sdpa", "eager")
# Mean |Δ log-prob| over completion tokens that the first-use check accepts, by compute dtype: fp32 differs from the
# stock path only by summation order; 16-bit activations round differently when the prompt is encoded once. bf16,
# measured on an H200 (Qwen3-4B architecture, 36 layers; benchmarks/results/shared_prefix_gpu*.json): rounding gives
# 0.027-0.031 (fp32: 1e-5), completions seeing their siblings 0.99-1.03, positions not restarting 0.87-0.90. The
# earlier 2e-2 (from a 2-layer CPU model) sat below that rounding and would have turned the path off on every GPU run.
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-1, torch.float16: 1e-2}
CheckMode = Literal["off", "logps", "gradients"]
# How the packed rows' attention pattern reaches the kernel (train/packing.py): a dense (L x L) boolean mask for SDPA /
# eager; a FlexAttention BlockMask that lets the kernel skip the empty blocks; or split, the prompt and the
# completions in separate SDPA calls with no row mask. "auto": flex on CUDA where torch has it, split elsewhere.
Attention = Literal["auto", "dense", "flex", "split"]
OnFailure = Literal["fallback", "fail"]
# The TRL releases whose GRPOTrainer this was written against and tested with; pyproject.toml pins the same range.
# 1.15 has the same overridden methods, but its fused LM head (which scores the packed rows and TRL's own) has no CPU
# kernel, so it cannot be tested here; 1.14 moved _get_per_token_logps_and_entropies's parameters behind *args.
SUPPORTED_TRL = ">=1.16,<1.17"
# The GRPOTrainer methods this class overrides, with the leading parameters it calls them with (the rest, TRL's
# multimodal inputs, must be optional: they are passed through by name).
OVERRIDDEN = {
    "_prepare_inputs": ("self", "generation_batch"),
    "_get_per_token_logps_and_entropies": (
        "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
        "compute_aux_loss",
    ),
}  # fmt: skip
# GRPOTrainer state the overrides read or replace, present after its __init__.
TRL_ATTRIBUTES = ("_buffered_inputs", "_step", "_metrics", "_tokenizer")


@dataclass
class SharedPrefixConfig:
    """Settings of the shared-prefix path. The defaults are right on CUDA and on CPU."""

    attention: Attention = field(
        default="auto",
        metadata={
            "help": "How the packed rows get their attention pattern: 'dense', an (L x L) boolean mask for the "
            "model's sdpa / eager kernel; 'flex', a FlexAttention block mask that skips the empty blocks; 'split', "
            "the prompt and the group's completions in separate SDPA calls, no row mask; 'auto', flex on CUDA where "
            "torch has it, split elsewhere (torch has no FlexAttention backward on CPU)."
        },
    )
    check: CheckMode = field(
        default="logps",
        metadata={
            "help": "First-use check against TRL's path on the live batch: per-token log-probs ('logps'), also "
            "parameter gradients ('gradients'; not under ZeRO-3), or none ('off')."
        },
    )
    check_tolerance: float | None = field(
        default=None,
        metadata={
            "help": "Largest mean |log-prob difference| the check accepts (default by compute dtype: 1e-4 fp32, "
            "1e-1 bf16, 1e-2 fp16; CHECK_TOLERANCE)."
        },
    )
    on_failure: OnFailure = field(
        default="fallback",
        metadata={
            "help": "When the path cannot run (an unsupported model or feature, a failed check): 'fallback' continues "
            "on TRL's path, logged as an error; 'fail' raises SharedPrefixUnavailable with the fix."
        },
    )

    def __post_init__(self) -> None:
        for name, kind in (("attention", Attention), ("check", CheckMode), ("on_failure", OnFailure)):
            value = getattr(self, name)
            if value not in get_args(kind):
                raise ValueError(f"SharedPrefixConfig.{name} must be one of {get_args(kind)}, got {value!r}")
        if self.check_tolerance is not None and not self.check_tolerance > 0:
            raise ValueError(f"SharedPrefixConfig.check_tolerance must be positive, got {self.check_tolerance}")


def group_contiguous(batches: list[dict]) -> list[dict]:
    """Re-split TRL's shuffled micro-batches so that each group's completions sit together: groups keep the random
    order the shuffle gave them (by first appearance), so each micro-batch holds whole groups where sizes allow.

    >>> p = torch.tensor([[1], [2], [1], [2]])
    >>> batches = [{"prompt_ids": p[:2], "prompt_mask": torch.ones(2, 1), "x": [0, 1], "n": torch.tensor(4)},
    ...            {"prompt_ids": p[2:], "prompt_mask": torch.ones(2, 1), "x": [2, 3], "n": torch.tensor(4)}]
    >>> [b["x"] for b in group_contiguous(batches)]
    [[0, 2], [1, 3]]
    """
    from trl.trainer.utils import split_tensor_dict  # checked by check_trl_api

    merged = {}
    for key, first in batches[0].items():
        if isinstance(first, torch.Tensor) and first.ndim > 0:
            merged[key] = torch.cat([b[key] for b in batches])
        elif isinstance(first, list):
            merged[key] = [x for b in batches for x in b[key]]
        else:
            merged[key] = first  # None or a 0-dim tensor (e.g. num_items_in_batch): the same in every micro-batch
    order = torch.tensor(prompt_groups(merged["prompt_ids"], merged["prompt_mask"]))
    permutation = torch.sort(order, stable=True).indices

    def permute(value):
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return value[permutation.to(value.device)]
        if isinstance(value, list):
            return [value[i] for i in permutation.tolist()]
        return value

    return split_tensor_dict({k: permute(v) for k, v in merged.items()}, len(batches))


class SharedPrefixGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the shared-prefix log-prob path (see the module docstring); everything else is TRL's.

    Built with GRPOTrainer's own arguments, plus ``shared_prefix``, a ``SharedPrefixConfig`` (defaults when omitted).
    Its ``check``: ``"logps"`` compares the packed path's per-token log-probs with TRL's on the first chunk it sees
    (mean |Δ| over completion tokens ≤ ``check_tolerance``, by default ``CHECK_TOLERANCE`` of the compute dtype);
    ``"gradients"`` also compares the parameter gradients of a random linear function of those log-probs on the
    first chunk with gradients enabled (not under ZeRO-3, whose partitioned parameters have no plain ``.grad``);
    ``"off"`` trusts the packing. A failed check of the flex or split path (a mismatch, or a kernel failing to
    compile or run) switches every rank to the dense mask and checks again; a failed dense check switches every rank
    to TRL's path for the rest of the run (or raises, with ``on_failure="fail"``).
    """

    def __init__(self, *args, shared_prefix: SharedPrefixConfig | None = None, **kwargs):
        check_trl_api()  # before anything loads: a TRL this was not written for is refused, never silently used
        settings = shared_prefix or SharedPrefixConfig()
        super().__init__(*args, **kwargs)
        missing = [name for name in TRL_ATTRIBUTES if not hasattr(self, name)]
        if missing:
            raise UnsupportedTRL(unsupported_trl_message(f"GRPOTrainer instances have no {', '.join(missing)}"))
        self.shared_prefix_mask: str | None = None
        self.shared_prefix_tolerance = settings.check_tolerance
        self.shared_prefix_on_failure = settings.on_failure
        self.shared_prefix_reason = None
        self._check = settings.check
        self._logps_checked = settings.check == "off"
        self._gradients_checked = settings.check != "gradients"
        self.shared_prefix_attention = resolve_attention(settings.attention, self.accelerator.device)
        bare = self.accelerator.unwrap_model(self.model)
        reason = unsupported_model_reason(bare, self.shared_prefix_attention)
        if reason and self.shared_prefix_attention != "dense" and not unsupported_model_reason(bare, "dense"):
            self.to_dense(reason)
        reason = (
            unsupported_feature_reason(self.args, self.train_dataset)
            or unsupported_call_reason(getattr(self, "aux_loss_enabled", False), {})
            or unsupported_model_reason(bare, self.shared_prefix_attention)
        )
        if reason:
            self.disable_shared_prefix(reason)
        logger.info("shared-prefix training: %s", self.shared_prefix_attention if self.shared_prefix_active else "off")

    @property
    def shared_prefix_active(self) -> bool:
        return self.shared_prefix_reason is None

    def disable_shared_prefix(self, reason: str) -> None:
        """Switch to TRL's path, loudly, or stop (``on_failure="fail"``): TRL's path encodes each group's prompt G
        times, so a micro-batch sized for the shared path can run out of memory there."""
        self.shared_prefix_reason = reason
        if self.shared_prefix_on_failure == "fail":
            raise SharedPrefixUnavailable(
                f"shared-prefix training cannot run: {reason}. TRL's per-completion path needs about "
                f"{self.args.num_generations}x the prompt activations per micro-batch: fix the cause, or train with "
                "GRPOTrainer (memstate: shared_prefix_training: false) and a per_device_train_batch_size that fits "
                "(on_failure 'fallback' continues on TRL's path instead)"
            )
        logger.error(
            "shared-prefix training off for the rest of the run: %s; TRL's per-completion path now encodes each prompt "
            "%d times per group (more memory and time per micro-batch)", reason, self.args.num_generations,
        )  # fmt: skip

    def to_dense(self, reason: str) -> None:
        """Leave the flex or split path for the dense mask (exact too, more memory and time at long lengths), checked
        anew."""
        logger.error(
            "shared-prefix training: %s attention off (%s); the dense mask from here on",
            self.shared_prefix_attention, reason,
        )  # fmt: skip
        self.shared_prefix_attention = "dense"
        self._logps_checked = self._check == "off"
        self._gradients_checked = self._check != "gradients"

    def _prepare_inputs(self, generation_batch):
        buffered = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self._buffered_inputs is not buffered and self.shared_prefix_active:
            self._buffered_inputs = group_contiguous(self._buffered_inputs)
            inputs = self._buffered_inputs[self._step % self.args.steps_per_generation]
        return inputs

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        stock = super()._get_per_token_logps_and_entropies
        reason = self.shared_prefix_active and unsupported_call_reason(compute_aux_loss, multimodal)
        if reason:
            self.disable_shared_prefix(reason)
        if not self.shared_prefix_active:
            return stock(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                         compute_aux_loss, **multimodal)  # fmt: skip
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        # TRL's chunks, one forward each: under ZeRO-3 every rank must run the same number of forwards.
        for start in range(0, input_ids.size(0), batch_size):
            chunk = (input_ids[start : start + batch_size], attention_mask[start : start + batch_size])
            if not self._logps_checked or (not self._gradients_checked and torch.is_grad_enabled()):
                if not self.first_use_check(model, *chunk, logits_to_keep):
                    rest = (input_ids[start:], attention_mask[start:])
                    lp, ent, _ = stock(model, *rest, logits_to_keep, batch_size, compute_entropy)
                    logps.append(lp)
                    entropies.append(ent)
                    break
            try:
                lp, ent = self.shared_prefix_logps(model, *chunk, logits_to_keep, compute_entropy)
            except Unsupported as e:  # this chunk only (TRL left-pads prompts, so not expected), still one forward
                logger.warning("shared-prefix: %s; this chunk goes through TRL's path", e)
                lp, ent, _ = stock(model, *chunk, logits_to_keep, batch_size, compute_entropy)
            logps.append(lp)
            entropies.append(ent)
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

    def shared_prefix_logps(self, model, input_ids, attention_mask, logits_to_keep, compute_entropy):
        attention = self.shared_prefix_attention
        if attention == "flex" and input_ids.device.type == "cpu":
            if torch.is_grad_enabled():
                attention = "split"  # torch has no FlexAttention backward on CPU; split is exact with stock SDPA
            else:
                static_flex_on_cpu()
        self.shared_prefix_mask = attention  # what the last packed forward used
        packed = pack_groups(input_ids, attention_mask, logits_to_keep, self._tokenizer.pad_token_id,
                             FLEX_BLOCK if attention == "flex" else 1)  # fmt: skip
        bare = self.accelerator.unwrap_model(model)
        mask = packed.attention_inputs(attention)
        if attention != "dense":
            install_packed_attention(attention_implementation(bare))
        else:
            if attention_implementation(bare) == "eager":
                # eager attention adds the mask to the scores: 0 where allowed, the dtype's minimum elsewhere
                dtype = next(model.parameters()).dtype
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                    ~mask, torch.finfo(dtype).min
                )
        with self.accelerator.autocast():
            outputs = model(
                input_ids=packed.input_ids,
                attention_mask=mask,
                position_ids=packed.position_ids,
                shift_labels=packed.shift_labels,
                fused_lm_head=True,
            )
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["shared_prefix/token_ratio"].append(input_ids.numel() / packed.tokens)
        entropy = packed.unpack(outputs.entropy) if compute_entropy else None
        return packed.unpack(outputs.log_probs), entropy

    def first_use_check(self, model, input_ids, attention_mask, logits_to_keep) -> bool:
        """Compare the packed path with TRL's on this chunk; on any mismatch (on any rank) turn it off everywhere."""
        stock = super()._get_per_token_logps_and_entropies
        completion_mask = attention_mask[:, -logits_to_keep:].bool()
        failures = []
        if not self._logps_checked:
            with torch.no_grad():
                reference, _, _ = stock(model, input_ids, attention_mask, logits_to_keep)
                try:
                    packed, _ = self.shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep, False)
                except Exception as e:  # a flex or split kernel that does not compile or run here: dense next
                    if not isinstance(e, Unsupported) and self.shared_prefix_attention == "dense":
                        raise
                    failures.append(f"{type(e).__name__}: {e}")
                else:
                    diff = (packed - reference).abs()[completion_mask]
                    mean = diff.mean().item() if diff.numel() else 0.0
                    tolerance = self.shared_prefix_tolerance or CHECK_TOLERANCE.get(compute_dtype(self, model), 1e-4)
                    logger.info(
                        "shared-prefix check: log-probs mean |Δ| %.2e, max %.2e over %d tokens (tolerance %.0e)",
                        mean, diff.max().item() if diff.numel() else 0.0, diff.numel(), tolerance,
                    )  # fmt: skip
                    if not mean <= tolerance:
                        failures.append(f"log-probs differ from TRL's by mean |Δ| {mean:.2e} > {tolerance:.0e}")
            self._logps_checked = True
        if not self._gradients_checked and torch.is_grad_enabled() and not failures:
            try:
                failures += self.gradient_check(model, input_ids, attention_mask, logits_to_keep, completion_mask)
            except Exception as e:  # a flex or split backward failing to compile or run here
                if self.shared_prefix_attention == "dense":
                    raise
                failures.append(f"{type(e).__name__}: {e}")
            self._gradients_checked = True
        failed = torch.tensor([float(bool(failures))], device=self.accelerator.device)
        if self.accelerator.gather(failed).max().item() == 0:
            return True
        reason = "first-use check failed: " + ("; ".join(failures) or "on another rank")
        bare = self.accelerator.unwrap_model(model)
        if self.shared_prefix_attention != "dense" and not unsupported_model_reason(bare, "dense"):
            self.to_dense(reason)
            return self.first_use_check(model, input_ids, attention_mask, logits_to_keep)
        self.disable_shared_prefix(reason)
        return False

    def gradient_check(self, model, input_ids, attention_mask, logits_to_keep, completion_mask) -> list[str]:
        plugin = self.accelerator.state.deepspeed_plugin if self.is_deepspeed_enabled else None
        if plugin is not None and plugin.zero_stage == 3:
            # ZeRO-1/2 keep every parameter whole on each rank (autograd.grad leaves the engine's reduction hooks,
            # on .grad accumulation, alone); ZeRO-3 partitions them. The mask's backward does not depend on the
            # partitioning: benchmarks/gpu/shared_prefix_check.py compares it against the stock path on one GPU.
            logger.warning("shared-prefix gradient check skipped under ZeRO-3 (partitioned parameters); the mask's "
                           "gradient is checked on one GPU by benchmarks/gpu/shared_prefix_check.py")  # fmt: skip
            return []
        # The bare module: under DDP a forward of the wrapper expects a .backward() that syncs gradients.
        model = self.accelerator.unwrap_model(model)
        params = [p for p in model.parameters() if p.requires_grad]
        weights = torch.randn(completion_mask.shape, device=completion_mask.device) * completion_mask

        def grads(logps: torch.Tensor) -> list[torch.Tensor]:
            return torch.autograd.grad((logps * weights).sum(), params, allow_unused=True)

        with self.accelerator.autocast():
            reference = grads(super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                                         logits_to_keep)[0])  # fmt: skip
        packed = grads(self.shared_prefix_logps(model, input_ids, attention_mask, logits_to_keep, False)[0])
        worst = 0.0
        for ref, got in zip(reference, packed, strict=True):
            if ref is None or got is None:
                continue
            worst = max(worst, ((got - ref).norm() / ref.norm().clamp(min=1e-12)).item())
        logger.info("shared-prefix check: gradients worst relative difference %.2e over %d tensors", worst, len(params))
        tolerance = 1e-4 if compute_dtype(self, model) == torch.float32 else 5e-2
        return [] if worst <= tolerance else [f"gradients differ from TRL's by {worst:.2e} relative > {tolerance:.0e}"]


class SharedPrefixUnavailable(MemstateError, RuntimeError):
    """The shared-prefix path cannot run and the run was told not to fall back (``shared_prefix_on_failure: fail``)."""

    hint = "see shared_prefix_training and shared_prefix_on_failure in `memstate train --help`"


class UnsupportedTRL(MemstateError, RuntimeError):
    """The installed TRL's GRPOTrainer is not the one this trainer overrides (its private methods moved)."""

    hint = f"install trl{SUPPORTED_TRL} (pyproject.toml's pin), or train with GRPOTrainer"


def unsupported_trl_message(problem: str) -> str:
    return (
        f"SharedPrefixGRPOTrainer cannot run on trl {trl.__version__} (written for trl{SUPPORTED_TRL}): {problem}; "
        f"install trl{SUPPORTED_TRL} or train with GRPOTrainer"
    )


def check_trl_api(trainer_class: type = GRPOTrainer) -> None:
    """Refuse, in one line, a TRL whose GRPOTrainer lacks what the overrides rely on: each overridden method with the
    leading parameters it is called with (the others optional), the TRL helpers used. A TRL outside ``SUPPORTED_TRL``
    that passes is logged as untested (the first-use check then compares the paths on the live batch).

    >>> check_trl_api()
    >>> class Moved:
    ...     def _prepare_inputs(self, batch): ...
    >>> try:
    ...     check_trl_api(Moved)
    ... except UnsupportedTRL as e:
    ...     print(str(e).split(": ", 1)[1].split(";")[0])
    GRPOTrainer._prepare_inputs takes (self, batch), not (self, generation_batch, ...)
    """
    from packaging.specifiers import SpecifierSet
    from trl.trainer import utils

    for name, expected in OVERRIDDEN.items():
        method = getattr(trainer_class, name, None)
        if method is None:
            raise UnsupportedTRL(unsupported_trl_message(f"GRPOTrainer has no {name}"))
        params = list(inspect.signature(method).parameters.values())
        leading = [p for p in params[: len(expected)] if p.kind is p.POSITIONAL_OR_KEYWORD]
        rest_optional = all(p.default is not p.empty or p.kind is p.VAR_KEYWORD for p in params[len(expected) :])
        if tuple(p.name for p in leading) != expected or not rest_optional:
            found = ", ".join(str(p.replace(annotation=p.empty)) for p in params)
            raise UnsupportedTRL(unsupported_trl_message(
                f"GRPOTrainer.{name} takes ({found}), not ({', '.join(expected)}, ...)"
            ))  # fmt: skip
    missing = [name for name in ("split_tensor_dict", "add_fused_lm_head") if not hasattr(utils, name)]
    if missing:
        raise UnsupportedTRL(unsupported_trl_message(f"trl.trainer.utils has no {', '.join(missing)}"))
    if trl.__version__ not in SpecifierSet(SUPPORTED_TRL, prereleases=True):
        logger.warning("SharedPrefixGRPOTrainer: trl %s is outside the tested range %s; its overridden methods have "
                       "the expected signatures, and the first-use check compares the paths", trl.__version__,
                       SUPPORTED_TRL)  # fmt: skip


def unsupported_feature_reason(args, train_dataset) -> str | None:
    """Why the packed path cannot serve these GRPOConfig settings or this dataset (None when it can): decided at
    construction, so a run does not change paths mid-way.

    >>> from types import SimpleNamespace as NS
    >>> unsupported_feature_reason(NS(use_liger_kernel=False), None) is None
    True
    >>> unsupported_feature_reason(NS(use_liger_kernel=True), None)
    "use_liger_kernel: Liger's kernels replace the model's layers and are not checked against packed rows"
    >>> unsupported_feature_reason(NS(), NS(column_names=["prompt", "image"]))
    "the dataset's 'image' column: multimodal prompts are not packed"
    >>> image_part = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}
    >>> unsupported_feature_reason(NS(), [{"prompt": [image_part]}])
    "the dataset's first prompt has an image part: multimodal prompts are not packed"
    """
    if getattr(args, "use_liger_kernel", False):
        return "use_liger_kernel: Liger's kernels replace the model's layers and are not checked against packed rows"
    if getattr(args, "padding_free", False):
        return "padding_free: the packed path lays out its own rows (one per prompt) and needs TRL's padded batch"
    parallelism = getattr(args, "parallelism_config", None)
    if getattr(parallelism, "cp_enabled", False) or getattr(parallelism, "sp_enabled", False):
        return "sequence parallelism (parallelism_config cp_size or sp_size > 1) would split a packed row across ranks"
    columns = getattr(train_dataset, "column_names", None) or []
    for column in ("image", "images"):
        if column in columns:
            return f"the dataset's {column!r} column: multimodal prompts are not packed"
    try:  # images may also be parts of a conversational prompt's messages (TRL extracts them)
        first = train_dataset[0]["prompt"]
    except (TypeError, KeyError, IndexError):  # no dataset, an iterable one, or another layout: TRL's to judge
        return None
    messages = [m for m in first if isinstance(m, dict)] if isinstance(first, list) else []
    parts = [part for m in messages if isinstance(m.get("content"), list) for part in m["content"]]
    if any(isinstance(part, dict) and part.get("type") == "image" for part in parts):
        return "the dataset's first prompt has an image part: multimodal prompts are not packed"
    return None


def attention_implementation(model) -> str:
    return getattr(model.config, "_attn_implementation", None) or "eager"


def static_flex_on_cpu() -> None:
    """Compile flex attention for each new length instead of once for all lengths: inductor's CPU code for the
    dynamic-shape flex kernel does not compile (torch 2.13: "cur_kvSplitSize8 was not declared"), the static one does.
    Process-wide, and only on CPU runs, where nothing else compiles."""
    import torch._dynamo

    if torch._dynamo.config.automatic_dynamic_shapes:
        torch._dynamo.config.automatic_dynamic_shapes = False
        logger.info("shared-prefix flex on CPU: flex attention compiled per length (no dynamic shapes)")


def resolve_attention(attention: Attention, device: torch.device) -> Literal["dense", "flex", "split"]:
    """``auto``: flex where its kernel runs the whole pass (CUDA, a torch with FlexAttention), else split.

    >>> resolve_attention("auto", torch.device("cpu")), resolve_attention("flex", torch.device("cpu"))
    ('split', 'flex')
    """
    if attention != "auto":
        return attention
    return "flex" if device.type == "cuda" and flex_unavailable() is None else "split"


def flex_unavailable() -> str | None:
    """Why FlexAttention cannot run here (torch without it), or None."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} has no FlexAttention ({e})"
    return None


def unsupported_model_reason(model, attention: Attention = "dense") -> str | None:
    """Why the packed path cannot run on this model, or None."""
    implementation = attention_implementation(model)
    if attention == "dense" and implementation not in MASKED_ATTENTION:
        return f"attention implementation {implementation!r} takes no custom 4-D mask (supported: sdpa, eager)"
    if attention != "dense" and implementation == "eager":
        # flex and split are routed in front of the model's kernel in transformers' registry, which eager is not in
        return f"{attention} attention routes through transformers' attention registry: load the model with sdpa"
    if attention == "flex" and flex_unavailable():
        return flex_unavailable()
    text = model.config.get_text_config()
    if "sliding_attention" in (getattr(text, "layer_types", None) or []):
        return "the model has sliding-window layers, which a custom 4-D mask would override"
    return None


def unsupported_call_reason(compute_aux_loss: bool, extra_inputs: dict) -> str | None:
    if compute_aux_loss:
        return "the MoE load-balancing loss depends on the token layout"
    given = sorted(k for k, v in extra_inputs.items() if v is not None)
    return f"inputs {given} (multimodal or token-type ids) are not packed" if given else None


def compute_dtype(trainer: GRPOTrainer, model) -> torch.dtype:
    if trainer.args.bf16:
        return torch.bfloat16
    if trainer.args.fp16:
        return torch.float16
    return next(model.parameters()).dtype
