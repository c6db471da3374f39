"""The comparability checks of ``speclens compare``: is a pair of inputs worth a speed-up?

Two runs are only worth a speed-up when they did the same work at the same acceptance. So every
pair is checked first, one line per check with its evidence: the same prompts (the dataset's
``prompts_sha256`` and the same measured indices and categories), the same sampling and client
(max_tokens, ignore_eos, temperature, stream, endpoint), input and output lengths that agree
(two-sample Kolmogorov-Smirnov), the same K (or a difference the user named), and acceptance:
forced runs must agree (realized AL intervals overlap, histograms pass a chi-square homogeneity
test), natural runs state their AL difference with its interval, and a forced run against a
natural one is no comparison.

Aggregate-only inputs (``aggregate_checks``): every check that needs per-request data (prompts,
sampling, acceptance, histogram) says so and neither passes nor fails; lengths, deployment
(chip, engine, precision, parallelism, GPUs), load and speculation are checked from the
settings.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from scipy import stats as _stats

from speclens.runs import rundir
from speclens.runs.compare_inputs import Input, is_predicted, loads, single
from speclens.runs.record import TOLERANCE
from speclens.runs.rundir import Run
from speclens.runs.stats import CONFIDENCE, RealizedAL, realized_al

#: The false-alarm rate of each distribution test (lengths, histograms).
ALPHA = 0.01

#: Check names, in the order they are reported.
CHECKS = ("model", "prompts", "sampling", "lengths", "k", "acceptance", "histogram")

#: Differences a user may name (``--differ``): they pass their check, stated.
NAMEABLE = ("k",)
#: The settings that make a deployment (an aggregate-only run states them).
DEPLOYMENT = ("hardware", "engine", "precision", "tensor_parallel", "expert_parallel",
              "dp_attention", "gpus", "disaggregated", "prefill", "decode")  # fmt: skip


@dataclass(frozen=True)
class Check:
    """One comparability check: ``ok`` True (passed), False (failed) or None (not run: it
    needs per-request data an aggregate-only input does not have). ``stated``: the check is
    not required of the pair (a named difference, natural acceptance, a prediction against a
    measurement): its figure is shown, nothing rests on it, and it reads "stated", never
    "pass"."""

    name: str
    ok: bool | None
    detail: str
    stated: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "ok": self.ok, "detail": self.detail}
        if self.stated:  # written only where it holds: a check without it is required
            out["stated"] = True
        return out


def check_model(a: Input, b: Input) -> Check:
    return Check("model", a.model == b.model, f"{a.label} and {b.label} ran {a.model!r}")


def _prompt_ids(item: Input) -> tuple[set[str | None], set[tuple[tuple[int, str], ...]]]:
    hashes = {run.settings.get("prompts_sha256") for run in item.runs}
    sent = {tuple(sorted((int(r["index"]), str(r.get("category"))) for r in run.rows))
            for run in item.runs}  # fmt: skip
    return hashes, sent


def check_prompts(a: Input, b: Input) -> Check:
    """The same dataset (its digest) and the same measured indices and categories."""
    (ha, sa), (hb, sb) = _prompt_ids(a), _prompt_ids(b)
    for item, hashes in ((a, ha), (b, hb)):
        if None in hashes:
            return Check("prompts", False, f"unknown: {item.label} {_no_digest(item)}")
        if len(hashes) > 1:
            return Check("prompts", False, f"{item.label}'s runs drew from {len(hashes)} "
                         "different datasets (prompts_sha256)")  # fmt: skip
    if ha != hb:
        return Check("prompts", False, f"different datasets: prompts_sha256 {single(ha)[:12]}… "
                     f"vs {single(hb)[:12]}…")  # fmt: skip
    if len(sa) > 1 or len(sb) > 1 or sa != sb:
        counts = sorted({len(s) for s in sa | sb})
        return Check("prompts", False, f"same dataset ({single(ha)[:12]}…) but different "
                     f"requests sent: measured request counts {counts} or their indices and "
                     "categories differ")  # fmt: skip
    return Check("prompts", True, f"prompts_sha256 {single(ha)[:12]}… in both; "
                 f"{len(single(sa))} measured requests at the same indices and categories")  # fmt: skip


def _no_digest(item: Input) -> str:
    """Why an input records no ``settings.prompts_sha256``: a run written before runs recorded
    it is named as such (``rundir.predates``); a fresh one never is."""
    run = next(r for r in item.runs if r.settings.get("prompts_sha256") is None)
    where = f"({run.path})" if len(item.runs) > 1 else ""
    if rundir.predates(run.settings):
        who = "speclens sim" if is_predicted(run) else "speclens bench"
        return (
            f"records no settings.prompts_sha256: a run written before {who} recorded it {where}"
        ).rstrip()
    return (
        f"records no settings.prompts_sha256 {where}".rstrip() + ": its settings say "
        f"{rundir.SETTINGS_SCHEMA} but leave the digest null (its workload is unknown)"
    )


def _simulated(settings: dict[str, Any]) -> bool:
    return settings.get("sampling") == rundir.SAMPLING[0]


def check_sampling(a: Input, b: Input) -> Check:
    """What each request asked for and how it was sent: max_tokens, ignore_eos, temperature,
    and the client's stream and endpoint (a streamed run times its tokens as they come, a
    non-streamed one only at the end). A setting a run does not record is "unknown", and two
    runs that both leave it out agree on it."""

    def sampling(item: Input) -> set[tuple[Any, ...]]:
        return {(r.settings["max_tokens"], r.settings["ignore_eos"],
                 float(r.settings["temperature"]),
                 *((rundir.SAMPLING[0], None) if _simulated(r.settings)
                   else (r.settings.get("stream"), r.settings.get("endpoint"))))
                for r in item.runs}  # fmt: skip

    def show(s: tuple[Any, ...]) -> str:
        asked = f"max_tokens {s[0]}, ignore_eos {str(s[1]).lower()}, temperature {s[2]:g}, "
        if s[3] == rundir.SAMPLING[0]:
            return asked + "simulated (no request sent)"
        stream = "unknown" if s[3] is None else str(s[3]).lower()
        return asked + f"stream {stream}, endpoint {s[4] or 'none'}"

    sa, sb = sampling(a), sampling(b)
    for item, s in ((a, sa), (b, sb)):
        if len(s) > 1:
            return Check("sampling", False, f"{item.label}'s runs differ: "
                         + "; ".join(sorted(map(show, s))))  # fmt: skip
    if sa == sb:
        return Check("sampling", True, f"{show(single(sa))} in both")
    sim_a, sim_b = (single(s)[3] == rundir.SAMPLING[0] for s in (sa, sb))
    if sim_a != sim_b and single(sa)[:3] == single(sb)[:3]:
        # a simulation against a measurement: what the requests asked for must agree; how the
        # client sent them is the measurement's alone
        return Check("sampling", True, f"{a.label} {show(single(sa))}; {b.label} "
                     f"{show(single(sb))}: the same requests, a prediction against a "
                     "measurement")  # fmt: skip
    return Check("sampling", False, f"{show(single(sa))} vs {show(single(sb))}")


def _lengths(item: Input, name: str) -> list[int]:
    return [int(r[name]) for run in item.runs for r in run.completed if r.get(name) is not None]


def check_lengths(a: Input, b: Input) -> Check:
    """Two-sample Kolmogorov-Smirnov on input and output token counts of completed requests."""
    parts, ok = [], True
    for name, title in (("prompt_tokens", "input"), ("completion_tokens", "output")):
        xa, xb = _lengths(a, name), _lengths(b, name)
        if not xa or not xb:
            return Check("lengths", False, f"{title} lengths unknown: "
                         f"{a.label} {len(xa)} and {b.label} {len(xb)} requests report them")  # fmt: skip
        test = _stats.ks_2samp(xa, xb)
        p = float(test.pvalue)
        ok = ok and p >= ALPHA
        parts.append(f"{title} tokens KS D {float(test.statistic):.3f} p {p:.3g} "
                     f"({len(xa)} vs {len(xb)} requests)")  # fmt: skip
    return Check("lengths", ok, "; ".join(parts) + ("" if ok else f" (p below {ALPHA:g})"))


def _k(item: Input) -> set[int]:
    return {k for p in item.points for r in p.runs for k in r.ks()} | {
        int(p.settings["num_speculative_tokens"]) for p in item.points
        if p.settings.get("num_speculative_tokens") is not None
    }  # fmt: skip


def _show_k(ks: set[int]) -> str:
    return "K " + ",".join(map(str, sorted(ks))) if ks else "no K (no speculation reported)"


def check_k(a: Input, b: Input, named: Sequence[str]) -> Check:
    ka, kb = _k(a), _k(b)
    if ka == kb:
        return Check("k", True, f"{_show_k(ka)} in both")
    if "k" in named:
        return Check("k", True, f"{_show_k(ka)} vs {_show_k(kb)} (a named difference: --differ k)",
                     stated=True)  # fmt: skip
    return Check("k", False, f"{_show_k(ka)} vs {_show_k(kb)} (name it with --differ k to compare "
                 "across K)")  # fmt: skip


def pooled_al(item: Input) -> RealizedAL:
    specs = [s for run in item.runs for s in run.specs() if s.get("num_spec_steps") is not None]
    return realized_al([s["num_accepted_draft_tokens"] for s in specs],
                       [s["num_spec_steps"] for s in specs])  # fmt: skip


def _show_al(label: str, al: RealizedAL) -> str:
    if not al.verify_steps:
        return f"{label} AL unknown (no per-request acceptance stats)"
    ci = al.interval()
    span = f"95% CI {ci.low:.3f} to {ci.high:.3f}" if ci.method != "none" else "no interval"
    return f"{label} AL {al.al:.3f} ({span}, {al.requests} requests)"


def _mode(item: Input) -> str:
    """ "forced" when every run forced its acceptance, "natural" when none did, else "mixed"."""
    forced = {run.forced for run in item.runs}
    return "mixed" if len(forced) > 1 else "forced" if forced == {True} else "natural"


def _show_mode(item: Input) -> str:
    mode = _mode(item)
    if mode == "mixed":
        return f"{item.label} mixed (forced and natural runs)"
    targets = sorted({t for t in (r.forced_al for r in item.runs) if t is not None})
    said = f" (AL {', '.join(f'{t:g}' for t in targets)})" if mode == "forced" and targets else ""
    return f"{item.label} {mode}{said}"


def _same_targets(a: set[float | None], b: set[float | None]) -> bool:
    """The forced ALs two servers report, equal within the record's tolerance (3.78 and
    1 + 2.78 are one target)."""

    def close(x: float, ys: set[float]) -> bool:
        return any(math.isclose(x, y, rel_tol=0, abs_tol=TOLERANCE) for y in ys)

    fa, fb = {t for t in a if t is not None}, {t for t in b if t is not None}
    return all(close(x, fb) for x in fa) and all(close(y, fa) for y in fb)


def check_acceptance(a: Input, b: Input, named: Sequence[str]) -> Check:
    """Forced runs agree (their realized AL intervals overlap, same forced AL where both say);
    natural ones state the difference B - A with its interval. A forced run against a natural
    one (or an input that mixes them) is no comparison: the acceptance checks apply to forced
    pairs only, and a natural AL is no statement about a forced one."""
    ala, alb = pooled_al(a), pooled_al(b)
    both = f"{_show_al(a.label, ala)}; {_show_al(b.label, alb)}"
    modes = {_mode(a), _mode(b)}
    if modes != {"forced"} and modes != {"natural"} and a.prediction != b.prediction:
        # a prediction's acceptance is its input (forced, or replayed from the trace): stated
        # against the observed one, its difference part of the prediction's error
        return Check("acceptance", True, f"a prediction against a measurement: {_show_mode(a)}, "
                     f"{_show_mode(b)}: {both}{_difference(ala, alb, b.label, a.label)}",
                     stated=True)  # fmt: skip
    if modes != {"forced"} and modes != {"natural"}:
        return Check("acceptance", False, f"{_show_mode(a)}, {_show_mode(b)}: a forced "
                     f"acceptance is not comparable with a natural one: {both}")  # fmt: skip
    if modes == {"natural"} or "k" in named:
        why = "a named K difference" if "k" in named else "natural acceptance"
        return Check("acceptance", True, f"{why}: {both}{_difference(ala, alb, b.label, a.label)}",
                     stated=True)  # fmt: skip
    if not ala.verify_steps or not alb.verify_steps:
        return Check("acceptance", False, f"forced, but unknown: {both}")
    ta, tb = ({r.forced_al for r in x.runs} for x in (a, b))
    if None not in ta | tb and not _same_targets(ta, tb):
        shown = " vs ".join(
            ",".join(f"{t:g}" for t in sorted(t for t in s if t is not None)) for s in (ta, tb)
        )
        return Check("acceptance", False, f"forced at different ALs ({shown}): {both}")
    ia, ib = ala.interval(), alb.interval()
    if "none" in (ia.method, ib.method):
        return Check("acceptance", False, f"forced, too few requests for an interval: {both}")
    ok = ia.low <= ib.high and ib.low <= ia.high
    verdict = "intervals overlap" if ok else "intervals do not overlap"
    return Check("acceptance", ok, f"forced: {both}: {verdict}")


def _difference(a: RealizedAL, b: RealizedAL, label_b: str, label_a: str) -> str:
    if not (a.verify_steps and b.verify_steps and math.isfinite(a.se) and math.isfinite(b.se)):
        return ""
    q = float(_stats.norm.ppf((1 + CONFIDENCE) / 2))
    d, se = b.al - a.al, math.hypot(a.se, b.se)
    return f"; {label_b} - {label_a} {d:+.3f} (95% CI {d - q * se:+.3f} to {d + q * se:+.3f})"


def pooled_histogram(item: Input) -> Counter[int]:
    out: Counter[int] = Counter()
    for run in item.runs:
        for spec in run.specs():
            for j, n in (spec.get("acceptance_histogram") or {}).items():
                out[int(j)] += int(n)
    return out


def check_histogram(a: Input, b: Input, named: Sequence[str]) -> Check:
    """Chi-square homogeneity of the pooled histograms {accepted drafts: verify steps}; required
    of forced runs only (natural ones differ by design, and the test is stated)."""
    ha, hb = pooled_histogram(a), pooled_histogram(b)
    required = _mode(a) == _mode(b) == "forced" and "k" not in named
    why = ("a named K difference" if "k" in named and _mode(a) == _mode(b)
           else "natural acceptance" if _mode(a) == _mode(b) == "natural"
           else f"{_show_mode(a)}, {_show_mode(b)}")  # fmt: skip
    if not ha or not hb:
        return Check("histogram", not required, f"unknown: {a.label} has {sum(ha.values())}, "
                     f"{b.label} {sum(hb.values())} verify steps in histograms",
                     stated=not required)  # fmt: skip
    p, df = homogeneity(ha, hb)
    steps = f"{sum(ha.values())} vs {sum(hb.values())} verify steps"
    if not required:
        return Check("histogram", True, f"chi-square p {p:.3g} (df {df}, {steps}): stated, "
                     f"not required ({why})", stated=True)  # fmt: skip
    ok = p >= ALPHA
    return Check("histogram", ok, f"chi-square p {p:.3g} (df {df}, {steps})"
                 + ("" if ok else f": below {ALPHA:g}, the forced histograms differ"))  # fmt: skip


def homogeneity(a: Counter[int], b: Counter[int]) -> tuple[float, int]:
    """(p-value, degrees of freedom) of the chi-square test that two histograms share one
    distribution; p 1 when every step fell in one bucket."""
    keys = sorted(set(a) | set(b))
    if len(keys) < 2:
        return 1.0, 0
    table = np.array([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]], dtype=float)
    result = _stats.chi2_contingency(table, correction=False)
    return float(result.pvalue), int(result.dof)


def checks(a: Input, b: Input, named: Sequence[str]) -> list[Check]:
    return [check_model(a, b), check_prompts(a, b), check_sampling(a, b), check_lengths(a, b),
            check_k(a, b, named), check_acceptance(a, b, named),
            check_histogram(a, b, named)]  # fmt: skip


# --- aggregate-only inputs: checked from their settings -------------------------------------


def who_is_aggregate_only(a: Input, b: Input) -> str:
    names = [x.label for x in (a, b) if x.aggregate_only]
    return " and ".join(names) + (" are" if len(names) > 1 else " is") + " aggregate-only"


def not_run(name: str, a: Input, b: Input) -> Check:
    return Check(name, None, f"needs per-request data: {who_is_aggregate_only(a, b)}")


def _speculation(run: Run) -> tuple[str, int | None] | None:
    """(method, K) of a run that speculates; None when speculation is off (method null/none)."""
    method = run.settings.get("method")
    if not isinstance(method, str) or method.strip().lower() in ("", "none"):
        return None
    k = run.settings.get("num_spec_tokens")
    return method, k if rundir.is_int(k) else None


def _show_spec(spec: tuple[str, int | None] | None) -> str:
    if spec is None:
        return "speculation off"
    return spec[0].upper() + (f" K {spec[1]}" if spec[1] is not None else "")


def _settings_of(item: Input, names: Sequence[str]) -> set[tuple[Any, ...]]:
    return {tuple(orjson.dumps(run.settings.get(n), option=orjson.OPT_SORT_KEYS).decode()
                  for n in names) for run in item.runs}  # fmt: skip


def states_deployment(run: Run) -> bool:
    """An aggregate-only run states its deployment; so does a simulated run that records one
    (``settings.tensor_parallel``, written by ``sim --output-dir``)."""
    return run.aggregate_only or (is_predicted(run) and "tensor_parallel" in run.settings)


def check_deployment(a: Input, b: Input, lenient: bool) -> Check:
    """The same chip, engine, precision, parallelism and GPUs (an aggregate-only run states
    them, as a simulated run does; a field a prediction leaves null is not compared when
    ``lenient``)."""
    for item in (a, b):
        if not all(states_deployment(run) for run in item.runs):
            return Check("deployment", None, f"unknown: {item.label} is not aggregate-only and "
                         "records no chip, parallelism or GPUs")  # fmt: skip
        found = _settings_of(item, DEPLOYMENT)
        if len(found) > 1:
            return Check("deployment", False, f"{item.label}'s runs differ in their deployment")
    da = dict(zip(DEPLOYMENT, next(iter(_settings_of(a, DEPLOYMENT))), strict=True))
    db = dict(zip(DEPLOYMENT, next(iter(_settings_of(b, DEPLOYMENT))), strict=True))
    differ = [f"{n} {da[n]} vs {db[n]}" for n in DEPLOYMENT
              if da[n] != db[n] and not (lenient and "null" in (da[n], db[n]))]  # fmt: skip
    if differ:
        return Check("deployment", False, "; ".join(differ).replace('"', ""))
    shown = ", ".join(f"{n} {da[n]}" for n in DEPLOYMENT
                      if da[n] != "null" and da[n] == db[n]).replace('"', "")  # fmt: skip
    unstated = [f"{n} ({(a if da[n] == 'null' else b).label} states none)" for n in DEPLOYMENT
                if da[n] != db[n]]  # fmt: skip
    return Check("deployment", True, f"{shown or 'nothing stated'} in both"
                 + (f"; not compared: {', '.join(unstated)}" if unstated else ""))  # fmt: skip


def check_published_lengths(a: Input, b: Input) -> Check:
    """The published input and output lengths (settings), since no request's are known."""
    names = ("input_tokens", "output_tokens")
    for item in (a, b):
        if not all(run.aggregate_only for run in item.runs):
            return not_run("lengths", a, b)
    la, lb = _settings_of(a, names), _settings_of(b, names)
    for item, found in ((a, la), (b, lb)):
        if len(found) > 1:
            return Check("lengths", False, f"{item.label}'s runs differ in their lengths")

    def show(found: set[tuple[Any, ...]]) -> str:
        lengths = [orjson.loads(v) for v in single(found)]
        return " / ".join("unknown" if x is None else f"{x['min']}" if x["min"] == x["max"]
                          else f"{x['min']}-{x['max']}" for x in lengths)  # fmt: skip

    if la != lb:
        return Check("lengths", False, f"published input / output tokens {show(la)} vs {show(lb)}")
    return Check("lengths", True, f"published input / output tokens {show(la)} in both (no "
                 f"per-request lengths: {who_is_aggregate_only(a, b)})")  # fmt: skip


