"""``memstate serve policy`` before and around vLLM, without vLLM: the context it asks for never exceeds the model's
positions, and a server that dies at start ends the command in one error line carrying the end of vLLM's output.

(The real server: ``tests/test_serve_vllm.py``, marker ``vllm``.)"""

from __future__ import annotations

import json
import logging
import stat

import pytest

from memstate.checkpoint import CheckpointMetadata
from memstate.cli import main
from memstate.errors import ConfigError
from memstate.serve.policy import PolicyServerConfig, VLLMStartFailed, context_length, free_port, start, wait_healthy


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint whose trained budget (8192 + 128) is longer than its model's 4096 positions (the tiny policy)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 4096}))
    CheckpointMetadata("v", "policy", "responder", "likelihood", 8192, 128, "data").write(ckpt)
    return ckpt


def test_the_trained_budget_is_capped_at_the_models_positions(checkpoint, caplog):
    with caplog.at_level(logging.WARNING, logger="memstate.serve"):
        assert context_length(PolicyServerConfig(model=str(checkpoint))) == 4096
    assert "budget (8320 tokens) is longer than the model's 4096 positions" in caplog.text
    assert context_length(PolicyServerConfig(model=str(checkpoint), max_model_len=2048)) == 2048


def test_a_longer_context_asked_by_hand_is_refused_naming_both_numbers(checkpoint):
    with pytest.raises(ConfigError, match=r"^max_model_len 8192 is longer than the 4096 positions of "):
        context_length(PolicyServerConfig(model=str(checkpoint), max_model_len=8192))


@pytest.fixture
def dying_vllm(tmp_path):
    """An interpreter that prints what vLLM prints when it refuses a context, then exits 1."""
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        "echo 'INFO starting the engine'\n"
        "echo 'ValueError: User-specified max_model_len (8320) is greater than the derived max_model_len (4096)'\n"
        "exit 1\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_a_server_that_dies_at_start_is_one_error_with_the_end_of_its_output(checkpoint, dying_vllm):
    config = PolicyServerConfig(model=str(checkpoint), port=free_port(), vllm_python=str(dying_vllm))
    proc = start(config, cuda=False)
    with pytest.raises(VLLMStartFailed) as failed:
        wait_healthy(proc, f"http://127.0.0.1:{config.port}", timeout_s=30)
    assert "exited with code 1 before it became healthy" in str(failed.value)
    assert str(failed.value).endswith("is greater than the derived max_model_len (4096)")
    assert "(output not captured)" not in str(failed.value)


def test_the_command_ends_in_one_error_line_not_a_traceback(checkpoint, dying_vllm, capsys):
    argv = ["serve", "policy", "--model", str(checkpoint), "--port", str(free_port()), "--vllm_python",
            str(dying_vllm), "--start_timeout", "30"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("memstate serve policy: error: the vLLM server exited with code 1")
    assert "derived max_model_len (4096)" in err
