"""``speclens export``: write a model speclens loads as a Hugging Face directory, so the same
weights can be served by vLLM, transformers or SGLang and compared with speclens's engine.

Exit codes: 0 written; 1 refused (the model cannot be loaded, OUT_DIR is not empty without
``--force`` or cannot be written), one line each; 2 bad options; 130 interrupted.
"""

from __future__ import annotations

from pathlib import Path

import typer

from speclens.cli._common import fail, interrupt_deferred, out_console

DTYPE_NAMES = ("float32", "bfloat16", "float16")
MAX_SEED = 2**63 - 1


def export(
    model: str = typer.Argument(
        ..., help="dummy, dummy-draft, smollm2, a .gguf file or a Hugging Face directory."
    ),
    out_dir: Path = typer.Argument(..., help="The directory to write (created if missing)."),
    dtype: str = typer.Option(
        "float32", "--dtype", help="Weight type: float32, bfloat16 or float16."
    ),
    seed: int = typer.Option(0, "--seed", help="The dummy models' weights, as serve --seed."),
    force: bool = typer.Option(
        False, "--force", help="Write into a non-empty OUT_DIR, replacing its model files."
    ),
) -> None:
    """Export MODEL as a Hugging Face directory (config, safetensors, tokenizer, chat template)."""
    if dtype not in DTYPE_NAMES:
        fail(f"command line: --dtype: expected float32, bfloat16 or float16, got {dtype!r}", code=2)
    if not 0 <= seed <= MAX_SEED:
        fail(f"command line: --seed: expected an integer in [0, 2**63 - 1], got {seed}", code=2)
    with interrupt_deferred():  # torch's native import must not see a Ctrl-C
        from speclens.engine.config import ConfigError, ModelLoadError
        from speclens.engine.export import export_model
    try:
        written = export_model(model, out_dir, dtype=dtype, force=force, seed=seed)
    except ModelLoadError as exc:
        fail(f"refused: MODEL {exc.spec}: {str(exc).removeprefix(f'{exc.spec}: ')}")
    except ConfigError as exc:
        fail(f"refused: OUT_DIR {exc}")
    out_console.print(
        f"exported {model} ({dtype}) to {out_dir}: {', '.join(f.name for f in written)}",
        markup=False,
    )
