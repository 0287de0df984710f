"""Schemathesis against the API's own OpenAPI schema: generated valid and invalid requests never get a 5xx, and
every response conforms to the schema (status codes, content types, bodies, auth). One default check is left out:
"schema-valid request rejected". Some rules cannot be written in JSON Schema — fact ids unique, relations pointing
at known facts, no options or at least two, the configured limits — and schema-valid requests breaking them get a
422, by design (each is pinned in test_serve_api.py).

The policy behind the API is a mock that answers every chat call (alternating a well-formed state and one that
fails the format), so any 5xx would be the API's own fault, not the policy's. A bearer key is configured, so the
auth checks (a request without or with a wrong token must get 401) run too. In the default suite (~15 s).
"""

from __future__ import annotations

import itertools
import os

import httpx
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from memstate.serve.api import ApiConfig, create_app

KEY_ENV = "MEMSTATE_SCHEMATHESIS_API_KEY"
KEY = "schemathesis-key"
STATES = itertools.cycle(["- Use F1.\n- Ignore the rest.", "not a state"])


def policy(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "mock-policy"}]})
    if request.url.path == "/health":
        return httpx.Response(200)
    return httpx.Response(200, json={"choices": [{"message": {"content": next(STATES)}}]})


os.environ[KEY_ENV] = KEY  # read once, by create_app
app = create_app(ApiConfig(api_key_env=KEY_ENV, max_facts=64), policy_transport=httpx.MockTransport(policy))
schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers={"Authorization": f"Bearer {KEY}"})


@schema.parametrize()
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_schema_conformance_and_no_server_errors(case):
    case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, excluded_checks=[positive_data_acceptance])
