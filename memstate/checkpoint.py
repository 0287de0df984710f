"""What a trained checkpoint carries about its training (``memstate.json``), so that it is served and evaluated
exactly as it was trained: the prompt version, the policy prompt budget, the completion budget, the responder and
its score mode, the data.

``memstate train`` writes it into every checkpoint and the final model; ``memstate serve`` and ``memstate eval``
read it. The run's full argument dicts are kept next to the typed fields for provenance; code reads the fields.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from memstate.errors import ConfigError

METADATA_FILE = "memstate.json"


@dataclass
class CheckpointMetadata:
    """A checkpoint's training facts (``memstate.json``)."""

    prompt_version: str = field(metadata={"help": "memstate.prompts.PROMPT_VERSION the policy was trained with."})
    policy_model: str = field(metadata={"help": "The base policy GRPO started from (before any warm-up)."})
    responder_model: str = field(metadata={"help": "The responder that rewarded it (path, hub id or served name)."})
    score_mode: str = field(metadata={"help": "The score mode the reward scored the responder in (likelihood, …)."})
    max_prompt_tokens: int = field(metadata={"help": "Policy prompt budget: facts were dropped to fit it."})
    max_completion_length: int = field(metadata={"help": "Most tokens a state could have."})
    data_dir: str = field(metadata={"help": "The dataset it trained on."})
    data_manifest_sha256: str | None = field(default=None, metadata={"help": "That dataset's manifest hash."})
    prompts_truncated: int | None = field(default=None, metadata={"help": "Training prompts cut to the budget."})
    world_size: int | None = field(default=None, metadata={"help": "Training processes that saved it (resume)."})
    zero_stage: int | None = field(
        default=None, metadata={"help": "DeepSpeed ZeRO stage it was saved under; None: no DeepSpeed (resume)."}
    )
    memstate_args: dict[str, Any] = field(default_factory=dict, metadata={"help": "Provenance: all memstate args."})
    responder: dict[str, Any] = field(default_factory=dict, metadata={"help": "Provenance: the ResponderConfig."})
    grpo_config: dict[str, Any] = field(default_factory=dict, metadata={"help": "Provenance: TRL's GRPOConfig."})

    @property
    def context_length(self) -> int:
        """Prompt plus completion budget: the context a server of this policy needs."""
        return self.max_prompt_tokens + self.max_completion_length

    def write(self, directory: str | Path) -> Path:
        path = Path(directory) / METADATA_FILE
        path.write_text(json.dumps(asdict(self), indent=2, default=str))
        return path

    @classmethod
    def read(cls, directory: str | Path) -> CheckpointMetadata | None:
        """The metadata in ``directory``, or None if it has none (a base model); a malformed file is a
        ``ConfigError`` naming the file and the field.

        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> CheckpointMetadata.read(d) is None
        True
        >>> _ = CheckpointMetadata("v", "p", "r", "exact", 100, 20, "data").write(d)
        >>> CheckpointMetadata.read(d).context_length
        120
        >>> legacy = {"prompt_version": "v", "policy_model": "p", "responder_model": "r", "data_dir": "data",
        ...           "memstate_args": {"max_prompt_tokens": 300}, "grpo_config": {"max_completion_length": 40},
        ...           "responder": {"score_mode": "exact"}}  # written before the typed fields
        >>> _ = (Path(d) / METADATA_FILE).write_text(json.dumps(legacy))
        >>> m = CheckpointMetadata.read(d)
        >>> m.score_mode, m.context_length
        ('exact', 340)
        >>> _ = (Path(d) / METADATA_FILE).write_text('{"prompt_version": "v"}')
        >>> CheckpointMetadata.read(d)
        Traceback (most recent call last):
        ...
        memstate.errors.ConfigError: .../memstate.json: field 'policy_model' is missing
        """
        path = Path(directory) / METADATA_FILE
        if not path.is_file():
            return None
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        raw = _from_nested(raw)
        values = {}
        for f in fields(cls):
            if f.name not in raw:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise ConfigError(f"{path}: field {f.name!r} is missing")
                continue
            values[f.name] = raw[f.name]
        for name in ("max_prompt_tokens", "max_completion_length"):
            if not isinstance(values[name], int) or values[name] < 1:
                raise ConfigError(f"{path}: field {name!r} must be a positive integer, got {values[name]!r}")
        return cls(**values)


def _from_nested(raw: dict[str, Any]) -> dict[str, Any]:
    """Checkpoints written before the typed fields existed kept them only in the provenance dicts."""
    derived = {
        "score_mode": raw.get("responder", {}).get("score_mode"),
        "max_prompt_tokens": raw.get("memstate_args", {}).get("max_prompt_tokens"),
        "max_completion_length": raw.get("grpo_config", {}).get("max_completion_length"),
    }
    return {k: v for k, v in derived.items() if v is not None} | raw
