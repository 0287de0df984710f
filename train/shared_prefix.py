"""Shared-prefix GRPO: each group's prompt is encoded once per forward/backward and its completions attend to it.

TRL's GRPOTrainer scores every completion with its own copy of the prompt: a group of G completions costs
G·(P + R) tokens in the training forward/backward, the old-policy log-probs and the reference forward. The prompt
is the same across the group, so ``pack_groups`` lays a micro-batch out as one row per distinct prompt::

    [prompt[:-1] | prompt[-1], c1[:-1] | prompt[-1], c2[:-1] | ...]

with a 4-D attention mask in which every completion segment sees the prompt and itself (causally) and nothing
of the other completions, and position ids that continue after the prompt for every segment, exactly as in the
stock layout (Prefix Grouper, arXiv 2506.05433). Each segment starts with a copy of the prompt's last token so
that every completion's first token has a position of its own to be predicted from; TRL's fused LM head then
scores the packed rows with pre-shifted labels (``shift_labels``), so temperature, fp32 head and entropy are
TRL's own. The forward outputs, and so the gradients, equal the stock path's up to floating-point reordering.

``SharedPrefixGRPOTrainer`` plugs this in at ``_get_per_token_logps_and_entropies`` (training, old-policy and
reference log-probs alike) and keeps each group's completions in the same micro-batch. On first use it compares
the packed path with TRL's on the live batch and falls back to TRL's path, with the reason logged, on any
mismatch or on inputs it does not handle (multimodal inputs, token-type ids, MoE aux loss, sliding-window
layers, attention kernels that take no 4-D mask).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from trl import GRPOTrainer
from trl.trainer.utils import split_tensor_dict

from memstate.errors import MemstateError

logger = logging.getLogger("memstate.train")

# Attention kernels that take a custom 4-D mask as it is (transformers' masking utils return a 4-D mask unchanged).
MASKED_ATTENTION = ("sdpa", "eager")
# Mean |Δ log-prob| over completion tokens that the first-use check accepts, by compute dtype: fp32 differs from the
# stock path only by summation order; 16-bit activations round differently when the prompt is encoded once.
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}
CheckMode = Literal["off", "logps", "gradients"]
# How the packed rows' attention pattern reaches the kernel: a dense (L x L) boolean mask for SDPA / eager, or a
# FlexAttention BlockMask (per 128 x 128 block: empty, full or partial) that lets the kernel skip the empty blocks.
Attention = Literal["dense", "flex"]
FLEX_BLOCK = 128


class Unsupported(Exception):
    """An input the packed path does not handle; the caller uses TRL's path for it."""


@dataclass
class PackedGroups:
    """A chunk of ``(prompt, completion)`` rows packed as one row per distinct prompt."""

    input_ids: torch.Tensor  # (rows, L)
    segment: torch.Tensor  # (rows, L): 0 the shared prompt, n + 1 the completion of stock row n, -1 padding
    valid: torch.Tensor  # (rows, L) bool: a real token (keys that are not are never attended)
    position_ids: torch.Tensor  # (rows, L)
    shift_labels: torch.Tensor  # (rows, L): the token each position predicts, -100 where none
    source: torch.Tensor  # flat indices into (rows·L) of each scored completion token ...
    target: torch.Tensor  # ... and where it goes in the flat (B·T) output
    batch_shape: tuple[int, int]  # (B, T) of the stock layout

    @property
    def tokens(self) -> int:
        """Token positions the packed forward processes (row padding included)."""
        return self.input_ids.numel()

    @property
    def attention_mask(self) -> torch.Tensor:
        """The dense mask for SDPA / eager attention: (rows, 1, L, L) bool, True = may attend."""
        return allowed_keys(self.valid, self.segment)

    def block_mask(self):
        """The same pattern as a FlexAttention ``BlockMask``: per (row, 128 x 128 block) whether it is empty, full
        or partial, so the kernel skips empty blocks (a prompt's upper triangle, a completion's view of its
        siblings) and the mask costs kilobytes instead of L² bytes per row."""
        from torch.nn.attention.flex_attention import create_block_mask

        segment, valid = self.segment, self.valid

        def mask_mod(b, h, q, kv):
            return attends(q, kv, segment[b, q], segment[b, kv], valid[b, kv])

        rows, length = segment.shape
        return create_block_mask(mask_mod, rows, None, length, length, device=segment.device, _compile=True)

    def unpack(self, per_token: torch.Tensor) -> torch.Tensor:
        """Packed (rows, L) per-token values → the stock (B, T) layout, zeros where no completion token is scored.
        Stays connected to the graph even when nothing is scored (an all-masked micro-batch still back-propagates)."""
        values = per_token.reshape(-1)[self.source]
        out = per_token.new_zeros(self.batch_shape[0] * self.batch_shape[1]).scatter(0, self.target, values)
        if not len(self.source):
            out = out + 0 * per_token.sum()
        return out.view(self.batch_shape)


