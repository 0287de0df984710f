"""One prepared GPU check of shared-prefix training (issue 42): does the packed path agree with TRL's layout, and how
much faster and leaner is its training pass, on one GPU, at production lengths?

A random-init model of Qwen3-4B's architecture in bf16 (no weights to download), activation checkpointing on, G = 8
completions of R = 256 tokens after one P-token prompt, P in {2048, 8192}. The policy's training pass (forward and
backward of a weighted sum of the completion tokens' log-probs: what GRPO's loss costs) along each path:

- ``stock``: TRL's layout, G rows of P + R tokens, the model's own kernel (``stock_sdpa``; ``stock_flash`` too where
  flash-attn is installed);
- ``dense``: one packed row of P + G·R tokens (``memstate.train.packing``) with the dense (L x L) mask, sdpa;
- ``flex``: the same row with a FlexAttention block mask;
- ``split``: the same row, the prompt and the completions in separate SDPA calls with no row mask.

Each: seconds per pass (median of ``--repeats`` after a warm-up), peak GPU memory, the mask's bytes, and for
each packed path the mean and max |Δ log-prob| against stock (without gradients) and its parameter gradients against
stock's (``grad_rel_diff`` over the whole gradient, the worst tensor's, the cosine): a wrong backward through a mask
would leave the log-probs equal and the update wrong. JSON to
``benchmarks/results/shared_prefix_gpu.json`` with the GPU's name. ``--dtype float32 --repeats 0`` checks the
agreement alone without bf16's rounding (``shared_prefix_gpu_fp32.json``; P = 2048 only: fp32 SDPA has no fused
kernel for the stock reference at 8192, whose math path asks for 68 GiB). ``--dry-run``: a tiny model and lengths
on CPU in fp32 (the test suite runs it; torch has no FlexAttention backward on CPU, so there flex times its
forward only).

On the device machine (torch and transformers; TRL is not needed, nor an install: the two packages it imports are
copied into place):

    mkdir -p /tmp/pkg && cp -r memstate /tmp/pkg/ && cp -r train /tmp/pkg/memstate/train \\
      && PYTHONPATH=/tmp/pkg python benchmarks/gpu/shared_prefix_check.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

from memstate.train.packing import FLEX_BLOCK, attention_as, install_packed_attention, pack_groups, packed_mask_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results_io import report  # noqa: E402

# Qwen/Qwen3-4B-Instruct-2507's config.json (architecture only; weights random).
QWEN3_4B = dict(
    hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, vocab_size=151936, rope_theta=5_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    max_position_embeddings=32768,
)  # fmt: skip
PACKED = ("dense", "flex", "split")
# Bugs the trainer's first-use check must tell from rounding (--planted): the check's tolerance sits between them.
PLANTED = ("planted_siblings_visible", "planted_positions")
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=4096,
)  # fmt: skip


def completion_logps(model, hidden: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probs of ``labels`` from the hidden states at flat positions ``rows`` (the LM head on those only)."""
    logits = model.lm_head(hidden.reshape(-1, hidden.size(-1))[rows]).float()
    return torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)


def stock_logps(model, input_ids, completion_len: int, implementation: str) -> torch.Tensor:
    """TRL's layout: every row its own copy of the prompt; (G, R) log-probs."""
    group, width = input_ids.shape
    with attention_as(model, implementation):
        hidden = model.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).last_hidden_state
    positions = torch.arange(width - completion_len - 1, width - 1, device=input_ids.device)
    rows = (torch.arange(group, device=input_ids.device)[:, None] * width + positions).reshape(-1)
    return completion_logps(model, hidden, rows, input_ids[:, -completion_len:].reshape(-1)).view(group, -1)


