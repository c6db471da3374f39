"""Runs: the directory bench and sim both write (records, summary) and that statistics,
``compare``, ``merge`` and the reports read. Dependencies go bench -> runs <- sim, and
runs -> acceptance; nothing here imports bench, sim or the engine."""
