"""The fenced shell blocks of README.md and the docs/ pages, as tests/test_readme.py runs them.

A block's info string is its language and, optionally, one tag saying why it is only syntax-checked:
```` ```bash ```` runs; ```` ```bash gpu ```` (and the other ``SYNTAX_ONLY`` tags) is checked with ``bash -n``.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The pages whose shell blocks run after README.md's, in this order: the order in which their runnable blocks can run
# (training.md's --resume needs the demo's run, evaluation.md's compare its checkpoints evaluated after the resume).
# README.md's "Documentation" list links them in the same order; every docs/*.md page must be named here.
DOCS = (
    "data",
    "data_fetch",
    "training",
    "shared_prefix",
    "reward",
    "evaluation",
    "memory",
    "serving",
    "sycophancy",
    "benchmarks",
    "development",
    "design",
)
DOC_PAGES = tuple(ROOT / "docs" / f"{name}.md" for name in DOCS)
SHELLS = {"bash", "sh", "shell"}
SYNTAX_ONLY = {
    "gpu": "needs GPUs, real weights or a cluster",
    "data": "needs the full public datasets (`memstate data fetch` downloads them: network, gigabytes)",
    "long": "runs for many minutes: the sycophancy experiment (`make check-all` runs its quick form, "
    "pytest -m experiment), the whole MemSyco-Bench ingest and the full retrieval sweep (their figures are in "
    "docs/), the test suites themselves (docs/development.md)",
    "slow": "minutes of CPU that the default suite covers on smaller data; `make check-all` runs it "
    "(MEMSTATE_README_SLOW=1)",
}
# Blocks tagged `slow` run when this is set (`make check-all`, .ci/run --full); otherwise they are syntax-checked.
RUN_SLOW = os.environ.get("MEMSTATE_README_SLOW") == "1"
# Runs with its servers (tests/server_blocks.py): each `memstate serve` line starts in the background and is waited
# for, the block's other lines run against it, the servers stop. Needs the vLLM venv (`make vllm-venv`).
SERVER = "server"
# The suite this test belongs to: CI runs it as its own step (.ci/run), so the README test does not recurse into it.
TEST_COMMAND = "make test"
# A fence may be indented (a block inside a list item); its closing fence has the same indentation.
_FENCE = re.compile(r"^([ \t]*)```(\S*)[ \t]*(.*?)\n(.*?)^\1```[ \t]*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    language: str
    tag: str | None
    code: str

    @property
    def runs(self) -> bool:
        return self.tag in (None, SERVER) or (self.tag == "slow" and RUN_SLOW)

    @property
    def commands(self) -> str:
        """The code without the test-suite command (see ``TEST_COMMAND``)."""
        return "".join(
            line for line in self.code.splitlines(keepends=True) if line.split("#")[0].strip() != TEST_COMMAND
        )

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.tag or 'run'})"


def file_blocks(text: str, path: str = "README.md") -> list[Block]:
    """The shell blocks of one Markdown text, in order."""
    blocks = []
    for m in _FENCE.finditer(text):
        if m.group(2) in SHELLS:
            line = text.count("\n", 0, m.start()) + 1
            blocks.append(Block(path, line, m.group(2), m.group(3).strip() or None, m.group(4)))
    return blocks


def shell_blocks() -> list[Block]:
    """The shell blocks of README.md, then of each page of ``DOCS``, in the order they run."""
    return [
        block
        for page in (README, *DOC_PAGES)
        for block in file_blocks(page.read_text(), page.relative_to(ROOT).as_posix())
    ]


DEMO_SECTION = re.compile(r"(<!-- demo-summary: begin -->\n)(.*?)(<!-- demo-summary: end -->)", re.S)


def update_demo_section(summary_md: Path) -> None:
    """Replace README.md's demo section with a demo run's summary.md (``make demo`` writes runs/demo/summary.md)."""
    text = README.read_text()
    if not DEMO_SECTION.search(text):
        raise SystemExit("README.md has no <!-- demo-summary: begin --> ... <!-- demo-summary: end --> section")
    README.write_text(DEMO_SECTION.sub(lambda m: m.group(1) + summary_md.read_text() + m.group(3), text))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--update":
        raise SystemExit("usage: python tests/readme_blocks.py --update runs/demo/summary.md")
    update_demo_section(Path(sys.argv[2]))
    print(f"README.md: demo section now holds {sys.argv[2]}")
