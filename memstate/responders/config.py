"""The responder settings every command shares (``train``, ``reward precompute-baselines``, ``eval``, ``eval memsyco``,
``eval sweep``, ``memory ask``), and ``make_responder`` that turns them into a responder.

One dataclass, so the flags read the same everywhere: ``--responder_model`` / ``--responder-model``,
``--responder_url``, … (``HfArgumentParser`` accepts both spellings), and the same flat keys in a YAML config.
Light on purpose: torch and transformers are imported only when an in-process responder is built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memstate.errors import ConfigError, InputNotFound

if TYPE_CHECKING:
    from memstate.responders.protocol import Responder

DTYPES = ("float32", "bfloat16", "float16")  # of an in-process model


@dataclass
class ResponderConfig:
    """The frozen responder: in-process (``transformers``) unless ``responder_url`` names a server."""

    responder_model: str | None = field(
        default=None,
        metadata={
            "help": "Frozen responder: a local path/hub id loaded in-process, or, with responder_url, the model name "
            "the server serves.",
            "aliases": ["--responder"],
        },
    )
    responder_url: str | None = field(
        default=None, metadata={"help": "OpenAI-compatible endpoint of the responder (vllm serve), e.g. http://h:8000"}
    )
    responder_api_key_env: str | None = field(
        default=None, metadata={"help": "Environment variable holding the endpoint's API key, if it needs one."}
    )
    responder_concurrency: int = field(
        default=64,
        metadata={
            "help": "HTTP requests in flight at once, PER PROCESS: each training rank (and each command) has its own "
            "client, so N ranks put N x this many requests in flight at the server; size the server for the total."
        },
    )
    responder_timeout: float = field(
        default=120.0, metadata={"help": "Seconds per HTTP attempt (each retry gets its own; see responder_deadline)."}
    )
    responder_max_retries: int = field(default=4, metadata={"help": "Retries per HTTP request before giving up."})
    responder_deadline: float | None = field(
        default=600.0,
        metadata={
            "help": "Seconds one HTTP request may take in all: every attempt, every wait between retries and the wait "
            "for a free slot. Without it a hung server holds a request for responder_timeout x (retries + 1) plus "
            "the waits; past it the prompt is unscorable (see max_unscorable_share in train). None: no bound."
        },
    )
    responder_round_deadline: float | None = field(
        default=None,
        metadata={
            "help": "Seconds one reward call (a generation round on one rank) may wait on a served responder in all, "
            "over its passes (fitting, answer flow, baselines, scoring): past it the round is unscorable and "
            "max_unscorable_share decides (a checkpoint and a stop). Bounds a hung server to one budget, where "
            "responder_deadline alone allows one per pass. The launch scripts give the watcher this plus the save "
            "time before they kill a trainer that was asked to stop. None: no round budget."
        },
    )
    responder_batch_size: int = field(default=32, metadata={"help": "Prompts per forward pass (in-process)."})
    score_mode: str = field(
        default="likelihood",
        metadata={
            "help": "How the responder's answer is scored: a registered score mode (memstate.reward.responder_score); "
            "built in: likelihood (dense: log-probability of the right option) or exact (greedy answer compared to "
            "the answer). Checked by the commands that score."
        },
    )

    def __post_init__(self) -> None:
        for name in ("responder_concurrency", "responder_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.responder_max_retries < 0:
            raise ConfigError(f"responder_max_retries must be at least 0, got {self.responder_max_retries}")
        for name in ("responder_timeout", "responder_deadline", "responder_round_deadline"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"{name} must be positive, got {value}")

    def api_key(self) -> str | None:
        """The endpoint's API key, read from ``responder_api_key_env`` (never stored in a config or checkpoint)."""
        return os.environ.get(self.responder_api_key_env) if self.responder_api_key_env else None


def make_responder(
    config: ResponderConfig, device: str = "cpu", dtype: str = "float32", *, likelihood: bool = False
) -> Responder:
    """The HTTP responder for ``config.responder_url``, else the in-process one on ``device`` in ``dtype``.

    The server is checked here, so one that cannot serve fails now, in one line, not mid-run: it must answer and serve
    ``responder_model`` (``check_health``), and answer a greedy chat request, and with ``likelihood`` the log-prob
    requests too, with what scoring reads (``check_contract``). A caller that scores passes
    ``likelihood=score_mode(config.score_mode).likelihood`` (``memstate.reward.responder_score``), or true when it
    scores by likelihood whatever the mode (the answer-flow check); one that only asks for answers passes nothing."""
    if not config.responder_model:
        raise ConfigError("no responder: give --responder_model (a model path/id, or the served name with a URL)")
    if config.responder_url:
        from memstate.responders.remote import OpenAIResponder

        responder = OpenAIResponder(
            config.responder_url,
            config.responder_model,
            api_key=config.api_key(),
            concurrency=config.responder_concurrency,
            timeout=config.responder_timeout,
            max_retries=config.responder_max_retries,
            deadline=config.responder_deadline,
        )
        try:
            responder.check_health()
            responder.check_contract(likelihood=likelihood)
        except BaseException:
            responder.close()
            raise
        return responder
    from memstate.responders.local import TransformersResponder

    try:
        return TransformersResponder(
            config.responder_model, batch_size=config.responder_batch_size, device=device, dtype=dtype
        )
    except OSError as e:  # not a model directory, not in the local cache, no network: the library says which
        reason = " ".join(str(e).split())[:300]
        raise InputNotFound(f"responder_model {config.responder_model}: cannot load it in-process: {reason}") from e
