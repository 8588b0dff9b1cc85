"""Building the models of the ``graphcl`` commands, and loading a pre-trained encoder again.

An encoder is described by a plain config (the keys :data:`graphcl.config.ENCODER_KEYS`):
:func:`encoder_from_config` builds it (the networks are in :mod:`graphcl.encoders`).
``pretrain`` writes ``encoder.safetensors`` with that config in the file's header
(:func:`save_pretrained`, and the same config as ``encoder.json`` beside it, for people);
``finetune`` and ``probe`` rebuild the encoder from the header alone
(:func:`load_pretrained`), so a file copied elsewhere still loads. :class:`GraphCLModel` is the
pre-training model (encoder, projection head, optional queue and JOAO sampler state), built by
:func:`pretrain_model`; :func:`finetune_encoder` is the encoder a fine-tuning run starts from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import safetensors
from torch import Tensor, nn
from torch_geometric.data import Batch

from graphcl.adaptive import AugmentationSampler
from graphcl.config import AUGMENT_CHOICES, ENCODER_KEYS, FinetuneConfig, PretrainConfig
from graphcl.encoders import build_encoder
from graphcl.features import LAYOUTS
from shared.checkpoint import atomic_write, export_encoder, load_encoder
from shared.heads import simclr_v1_head
from shared.losses import MemoryQueue

__all__ = [
    "GraphCLModel",
    "SamplerState",
    "encoder_from_config",
    "finetune_encoder",
    "load_pretrained",
    "pretrain_model",
    "pretrain_names",
    "save_pretrained",
]


def encoder_from_config(config: dict[str, Any]) -> nn.Module:
    """Build the encoder described by ``config`` (keys :data:`ENCODER_KEYS`), randomly init."""
    config = {"conv": "gine", **config}  # encoders saved before the choice of layer existed
    missing = [key for key in ENCODER_KEYS if key not in config]
    if missing:
        raise ValueError(f"encoder config lacks {missing}; it holds {sorted(config)}")
    if config["layout"] not in LAYOUTS:
        raise ValueError(f"unknown feature layout {config['layout']!r}; known: {sorted(LAYOUTS)}")
    layout = LAYOUTS[config["layout"]]
    kwargs: dict[str, Any] = {"num_layers": config["num_layers"], "hidden": config["hidden"]}
    if config["encoder"] == "gin":
        kwargs.update(
            jk=config["jk"],
            pooling=config["pooling"],
            dropout=config["dropout"],
            conv=config["conv"],
        )
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
    if path.stat().st_size == 0:
        raise ValueError(f"encoder file {path} is empty (0 bytes): not a safetensors file")
    try:
        with safetensors.safe_open(str(path), framework="pt") as reader:
            header = dict(reader.metadata() or {})
    except (safetensors.SafetensorError, OSError) as exc:
        raise ValueError(f"encoder file {path} is not a valid safetensors file: {exc}") from exc
    if "encoder_config" not in header:
        raise ValueError(f"{path} has no encoder_config in its header: not written by pretrain")
    try:
        config = json.loads(header["encoder_config"])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: the encoder_config in its header is not JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the encoder_config in its header is not a JSON object")
    encoder = encoder_from_config(config)
    load_encoder(encoder, path)
    return encoder, config


class SamplerState(nn.Module):
    """Holds JOAO's sampler so that its state is part of the model's ``state_dict`` (extra
    state, tensors only) and therefore of every checkpoint."""

    def __init__(self, sampler: AugmentationSampler) -> None:
        super().__init__()
        self.sampler = sampler

    def get_extra_state(self) -> dict[str, Tensor]:
        return self.sampler.state_dict()

    def set_extra_state(self, state: dict[str, Tensor]) -> None:
        self.sampler.load_state_dict(state)


class GraphCLModel(nn.Module):
    """Encoder -> h, projection head -> z, and an optional queue of past keys (in state_dict).

    Shape:
        input: a ``Batch`` of G graphs; output: ``(h (G, feature_dim), z (G, head_dim))``.
    """

    def __init__(self, encoder: nn.Module, head_dim: int, queue_size: int = 0) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = simclr_v1_head(int(encoder.feature_dim), head_dim)  # type: ignore[arg-type]
        self.queue = MemoryQueue(queue_size, head_dim) if queue_size else None
        self.joao: SamplerState | None = None

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        h = self.encoder(batch)  # (G, feature_dim)
        return h, self.head(h)  # (G, head_dim)


def pretrain_names(cfg: PretrainConfig) -> tuple[str, ...]:
    """The augmentation names of a pre-training run's views: ``(augment1, augment2)``, or with
    ``--adaptive`` every augmentation JOAO chooses pairs from."""
    if cfg.adaptive:
        return tuple(name for name in AUGMENT_CHOICES if name != "random")
    return (cfg.augment1, cfg.augment2)


def pretrain_model(cfg: PretrainConfig) -> GraphCLModel:
    """The randomly initialised pre-training model of ``cfg``, with JOAO's sampler (over
    :func:`pretrain_names`) under ``--adaptive``."""
    model = GraphCLModel(encoder_from_config(cfg.encoder_config()), cfg.head_dim, cfg.queue_size)
    if cfg.adaptive:
        sampler = AugmentationSampler(pretrain_names(cfg), gamma=cfg.joao_gamma)
        model.joao = SamplerState(sampler)
    return model


def finetune_encoder(cfg: FinetuneConfig, pretrained: bool) -> nn.Module:
    """The encoder a fine-tuning run starts from: the pre-trained ``--encoder``, its randomly
    initialised twin (``pretrained=False`` with ``--encoder``), or a GIN of the config's
    sizes."""
    if pretrained:
        assert cfg.encoder is not None
        encoder, _ = load_pretrained(cfg.encoder)
        return encoder
    if cfg.encoder is not None:  # scratch twin of the pre-trained architecture
        _, config = load_pretrained(cfg.encoder)
        return encoder_from_config(config)
    return encoder_from_config(
        {
            "encoder": "gin",
            "layout": cfg.layout,
            "num_layers": cfg.num_layers,
            "hidden": cfg.hidden,
            "jk": cfg.jk,
            "pooling": cfg.pooling,
            "conv": cfg.conv,
            "dropout": 0.0,
        }
    )
