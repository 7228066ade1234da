"""The OpenAI-compatible gateway: a FastAPI app over a pool of workers.

`create_app(discovery, config)` builds it; the lifespan starts the worker pool (discovery,
health monitors, output pumps) and stops it.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request

from services.gateway.admission import TokenBudget, check_choices
from services.gateway.body import parse_json_object, read_body
from services.gateway.config import GatewayConfig
from services.gateway.dispatcher import Dispatcher
from services.gateway.endpoints import CHAT, COMPLETION, Endpoint, Plan, Req, Served
from services.gateway.error_handlers import install_error_handlers
from services.gateway.errors import (
    APIError,
    AuthenticationFailed,
    ModelNotFound,
    ServiceUnavailable,
)
from services.gateway.openapi import install_openapi
from services.gateway.pool import Discovery, Replica, WorkerPool
from services.gateway.preparation import PreparationPool
from services.gateway.preprocess import tokenizer_vocab_size
from services.gateway.rate_limit import RateLimiter
from services.gateway.responses import TokenText
from services.gateway.responses_api import install_responses_routes
from services.gateway.serving import Generation, GenerationRunner, Started, new_response_id
from services.gateway.streaming import until_disconnect
from services.gateway.structured_output import GrammarCheck
from services.gateway.telemetry import UNKNOWN_MODEL, RequestMetrics, RequestTimer, WorkerStatsExporter
from services.gateway.tracked import Tracked
from services.gateway.utility_routes import install_utility_routes, package_version
from services.metrics import Metrics
from services.router import Router
from services.workers.types import StatsSnapshot

logger = logging.getLogger(__name__)

Parsed = TypeVar("Parsed")

# decoded on the event loop up to this size: under 0.6 ms, less than the preparation thread's
# round trip it saves the request (docs/design.md §6.8, docs/results/ttft-hops-cpu.md)
INLINE_BODY_BYTES = 16 * 1024


@dataclass
class Admission:
    """What is known of a request while it is being admitted (for its metric labels)."""

    requested_model: str | None = None


@dataclass
class Gateway:
    """Everything the routes share (reachable as `app.state.gateway`)."""

    config: GatewayConfig
    pool: WorkerPool
    dispatcher: Dispatcher
    metrics: Metrics
    request_metrics: RequestMetrics
    exporter: WorkerStatsExporter
    runner: GenerationRunner
    preparation: PreparationPool  # JSON, validation, templates and tokenising, off the event loop
    rate_limiter: RateLimiter
    started_s: float
    grammars: GrammarCheck = field(default_factory=GrammarCheck)
    draining: bool = False  # stopping: takes no new generation (docs/design.md §6.9)
    _token_text: TokenText | None = None

    def model_info(self) -> tuple[str, int, Any]:
        """(model id, max_model_len, tokenizer) of the workers; 503 until one is ready."""
        info = self.pool.any_info()
        tokenizer = self.pool.tokenizer
        if info is None or tokenizer is None:
            raise ServiceUnavailable("No workers are ready yet; retry shortly.")
        return info.model_name, info.max_model_len, tokenizer

    def served_name(self, model: str) -> str:
        """The model id responses report: the first --served-model-name, else the workers' own."""
        return self.config.served_model_names[0] if self.config.served_model_names else model

    def served(self, response_id: str, model: str, max_model_len: int, tokenizer: Any, include_usage: bool) -> Served:
        """What a generation route plans a request with, labelled with the served model name;
        503 once the gateway is draining."""
        if self.draining:
            raise ServiceUnavailable("The server is shutting down; retry the request.")
        return Served(
            response_id,
            self.served_name(model),
            max_model_len,
            tokenizer,
            self.token_text(tokenizer),
            include_usage,
            self.config.tool_call_parser,
            TokenBudget(self.config.admission.tokens_per_request(max_model_len)),
        )

    def admit(self, request: Request) -> Callable[[int], None]:
        """The bearer key (401), then its caller's rate limit (429): the key, or the client's
        address without --api-keys. Returns what charges the request's tokens to the caller."""
        key_index = self.check_auth(request)
        if key_index is not None:
            caller = f"key-{key_index}"
        else:
            caller = f"address-{request.client.host if request.client else 'unknown'}"
        return self.rate_limiter.admit(caller)

    async def read_body(self, request: Request) -> bytes:
        """The raw body (413 too large, 408 too slow, 499 the client left while sending it)."""
        return await read_body(request, self.config.max_body_bytes, self.config.admission.body_timeout_s)

    async def parse_body(self, raw: bytes) -> dict[str, Any]:
        if len(raw) <= INLINE_BODY_BYTES:
            return parse_json_object(raw)
        return await self.preparation.run(parse_json_object, raw)

    async def read_json(self, request: Request) -> dict[str, Any]:
        return await self.parse_body(await self.read_body(request))

    async def parse(self, validate: Callable[[dict[str, Any]], Parsed], body: dict[str, Any]) -> Parsed:
        return await self.preparation.run(validate, body)

    async def plan(self, plan: Callable[[Parsed, Served], Plan], req: Parsed, served: Served) -> Plan:
        """Tokenised off the event loop; if the client leaves, tokenising stops at the next prompt."""
        return await self.preparation.run(plan, req, served, on_cancel=served.budget.abandon)

    async def check_grammar(self, plan: Plan, tokenizer: Any) -> None:
        """A 400 naming the field when the plan's grammar does not compile."""
        if plan.grammar is not None:
            vocab_size = tokenizer_vocab_size(tokenizer) or 0
            await self.grammars.check(plan.grammar, plan.grammar_param, tokenizer, vocab_size)

    def token_text(self, tokenizer: Any) -> TokenText:
        if self._token_text is None or self._token_text.tokenizer is not tokenizer:
            self._token_text = TokenText(tokenizer)
        return self._token_text

    def model_label(self, requested: str | None) -> str:
        """The `model` label of a request: a served id, never arbitrary client input."""
        info = self.pool.any_info()
        if info is None or requested is None:
            return UNKNOWN_MODEL
        if requested == info.model_name or requested in self.config.served_model_names:
            return info.model_name
        return UNKNOWN_MODEL

    @contextlib.contextmanager
    def counting_refusals(self) -> Iterator[Admission]:
        """Count a request refused with an APIError (4xx, 429, 503) or an unexpected error (500)
        in dspark_requests_total; accepted requests are counted when they finish."""
        admission = Admission()
        try:
            yield admission
        except APIError as exc:
            self.request_metrics.count(self.model_label(admission.requested_model), exc.status)
            raise
        except Exception:
            self.request_metrics.count(self.model_label(admission.requested_model), 500)
            raise

    def check_model(self, requested: str, model: str) -> None:
        if requested != model and requested not in self.config.served_model_names:
            raise ModelNotFound(requested)

    def check_auth(self, request: Request) -> int | None:
        """401 unless the request carries one of the keys; the key's position (None: no keys)."""
        keys = self.config.api_keys
        if not keys:
            return None
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationFailed("You didn't provide an API key. Provide it as 'Authorization: Bearer KEY'.")
        token = token.strip()
        matches = [i for i, key in enumerate(keys) if hmac.compare_digest(token.encode(), key.encode())]
        if not matches:
            raise AuthenticationFailed("Incorrect API key provided.")
        return matches[0]


