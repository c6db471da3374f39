"""The benchmark client: load, raw responses, per-request acceptance records, reports."""
