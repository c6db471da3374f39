"""The OpenAI-compatible server around the engine: ``speclens serve``."""

from speclens.server.app import ServerSettings, create_app
from speclens.server.runner import EngineRunner

__all__ = ["EngineRunner", "ServerSettings", "create_app"]
