"""`memstate build-data --out`: all or nothing. A failed rebuild leaves the previous build byte-identical, a build
never replaces files of its names that a previous build did not write (without --overwrite), and never touches
files of other names."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from datasets import DatasetDict

from memstate.cli import main
from memstate.data_build.build import build_data, load_data_config
from memstate.errors import OutputUnwritable

ROOT = Path(__file__).resolve().parents[1]
FEVER = ROOT / "tests" / "fixtures" / "fever"
# A lone surrogate: valid JSON, but no UTF-8 file can hold the string it decodes to.
SURROGATE_CLAIM = (
    '{"id": 99001, "verifiable": "VERIFIABLE", "label": "SUPPORTS", "claim": "Tokyo \\ud800 is big.", '
    '"evidence": [[[1, 2, "Tokyo", 0]]]}'
)


def fever_source(tmp: Path, extra_line: str | None = None, skip_invalid: bool = False) -> Path:
    """A data YAML over FEVER's dev fixture (13 lines: a build in about a second), with ``extra_line`` appended."""
    src = tmp / "fever"
    if not src.exists():
        shutil.copytree(FEVER, src)
    lines = (FEVER / "shared_task_dev.jsonl").read_text(encoding="utf-8").splitlines()
    (src / "claims.jsonl").write_text("\n".join(lines + ([extra_line] if extra_line else [])) + "\n")
    cfg = tmp / "data.yaml"
    cfg.write_text(
        f"fever:\n  dir: {src}\n  claim_files: [claims.jsonl]\nshortcut_probe: warn\nseed: 0\n"
        f"skip_invalid: {str(skip_invalid).lower()}\n"
    )
    return cfg


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def build(capsys, cfg: Path, out: Path, *flags: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["--log-level", "ERROR", "build-data", "--config", str(cfg), "--out", str(out), *flags])
    return code, capsys.readouterr().err


def test_a_failed_rebuild_leaves_the_previous_build_byte_identical(tmp_path, capsys):
    out = tmp_path / "built"
    assert build(capsys, fever_source(tmp_path), out)[0] == 0
    before = digests(out)
    assert {"train.parquet", "test.jsonl", "manifest.json", "README.md"} <= set(before)
    assert any(name.startswith("hf/") for name in before)

    code, err = build(capsys, fever_source(tmp_path, SURROGATE_CLAIM), out)
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{tmp_path / 'fever' / 'claims.jsonl'}:14: field 'claim': lone surrogate U+D800" in err
    assert digests(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built", "data.yaml", "fever"]  # no staging folder left

    # The same record with --skip-invalid: skipped, listed, and the previous build replaced whole.
    assert build(capsys, fever_source(tmp_path, SURROGATE_CLAIM, skip_invalid=True), out)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["line"], s["kind"]) for s in manifest["skipped"]] == [(14, "invalid_record")]
    assert manifest["skipped"][0]["where"] == f"{tmp_path / 'fever' / 'claims.jsonl'}:14"  # as an error names it
    assert "lone surrogate" in manifest["skipped"][0]["reason"]
    assert set(digests(out)) == set(before) and digests(out) != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built", "data.yaml", "fever"]


def test_an_out_holding_files_of_the_builds_names_is_refused_without_overwrite(tmp_path, capsys):
    cfg = fever_source(tmp_path)
    out = tmp_path / "project"
    out.mkdir()
    (out / "README.md").write_text("my project\n")
    (out / "notes.txt").write_text("mine\n")
    mine = digests(out)

    code, err = build(capsys, cfg, out)
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{out}: --out holds README.md" in err and "--overwrite" in err
    assert digests(out) == mine

    assert build(capsys, cfg, out, "--overwrite")[0] == 0
    assert (out / "README.md").read_text().startswith("# memstate Instance dataset")
    assert (out / "notes.txt").read_text() == "mine\n"  # files of other names are never touched
    # Now it holds a previous build (beside notes.txt): a rebuild replaces it without --overwrite.
    (out / "train.jsonl").write_text("stale\n")
    assert build(capsys, cfg, out)[0] == 0
    assert (out / "train.jsonl").read_text() != "stale\n" and (out / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_files_of_other_names_are_kept_and_a_file_is_not_an_out_dir(tmp_path, capsys):
    cfg = fever_source(tmp_path)
    out = tmp_path / "runs"
    out.mkdir()
    (out / "data.yaml").write_text("kept\n")
    assert build(capsys, cfg, out)[0] == 0
    assert (out / "data.yaml").read_text() == "kept\n" and (out / "manifest.json").is_file()

    code, err = build(capsys, cfg, out / "data.yaml")
    assert code == 2 and "is not a directory" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("state", ["missing", "empty", "previous build"])
def test_a_build_that_fails_while_writing_leaves_out_as_it_was(tmp_path, capsys, monkeypatch, state):
    cfg = fever_source(tmp_path)
    out = tmp_path / "a" / "b"
    if state == "empty":
        out.mkdir(parents=True)
    elif state == "previous build":
        assert build(capsys, cfg, out)[0] == 0
    before = digests(out) if out.exists() else None

    def disk_full(*args, **kwargs):  # after the parquet and jsonl files of every split were written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DatasetDict, "save_to_disk", disk_full)
    kept = "the previous build is untouched" if state == "previous build" else "nothing was written there"
    with pytest.raises(OutputUnwritable, match=f"^{out}: cannot write the build: No space left on device; {kept}$"):
        build_data(load_data_config(cfg, progress=False), out)
    assert (digests(out) if out.exists() else None) == before
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ([] if state == "missing" else ["b"])


def test_a_file_size_limit_while_writing_is_one_line_and_the_previous_build_stays(tmp_path, capsys, monkeypatch):
    from datasets import Dataset

    cfg = fever_source(tmp_path)
    out = tmp_path / "built"
    assert build(capsys, cfg, out)[0] == 0
    before = digests(out)

    def too_large(*args, **kwargs):  # pyarrow's OSError carries no errno, only the text
        raise OSError("error writing to file: [Errno 27] File too large")

    monkeypatch.setattr(Dataset, "to_parquet", too_large)
    code, err = build(capsys, cfg, out)
    errors = [line for line in err.splitlines() if "error" in line]  # the inputs were read: their progress bars
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert f"{out}: cannot write the build: error writing to file: [Errno 27] File too large; the previous build" in err
    assert digests(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["built", "data.yaml", "fever"]  # no staging folder left


def test_a_parent_that_cannot_be_written_stages_inside_out(tmp_path, capsys, monkeypatch):
    import tempfile

    cfg = fever_source(tmp_path)
    out = tmp_path / "built"
    assert build(capsys, cfg, out)[0] == 0
    (out / "notes.txt").write_text("mine\n")
    real = tempfile.mkdtemp

    def read_only_parent(*args, dir=None, **kwargs):
        if Path(dir) == tmp_path:
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only_parent)
    (out / "train.jsonl").write_text("stale\n")
    assert build(capsys, cfg, out)[0] == 0
    assert (out / "train.jsonl").read_text() != "stale\n" and (out / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # the staging folder is gone


def test_out_dot_is_filled_in_place_not_renamed_away(tmp_path, capsys, monkeypatch):
    cfg = fever_source(tmp_path)
    here = tmp_path / "project"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    assert build(capsys, cfg, Path("."))[0] == 0
    assert build(capsys, cfg, Path("."))[0] == 0  # a previous build in the working directory: replaced in place
    assert here.stat().st_ino == inode and (here / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.yaml", "fever", "project"]
