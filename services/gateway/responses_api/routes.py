"""`POST /v1/responses`: OpenAI's Responses API served as a chat completion (docs/design.md §6.7).

The route takes the generation routes' checks in the same order (key, body size and JSON,
fields, 503 until a worker is ready, model) and counts refusals the same way; the request is
planned by the chat endpoint's own plan (tool parser, grammar, jobs) and run by the shared
`GenerationRunner`, with `ResponsesWire` re-shaping what the chat formatter writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.requests import Request

from services.gateway.endpoints import CHAT
from services.gateway.responses_api.events import ResponsesWire
from services.gateway.responses_api.objects import ResponseShape, new_object_id
from services.gateway.responses_api.protocol import parse_responses
from services.gateway.responses_api.translate import chat_request, responses_fields
from services.gateway.serving import Generation, Started
from services.gateway.streaming import until_disconnect
from services.gateway.telemetry import RequestTimer

if TYPE_CHECKING:
    from services.gateway.app import Admission, Gateway


def install_responses_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        with gateway.counting_refusals() as admission:
            timer = RequestTimer(time.perf_counter())
            charge_tokens = gateway.admit(request)
            raw = await gateway.read_body(request)
            started = await until_disconnect(request.receive, start(raw, admission, timer, charge_tokens))
            return await gateway.runner.respond(started, request)

    async def start(raw: bytes, admission: Admission, timer: RequestTimer, charge: Callable[[int], None]) -> Started:
        body = await gateway.parse_body(raw)
        admission.requested_model = str(body.get("model"))
        req = await gateway.parse(parse_responses, body)
        model, max_model_len, tokenizer = gateway.model_info()
        gateway.check_model(req.model, model)
        response_id = new_object_id("resp")
        served = gateway.served(response_id, model, max_model_len, tokenizer, include_usage=False)
        with responses_fields():
            plan = await gateway.plan(CHAT.plan, chat_request(req), served)
            await gateway.check_grammar(plan, tokenizer)
            wire = ResponsesWire(ResponseShape(response_id, served.model, req))
            gen = Generation(
                response_id,
                model,
                plan.jobs,
                plan.num_prompts,
                bool(req.stream),
                plan.formatter,
                timer,
                wire,
                charge_tokens=charge,
            )
            return await gateway.runner.start(gen)