def create_app(
    discovery: Discovery,
    config: GatewayConfig | None = None,
    *,
    metrics: Metrics | None = None,
    consumer_id: str | None = None,
) -> FastAPI:
    config = config or GatewayConfig()
    metrics = metrics or Metrics()
    pool = WorkerPool(discovery, consumer_id or f"gateway-{uuid.uuid4().hex[:12]}", config.pool)
    dispatcher = Dispatcher(
        pool,
        Router(config.router),
        add_timeout_s=config.add_timeout_s,
        kv_transfer_timeout_s=config.kv_transfer_timeout_s,
        retry_after_s=config.retry_after_s,
        migration_limit=config.migration_limit,
    )
    exporter = WorkerStatsExporter(metrics)
    request_metrics = RequestMetrics(metrics)

    def count_migration(tracked: Tracked, reason: str) -> None:
        info = pool.any_info()
        request_metrics.migrated(info.model_name if info is not None else UNKNOWN_MODEL, reason)

    dispatcher.on_migration = count_migration
    gateway = Gateway(
        config,
        pool,
        dispatcher,
        metrics,
        request_metrics,
        exporter,
        GenerationRunner(
            dispatcher,
            request_metrics,
            request_timeout_s=config.request_timeout_s,
            queue_timeout_s=config.queue_timeout_s,
            keepalive_s=config.keepalive_s,
        ),
        PreparationPool(config.admission.tokenizer_threads),
        RateLimiter(config.admission.rate_limit_rpm, config.admission.rate_limit_tpm),
        time.time(),
    )
    _wire_pool(gateway)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        try:
            yield
        finally:
            await pool.stop()
            gateway.preparation.shutdown()

    app = FastAPI(title="dspark-serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = gateway
    install_error_handlers(app)
    install_openapi(app, package_version())

    async def generate(request: Request, endpoint: Endpoint[Req]) -> Response:
        with gateway.counting_refusals() as admission:
            timer = RequestTimer(time.perf_counter())
            charge_tokens = gateway.admit(request)
            raw = await gateway.read_body(request)
            started = await until_disconnect(request.receive, start(raw, endpoint, admission, timer, charge_tokens))
            return await gateway.runner.respond(started, request)

    async def start(
        raw: bytes, endpoint: Endpoint[Req], admission: Admission, timer: RequestTimer, charge: Callable[[int], None]
    ) -> Started:
        """From the body to choices running on workers (docs/design.md §6.9 says in which order
        the limits are checked); cancelled, it leaves nothing behind on the workers."""
        body = await gateway.parse_body(raw)
        admission.requested_model = str(body.get("model"))
        num_prompts = endpoint.count_prompts(body)
        check_choices(num_prompts, 1, config.admission.max_choices_per_request)  # before validating them all
        req = await gateway.parse(endpoint.parse, body)
        check_choices(num_prompts, req.n, config.admission.max_choices_per_request)
        model, max_model_len, tokenizer = gateway.model_info()
        gateway.check_model(req.model, model)
        include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
        response_id = new_response_id(endpoint.id_prefix)
        served = gateway.served(response_id, model, max_model_len, tokenizer, include_usage)
        plan = await gateway.plan(endpoint.plan, req, served)
        await gateway.check_grammar(plan, tokenizer)
        gen = Generation(
            response_id,
            model,
            plan.jobs,
            plan.num_prompts,
            bool(req.stream),
            plan.formatter,
            timer,
            charge_tokens=charge,
        )
        return await gateway.runner.start(gen)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, CHAT)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, COMPLETION)

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        gateway.check_auth(request)
        info = pool.any_info()
        if info is None:
            return JSONResponse({"object": "list", "data": []})
        names = list(config.served_model_names) or [info.model_name]
        return JSONResponse(
            {"object": "list", "data": [_model_card(n, info.max_model_len, gateway.started_s) for n in names]}
        )

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> JSONResponse:
        gateway.check_auth(request)
        model, max_model_len, _ = gateway.model_info()
        gateway.check_model(model_id, model)
        return JSONResponse(_model_card(model_id, max_model_len, gateway.started_s))

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        workers = [
            {
                "id": r.replica_id,
                "role": r.role,
                "healthy": r.healthy,
                "inflight": r.inflight,
                "error": r.last_error,
            }
            for r in pool.replicas.values()
        ]
        is_ready = pool.ready() and not gateway.draining
        info = pool.any_info()
        return JSONResponse(
            {
                "status": "draining" if gateway.draining else "ready" if is_ready else "not ready",
                "model": info.model_name if info else None,
                "workers": workers,
            },
            status_code=200 if is_ready else 503,
        )

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    install_utility_routes(app, gateway)
    install_responses_routes(app, gateway)
    return app


