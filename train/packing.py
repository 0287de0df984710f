"""Packing a GRPO micro-batch as one row per distinct prompt (the layout of ``train/shared_prefix.py``), and three
ways to give attention the packed rows' pattern (``attends``):

- ``dense``: one (L x L) boolean mask per row for the model's sdpa / eager kernel;
- ``flex``: a FlexAttention block mask (per 128 x 128 block: empty, full or partial), so the kernel skips the empty
  blocks; torch has no FlexAttention backward on CPU;
- ``split``: no mask over the row at all (Prefix Grouper's decomposition): per row, the prompt attends to itself
  causally (SDPA ``is_causal``), and the group's completions, gathered as a batch, attend to the prompt's keys and
  their own (a lower-right causal mask of R x (P + R)); every kernel call is stock SDPA, forward and backward, on
  any device.

Plain torch and transformers: no TRL, so the prepared GPU check (``benchmarks/gpu/shared_prefix_check.py``) runs it
where TRL is not installed."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F

# FlexAttention's block size: packed rows are padded to a multiple of it for the block mask.
FLEX_BLOCK = 128
Attention = Literal["dense", "flex", "split"]


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
    prefix: int = 0  # the shared prompt occupies columns [0, prefix) of every row (left padding first)
    spans: list[list[tuple[int, int]]] = field(default_factory=list)  # per row, each completion's (offset, length)

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

    def split_layout(self) -> SplitLayout:
        """What ``split_attention`` needs of each row: where its prompt starts and its completions' token indices."""
        rows = []
        for r, spans in enumerate(self.spans):
            real = self.valid[r, : self.prefix].nonzero()
            start = int(real[0]) if len(real) else self.prefix
            end = self.prefix + sum(n for _, n in spans)
            if not bool(self.valid[r, start:end].all()):
                raise Unsupported("a prompt or completion with padding inside it")
            if spans:
                width = max(n for _, n in spans)
                steps = torch.arange(width, device=self.valid.device)
                offsets = torch.tensor([o for o, _ in spans], device=self.valid.device)
                lengths = torch.tensor([n for _, n in spans], device=self.valid.device)
                # padded query slots repeat the completion's last token: finite outputs, dropped by ``keep``
                index = offsets[:, None] + torch.minimum(steps[None], lengths[:, None] - 1)
                keep = steps[None] < lengths[:, None]
                # each completion slot sees the whole prompt and, lower-right causally, its own earlier slots
                prompt_keys = steps.new_ones(width, self.prefix - start, dtype=torch.bool)
                mask = torch.cat([prompt_keys, steps[None, :] <= steps[:, None]], 1)
            rows.append(SplitRow(start, index, keep, mask) if spans else SplitRow(start, None, None, None))
        return SplitLayout(self.prefix, rows)

    def attention_inputs(self, attention: Attention) -> object:
        """The packed forward's ``attention_mask`` for ``attention``. flex and split pass a dict, which skips
        transformers' mask construction: every full-attention layer receives the block mask or the layout as is, and
        the dispatch ``install_packed_attention`` puts in front of the model's kernel routes it by its type (also
        when activation checkpointing recomputes a layer in the backward)."""
        if attention == "flex":
            return {"full_attention": self.block_mask()}
        if attention == "split":
            return {"full_attention": self.split_layout()}
        return self.attention_mask

    def unpack(self, per_token: torch.Tensor) -> torch.Tensor:
        """Packed (rows, L) per-token values → the stock (B, T) layout, zeros where no completion token is scored.
        Stays connected to the graph even when nothing is scored (an all-masked micro-batch still back-propagates)."""
        values = per_token.reshape(-1)[self.source]
        out = per_token.new_zeros(self.batch_shape[0] * self.batch_shape[1]).scatter(0, self.target, values)
        if not len(self.source):
            out = out + 0 * per_token.sum()
        return out.view(self.batch_shape)


@dataclass
class SplitRow:
    start: int  # the prompt's first real column (columns before it are left padding)
    index: torch.Tensor | None  # (G, R_max): the row columns of each completion's tokens, padded slots repeated
    keep: torch.Tensor | None  # (G, R_max) bool: the real slots, in the row's order
    mask: torch.Tensor | None  # (R_max, P + R_max) bool: what a completion slot attends to, the same for all G


