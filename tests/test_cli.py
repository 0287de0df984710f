from pathlib import Path

import pytest

from memstate.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("tiny-models", "--out"),
        ("build-data", "--config"),
        ("train", "--resume"),
        ("eval", "--checkpoint"),
        ("serve", "policy"),
        ("experiment sycophancy", "--quick"),  # its help strings hold "%", which argparse would %-format
        ("data fetch", "MEMSTATE_FETCH_BASE_URL"),  # the mirror override is documented in the help
    ],
)
def test_every_subcommand_has_help(command, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command.split(), "--help"])
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


def test_train_rejects_unknown_config_fields(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(
        "policy_model: p\nresponder_model: r\ndata_dir: d\noutput_dir: o\nuse_cpu: true\nnum_generationz: 4\n"
    )
    assert main(["train", "--config", str(config)]) == 2
    assert "unknown field(s) num_generationz (did you mean num_generations?)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", str(ROOT / "configs" / "train" / "tiny_cpu.yaml"), "--max-stepz", "3"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --max-stepz 3 (did you mean --max_steps?)" in capsys.readouterr().err


def test_a_group_that_runs_on_its_own_names_its_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["eval"])
    assert "memstate eval also has subcommands: compare, memsyco, sweep, retrieval" in capsys.readouterr().err


def test_eval_of_a_non_checkpoint_names_the_path(tmp_path, capsys):
    assert main(["eval", "--checkpoint", str(tmp_path)]) == 2
    assert str(tmp_path) in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["train"],
        ["reward", "precompute-baselines"],
        ["eval"],
        ["eval", "memsyco"],
        ["eval", "sweep"],
        ["memory", "ask"],
    ],
)
def test_responder_flags_are_spelled_the_same_everywhere(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = capsys.readouterr().out
    for flag in ("--responder_model", "--responder-model", "--responder_url", "--responder-url", "--score_mode"):
        assert flag in out, (command, flag)


def test_help_lists_every_command_without_importing_a_stage(capsys):
    import subprocess
    import sys

    code = "import sys; from memstate.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n" + (
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'trl', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")
    for name in ("tiny-models", "build-data", "train", "reward", "eval", "memory", "serve"):
        assert f"  {name} " in out


def _command_paths() -> list[list[str]]:
    from memstate.cli import COMMANDS

    return [[]] + [[c.name] for c in COMMANDS] + [[c.name, s.name] for c in COMMANDS for s in c.subcommands]


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "memstate")
def test_every_help_shows_an_example_that_parses(path, capsys, monkeypatch):
    """`--help` of the program, of every command and subcommand ends with copy-paste example lines; each of them is
    parsed by its command's own parser (from the repository root, where its paths are relative to)."""
    import shlex

    from memstate.cli import _parse, _resolve, _top_parser, command_parser

    with pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith("memstate ")]
    assert examples, f"`memstate {' '.join(path)} --help` shows no example:\n{text}"
    monkeypatch.chdir(ROOT)
    for example in examples:
        name, *rest = shlex.split(example)[1:]
        command, prog, argv = _resolve(_top_parser(), name, rest)
        if path:  # a command's help shows its own example (and its subcommands')
            assert prog.split()[1 : 1 + len(path)] == path, example
        _parse(command_parser(command, prog), argv)  # a parse error would exit 2
