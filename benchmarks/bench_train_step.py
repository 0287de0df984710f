"""The training pass of one GRPO micro-batch, TRL's per-completion path vs the shared-prefix path (dense, flex, split).

    python benchmarks/bench_train_step.py [--settings 2048:128:8 8192:512:8 ...] [--repeats 3]
    python benchmarks/bench_train_step.py --smoke --out /tmp/bench_train_step.json  # seconds: a check

One micro-batch is one group: a prompt of P random tokens and G completions of R tokens each (all scored). The pass
is what a GRPO step does with it on the policy side: the reference log-probs (a no-grad forward; the policy's own
weights stand in for the reference model), then TRL's GRPO loss (``_compute_loss``: forward with entropies, clipped
ratio, KL) and its backward. All paths run through ``SharedPrefixGRPOTrainer._get_per_token_logps_and_entropies``:
"stock" with the shared-prefix path switched off (TRL's own method); "dense", "flex" and "split" with it on (first-use
check off), its packed rows given their attention pattern as a dense (L x L) mask, as a FlexAttention block mask, or
as split attention (the prompt and the completions in separate SDPA calls, no row mask; ``train/packing.py``). torch
has no FlexAttention backward on CPU: there "flex" runs the reference forward with the block mask and the loss's
forward/backward with split attention (what the trainer does on CPU); the GPU check (``benchmarks/gpu/``) times
flex's backward. ``mask_bytes``: what the path hands the layers as their mask per micro-batch (stock: TRL's 2-D
padding mask; split: its index tensors and per-row completion masks).

The model is a random-init Qwen3 wider than the test models (hidden 512, 4 layers, 8 query / 4 KV heads of 64,
MLP 1536, fp32, SDPA) with the tiny test tokenizer (1,024 tokens, so the LM head is a small share of the work; on
CPU TRL's fused head scores every position, on CUDA only the scored ones). Each (setting, path) runs in a fresh
process: time is the median of ``--repeats`` passes after one warm-up pass (one pass where a stock pass encodes over
32k tokens: minutes each here); peak memory is the growth of the process's peak resident set (``ru_maxrss``) over its
resident set just before the warm-up pass. Each row records when it was measured and the machine's load then
(``--update`` re-measures some settings and keeps the other rows). Tokens are the positions the policy's forwards
encode. Ratios are stock / the path the trainer takes by default here (``shared_prefix_attention: auto``: flex on
CUDA, split on CPU).

Writes ``benchmarks/results/bench_train_step.json``.

``--smoke`` runs the same code at a size that finishes in seconds: one setting, P 64, R 16, G 2, every path, one
timed pass after the warm-up, on a narrower model (hidden 128, 2 layers, 4 query / 2 KV heads of 32, MLP 384); its
JSON says ``"smoke": true`` and goes to ``--out`` (default: the system's temporary directory).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import default_out, report

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("stock", "dense", "flex", "split")
LONG = 32_768
DEFAULT = "split"  # shared_prefix_attention "auto" on CPU (no FlexAttention backward there)
MODEL = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
}
# --smoke's model: the same architecture, narrower and shallower
SMOKE_MODEL = MODEL | {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "head_dim": 32}  # fmt: skip


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(args: argparse.Namespace) -> None:
    from memstate.threads import configure_threads

    configure_threads()
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
    from trl import GRPOConfig

    from memstate.train.packing import FLEX_BLOCK, pack_groups, packed_mask_bytes
    from memstate.train.shared_prefix import SharedPrefixConfig, SharedPrefixGRPOTrainer

    prompt_len, completion_len, group = args.setting
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    torch.manual_seed(0)
    shape = SMOKE_MODEL if args.smoke else MODEL
    config = Qwen3Config(vocab_size=len(tokenizer), max_position_embeddings=8192, tie_word_embeddings=True, **shape)
    model_dir = tempfile.mkdtemp()
    Qwen3ForCausalLM(config).save_pretrained(model_dir)  # TRL loads the reference model from the same path
    trainer = SharedPrefixGRPOTrainer(
        model=model_dir,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=GRPOConfig(
            output_dir=tempfile.mkdtemp(),
            use_cpu=True,
            bf16=False,
            report_to="none",
            beta=0.001,
            per_device_train_batch_size=group,
            num_generations=group,
            max_completion_length=completion_len,
        ),  # fmt: skip
        train_dataset=Dataset.from_list([{"prompt": "x"}] * group),
        processing_class=tokenizer,
        shared_prefix=SharedPrefixConfig(check="off", attention="dense" if args.path == "stock" else args.path),
    )
    if args.path == "stock":
        trainer.shared_prefix_reason = "benchmark: TRL's path"
    trainer.current_gradient_accumulation_steps = 1
    model = trainer.model
    model.train()
    vocab = len(tokenizer)
    prompt = torch.randint(5, vocab, (1, prompt_len)).expand(group, -1)
    completions = torch.randint(5, vocab, (group, completion_len))
    input_ids = torch.cat([prompt, completions], 1)
    attention_mask = torch.ones_like(input_ids)
    inputs = {
        "prompt_ids": prompt,
        "prompt_mask": attention_mask[:, :prompt_len],
        "completion_ids": completions,
        "completion_mask": attention_mask[:, prompt_len:],
        "advantages": torch.randn(group),
        "num_items_in_batch": torch.tensor(group * completion_len),
    }

    if args.path == "stock":
        mask_bytes = attention_mask.numel() * attention_mask.element_size()
    else:
        flex = args.path == "flex"
        packed = pack_groups(
            input_ids, attention_mask, completion_len, tokenizer.pad_token_id, FLEX_BLOCK if flex else 1
        )
        mask_bytes = packed_mask_bytes(packed, args.path)
        del packed

    def training_pass() -> None:
        with torch.no_grad():
            inputs["ref_per_token_logps"] = trainer._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion_len
            )[0]
        trainer._compute_loss(model, inputs).backward()
        model.zero_grad(set_to_none=True)

    before = rss_mib()
    training_pass()  # warm-up; its peak is the pass's peak
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        training_pass()
        seconds.append(time.perf_counter() - start)
    tokens = group * (prompt_len + completion_len)
    ratio = trainer._metrics["train"].get("shared_prefix/token_ratio")
    if ratio:
        tokens = round(tokens / ratio[-1])
    result = {"seconds": round(statistics.median(seconds), 3), "peak_mib": round(peak, 1), "tokens": tokens}
    print(json.dumps(result | {"mask_bytes": mask_bytes}))


def run_child(setting: tuple[int, int, int], path: str, tokenizer: Path, repeats: int, smoke: bool = False) -> dict:
    command = [sys.executable, __file__, "--child", path, "--setting", ":".join(map(str, setting)),
               "--tokenizer", str(tokenizer), "--repeats", str(repeats), *(["--smoke"] if smoke else [])]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"{path} {setting} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def parse_setting(text: str) -> tuple[int, int, int]:
    prompt, completion, group = (int(x) for x in text.split(":"))
    return prompt, completion, group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--settings",
        nargs="+",
        type=parse_setting,
        default=None,
        help="P:R:G (prompt tokens, completion tokens, group size); default 8192:512:8 8192:128:8 2048:512:8 "
        "2048:128:8 (--smoke: 64:16:2)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (--smoke: 1)")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/bench_train_step.json (--smoke: /tmp)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    parser.add_argument("--update", action="store_true", help="Keep --out's rows for the settings not measured now.")
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--setting", type=parse_setting, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="seconds, the same code: see the module docstring")
    args = parser.parse_args()
    if args.child:
        args.path = args.child
        child(args)
        return
    args.settings = args.settings or (
        [(64, 16, 2)] if args.smoke else [(8192, 512, 8), (8192, 128, 8), (2048, 512, 8), (2048, 128, 8)]
    )
    args.repeats = args.repeats or (1 if args.smoke else 3)
    args.out = args.out or default_out("bench_train_step.json", args.smoke)

    from memstate.tiny_models import build_tiny_models

    models = build_tiny_models(Path(tempfile.mkdtemp()) / "tiny")
    settings = []
    for setting in args.settings:
        prompt, completion, group = setting
        # a stock pass of more than LONG tokens takes minutes here: one timed pass after the warm-up
        repeats = args.repeats if group * (prompt + completion) <= LONG else 1
        paths = {path: run_child(setting, path, models["policy"], repeats, args.smoke) for path in args.paths}
        row = {"prompt_tokens": prompt, "completion_tokens": completion, "group_size": group, "repeats": repeats}
        row |= {"measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg": os.getloadavg()}
        row["default"] = DEFAULT
        stock, default = paths.get("stock"), paths.get(DEFAULT)
        if stock and default:
            row |= {
                "time_ratio": round(stock["seconds"] / default["seconds"], 2),
                "memory_ratio": round(stock["peak_mib"] / default["peak_mib"], 2),
                "tokens_ratio": round(stock["tokens"] / default["tokens"], 2),
            }
        if "dense" in paths and "flex" in paths:
            row["flex_mask_share"] = round(paths["flex"]["mask_bytes"] / paths["dense"]["mask_bytes"], 5)
        row |= paths
        print(json.dumps(row), flush=True)
        settings.append(row)
    if args.update and Path(args.out).is_file():  # re-measured settings replace their rows; the others stay
        measured = {(r["prompt_tokens"], r["completion_tokens"], r["group_size"]) for r in settings}
        kept = [r for r in json.loads(Path(args.out).read_text())["settings"]
                if (r["prompt_tokens"], r["completion_tokens"], r["group_size"]) not in measured]  # fmt: skip
        settings = kept + settings
    report(
        {
            **({"smoke": True} if args.smoke else {}),
            "settings": settings,
            "model": (SMOKE_MODEL if args.smoke else MODEL)
            | {"vocab_size": 1024, "dtype": "float32", "attention": "sdpa"},
            "flex_on_cpu": "reference forward with the block mask; loss forward/backward split (no CPU flex backward)",
            "repeats": args.repeats,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        },
        args.out,
    )


if __name__ == "__main__":
    main()
