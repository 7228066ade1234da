"""The OpenAI-compatible HTTP gateway (docs/design.md §6)."""

from services.gateway.app import create_app
from services.gateway.config import GatewayConfig

__all__ = ["GatewayConfig", "create_app"]