def packed_logps(model, input_ids, completion_len: int, attention: str) -> tuple[torch.Tensor, int]:
    """The shared-prefix layout with ``attention`` (dense, flex or split): (G, R) log-probs, and the mask's bytes.
    ``planted_*``: the dense layout with a bug the first-use check must catch (``PLANTED``)."""
    packed = pack_groups(
        input_ids, torch.ones_like(input_ids), completion_len, 0, FLEX_BLOCK if attention == "flex" else 1
    )
    if attention in ("flex", "split"):
        install_packed_attention("sdpa")
    mask, positions = packed.attention_inputs("dense" if attention.startswith("planted") else attention), None
    if attention == "planted_siblings_visible":
        mask = None  # plain causal over the row: each completion also sees the completions packed before it
    elif attention == "planted_positions":  # positions run on along the row instead of restarting per completion
        positions = torch.arange(packed.input_ids.size(1), device=input_ids.device)[None]
    hidden = model.model(
        input_ids=packed.input_ids,
        attention_mask=mask,
        position_ids=packed.position_ids if positions is None else positions,
    )
    labels = packed.shift_labels.reshape(-1)[packed.source]
    logps = completion_logps(model, hidden.last_hidden_state, packed.source, labels)
    out = logps.new_zeros(packed.batch_shape[0] * packed.batch_shape[1]).scatter(0, packed.target, logps)
    return out.view(packed.batch_shape), packed_mask_bytes(packed, attention)


def parameter_gradients(model, logps_of, weights: torch.Tensor) -> list[torch.Tensor | None]:
    """The parameters' gradients of ``(logps_of() * weights).sum()`` (a linear loss of the log-probs, as GRPO's is),
    copied out; the model's ``.grad`` left empty."""
    model.zero_grad(set_to_none=True)
    (logps_of() * weights).sum().backward()
    grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def gradient_agreement(model, logps_of, weights: torch.Tensor, reference: list[torch.Tensor | None]) -> dict:
    """How far this path's parameter gradients are from the stock path's: the whole gradient's relative difference
    (||g - g_stock|| / ||g_stock|| over every parameter) and the worst tensor's, and the cosine between the two."""
    model.zero_grad(set_to_none=True)
    (logps_of() * weights).sum().backward()
    diff_sq = ref_sq = dot = got_sq = 0.0
    worst = 0.0
    for param, ref in zip(model.parameters(), reference, strict=True):
        got = param.grad
        if ref is None or got is None:
            continue
        ref32, got32 = ref.double(), got.double()  # float64 sums: a cosine of 1 + 2e-6 is rounding
        d = (got32 - ref32).norm().item()
        r = ref32.norm().item()
        diff_sq, ref_sq, got_sq, dot = diff_sq + d * d, ref_sq + r * r, got_sq + got32.norm().item() ** 2, (
            dot + (got32 * ref32).sum().item())  # fmt: skip
        worst = max(worst, d / max(r, 1e-12))
    model.zero_grad(set_to_none=True)
    return {
        "grad_rel_diff": diff_sq**0.5 / max(ref_sq**0.5, 1e-12),
        "grad_worst_tensor_rel_diff": worst,
        "grad_cosine": dot / max((ref_sq * got_sq) ** 0.5, 1e-30),
    }


