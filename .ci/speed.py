"""How much slower this machine is than the one CI's step budgets were measured on: prints a factor, never below 1.

.ci/run scales every step's budget by it, so a machine 2.5x slower gets 2.5x the time before a step counts as too
slow. The workload is what CI's steps spend their time on, on one core: small torch ops (a tiny model's matmuls and
element-wise ops) and plain Python (tokenising, parsing, the test suite's own code). Best of three, ~3 s here.
"""

import time

import torch

# Best of three on the budgets' machine (2-core x86 dev machine, nothing else running, 2026-12-08: 0.66-0.95 s
# from process to process; the upper end, so that this machine reads 1).
REFERENCE_S = 0.90


def workload() -> float:
    start = time.perf_counter()
    a = torch.randn(128, 128)
    for _ in range(3000):
        a = torch.tanh(a @ a.T * 0.01) + 0.5
    total = 0
    for i in range(3_000_000):
        total += (i * 7) % 13
    assert total > 0
    return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    best = min(workload() for _ in range(3))
    print(f"{max(1.0, best / REFERENCE_S):.2f}")


if __name__ == "__main__":
    main()
