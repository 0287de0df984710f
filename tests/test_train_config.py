"""Production config: validated on CPU by --dry-run, with its batch arithmetic asserted."""

import json
import re
import shutil
from pathlib import Path

import pytest

from memstate.cli import main
from memstate.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
QWEN = ROOT / "configs" / "train" / "qwen3_4b_8gpu.yaml"


def test_dry_run_of_the_production_config_prints_its_arithmetic(tiny_models, fever_data, capsys):
    # The hub ids of the real models cannot be fetched here: the tiny tokenizer and the fixture data stand in.
    main(["train", "--config", str(QWEN), "--dry-run", "--world-size", "8",
          "--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data)])  # fmt: skip
    report = dict(line.split(None, 1) for line in capsys.readouterr().out.strip().splitlines())
    n_train = int(report["train_instances"])
    assert n_train > 100
    assert report["world_size"] == "8" and report["num_generations"] == "8"
    assert report["prompts_per_generation"] == "512" and report["completions_per_generation"] == "4096"
    assert report["completions_per_micro_batch"] == "128"  # 16 per device x 8 GPUs
    assert report["completions_per_optimizer_step"] == "1024"  # x 8 accumulation steps
    assert report["optimizer_steps_per_generation"] == "4"
    rounds = -(-n_train * 8 // 4096)
    assert report["optimizer_steps_per_epoch"] == str(4 * rounds)
    assert report["total_rollouts"] == str(4096 * rounds)
    assert report["max_prompt_tokens"] == "8192" and report["max_completion_length"] == "512"
    assert int(report["prompt_tokens_max"]) >= int(report["prompt_tokens_p50"]) > 100
    # The colocated rollout engine: its context is the prompt + completion budget, and its memory settings.
    assert report["vllm"] == "colocate" and report["vllm_max_model_length"] == str(8192 + 512)
    assert report["vllm_gpu_memory_utilization"] == "0.3" and report["vllm_enable_sleep_mode"] == "True"
    # KV cache of the tiny stand-in: 2 layers x 1 KV head x head_dim 64 x (K, V) x 2 bytes = 0.5 KiB a token
    assert report["kv_cache_kib_per_token"] == "0.5" and float(report["kv_cache_mib_per_sequence_at_context"]) == 4.2
    # The shared-prefix mask at the data's median prompt: dense bytes vs a FlexAttention block mask's
    pattern = r"auto \(flex on CUDA, split on CPU\): dense [\d.]+ MiB, split [\d.]+ MiB, flex block mask \d+ KiB"
    assert re.fullmatch(pattern, report["shared_prefix_attention"])
    # Validation: the fixture's 18 validation instances (below the config's 512) x 4 states, answer flow doubling it
    assert report["validation"].startswith("18 validation instances x 4 states every 50 steps")
    assert report["validation_responder_prompts"].startswith("144 per evaluation")


def _dry_run_report(capsys, *args: str) -> dict[str, str]:
    assert main(["train", "--config", str(QWEN), "--dry-run", "--world-size", "8", *args]) == 0
    return dict(line.split(None, 1) for line in capsys.readouterr().out.strip().splitlines())


def test_dry_run_reports_the_baseline_cache_for_the_split(tiny_models, fever_data, tmp_path, capsys):
    from memstate.data import load_split
    from memstate.reward.cache import BaselineCache, CacheKey
    from memstate.reward.responder_score import Judgement

    tiny = ["--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data)]
    cache = tmp_path / "baselines.sqlite"
    # Training asks for the train split's baselines and, as it validates, the validation split's.
    total = len(load_split(fever_data, "train")) + len(load_split(fever_data, "validation"))
    report = _dry_run_report(capsys, *tiny, "--baseline_cache", str(cache))
    # with the Hub on here, the offline check still says what the nodes would lack
    offline_check = report["models_local"]
    assert offline_check.startswith("MISSING: responder Qwen/Qwen3-8B") and "is not set here" in offline_check
    assert (
        report["baseline_cache"].startswith(f"{cache}: missing")
        and "--precompute-baselines" in report["baseline_cache"]
    )
    assert report["baseline_cache_missing"] == str(total)
    train = load_split(fever_data, "train")
    db = BaselineCache(cache)
    served = "Qwen/Qwen3-8B|{}|root=Qwen/Qwen3-8B"  # an identity as a served responder gives it
    db.put_many({CacheKey(f"d{i}", inst.id, served, "v", "likelihood"): Judgement(0.5, True)
                 for i, inst in enumerate(train[:5])})  # fmt: skip
    db.put_many({CacheKey("other-mode", train[5].id, served, "v", "exact"): Judgement(1.0, True)})
    db.put_many(
        {CacheKey("other-responder", train[6].id, "Qwen/Qwen3-8B-FP8|{}", "v", "likelihood"): Judgement(1.0, True)}
    )
    db.close(self_contained=True)
    report = _dry_run_report(capsys, *tiny, "--baseline_cache", str(cache), "--score_mode", "likelihood")
    assert report["baseline_cache"].startswith(
        f"{cache}: 5 of {total} instances have a likelihood baseline from Qwen/Qwen3-8B"
    )
    assert report["baseline_cache_missing"] == str(total - 5)
    (tmp_path / "baselines.sqlite-wal").write_bytes(b"")
    report = _dry_run_report(capsys, *tiny, "--baseline_cache", str(cache), "--score_mode", "likelihood")
    assert "-wal next to it: unfinished" in report["baseline_cache"]


def test_dry_run_checks_offline_that_the_models_resolve_and_the_disk_holds_the_saves(
    tiny_models, fever_data, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    tiny = ["--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data),
            "--output_dir", str(tmp_path / "run")]  # fmt: skip
    local = [*tiny, "--responder_model", str(tiny_models["responder"])]
    report = _dry_run_report(capsys, *local)
    assert report["models_local"].startswith("ok: policy") and "responder" in report["models_local"]
    # The size of a save follows the parameter count: 16 bytes a parameter in bf16, 20 in float32 (the tiny model)
    params = int(report["policy_parameters"].replace(",", ""))
    size = float(report["checkpoint_size_per_save"].split()[0])
    assert report["checkpoint_size_per_save"].split()[1] == "MB"
    assert size == pytest.approx(params * 20 / 1e6, abs=0.06)
    assert "3 checkpoint(s) + 2 whole models" in report["disk_for_kept_saves"]  # save_total_limit 3; final/, best/
    assert "NOT ENOUGH" not in report["disk_for_kept_saves"]
    # The responder named by its Hub id is not in this HF_HOME: reported, and refused on the job's node
    report = _dry_run_report(capsys, *tiny)
    assert report["models_local"].startswith("MISSING: responder Qwen/Qwen3-8B is not in ")
    assert main(["train", "--config", str(QWEN), "--dry-run", "--world-size", "8", *tiny, "--launch-checks"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "HF_HUB_OFFLINE is set and responder Qwen/Qwen3-8B" in err[0], err
    # A disk that cannot hold the kept saves: reported, and refused on the job's node
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=1000))
    assert "NOT ENOUGH" in _dry_run_report(capsys, *local)["disk_for_kept_saves"]
    assert main(["train", "--config", str(QWEN), "--dry-run", "--world-size", "8", *local, "--launch-checks"]) == 2
    err = capsys.readouterr().err
    assert "free space, lower save_total_limit or set output_dir elsewhere" in err, err


def test_saves_between_evaluations_are_refused(tiny_models, fever_data, capsys):
    argv = ["train", "--config", str(QWEN), "--dry-run", "--world-size", "8", "--eval_steps", "20",
            "--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data)]  # fmt: skip
    assert main(argv) == 2
    assert "save_steps 50 is not a multiple of eval_steps 20" in capsys.readouterr().err
    assert main([*argv, "--eval_steps", "25"]) == 0  # every save falls on an evaluation
    assert main([*argv, "--eval_strategy", "no"]) == 0
    assert "off: best/ by training reward" in capsys.readouterr().out


def test_a_validation_subset_is_fixed_by_the_seed(fever_data, tmp_path):
    from memstate.train.validation import validation_instances

    full = validation_instances(str(fever_data), "validation", None, 0)
    a, b = (validation_instances(str(fever_data), "validation", 5, seed) for seed in (0, 0))
    assert [i.id for i in a] == [i.id for i in b] and len(a) == 5 and {i.id for i in a} < {i.id for i in full}
    assert [i.id for i in validation_instances(str(fever_data), "validation", 5, 1)] != [i.id for i in a]
    assert validation_instances(str(tmp_path), "validation", None, 0) is None  # data without the split
    with pytest.raises(ConfigError, match="validation_split"):
        validation_instances(str(fever_data), "valid", None, 0)


def test_dry_run_rejects_arithmetic_that_does_not_divide(tiny_models, fever_data, capsys):
    argv = ["train", "--config", str(QWEN), "--dry-run", "--world-size", "8", "--generation_batch_size", "4112",
            "--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data)]  # fmt: skip
    assert main(argv) == 2
    assert "per_device_train_batch_size x world size = 128" in capsys.readouterr().err


def test_dry_run_needs_the_data(tiny_models, tmp_path, capsys):
    assert main(["train", "--config", str(QWEN), "--dry-run", "--policy_model", str(tiny_models["policy"]),
                 "--data_dir", str(tmp_path)]) == 2  # fmt: skip
    assert "train.parquet" in capsys.readouterr().err


def test_colocated_vllm_without_a_context_length_is_refused(tiny_models, fever_data, capsys):
    # Unset, TRL hands vLLM the model's own maximum (262k tokens for Qwen3-4B-Instruct-2507): its KV cache would not
    # fit in vllm_gpu_memory_utilization of a GPU beside the trainer.
    argv = ["train", "--config", str(QWEN), "--dry-run", "--policy_model", str(tiny_models["policy"]),
            "--data_dir", str(fever_data), "--vllm_max_model_length", "null"]  # fmt: skip
    assert main(argv) == 2
    assert "set it to max_prompt_tokens + max_completion_length = 8704" in capsys.readouterr().err
    assert main([*argv[:-1], "8000"]) == 2
    assert "is below max_prompt_tokens 8192 + max_completion_length 512 = 8704" in capsys.readouterr().err


def test_sleep_mode_is_refused_on_cpu_before_anything_loads(tiny_models, tmp_path, capsys):
    argv = ["train", "--config", str(ROOT / "configs/train/tiny_cpu.yaml"),
            "--policy_model", str(tiny_models["policy"]), "--responder_model", str(tiny_models["responder"]),
            "--data_dir", str(tmp_path / "no-data"), "--use_vllm", "true", "--vllm_mode", "colocate",
            "--max_prompt_tokens", "2000", "--vllm_max_model_length", "4096",
            "--vllm_enable_sleep_mode", "true"]  # fmt: skip
    assert main(argv) == 2
    assert "no sleep mode on CPU" in capsys.readouterr().err


def test_the_configs_use_the_current_checkpointing_name_and_load_without_a_deprecation_warning(recwarn):
    # transformers 5.24 renamed gradient_checkpointing to activation_checkpointing and warns on the old name; 5.17 (the
    # vLLM venv's) knows only the old one, which the parser then reads the new name as.
    from memstate.train.config import parse_train_args

    for name, expected in (("qwen3_4b_8gpu.yaml", True), ("tiny_cpu.yaml", False)):
        text = (ROOT / "configs" / "train" / name).read_text()
        assert "\nactivation_checkpointing:" in text and "\ngradient_checkpointing:" not in text
        *_, config = parse_train_args(["--config", str(ROOT / "configs" / "train" / name), "--use_cpu", "true",
                                       "--bf16", "false"])  # fmt: skip
        assert config.gradient_checkpointing is expected
    *_, config = parse_train_args(["--config", str(QWEN), "--activation-checkpointing", "false", "--use_cpu", "true",
                                   "--bf16", "false"])  # fmt: skip
    assert config.gradient_checkpointing is False
    assert not [w for w in recwarn if "checkpointing" in str(w.message)], [str(w.message) for w in recwarn]


def test_dry_run_without_the_hub_checks_what_it_can_and_says_what_it_could_not(fever_data, capsys, monkeypatch):
    # A login node or CI: the production policy is a Hub id that is neither cached nor reachable.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", "/nonexistent-hf-home")
    assert main(["train", "--config", str(QWEN), "--dry-run", "--world-size", "8", "--data_dir", str(fever_data)]) == 0
    report = dict(line.split(None, 1) for line in capsys.readouterr().out.strip().splitlines())
    assert report["completions_per_optimizer_step"] == "1024" and report["vllm"] == "colocate"
    assert "Qwen/Qwen3-4B-Instruct-2507" in report["not_checked"] and "KV cache" in report["not_checked"]
    # the offline check: neither model resolves from this HF_HOME
    assert report["models_local"].startswith("MISSING: policy Qwen/Qwen3-4B-Instruct-2507 is not in ")
    assert "prompt_tokens_max" not in report and "kv_cache_kib_per_token" not in report


def test_dry_run_of_a_missing_local_policy_is_an_error(fever_data, tmp_path, capsys):
    argv = ["train", "--config", str(QWEN), "--dry-run", "--data_dir", str(fever_data),
            "--policy_model", str(tmp_path / "policy")]  # fmt: skip
    # A path, not a Hub id that may be out of reach: a typo there is an error, not "not checked".
    assert main(argv) == 2
    assert "policy_model" in capsys.readouterr().err


# --- launch arithmetic for the world sizes of a real cluster ----------------------------------------------------------


def trl_config_for(world_size: int, *overrides: str):
    """TRL's own GRPOConfig, built from the production YAML as if ``world_size`` processes were running (its
    ``__post_init__`` reads the world size from the live process group)."""
    from unittest import mock

    from trl import GRPOConfig

    from memstate.train.config import parse_train_args

    with mock.patch.object(GRPOConfig, "world_size", new_callable=mock.PropertyMock, return_value=world_size):
        return parse_train_args(["--config", str(QWEN), "--use_cpu", "true", "--bf16", "false", *overrides])[2]


@pytest.mark.parametrize("world_size", [4, 8, 16, 24, 32])
def test_dry_run_for_cluster_world_sizes_agrees_with_trl(world_size, tiny_models, fever_data, capsys):
    """Each world size either passes TRL's GRPOConfig with the derived settings, keeping 1,024 completions per step,
    or is refused in one line whose suggested setting then passes (and TRL would indeed have refused the original)."""
    base = ["train", "--config", str(QWEN), "--dry-run", "--policy_model", str(tiny_models["policy"]),
            "--data_dir", str(fever_data)]  # fmt: skip
    rc = main([*base, "--world-size", str(world_size)])
    out, err = capsys.readouterr()
    if rc == 0:
        report = dict(line.split(None, 1) for line in out.strip().splitlines())
        accumulation = int(report["gradient_accumulation_steps"])
        assert accumulation * 16 * world_size == 1024 == int(report["completions_per_optimizer_step"])
        trl = trl_config_for(world_size, "--gradient_accumulation_steps", str(accumulation))
        assert trl.generation_batch_size == 4096
        assert trl.steps_per_generation == accumulation * int(report["optimizer_steps_per_generation"])
        return
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "processes" in lines[0], err
    with pytest.raises(ValueError, match="must be divisible by the global batch size"):
        trl_config_for(world_size)  # TRL refuses the production settings at this size, after everything has loaded
    # The one line names a setting for this world size; that setting passes the dry run and TRL.
    fix = re.search(r"set completions_per_step (\d+) and generation_batch_size (\d+) for (\d+) processes", lines[0])
    assert fix and int(fix[3]) == world_size, lines[0]
    per_step, generation = fix[1], fix[2]
    assert main([*base, "--world-size", str(world_size), "--completions_per_step", per_step,
                 "--generation_batch_size", generation]) == 0  # fmt: skip
    report = dict(line.split(None, 1) for line in capsys.readouterr().out.strip().splitlines())
    trl = trl_config_for(world_size, "--generation_batch_size", generation,
                         "--gradient_accumulation_steps", report["gradient_accumulation_steps"])  # fmt: skip
    assert trl.generation_batch_size == int(generation)
    # And the process counts it lists keep the configured step.
    counts = [int(n) for n in re.search(r"use ([\d, ]+) processes", lines[0])[1].split(", ")]
    assert 24 not in counts and {4, 8, 16, 32} <= set(counts)


def test_accumulation_and_a_derived_step_cannot_both_be_set(tiny_models, fever_data, capsys):
    argv = ["train", "--config", str(QWEN), "--dry-run", "--world-size", "8", "--gradient_accumulation_steps", "4",
            "--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data)]  # fmt: skip
    assert main(argv) == 2
    assert "leave gradient_accumulation_steps unset" in capsys.readouterr().err


def test_flash_attention_is_refused_where_the_shared_prefix_path_must_not_fall_back(tiny_models, fever_data, capsys):
    argv = ["train", "--config", str(QWEN), "--dry-run", "--world-size", "8",
            "--model_init_kwargs", '{"attn_implementation": "flash_attention_2"}',
            "--policy_model", str(tiny_models["policy"]), "--data_dir", str(fever_data)]  # fmt: skip
    assert main([*argv, "--shared_prefix_attention", "dense"]) == 2
    assert "takes no 4-D mask" in capsys.readouterr().err
    assert main([*argv, "--shared_prefix_attention", "dense", "--shared_prefix_on_failure", "fallback"]) == 0
    assert main(argv) == 0  # auto: flex on the cluster's GPUs runs flex attention in the packed forward itself


def test_a_budget_beyond_the_policy_positions_is_refused_by_train_and_the_dry_run(tiny_models, fever_data, tmp_path,
                                                                                  capsys):  # fmt: skip
    # A policy of 4,096 positions (tiny-models' own responder architecture) under the production budget 8192 + 512.
    short = tmp_path / "short-policy"
    shutil.copytree(tiny_models["policy"], short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 4096}))
    expected = ("max_prompt_tokens 8192 + max_completion_length 512 = 8704 exceeds the policy's 4096 positions "
                f"({short}: max_position_embeddings); set max_prompt_tokens to at most 3584")  # fmt: skip
    dry = ["train", "--config", str(QWEN), "--dry-run", "--policy_model", str(short), "--data_dir", str(fever_data)]
    assert main(dry) == 2
    assert expected in capsys.readouterr().err
    run = ["train", "--config", str(ROOT / "configs/train/tiny_cpu.yaml"), "--policy_model", str(short),
           "--responder_model", str(tiny_models["responder"]), "--data_dir", str(fever_data),
           "--max_completion_length", "512", "--output_dir", str(tmp_path / "out")]  # fmt: skip
    assert main(run) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written
    assert main([*dry, "--max_prompt_tokens", "3584"]) == 0  # at the limit it runs
