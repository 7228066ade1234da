"""The gateway's OpenAPI document describes the bodies the routes really take, and schemathesis
fuzzes every operation in it against the in-process gateway over the real engine: no 5xx, and
every refusal in OpenAI's error shape. The default run is a bounded number of examples; the
`slow` one explores further."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from services.gateway import GatewayConfig, create_app
from services.gateway.config import AdmissionConfig
from services.gateway.openapi import REQUEST_BODIES
from services.gateway.pool import StaticDiscovery
from services.workers.engine_loop import EngineLoop
from tests.services.conftest import MODEL, start_gateway
from tests.services.serving import wait_ready

pytestmark = pytest.mark.timeout(900)

# generated requests ask for up to 128 tokens of work: those with large or unset max_tokens are
# refused (a 400), so the fuzzing stays fast on a CPU engine
FUZZ_CONFIG = GatewayConfig(admission=AdmissionConfig(max_tokens_per_request=128))
DOCUMENT = create_app(StaticDiscovery([]), FUZZ_CONFIG).openapi()  # what /openapi.json serves
OPERATIONS = [result.ok() for result in schemathesis.openapi.from_dict(DOCUMENT).get_all_operations()]
# (operation, mode): bodies are generated valid and invalid; operations without a body, valid only
CASES = [(operation, GenerationMode.POSITIVE) for operation in OPERATIONS] + [
    (operation, GenerationMode.NEGATIVE) for operation in OPERATIONS if operation.method.upper() == "POST"
]


@pytest.fixture(scope="module")
def fuzz_url(loop: EngineLoop) -> Iterator[str]:
    with start_gateway(loop, FUZZ_CONFIG) as url:
        wait_ready(url, 60)
        yield url


def test_the_document_describes_every_post_body(fuzz_url: str) -> None:
    document = httpx.get(f"{fuzz_url}/openapi.json").json()
    assert document == DOCUMENT
    posts = {path for path, methods in document["paths"].items() if "post" in methods}
    assert posts == set(REQUEST_BODIES)
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat["schema"] == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    fields = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "max_tokens", "n", "tools", "response_format"} <= set(fields)
    tokenize = document["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert len(tokenize["oneOf"]) == 2


OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def serve_quickly(body: dict[str, Any]) -> None:
    """A valid body names the served model and, unless it says otherwise, asks for a few tokens
    (left unset, a completion may take the whole context, which the token limit refuses)."""
    if "model" in body:
        body["model"] = MODEL
    if ("messages" in body or "input" in body) and not any(name in body for name in OUTPUT_LIMITS):
        body["max_output_tokens" if "input" in body else "max_tokens"] = 8


def fuzz(url: str, operation: Any, mode: GenerationMode, examples: int) -> None:
    """`examples` generated requests to one operation: none may get a 5xx, and every refusal
    is in OpenAI's error shape."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def call(case: Any) -> None:
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
            serve_quickly(case.body)
        response = case.call(base_url=url, timeout=120)
        assert response.status_code < 500, (case.method, case.path, case.body, response.status_code, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"], error

    call()


CASE_IDS = [f"{operation.label} {mode}" for operation, mode in CASES]


@pytest.mark.parametrize(("operation", "mode"), CASES, ids=CASE_IDS)
def test_fuzzing_finds_no_server_error(fuzz_url: str, operation: Any, mode: GenerationMode) -> None:
    fuzz(fuzz_url, operation, mode, examples=20)


@pytest.mark.slow
@pytest.mark.parametrize(("operation", "mode"), CASES, ids=CASE_IDS)
def test_fuzzing_finds_no_server_error_thoroughly(fuzz_url: str, operation: Any, mode: GenerationMode) -> None:
    fuzz(fuzz_url, operation, mode, examples=500)
