"""Choosing the best checkpoint by validation gain, else by training reward (train/best.py), on a real TrainerState."""

import json

from transformers import TrainerControl, TrainerState, TrainingArguments

from memstate.train.best import BestCheckpointCallback


def test_each_save_is_scored_by_the_reward_since_the_previous_one_and_the_best_is_recorded(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), save_steps=20, max_steps=60, report_to=[], use_cpu=True)
    state, callback = TrainerState(), BestCheckpointCallback()
    rewards = {10: -0.9, 20: -0.1, 30: -0.5, 40: -0.4, 50: -0.2, 60: -0.3}
    best_at = {}
    for step in (20, 40, 60):
        state.log_history += [{"step": s, "reward": r} for s, r in rewards.items() if step - 20 < s <= step]
        state.log_history.append({"step": step, "loss": 1.0})  # entries without a reward are not counted
        state.global_step = step
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
        callback.on_save(args, state, TrainerControl())
        best_at[step] = (state.best_global_step, round(state.best_metric, 3))
    # windows: steps 1-20 -> -0.5, 21-40 -> -0.45, 41-60 -> -0.25
    assert best_at == {20: (20, -0.5), 40: (40, -0.45), 60: (60, -0.25)}
    assert state.best_model_checkpoint == str(tmp_path / "checkpoint-60")
    # the checkpoint's own trainer_state.json is brought up to date, so --resume from it knows the best so far
    saved = json.loads((tmp_path / "checkpoint-60" / "trainer_state.json").read_text())
    assert saved["best_global_step"] == 60 and saved["best_model_checkpoint"] == str(tmp_path / "checkpoint-60")


def test_a_worse_or_equal_later_checkpoint_does_not_replace_the_best(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), save_steps=10, max_steps=30, report_to=[], use_cpu=True)
    state, callback = TrainerState(), BestCheckpointCallback()
    for step, reward in ((10, -0.2), (20, -0.2), (30, -0.6)):
        state.log_history.append({"step": step, "reward": reward})
        state.global_step = step
        callback.on_save(args, state, TrainerControl())
    assert state.best_global_step == 10 and state.best_metric == -0.2
    assert state.best_model_checkpoint == str(tmp_path / "checkpoint-10")


def test_with_validation_each_save_is_scored_by_the_gain_measured_at_its_step(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), save_steps=10, max_steps=40, report_to=[], use_cpu=True)
    state, callback = TrainerState(), BestCheckpointCallback(by_validation=True)
    # training reward rises all along; the validation gain peaks at step 20; step 30 was saved without an evaluation
    gains = {10: 0.05, 20: 0.12, 30: None, 40: 0.08}
    for step, gain in gains.items():
        state.log_history.append({"step": step, "reward": step / 100})
        if gain is not None:
            state.log_history.append({"step": step, "eval_gain": gain, "eval_accuracy_state": 0.5})
        state.global_step = step
        callback.on_save(args, state, TrainerControl())
    assert (state.best_global_step, state.best_metric) == (20, 0.12)
    assert state.best_model_checkpoint == str(tmp_path / "checkpoint-20")
