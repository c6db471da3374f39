"""The OpenAI-compatible server around the engine: ``speclens serve``."""

from speclens.server.app import ServerSettings, create_app
from speclens.server.runner import EngineRunner, build_engine

__all__ = ["EngineRunner", "ServerSettings", "build_engine", "create_app"]
