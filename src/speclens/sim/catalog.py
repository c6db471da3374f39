"""The catalog: models by architecture and chips by datasheet, for pricing steps from physics.

Shipped entries live in the registry (``registry/catalog/models/<name>.yaml`` and
``registry/catalog/chips/<name>.yaml``), one per file, each citing its source. A model may also
come from a Hugging Face ``config.json``, and a chip from a file ``speclens calibrate --host``
wrote. Every entry is validated like the registry: every problem at once, located by field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from speclens.acceptance import Problem, ValidationError, read_yaml
from speclens.acceptance.files import validate
from speclens.acceptance.registry import shipped_registry
from speclens.acceptance.schema import NonEmptyStr, _Model

Dtype = Literal["fp32", "bf16", "fp16", "fp8", "fp4"]
#: The weight precisions a scenario, ``sim --precision`` and a published run choose: ``fp8``
#: (every weight in FP8) or ``fp4`` (the routed experts in FP4, MXFP4 on AMD and NVFP4 on NVIDIA,
#: as InferenceX runs them; the rest in the model's dtype).
PRECISIONS = ("fp8", "fp4")
#: Bytes per element of each dtype.
BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
Positive = Annotated[float, Field(gt=0)]
#: A bandwidth a new field states: positive and finite (``.inf`` would price a collective free).
Bandwidth = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1, le=1_000_000)]
Zero = Annotated[int, Field(ge=0, le=1_000_000)]


class Experts(_Model):
    """A mixture of experts: ``routed`` experts of which ``per_token`` run for each token, plus
    ``shared`` ones that always run; the first ``dense_layers`` layers keep a dense MLP."""

    routed: Count
    per_token: Count
    shared: Zero = 0
    intermediate_size: Count
    dense_layers: Zero = 0
    #: The width routed experts run at, when narrower than the model (a latent MoE).
    hidden_size: Count | None = None
    #: The routed experts' weights, when stored apart from the rest (None: the model's dtype).
    dtype: Dtype | None = None
    #: The dtype the routed experts' matmuls run in, when not the model's (an FP4 checkpoint's
    #: experts run at the chip's FP4 peak; weights stored narrow but computed wide leave it None).
    matmul_dtype: Dtype | None = None


class Mla(_Model):
    """Multi-head latent attention: the KV cache holds one compressed latent per token."""

    kv_lora_rank: Count
    q_lora_rank: Count | None = None
    qk_rope_head_dim: Zero = 64
    qk_nope_head_dim: Count = 128
    v_head_dim: Count = 128


class _Entry(_Model):
    """What every catalog entry carries: its kind, its name, and where its numbers come from."""

    kind: str
    name: NonEmptyStr
    description: str | None = None
    source: NonEmptyStr
    notes: str | None = None


class ModelSpec(_Entry):
    kind: Literal["Model"] = "Model"
    num_hidden_layers: Count
    hidden_size: Count
    num_attention_heads: Count
    num_key_value_heads: Count
    head_dim: Count | None = None
    intermediate_size: Count
    vocab_size: Count
    tie_word_embeddings: bool = False
    dtype: Dtype = "bf16"
    kv_dtype: Dtype = "bf16"
    experts: Experts | None = None
    mla: Mla | None = None
    #: Layers that keep per-token KV (the rest are linear attention); None: all of them.
    full_attention_layers: Zero | None = None
    mtp_layers: Zero = 0


Fraction = Annotated[float, Field(gt=0, le=1)]
Seconds = Annotated[float, Field(ge=0, le=10)]


class Efficiency(_Model):
    """The share of each peak a step reaches, and what it pays regardless: the roofline's free
    parameters (what ``calibrate`` fits)."""

    compute: Fraction = 0.5
    memory: Fraction = 0.8
    interconnect: Fraction = 0.7
    overhead: Seconds = 1e-3
    #: Per sequence in a step: the engine's own work per request (scheduling, sampling).
    per_sequence: Seconds = 2e-5
    #: Per query token of a decode (verify) step, beyond the roofline: the work that grows with
    #: the positions a step verifies (sampling each, MoE routing and its small grouped GEMMs).
    #: Prefill tokens pay the roofline only. On one-token decode steps it cannot be told from
    #: ``per_sequence``; a speculating step's K + 1 positions tell them apart.
    per_token: Seconds = 0.0
    all_reduce_latency: Seconds = 1e-5
    #: The share of memory the engine may fill (weights and KV cache).
    memory_utilization: Fraction = 0.9
    #: A disaggregated deployment's prefill pool's compute efficiency, where it differs from
    #: ``compute`` (a fit on disaggregated points sets it: what queues their prompts, the prefill
    #: workers' kernels or their KV hand-off, shows there); None: ``compute``.
    prefill_compute: Fraction | None = None


class FittedOn(_Model):
    """The published runs a chip's efficiency defaults were fitted on: how many MTP-off points
    of how many deployments (single-node) or configurations (disaggregated), and the
    concurrencies they span (a prediction past them extrapolates, and says so)."""

    runs: Literal["single-node", "disaggregated"]
    points: Count
    groups: Count
    concurrency: Annotated[list[Count], Field(min_length=2, max_length=2)]

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        span = data.get("concurrency")
        if not (isinstance(span, list) and len(span) == 2 and all(type(c) is int for c in span)):
            return []
        if span[0] > span[1]:
            return [(("concurrency",), f"expected [lowest, highest], got {span}")]
        return []


class ChipSpec(_Entry):
    kind: Literal["Chip"] = "Chip"
    #: Dense (no sparsity) peak TFLOP/s by the dtype a matmul runs in.
    tflops: dict[Dtype, Positive]
    memory_gb: Positive
    memory_bandwidth_tbps: Positive
    #: Scale-up bandwidth per GPU, one direction (GB/s).
    interconnect_gbps: Positive
    #: The GPUs one scale-up fabric (NVLink, Infinity Fabric) joins: 8 on an HGX board, 72 in an
    #: NVL72 rack. A collective over more crosses the network. None: unbounded.
    scale_up_domain: Count | None = None
    #: Scale-out (RDMA NIC) bandwidth per GPU, one direction (GB/s): what a collective wider than
    #: the scale-up domain runs at. None: ``interconnect_gbps``.
    scale_out_gbps: Bandwidth | None = None
    #: What ``calibrate --host`` measured, and how (free-form).
    measured: dict[str, Any] | None = None
    #: The roofline's defaults on this chip (fitted on published runs; the fields not given, and
    #: a chip without it, take the global defaults): what a roofline uses where its caller gives
    #: no efficiency.
    efficiency: Efficiency | None = None
    #: What ``efficiency`` was fitted on (with it, and only with it).
    fitted_on: FittedOn | None = None

    def link_gbps(self, width: int) -> float:
        """The bandwidth per GPU (GB/s, one direction) a collective over ``width`` GPUs runs at:
        the scale-up fabric's while they fit one domain (or none is stated), else the network's
        (the scale-up figure where the chip states none): the slowest hop sets a collective's
        pace."""
        if self.scale_up_domain is None or width <= self.scale_up_domain:
            return self.interconnect_gbps
        return self.scale_out_gbps if self.scale_out_gbps is not None else self.interconnect_gbps

    @classmethod
    def _cross_checks(cls, data: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
        found: list[tuple[tuple[str | int, ...], str]] = []
        tflops = data.get("tflops")
        if isinstance(tflops, dict) and "bf16" not in tflops:
            found.append((("tflops",), "must give bf16 (the dtype every chip runs)"))
        if data.get("scale_out_gbps") is not None and data.get("scale_up_domain") is None:
            found.append((("scale_out_gbps",), "never used without scale_up_domain (expected "
                          "both: the GPUs one scale-up fabric joins, and the GB/s past them)"))  # fmt: skip
        if data.get("fitted_on") is not None and data.get("efficiency") is None:
            found.append((("fitted_on",), "states what efficiency defaults were fitted on, but "
                          "the entry gives no efficiency"))  # fmt: skip
        return found


CATALOG = "catalog"


def catalog_dir(kind: str) -> Path:
    return shipped_registry() / CATALOG / kind


def names(kind: str) -> list[str]:
    """The shipped entries of ``kind`` (``models`` or ``chips``)."""
    return sorted(p.stem for p in catalog_dir(kind).glob("*.yaml"))


def _lookup(kind: str, name: str, file: str, field: str) -> Path:
    path = catalog_dir(kind) / f"{name}.yaml"
    if name not in names(kind):
        known = ", ".join(names(kind))
        raise ValidationError([Problem(file, field, f"{name!r} is not in the catalog ({known})")])
    return path


def resolve_model(text: str, file: str = "", field: str = "model") -> ModelSpec:
    """A catalog name, or a path to a model entry or a ``config.json``."""
    path = Path(text)
    return (
        read_model(path) if path.suffix in (".json", ".yaml", ".yml") else model(text, file, field)
    )


def resolve_chip(text: str, file: str = "", field: str = "hardware") -> ChipSpec:
    """A catalog name, or a path to a chip entry (``calibrate --host`` writes one)."""
    path = Path(text)
    return read_chip(path) if path.suffix in (".yaml", ".yml") else chip(text, file, field)


def model(name: str, file: str = "", field: str = "model") -> ModelSpec:
    """A shipped model entry by its catalog name."""
    return read_model(_lookup("models", name, file, field))


def chip(name: str, file: str = "", field: str = "hardware") -> ChipSpec:
    """A shipped chip entry by its catalog name."""
    return read_chip(_lookup("chips", name, file, field))


def read_chip(path: Path) -> ChipSpec:
    return validate(ChipSpec, read_yaml(path), str(path))


def read_model(path: Path) -> ModelSpec:
    """A model entry (YAML), or a Hugging Face ``config.json`` read into one."""
    if path.suffix == ".json":
        return from_hf_config(path)
    return validate(ModelSpec, read_yaml(path), str(path))


def _dtype(config: dict[str, Any]) -> str:
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and "fp8" in str(quant.get("quant_method", "")).lower():
        return "fp8"
    raw = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(raw, "bf16")


def from_hf_config(path: Path) -> ModelSpec:
    """A model entry from a Hugging Face ``config.json`` (a multimodal one's ``text_config``):
    the fields a roofline needs, under the spellings the common architectures use."""
    raw = read_yaml(path)  # JSON is YAML: the same bounded, located reading
    if not isinstance(raw, dict):
        raise ValidationError([Problem(str(path), "(document)", "expected a JSON object")])
    text = raw.get("text_config")
    config: dict[str, Any] = text if isinstance(text, dict) else raw

    def first(*keys: str) -> Any:
        return next((config[k] for k in keys if config.get(k) is not None), None)

    heads = first("num_attention_heads")
    data: dict[str, Any] = {
        "name": str(raw.get("_name_or_path") or path.parent.name or "model"),
        "source": str(path),
        "num_hidden_layers": first("num_hidden_layers", "n_layer", "num_layers"),
        "hidden_size": first("hidden_size", "n_embd", "d_model"),
        "num_attention_heads": heads,
        "num_key_value_heads": first("num_key_value_heads") or heads,
        "intermediate_size": first("intermediate_size", "ffn_dim", "n_inner"),
        "vocab_size": first("vocab_size"),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", False)),
        "dtype": _dtype(raw),
        "mtp_layers": int(first("num_nextn_predict_layers") or 0),
    }
    if first("head_dim") is not None:  # may differ from hidden / heads (Qwen3)
        data["head_dim"] = first("head_dim")
    routed = first("n_routed_experts", "num_experts", "num_local_experts")
    if routed:
        experts = {
            "routed": routed,
            "per_token": first("num_experts_per_tok", "num_experts_per_token"),
            "shared": first("n_shared_experts", "num_shared_experts") or 0,
            "intermediate_size": first("moe_intermediate_size") or data["intermediate_size"],
            "dense_layers": first("first_k_dense_replace") or 0,
        }
        if first("routed_expert_hidden_size"):
            experts["hidden_size"] = first("routed_expert_hidden_size")
        data["experts"] = experts
    if first("kv_lora_rank"):
        data["mla"] = {key: config[key] for key in Mla.model_fields if config.get(key) is not None}
    return validate(ModelSpec, data, str(path))


def check_precision(precision: str, file: str = "", field: str = "precision") -> None:
    """A ``ValidationError`` at ``field`` naming the choices, unless ``precision`` is one."""
    if precision not in PRECISIONS:
        choices = ", ".join(PRECISIONS)
        message = f"{precision!r} is not a weight precision (expected one of {choices})"
        raise ValidationError([Problem(file, field, message)])


def with_precision(
    model: ModelSpec, precision: str | None, file: str = "", field: str = "precision"
) -> ModelSpec:
    """``model`` with its weights at ``precision``: ``fp8``, every weight in FP8; ``fp4``, the
    routed experts stored in FP4 and their matmuls at FP4 (the chip's FP4 peak where it has one,
    else its FP8 peak), the rest in the model's dtype (a dense model, all of it in FP4). None:
    ``model`` unchanged. Anything else: a ``ValidationError`` at ``field`` naming the choices."""
    if precision is None:
        return model
    check_precision(precision, file, field)
    experts = model.experts
    if precision == "fp8":
        update: dict[str, Any] = {"dtype": "fp8"}
        if experts is not None:
            update["experts"] = experts.model_copy(update={"dtype": None, "matmul_dtype": None})
        return model.model_copy(update=update)
    if experts is None:
        return model.model_copy(update={"dtype": "fp4"})
    fp4 = experts.model_copy(update={"dtype": "fp4", "matmul_dtype": "fp4"})
    return model.model_copy(update={"experts": fp4})