def measure(run, repeats: int, device: torch.device) -> dict:
    """Seconds (median) and peak memory of ``run()``, after a warm-up that also compiles what needs compiling."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    run()
    seconds = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    return {"seconds": round(statistics.median(seconds), 4), "peak_mib": None if peak is None else round(peak, 1)}


def failure(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error)[:400]}"


def check_setting(
    model, prompt_len: int, completion_len: int, group: int, repeats: int, device, planted: bool = False
) -> dict:
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(5, vocab, (1, prompt_len), device=device).expand(group, -1)
    input_ids = torch.cat([prompt, torch.randint(5, vocab, (group, completion_len), device=device)], 1)
    weights = torch.randn(group, completion_len, device=device)  # a linear loss of the log-probs, as GRPO's is
    backward_flex = device.type != "cpu"  # torch has no FlexAttention backward on CPU

    stock_paths = {"stock_sdpa": "sdpa"}
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        stock_paths["stock_flash"] = "flash_attention_2"
    paths: dict[str, dict] = {}
    with torch.no_grad():
        reference = stock_logps(model, input_ids, completion_len, "sdpa")
        for name in PACKED + (PLANTED if planted else ()):
            try:
                logps, nbytes = packed_logps(model, input_ids, completion_len, name)
            except Exception as error:  # one path failing (a kernel that does not compile) must not cost the others
                paths[name] = {"error": failure(error)}
                continue
            diff = (logps - reference).abs()
            paths[name] = {"mask_bytes": nbytes, "logp_mean_abs_diff": diff.mean().item(),
                           "logp_max_abs_diff": diff.max().item()}  # fmt: skip

    # The gradients: what GRPO's update follows. A wrong backward through a mask (flex's block-sparse kernel above
    # all) would leave the forward log-probs equal and the update wrong.
    grad_paths = [name for name in PACKED + (PLANTED if planted else ())
                  if "error" not in paths[name] and (backward_flex or name != "flex")]  # fmt: skip
    if grad_paths:
        reference_grads = parameter_gradients(model, lambda: stock_logps(model, input_ids, completion_len, "sdpa"),
                                              weights)  # fmt: skip
        for name in grad_paths:
            try:
                paths[name] |= gradient_agreement(model, lambda name=name: packed_logps(
                    model, input_ids, completion_len, name)[0], weights, reference_grads)  # fmt: skip
            except Exception as error:
                paths[name]["gradient_error"] = failure(error)
                model.zero_grad(set_to_none=True)
        del reference_grads
    for name in PACKED:
        if name not in grad_paths and "error" not in paths[name]:
            paths[name]["gradient"] = "not compared: torch has no FlexAttention backward on CPU"

    for name in PLANTED:
        if name in paths:
            paths[f"{name} (not timed)"] = paths.pop(name)
    if repeats == 0:  # agreement only
        return {"prompt_tokens": prompt_len, "completion_tokens": completion_len, "group_size": group, "paths": paths}

    def training_pass(logps_of, backward: bool = True):
        def run():
            if not backward:
                with torch.no_grad():
                    logps_of()
                return
            (logps_of() * weights).sum().backward()
            model.zero_grad(set_to_none=True)

        return run

    for name, implementation in stock_paths.items():
        run = training_pass(lambda implementation=implementation: stock_logps(model, input_ids, completion_len,
                                                                            implementation))  # fmt: skip
        paths[name] = {"mask_bytes": 0, **measure(run, repeats, device)}
    for name in PACKED:
        if "error" in paths[name]:
            continue
        backward = backward_flex or name != "flex"
        run = training_pass(lambda name=name: packed_logps(model, input_ids, completion_len, name)[0], backward)
        try:
            paths[name] |= {**measure(run, repeats, device), "pass": "forward+backward" if backward else "forward"}
        except Exception as error:
            paths[name]["error"] = failure(error)
            model.zero_grad(set_to_none=True)
        print(f"P={prompt_len} {name}: {paths[name]}", flush=True)
    stock = paths["stock_sdpa"]
    # ratios only between passes of the same kind (a forward-only flex pass on CPU has none)
    same = [name for name in PACKED if paths[name].get("pass") == "forward+backward"]
    ratios = {f"time_ratio_{n}": round(stock["seconds"] / paths[n]["seconds"], 2) for n in same}
    if stock["peak_mib"]:
        ratios |= {f"memory_ratio_{n}": round(stock["peak_mib"] / paths[n]["peak_mib"], 2) for n in same}
    return {"prompt_tokens": prompt_len, "completion_tokens": completion_len, "group_size": group, **ratios,
            "paths": paths}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="Tiny model and lengths on CPU (fp32).")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--completion-tokens", type=int, default=256)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="Timed passes per path; 0: the agreement check only.")
    parser.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="bfloat16",
        help="float32: the paths' agreement without bf16's rounding (use with --repeats 0).",
    )
    parser.add_argument("--planted", action="store_true", help="Also measure planted layout bugs (PLANTED).")
    parser.add_argument("--out", default="benchmarks/results/shared_prefix_gpu.json")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, dtype, model_config = torch.device("cpu"), torch.float32, TINY
        args.prompt_tokens, args.completion_tokens, args.group_size, args.repeats = [200], 40, 4, 1
    else:
        if not torch.cuda.is_available():
            parser.error("no GPU here: run with --dry-run on CPU")
        device, dtype, model_config = torch.device("cuda"), getattr(torch, args.dtype), QWEN3_4B
    torch.manual_seed(0)
    config = Qwen3Config(**model_config, attn_implementation="sdpa")
    # built on the device in its dtype: a 4B model's fp32 random init on the host takes minutes of device time
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    results = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "model": "Qwen3-4B architecture, random init" if not args.dry_run else "tiny Qwen3, random init",
        "activation_checkpointing": True,
        "settings": [],
    }
    for prompt_len in args.prompt_tokens:  # written after each setting: a run cut short keeps what it measured
        setting = check_setting(
            model, prompt_len, args.completion_tokens, args.group_size, args.repeats, device, args.planted
        )
        results["settings"].append(setting)
        report(results, args.out)
    return results


if __name__ == "__main__":
    main()