def _model_card(model_id: str, max_model_len: int, created_s: float) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": int(created_s),
        "owned_by": "dspark-serve",
        "max_model_len": max_model_len,
    }


def _wire_pool(gateway: Gateway) -> None:
    """The pool's events reach the dispatcher, the router and the exporter from here alone."""
    pool, dispatcher, exporter = gateway.pool, gateway.dispatcher, gateway.exporter

    def on_down(replica: Replica, why: str) -> None:
        dispatcher.on_replica_down(replica, why)
        exporter.set_live(replica.replica_id, False)

    def on_up(replica: Replica) -> None:
        exporter.set_live(replica.replica_id, True)
        if replica.info is not None:
            gateway.request_metrics.declare(replica.info.model_name, replica.role)

    def on_stats(replica: Replica, snapshot: StatsSnapshot) -> None:
        if replica.info is not None:
            exporter.update(
                replica.replica_id,
                replica.role,
                replica.info.model_name,
                snapshot.instance_id,
                snapshot.engine,
            )
            exporter.set_live(replica.replica_id, replica.healthy)

    def on_removed(replica: Replica) -> None:
        dispatcher.router.forget(replica.replica_id)
        exporter.remove(replica.replica_id)

    pool.on_events = dispatcher.on_events
    pool.on_down = on_down
    pool.on_up = on_up
    pool.on_stats = on_stats
    pool.on_removed = on_removed
