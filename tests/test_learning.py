"""GRPO with the project's own reward (likelihood mode, frozen tiny responder) must beat an lr=0 control."""

import json
from pathlib import Path

import pytest

from memstate.data import load_split
from train.config import parse_train_args
from train.run import train
from train.warmup import format_warmup

ROOT = Path(__file__).resolve().parents[1]
TINY_CPU = ROOT / "configs" / "train" / "tiny_cpu.yaml"


def mean_reward(log_history: list[dict], first_step: int, last_step: int) -> float:
    values = [e["reward"] for e in log_history if "reward" in e and first_step <= e["step"] <= last_step]
    assert values, f"no reward logged between steps {first_step} and {last_step}"
    return sum(values) / len(values)


@pytest.mark.slow
def test_grpo_raises_reward_over_lr0_control(tiny_models, fever_data, tmp_path):
    args, config = parse_train_args(["--config", str(TINY_CPU)])
    steps, learning_rate = config.max_steps, config.learning_rate
    assert 100 <= steps <= 200 and learning_rate > 0
    # One shared warm-up, so both runs start from the very same policy.
    warm = format_warmup(
        str(tiny_models["policy"]),
        load_split(fever_data, "train"),
        tmp_path / "warm",
        steps=args.format_warmup_steps,
        learning_rate=args.format_warmup_learning_rate,
        seed=config.seed,
        use_cpu=True,
    )
    # With lr=0 the policy never changes, so the control's reward is stationary: 50 steps estimate it as well
    # as 150 would, at a third of the time.
    histories = {}
    for name, lr, max_steps in (("trained", learning_rate, steps), ("control", 0.0, 50)):
        out = tmp_path / name
        train(
            *parse_train_args(
                [
                    "--config", str(TINY_CPU),
                    "--policy_model", str(warm),
                    "--responder_model", str(tiny_models["responder"]),
                    "--data_dir", str(fever_data),
                    "--output_dir", str(out),
                    "--format_warmup_steps", "0",
                    "--learning_rate", str(lr),
                    "--max_steps", str(max_steps),
                    "--save_strategy", "no",
                    "--report_to", "none",
                ]
            )
        )  # fmt: skip
        histories[name] = json.loads((out / "log_history.json").read_text())

    trained = mean_reward(histories["trained"], steps - 49, steps)  # its last 50 steps
    control = mean_reward(histories["control"], 1, 50)
    start = mean_reward(histories["trained"], 1, 20)
    print(f"mean reward over 50 steps: trained (last) {trained:.3f}, lr=0 control {control:.3f}; start {start:.3f}")
    assert trained - control >= 0.1
    assert trained - start >= 0.05
