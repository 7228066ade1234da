"""OpenAI's Responses API (`POST /v1/responses`) over the chat completion path (docs/design.md
§6.7): `protocol` (the request body), `translate` (to a chat request, refusals renamed back),
`objects` (response and output items), `events` (the stream events and whole body, from the
chat formatter's), `routes` (the route)."""

from services.gateway.responses_api.routes import install_responses_routes

__all__ = ["install_responses_routes"]