def attends(q, kv, q_segment, kv_segment, kv_valid):
    """The packed attention pattern, elementwise (tensors that broadcast; FlexAttention's ``mask_mod`` calls it on
    scalars): query ``q`` sees key ``kv`` iff the key is a real token, comes no later than ``q``, and is in the shared
    prompt (segment 0) or in ``q``'s own segment. Every position also sees itself, so padding queries have a key
    and attention yields no NaN (their outputs are never scored).

    >>> t = torch.tensor
    >>> [bool(attends(t(3), t(k), t(2), t(s), t(True))) for k, s in [(0, 0), (2, 1), (3, 2), (4, 2)]]
    [True, False, True, False]
    """
    return ((kv <= q) & kv_valid & ((kv_segment == 0) | (kv_segment == q_segment))) | (q == kv)


def allowed_keys(valid: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """``attends`` for every (query, key) pair of each packed row: the dense (rows, 1, L, L) mask.

    >>> valid = torch.tensor([[True, True, True, True, True]])
    >>> segment = torch.tensor([[0, 0, 1, 1, 2]])  # prompt of two, a completion of two, one of one
    >>> allowed_keys(valid, segment)[0, 0].int()
    tensor([[1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 0, 0, 1]], dtype=torch.int32)
    """
    index = torch.arange(valid.size(1), device=valid.device)
    return attends(index[:, None], index[None, :], segment[:, :, None], segment[:, None, :], valid[:, None, :])[:, None]


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[int]:
    """Each row's group: rows with the same prompt tokens at the same columns share one, numbered by first appearance.

    >>> prompt_groups(torch.tensor([[0, 7], [5, 6], [9, 7]]), torch.tensor([[0, 1], [1, 1], [0, 1]]))
    [0, 1, 0]
    """
    _, group_of = torch.unique(prompt_ids.masked_fill(prompt_mask == 0, -1), dim=0, return_inverse=True)
    first: dict[int, int] = {}
    return [first.setdefault(g, len(first)) for g in group_of.tolist()]


def pack_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, pad_token_id: int, multiple: int = 1
) -> PackedGroups:
    """Pack TRL's ``cat(prompt_ids, completion_ids)`` rows (prompts left-padded, completions right-padded, the
    last ``logits_to_keep`` columns being the completion) as one row per distinct prompt.

    Positions are the stock layout's column indices (transformers' default without ``position_ids``), so RoPE sees
    the same angles as in TRL's forward. A completion's segment is as long as its last scored token: trailing
    padding is not encoded. Rows are padded to a ``multiple`` of tokens (FlexAttention's block size: lengths then
    come in buckets, and a new length compiles nothing new).
    """
    batch, width = input_ids.shape
    prompt_len = width - logits_to_keep
    prompt_ids, prompt_mask = input_ids[:, :prompt_len], attention_mask[:, :prompt_len].bool()
    completion_ids, completion_mask = input_ids[:, prompt_len:], attention_mask[:, prompt_len:].bool()
    if prompt_len < 1 or not bool(prompt_mask[:, -1].all()):
        raise Unsupported("prompts are not left-padded (a prompt's last column is padding)")
    groups: dict[int, list[int]] = {}
    for row, group in enumerate(prompt_groups(prompt_ids, prompt_mask)):
        groups.setdefault(group, []).append(row)
    start = int(prompt_mask.float().argmax(dim=1).min())  # columns every prompt leaves as padding are dropped
    prefix = prompt_len - 1 - start
    scored = torch.where(completion_mask, torch.arange(logits_to_keep, device=input_ids.device) + 1, 0)
    lengths = scored.max(dim=1).values.tolist()  # a segment ends at its completion's last scored token
    members = list(groups.values())
    length = max(1, *(prefix + sum(lengths[r] for r in rows) for rows in members))
    length = -(-length // multiple) * multiple

    device = input_ids.device
    ids = torch.full((len(members), length), pad_token_id, dtype=input_ids.dtype, device=device)
    positions = torch.zeros((len(members), length), dtype=torch.long, device=device)
    segment = torch.full((len(members), length), -1, dtype=torch.long, device=device)
    valid = torch.zeros((len(members), length), dtype=torch.bool, device=device)
    labels = torch.full((len(members), length), -100, dtype=input_ids.dtype, device=device)
    source, target = [], []
    for g, rows in enumerate(members):
        first = rows[0]
        ids[g, :prefix] = prompt_ids[first, start : prompt_len - 1]
        positions[g, :prefix] = torch.arange(start, prompt_len - 1, device=device)
        segment[g, :prefix] = 0
        valid[g, :prefix] = prompt_mask[first, start : prompt_len - 1]
        offset = prefix
        for row in rows:
            n = lengths[row]
            if n == 0:
                continue  # nothing scored (e.g. a masked truncated completion): its log-probs stay 0
            span = slice(offset, offset + n)
            ids[g, span] = torch.cat([prompt_ids[row, -1:], completion_ids[row, : n - 1]])
            positions[g, span] = torch.arange(prompt_len - 1, prompt_len - 1 + n, device=device)
            segment[g, span] = row + 1
            valid[g, span] = torch.cat([prompt_mask[row, -1:], completion_mask[row, : n - 1]])
            labels[g, span] = completion_ids[row, :n].masked_fill(~completion_mask[row, :n], -100)
            keep = completion_mask[row, :n].nonzero().squeeze(1)
            source.append(g * length + offset + keep)
            target.append(row * logits_to_keep + keep)
            offset += n
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return PackedGroups(
        input_ids=ids,
        segment=segment,
        valid=valid,
        position_ids=positions,
        shift_labels=labels,
        source=torch.cat(source) if source else empty,
        target=torch.cat(target) if target else empty,
        batch_shape=(batch, logits_to_keep),
    )


def group_contiguous(batches: list[dict]) -> list[dict]:
    """Re-split TRL's shuffled micro-batches so that each group's completions sit together: groups keep the random
    order the shuffle gave them (by first appearance), so each micro-batch holds whole groups where sizes allow.

    >>> p = torch.tensor([[1], [2], [1], [2]])
    >>> batches = [{"prompt_ids": p[:2], "prompt_mask": torch.ones(2, 1), "x": [0, 1], "n": torch.tensor(4)},
    ...            {"prompt_ids": p[2:], "prompt_mask": torch.ones(2, 1), "x": [2, 3], "n": torch.tensor(4)}]
    >>> [b["x"] for b in group_contiguous(batches)]
    [[0, 2], [1, 3]]
    """
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

    ``check``: ``"logps"`` compares the packed path's per-token log-probs with TRL's on the first chunk it sees
    (mean |Δ| over completion tokens ≤ ``check_tolerance``, by default ``CHECK_TOLERANCE`` of the compute dtype);
    ``"gradients"`` also compares the parameter gradients of a random linear function of those log-probs on the
    first chunk with gradients enabled (not under DeepSpeed, whose partitioned parameters have no plain ``.grad``);
    ``"off"`` trusts the packing. Any failed check switches every rank to TRL's path for the rest of the run.
    """

    def __init__(
        self,
        *args,
        check: CheckMode = "logps",
        check_tolerance: float | None = None,
        on_failure: Literal["fallback", "fail"] = "fallback",
        attention: Attention = "dense",
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.shared_prefix_attention = attention
        self.shared_prefix_mask: str | None = None
        self.shared_prefix_tolerance = check_tolerance
        self.shared_prefix_on_failure = on_failure
        self.shared_prefix_reason = None
        self._logps_checked = check == "off"
        self._gradients_checked = check != "gradients"
        reason = unsupported_model_reason(self.accelerator.unwrap_model(self.model), attention)
        if reason:
            self.disable_shared_prefix(reason)

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
                f"{self.args.num_generations}x the prompt activations per micro-batch: fix the cause, or set "
                "shared_prefix_training: false with a per_device_train_batch_size that fits "
                "(shared_prefix_on_failure: fallback continues on TRL's path instead)"
            )
        logger.error(
            "shared-prefix training off for the rest of the run: %s; TRL's per-completion path now encodes each prompt "
            "%d times per group (more memory and time per micro-batch)", reason, self.args.num_generations,
        )  # fmt: skip

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
        # torch has no FlexAttention backward on CPU: there the gradient pass keeps the dense mask, and the old-policy
        # and reference forwards (no gradient) take the block mask.
        on_cpu = input_ids.device.type == "cpu"
        flex = self.shared_prefix_attention == "flex" and not (on_cpu and torch.is_grad_enabled())
        self.shared_prefix_mask = "flex" if flex else "dense"  # what the last packed forward used
        packed = pack_groups(input_ids, attention_mask, logits_to_keep, self._tokenizer.pad_token_id,
                             FLEX_BLOCK if flex else 1)  # fmt: skip
        bare = self.accelerator.unwrap_model(model)
        if flex:
            mask = packed.block_mask()
        else:
            mask = packed.attention_mask
            if attention_implementation(bare) == "eager":
                # eager attention adds the mask to the scores: 0 where allowed, the dtype's minimum elsewhere
                dtype = next(model.parameters()).dtype
                mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                    ~mask, torch.finfo(dtype).min
                )
        with self.accelerator.autocast(), attention_as(bare, "flex_attention" if flex else None):
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
                except Unsupported as e:
                    failures.append(str(e))
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
            failures += self.gradient_check(model, input_ids, attention_mask, logits_to_keep, completion_mask)
            self._gradients_checked = True
        failed = torch.tensor([float(bool(failures))], device=self.accelerator.device)
        if self.accelerator.gather(failed).max().item() > 0:
            self.disable_shared_prefix("first-use check failed: " + ("; ".join(failures) or "on another rank"))
            return False
        return True

    def gradient_check(self, model, input_ids, attention_mask, logits_to_keep, completion_mask) -> list[str]:
        if self.is_deepspeed_enabled:
            logger.warning("shared-prefix gradient check skipped: DeepSpeed partitions parameters and gradients")
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


def attention_implementation(model) -> str:
    return getattr(model.config, "_attn_implementation", None) or "eager"


@contextmanager
def attention_as(model, implementation: str | None):
    """Run the model's attention layers with ``implementation`` for the packed forward only (transformers reads
    ``config._attn_implementation`` at every layer call), whatever the model was loaded with; None: unchanged."""
    if implementation is None:
        yield
        return
    config = model.config
    loaded = config._attn_implementation
    config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = loaded


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
    if attention == "flex":
        # the packed forward switches the layers to flex attention itself, whatever the model was loaded with
        reason = flex_unavailable()
        if reason:
            return reason
    elif implementation not in MASKED_ATTENTION:
        return f"attention implementation {implementation!r} takes no custom 4-D mask (supported: sdpa, eager)"
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
