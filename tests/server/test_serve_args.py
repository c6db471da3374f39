"""``speclens serve``'s flags are ``ServeArgs``' fields, one for one (as vLLM's ``EngineArgs``):
the command only collects them, so a flag added to one and not the other is caught here."""

from __future__ import annotations

import dataclasses
import inspect

from speclens.cli.serve import ServeArgs, serve


def test_every_flag_is_a_serve_args_field() -> None:
    flags = list(inspect.signature(serve).parameters)
    fields = [f.name for f in dataclasses.fields(ServeArgs)]
    assert flags == fields
