"""The frozen responder the reward scores with, and its settings.

- ``protocol``: what a responder is (``Responder``, ``ContinuationLogprob``), without any backend;
- ``config``: the responder settings every command shares (``ResponderConfig``) and ``make_responder``;
- ``local``: the in-process Hugging Face ``transformers`` backend (``TransformersResponder``; loads torch);
- ``remote``: the OpenAI-compatible HTTP backend (``OpenAIResponder``, for a ``vllm serve`` of the responder).

The package itself stays light (no torch, no HTTP client): the backends are imported from their modules.
"""

from memstate.responders.config import DTYPES, ResponderConfig, make_responder
from memstate.responders.protocol import ContinuationLogprob, Responder

__all__ = ["DTYPES", "ContinuationLogprob", "Responder", "ResponderConfig", "make_responder"]
