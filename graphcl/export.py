"""Encoders on disk: a ``safetensors`` file whose header carries the config that rebuilds it.

``pretrain`` writes ``encoder.safetensors`` (and the same config as ``encoder.json`` beside it,
for people); ``finetune`` and ``probe`` rebuild the encoder from the header alone, so a file
copied elsewhere still loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors
from torch import nn

from graphcl.features import LAYOUTS
from graphcl.models import build_encoder
from shared.checkpoint import atomic_write, export_encoder, load_encoder

__all__ = ["encoder_from_config", "load_pretrained", "save_pretrained"]

ENCODER_KEYS = ("encoder", "layout", "num_layers", "hidden", "jk", "pooling", "dropout")


def encoder_from_config(config: dict[str, Any]) -> nn.Module:
    """Build the encoder described by ``config`` (keys :data:`ENCODER_KEYS`), randomly init."""
    missing = [key for key in ENCODER_KEYS if key not in config]
    if missing:
        raise ValueError(f"encoder config lacks {missing}; it holds {sorted(config)}")
    if config["layout"] not in LAYOUTS:
        raise ValueError(f"unknown feature layout {config['layout']!r}; known: {sorted(LAYOUTS)}")
    layout = LAYOUTS[config["layout"]]
    kwargs: dict[str, Any] = {"num_layers": config["num_layers"], "hidden": config["hidden"]}
    if config["encoder"] == "gin":
        kwargs.update(jk=config["jk"], pooling=config["pooling"], dropout=config["dropout"])
    return build_encoder(
        config["encoder"], atom_vocab=layout.atom_vocab, bond_vocab=layout.bond_vocab, **kwargs
    )


def save_pretrained(encoder: nn.Module, path: Path, config: dict[str, Any]) -> Path:
    """``encoder.safetensors`` with the encoder config in its header, and ``encoder.json``."""
    plain = {key: config[key] for key in ENCODER_KEYS}
    export_encoder(encoder, path, metadata={"encoder_config": json.dumps(plain)})
    with atomic_write(path.with_suffix(".json")) as handle:
        handle.write((json.dumps(plain, indent=2) + "\n").encode("utf-8"))
    return path


def load_pretrained(path: Path) -> tuple[nn.Module, dict[str, Any]]:
    """The encoder stored by :func:`save_pretrained` (weights loaded) and its config."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"encoder file {path} does not exist")
    try:
        with safetensors.safe_open(str(path), framework="pt") as reader:
            header = dict(reader.metadata() or {})
    except (safetensors.SafetensorError, OSError) as exc:
        raise ValueError(f"encoder file {path} is not a valid safetensors file: {exc}") from exc
    if "encoder_config" not in header:
        raise ValueError(f"{path} has no encoder_config in its header: not written by pretrain")
    config = json.loads(header["encoder_config"])
    encoder = encoder_from_config(config)
    load_encoder(encoder, path)
    return encoder, config
