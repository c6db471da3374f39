"""The bench client, one name to import it by; its parts live along their seams:

- ``load``: the load generator (``LoadConfig``, ``LoadGenerator``) and the request payloads;
- ``wire``: the response shapes, routes and chunk predicates, and ``Seen``, the one pass over a
  request's responses;
- ``finish``: ``Tally`` (token counts and gaps as events arrive) and ``finish_record``;
- ``speclens.runs.request``: what a request and a run leave behind (``RequestRecord``,
  ``RunResult``), re-exported here;
- ``transport``: bounded body reads, the resend of a request the server never received, and
  redirects refused;
- ``probe``: ``--backend auto``.

The server is untrusted: every value read from a response is type-checked where it is read, and
a bad one is dropped with a note on the record (``anomalies``), never passed on. Bodies, SSE
events and token counts are bounded, so no response can make the client raise or hold memory in
proportion to a number it claims.
"""

from __future__ import annotations

from speclens.bench.finish import Tally, finish_record
from speclens.bench.load import LoadConfig, LoadGenerator
from speclens.bench.probe import PROBE_BODY_BYTES, PROBE_TIMEOUT_S, PROBES, Probe, probe_backend
from speclens.bench.transport import (
    KEEPALIVE_S,
    MAX_BODY_BYTES,
    MAX_ERROR_BYTES,
    MAX_STALE_RETRIES,
    read_at_most,
)
from speclens.bench.wire import (
    LLAMACPP_NATIVE,
    MAX_TOKENS,
    NATIVE_ROUTES,
    OPENAI,
    ROUTES,
    SGLANG_NATIVE,
    Backend,
    Endpoint,
    Routing,
    Seen,
    Wire,
    carriers,
    chunk_problem,
    count_problem,
    is_content_chunk,
    route,
    token_bound,
    wire_for,
)
from speclens.runs.request import MAX_ANOMALIES, RequestRecord, RunResult

__all__ = [
    "KEEPALIVE_S", "LLAMACPP_NATIVE", "MAX_ANOMALIES", "MAX_BODY_BYTES", "MAX_ERROR_BYTES",
    "MAX_STALE_RETRIES", "MAX_TOKENS", "NATIVE_ROUTES", "OPENAI", "PROBES", "PROBE_BODY_BYTES",
    "PROBE_TIMEOUT_S", "ROUTES", "SGLANG_NATIVE", "Backend", "Endpoint", "LoadConfig",
    "LoadGenerator", "Probe", "RequestRecord", "Routing", "RunResult", "Seen", "Tally", "Wire",
    "carriers", "chunk_problem", "count_problem", "finish_record", "is_content_chunk",
    "probe_backend", "read_at_most", "route", "token_bound", "wire_for",
]  # fmt: skip
