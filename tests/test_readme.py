"""README.md and the docs/ pages are executable.

Default suite (fast): every shell block of README.md and of the docs/ pages (``readme_blocks.DOCS``) is tagged with
a known reason if it does not run, and parses (``bash -n``); the README starts with the two set-up commands and CI
runs the second; the README stays a map (at most ``README_MAX_LINES`` lines) linking every docs/ page.

``pytest -m readme`` (its own CI step): every runnable block runs, in order (README.md, then the pages of
``readme_blocks.DOCS``), with ``bash -e`` in a fresh copy of the
repository (tracked and untracked-but-not-ignored files: no ``runs/``, no data built before), with the venv activated
the way the README tells the user to (``source .venv/bin/activate``; the venv itself is this checkout's, linked in,
since ``make setup`` is what CI's earlier steps already did). Blocks tagged ``gpu``, ``data`` or ``long`` are only
syntax-checked (``readme_blocks.SYNTAX_ONLY`` says why); ``server`` blocks run with their servers
(``server_blocks.run_server_block``; the vLLM venv must exist). The Hub is off (``HF_HUB_OFFLINE=1``): nothing a README
command needs may come from it. After the demo block, the README's demo figures must match the fresh run's summary
within the bands of tests/demo_tolerance.py (derived there from the run's own spread and the run-to-run spread
measured by benchmarks/demo_spread.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from demo_tolerance import completions_per_step, demo_figures, measured_spread, moved
from readme_blocks import DEMO_SECTION, DOC_PAGES, README, ROOT, SERVER, SYNTAX_ONLY, TEST_COMMAND, shell_blocks
from server_blocks import run_server_block

BLOCKS = shell_blocks()
README_MAX_LINES = 250


def bash_parses(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)


def test_readme_has_runnable_and_syntax_only_blocks():
    assert sum(b.runs for b in BLOCKS) >= 5 and any(not b.runs for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_every_shell_block_is_tagged_and_parses(block):
    known = sorted([*SYNTAX_ONLY, SERVER])
    assert block.tag is None or block.tag in known, f"{block}: unknown tag (known: {known})"
    proc = bash_parses(block.code)
    assert proc.returncode == 0, f"{block} does not parse:\n{proc.stderr}"


def test_docs_pages_run_in_a_fixed_order_and_each_is_linked_from_the_readme():
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(p.name for p in DOC_PAGES) == pages, "readme_blocks.DOCS must name every docs/*.md page"
    links = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", README.read_text()))
    missing = [f"docs/{name}" for name in pages if f"docs/{name}" not in links]
    assert not missing, f"README.md links no {missing}"
    assert any(b.path.startswith("docs/") and b.runs for b in BLOCKS)
    # README's "Documentation" list names the pages in the order their blocks run
    listed = re.search(r"^## Documentation\n(.*?)(?=^## |\Z)", README.read_text(), re.M | re.S)
    assert listed, "README.md lacks its Documentation section"
    order = re.findall(r"^- \[docs/(\w+)\.md\]", listed.group(1), re.M)
    assert order == [p.stem for p in DOC_PAGES], f"README's Documentation list {order} is not readme_blocks.DOCS"


def test_readme_is_a_map_of_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the details belong in docs/"


def test_readme_starts_with_the_two_setup_commands_and_ci_runs_the_test_one():
    first = BLOCKS[0]
    assert first.path == "README.md"
    assert README.read_text().lstrip().startswith("# memstate\n\n```bash\n")
    commands = [line.split("#")[0].strip() for line in first.code.splitlines()]
    assert commands == ["make demo", TEST_COMMAND]
    # .ci/run runs each command as a timed step: `step NAME BUDGET COMMAND...`
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [line.strip() for line in ci if line.strip().startswith("step ")]
    assert any(line.endswith(f" {TEST_COMMAND}") for line in steps), ".ci/run must run the README's test command"


def test_readme_holds_a_demo_section_in_the_summary_format():
    section = DEMO_SECTION.search(README.read_text())
    assert section, "README.md lacks the <!-- demo-summary --> section"
    assert "Durations on the machine that wrote this" in section.group(2)


# ---- pytest -m readme ------------------------------------------------------------------------------------------------


def _project_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory) -> Path:
    venv = ROOT / ".venv"
    if not (venv / "bin" / "memstate").is_file():
        pytest.fail("run `make setup` first: the README test uses this checkout's .venv")
    copy = tmp_path_factory.mktemp("readme") / "memstate"
    for rel in _project_files():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, copy / rel)  # mtimes kept: make sees .venv up to date with pyproject.toml
    (copy / ".venv").symlink_to(venv)
    return copy


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VIRTUAL_ENV"))}
    return env | {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}


@pytest.mark.readme
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_readme_block(block, fresh_copy):
    if not block.runs:
        assert bash_parses(block.code).returncode == 0
        return
    prelude = "set -euo pipefail\nsource .venv/bin/activate"
    if block.tag == SERVER:
        proc = run_server_block(block.commands, fresh_copy, _env(), prelude)
    else:
        proc = subprocess.run(["bash", "-c", f"{prelude}\n{block.commands}"], cwd=fresh_copy, env=_env(),
                              capture_output=True, text=True, timeout=45 * 60)  # fmt: skip
    output = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"{block} failed (exit {proc.returncode}):\n{block.commands}\n--- output ---\n{output}"
    if block.tag == SERVER:  # the requests were answered, not only sent: every reply is the API's JSON
        replies = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        assert replies and all("format_ok" in r and "rules" in r for r in replies), output


@pytest.mark.readme
def test_readme_demo_figures_match_the_fresh_run(fresh_copy):
    summary_md = fresh_copy / "runs" / "demo" / "summary.md"
    assert summary_md.is_file(), "the demo block did not write runs/demo/summary.md"
    summary = json.loads((summary_md.parent / "summary.json").read_text())
    run = fresh_copy / "runs" / "train" / "sycophancy_cpu"
    # Each figure within the band a rerun on another CPU may fill, derived in tests/demo_tolerance.py: counts exactly,
    # what no sampled state touches within one instance, sampled figures within the wider of 1.96·√2 SE of the fresh
    # run's own spread (a gain by its bootstrap CI, a rate by its binomial SE) and t·√2·s of the run-to-run spread that
    # benchmarks/demo_spread.py measured (another CPU trains another policy); durations are not compared.
    per_step = completions_per_step(fresh_copy / "configs" / "train" / "sycophancy_cpu.yaml")
    spread = measured_spread(fresh_copy / "benchmarks" / "results" / "demo_spread.json")
    rules = demo_figures(summary, json.loads((run / "log_history.json").read_text()), per_step, spread)
    off = moved(DEMO_SECTION.search(README.read_text()).group(2), summary_md.read_text(), rules)
    hint = "regenerate it: python tests/readme_blocks.py --update runs/demo/summary.md (after make demo)"
    assert not off, "README's demo figures are not the fresh run's:\n" + "\n".join(off) + f"\n{hint}"
    # The demo's bar (issue 44): on unseen users the checkpoint's states raise the responder's accuracy over no state
    # and over self-guide, both CIs excluding 0, and it writes well-formed states about as often as in training.
    best_test = summary["test"]["best"]
    assert best_test["gain_ci95"][0] > 0 and best_test["gain_vs_self_guide_ci95"][0] > 0, best_test
    assert summary["best_test_format_rate_minus_peak_training"] >= -0.1, summary
    # best/ was chosen by the validation gain measured before every save (issue 41), logged at every eval_steps
    best = json.loads((run / "best.json").read_text())
    assert best["selected_by"] == "validation_gain", best
    assert all("validation_gain" in best["checkpoints"][str(step)] for step in range(25, 101, 25)), best
    # the last checkpoint (docs/training.md's --resume block takes the run on to 110): validated every 25 steps and at
    # the end
    last = max(int(p.name.split("-")[1]) for p in run.glob("checkpoint-*"))
    state = json.loads((run / f"checkpoint-{last}" / "trainer_state.json").read_text())
    expected = sorted({*range(25, last + 1, 25), last})
    assert [e["step"] for e in state["log_history"] if "eval_gain" in e] == expected
