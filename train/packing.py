"""Packing a GRPO micro-batch as one row per distinct prompt (the layout of ``train/shared_prefix.py``), and the
attention pattern of the packed rows as a dense mask or a FlexAttention block mask. Plain torch: no TRL, so the
prepared GPU check (``benchmarks/gpu/shared_prefix_check.py``) runs it where TRL is not installed."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

# FlexAttention's block size: packed rows are padded to a multiple of it for the block mask.
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
