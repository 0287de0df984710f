"""``memstate experiment world``: the sycophancy world's frozen responder and warmed-up policy, as ``make demo`` uses
them (shipped in ``examples/sycophancy_world/``).

The demo trains and evaluates a policy through the public commands in a few minutes; what takes longer (the world's
responder: ~10 minutes of SFT on 2 cores) is built once by this command and shipped, so the demo's figures are the
same on every machine. Steps, all from ``memstate.experiment.world``:

1. the data: ``memstate build-data --config configs/data/synthetic.yaml`` (the demo builds the same: ``world.json``
   records the instances' sha256 and the demo refuses another build);
2. a tokenizer fitted to the train split's text; random-init responder and policy;
3. the responder trained to fail like an LLM (``train_responder``), its iterate kept by the validation split;
4. the policy warmed up to write 2–4 rule shapes at random, never from the instance (``random_state_text``);
5. ``world.json``: every file's sha256, the data manifest's, the responder's measured behaviour on the test users
   (``responder_behaviour``), the settings and the command. ``tests/test_world_models.py`` checks the shipped files
   against it.

Rebuilding gives a responder of the same recipe, not the same bytes: another machine sums floating point in another
order (two runs on one machine gave identical responders; README, sycophancy experiment).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memstate.cli import main as memstate
from memstate.data import load_split
from memstate.errors import ConfigError
from memstate.parsing import StageParser
from memstate.responders.local import TransformersResponder
from memstate.tiny_models import tree_sha256

logger = logging.getLogger("memstate.experiment")

DATA_CONFIG = "configs/data/synthetic.yaml"
SHIPPED = Path("examples/sycophancy_world")
# Written by the trainers, not needed to load the models (training_args.bin is a pickle).
DROP = ("training_args.bin", "checkpoints")
SPLITS = ("train", "validation", "test")
CHECKED_INSTANCES = 240  # of the test split, re-measured by the test suite


@dataclass
class WorldConfig:
    out: str = field(default=str(SHIPPED), metadata={"help": "Where the responder, policy and world.json go."})
    data_dir: str = field(
        default="runs/data/synthetic", metadata={"help": f"Where the world's data is built ({DATA_CONFIG})."}
    )
    responder_steps: int = field(default=1200, metadata={"help": "Responder SFT steps (as the experiment's)."})
    warmup_steps: int = field(default=300, metadata={"help": "Policy warm-up steps (as the experiment's)."})
    seed: int = field(default=0, metadata={"help": "Seed of the models and their training."})


def instances_sha256(data_dir: str | Path) -> str:
    """sha256 of every split's instances as JSON, in order: the data itself, whatever parquet writer stored it."""
    digest = hashlib.sha256()
    for split in SPLITS:
        for inst in load_split(data_dir, split):
            digest.update(json.dumps(inst.to_dict(), sort_keys=True).encode() + b"\n")
    return digest.hexdigest()


def rounded(behaviour: dict) -> dict:
    return {k: None if v is None else round(v, 4) for k, v in behaviour.items()}


def check_world(world: Path, data_dir: Path) -> None:
    """A built world's models were made for one build of the data: refuse to use them with another."""
    record = world / "world.json"
    if not record.is_file():
        raise ConfigError(f"{record}: not found; build a world with memstate experiment world")
    expected, built = json.loads(record.read_text())["data_instances_sha256"], instances_sha256(data_dir)
    if built != expected:
        raise ConfigError(
            f"{data_dir}: its instances hash to {built}, but {world}'s models were made for the build hashing to "
            f"{expected} ({DATA_CONFIG}; the experiment's users and seed as the world was built with); rebuild the "
            "world: memstate experiment world"
        )


def build_world(cfg: WorldConfig) -> dict:
    from memstate.experiment.sycophancy import responder_behaviour
    from memstate.experiment.world import build_world_models, random_state_text, train_responder
    from memstate.train.warmup import format_warmup

    if not Path(DATA_CONFIG).is_file():
        raise ConfigError(f"{DATA_CONFIG}: not found; run memstate experiment world from the repository root")
    data_dir, out = Path(cfg.data_dir), Path(cfg.out)
    if not (data_dir / "manifest.json").is_file() and memstate(
        ["build-data", "--config", DATA_CONFIG, "--out", str(data_dir)]
    ):
        raise ConfigError(f"memstate build-data --config {DATA_CONFIG} failed")
    train_set, validation, test = (load_split(data_dir, s) for s in SPLITS)
    if out.exists():
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory() as work:
        inits = build_world_models(train_set, Path(work), seed=cfg.seed)
        train_responder(inits["responder"], train_set, validation, out / "responder", steps=cfg.responder_steps,
                        seed=cfg.seed)  # fmt: skip
        format_warmup(
            str(inits["policy"]), train_set, out / "policy", steps=cfg.warmup_steps, learning_rate=3e-3,
            seed=cfg.seed, use_cpu=True, state_writer=random_state_text, lr_scheduler_type="linear",
        )  # fmt: skip
    for name in DROP:
        for path in out.rglob(name):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    responder = TransformersResponder(str(out / "responder"), batch_size=32)
    behaviour = responder_behaviour(responder, test, "likelihood")
    # the test suite re-measures a share of the split (tests/test_world_models.py): the same figures on it
    checked = responder_behaviour(responder, test[:CHECKED_INSTANCES], "likelihood")
    world = {
        "command": "memstate experiment world " + " ".join(f"--{k} {v}" for k, v in asdict(cfg).items()),
        "settings": asdict(cfg),
        "data_config": DATA_CONFIG,
        "data_instances_sha256": instances_sha256(data_dir),
        "test_instances": len(test),
        "responder_selection": json.loads((out / "responder" / "selection.json").read_text()),
        "responder_behaviour": rounded(behaviour),
        f"responder_behaviour_first_{CHECKED_INSTANCES}": rounded(checked),
        "files": tree_sha256(out),
    }
    (out / "world.json").write_text(json.dumps(world, indent=2) + "\n")
    return world


def make_parser(prog: str | None = None) -> StageParser:
    return StageParser(
        (WorldConfig,),
        prog=prog,
        description="Build the sycophancy world's frozen responder and warmed-up policy (shipped in "
        f"{SHIPPED}/ for make demo; ~12 min on 2 cores). E.g. memstate experiment world --out runs/world",
    )


def run(parsed: tuple[WorldConfig]) -> int:
    world = build_world(parsed[0])
    print(json.dumps({k: world[k] for k in ("data_instances_sha256", "responder_behaviour")}, indent=2))
    print(f"written to {parsed[0].out}")
    return 0
