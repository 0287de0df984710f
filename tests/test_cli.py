import pytest

from memstate.cli import main


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("tiny-models", "--out"),
        ("build-data", "--config"),
        ("train", "--resume"),
        ("eval", "--checkpoint"),
        ("serve", "policy"),
    ],
)
def test_every_subcommand_has_help(command, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert expected in capsys.readouterr().out


def test_unknown_arguments_are_rejected_outside_train(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["build-data", "--config", "x", "--out", "y", "--bogus", "1"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--checkpoint", "x", "--bogus"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_train_rejects_unknown_config_fields(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(
        "policy_model: p\nresponder_model: r\ndata_dir: d\noutput_dir: o\nuse_cpu: true\nnum_generationz: 4\n"
    )
    with pytest.raises(ValueError, match="num_generationz"):
        main(["train", "--config", str(config)])


def test_eval_of_a_non_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        main(["eval", "--checkpoint", str(tmp_path)])