@dataclass
class SplitLayout:
    """The packed rows as ``split_attention`` reads them (passed through the model as its ``attention_mask``)."""

    prefix: int
    rows: list[SplitRow]

    def nbytes(self) -> int:
        """Bytes of what the layers read: the index tensors, and per row the (R x (P + R)) completion mask."""
        total = 0
        for row in self.rows:
            total += sum(t.numel() * t.element_size() for t in (row.index, row.keep, row.mask) if t is not None)
        return total


def split_attention(module, query, key, value, attention_mask: SplitLayout, dropout=0.0, scaling=None, **kwargs):
    """Attention over packed rows without a row mask: per row, the prompt causally over itself, then the group's
    completions as a batch over [prompt keys; own keys] with a lower-right causal mask. Positions outside both
    (padding) get zeros: they are never scored. Grouped-query heads are folded into the query length, so keys and
    values are never repeated. Returns (rows, L, heads, dim), as transformers' attention functions do."""
    layout = attention_mask
    rows, heads, length, dim = query.shape
    kv_heads = key.size(1)
    repeat = heads // kv_heads
    outputs = []
    for r, row in enumerate(layout.rows):
        start, prefix = row.start, layout.prefix
        parts = [query.new_zeros(start, heads, dim)]
        if prefix > start:
            q, k, v = (t[r : r + 1, :, start:prefix] for t in (query, key, value))
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, scale=scaling, is_causal=True, enable_gqa=repeat > 1
            )
            parts.append(out[0].transpose(0, 1))
        covered = prefix
        if row.index is not None:
            group, width = row.index.shape
            q = query[r][:, row.index].transpose(0, 1)  # (G, heads, R, dim)
            q = q.reshape(group, kv_heads, repeat * width, dim)  # query heads of one KV head in a row
            k, v = (
                torch.cat(
                    [t[r : r + 1, :, start:prefix].expand(group, -1, -1, -1), t[r][:, row.index].transpose(0, 1)], 2
                )
                for t in (key, value)
            )
            mask = row.mask.repeat(repeat, 1)  # the query heads of a KV head follow each other along the length
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
            out = out.reshape(group, heads, width, dim).transpose(1, 2)[row.keep]  # (S, heads, dim)
            parts.append(out)
            covered += len(out)
        parts.append(query.new_zeros(length - covered, heads, dim))
        outputs.append(torch.cat(parts))
    return torch.stack(outputs), None


def packed_mask_bytes(packed: PackedGroups, attention: Attention) -> int:
    """Bytes of what the layers get as their mask for ``attention``: the dense (rows, 1, L, L) booleans, the block
    mask's tensors, or the split layout's index tensors and per-row completion masks."""
    mask = packed.attention_inputs(attention)
    if attention == "split":
        return mask["full_attention"].nbytes()
    tensors = mask["full_attention"].as_tuple() if attention == "flex" else [mask]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def install_packed_attention(implementation: str) -> None:
    """Route attention calls whose mask is a ``SplitLayout`` to ``split_attention`` and a FlexAttention
    ``BlockMask`` to transformers' flex attention; every other call goes to ``implementation``'s function as before.
    The model keeps its implementation, so a layer recomputed in the backward (activation checkpointing, after the
    packed forward has returned) dispatches the same way. Idempotent; process-wide, as transformers' registry is."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    original = ALL_ATTENTION_FUNCTIONS[implementation]
    if getattr(original, "packed_original", None):
        return

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        if isinstance(attention_mask, SplitLayout):
            return split_attention(module, query, key, value, attention_mask, *args, **kwargs)
        if type(attention_mask).__name__ == "BlockMask":
            from transformers.integrations.flex_attention import flex_attention_forward

            kwargs.pop("dropout", None)  # 0.0 here (flex takes none); sliding windows are refused before
            return flex_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    attention.packed_original = original
    AttentionInterface.register(implementation, attention)


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
    spans: list[list[tuple[int, int]]] = [[] for _ in members]
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
            spans[g].append((offset, n))
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
        prefix=prefix,
        spans=spans,
    )


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