def check_load(a: Input, b: Input) -> Check:
    """Single runs: the same concurrency (or request rate); sweeps: load axes that overlap."""
    la, lb = loads(a), loads(b)

    def show(loads: Iterable[tuple[str, float]]) -> str:
        return ", ".join(f"{v:g}" for _, v in sorted(loads)) or "none"

    common = sorted(la.keys() & lb.keys())
    if a.kind == b.kind == "run":
        if not common:
            return Check("load", False, f"concurrency {show(la)} vs {show(lb)}")
        return Check("load", True, f"{common[0][0].replace('_', ' ')} {show(common)} in both")
    if not common:
        return Check("load", False, f"no load in common: {a.label} {show(la)}, "
                     f"{b.label} {show(lb)}")  # fmt: skip
    return Check("load", True, f"{common[0][0].replace('_', ' ')} {show(common)} in both "
                 f"({a.label} {show(la)}, {b.label} {show(lb)})")  # fmt: skip


def check_speculation(
    a: Input, b: Input, named: Sequence[str]
) -> tuple[Check, tuple[Input, Input, tuple[str, int | None]] | None]:
    """The K check of aggregate-only inputs, from their settings (method, K); and, when
    speculation is off in one and on in the other, (off, on, (method, K)): a speculation A/B."""
    sa = {_speculation(run) for run in a.runs}
    sb = {_speculation(run) for run in b.runs}
    for item, found in ((a, sa), (b, sb)):
        if len(found) > 1:
            return Check("k", False, f"{item.label}'s runs differ: "
                         + ", ".join(sorted(map(_show_spec, found)))), None  # fmt: skip
    xa, xb = single(sa), single(sb)
    if xa == xb:
        return Check("k", True, f"{_show_spec(xa)} in both"), None
    if (xa is None) != (xb is None):
        off, on = (a, b) if xa is None else (b, a)
        spec = xb if xa is None else xa
        assert spec is not None
        return Check("k", True, f"{off.label} {_show_spec(None)}, {on.label} {_show_spec(spec)}: "
                     "a speculation A/B"), (off, on, spec)  # fmt: skip
    if "k" in named:
        return Check("k", True, f"{_show_spec(xa)} vs {_show_spec(xb)} (a named difference: "
                     "--differ k)", stated=True), None  # fmt: skip
    return Check("k", False, f"{_show_spec(xa)} vs {_show_spec(xb)} (name it with --differ k "
                 "to compare across K)"), None  # fmt: skip


def aggregate_checks(
    a: Input, b: Input, named: Sequence[str], lenient: bool
) -> tuple[list[Check], tuple[Input, Input, tuple[str, int | None]] | None]:
    """The checks of a pair with an aggregate-only input, in the order they are reported (a
    deployment field a prediction leaves null not compared when ``lenient``); and the
    speculation A/B, where it is one (``check_speculation``)."""
    spec_check, ab = check_speculation(a, b, named)
    return [check_model(a, b), not_run("prompts", a, b), not_run("sampling", a, b),
            check_published_lengths(a, b), check_deployment(a, b, lenient),
            check_load(a, b), spec_check, not_run("acceptance", a, b),
            not_run("histogram", a, b)], ab  # fmt: skip
