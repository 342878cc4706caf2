"""Which optional extra provides a module: the one-line hint for a missing dependency."""

from __future__ import annotations

__all__ = ["EXTRA_OF", "missing_extra_message"]

# The top-level module each extra brings, and the extra that brings it.
EXTRA_OF: dict[str, str] = {
    "click": "cli",
    "rich": "cli",
    "matplotlib": "cli",
    "optax": "train",
    "sklearn": "train",
    "safetensors": "train",
    "starlette": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "httpx": "serve",
    "flax": "flax",
    "qwix": "peers",
    "model_signing": "sign",
    "cryptography": "sign",
    "OpenSSL": "sign",
    "gguf": "gguf",
    "llama_cpp": "gguf",
}


def missing_extra_message(error: ModuleNotFoundError, *, command: str) -> str | None:
    """``"<command> needs the extra 'x': pip install 'stejax[x]' (missing module: m)"``, or None if no extra has it.

    >>> missing_extra_message(ModuleNotFoundError("No module named 'click'", name="click"), command="stejax")
    "stejax needs the extra 'cli': pip install 'stejax[cli]' (missing module: click)"
    """
    root = (error.name or "").partition(".")[0]
    extra = EXTRA_OF.get(root)
    if extra is None:
        return None
    return f"{command} needs the extra {extra!r}: pip install 'stejax[{extra}]' (missing module: {root})"
