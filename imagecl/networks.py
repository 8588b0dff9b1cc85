"""The image network SimCLR, SupCon, CLAE and cross-entropy train: backbone -> h, head -> z.

SimCLR and SupCon contrast z = g(h) and evaluate h (Chen et al. 2020, Sec. 2.1); cross-entropy
trains a linear classifier on h end to end. Two further classifiers read a *detached* h, so
their gradients never reach the backbone: SupCon's joint classifier (trained alongside the
contrastive loss, the one-stage variant of Khosla et al. 2020) and the online linear probe that
shows representation quality while training. A MoCo-style queue of past keys can ride along;
as a submodule its buffers are in ``state_dict``, hence in every checkpoint.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from torch import Tensor, nn

from imagecl.backbones import Backbone
from shared.heads import LinearHead, simclr_v1_head, simclr_v2_head
from shared.losses import MemoryQueue

__all__ = ["HEADS", "ImageModel", "ModelOutput", "build_head"]

Head = Literal["mlp", "mlp3", "linear", "none"]
HEADS: tuple[str, ...] = ("mlp", "mlp3", "linear", "none")


class ModelOutput(NamedTuple):
    """What one forward computes; fields are ``None`` where the model has no such part."""

    h: Tensor  # (B, feature_dim) representation, the one evaluated
    z: Tensor | None  # (B, head_dim) projection, the one contrasted
    logits: Tensor | None  # (B, C) classifier: end to end (ce) or on detached h (joint)
    probe_logits: Tensor | None  # (B, C) online linear probe on detached h


def build_head(kind: Head, in_dim: int, out_dim: int = 128) -> nn.Module:
    """SimCLR's heads: ``mlp`` (v1, 2 layers), ``mlp3`` (v2, 3 layers with BN), ``linear``,
    ``none`` (z = h, SimCLR Fig. 8's "no projection")."""
    if kind == "mlp":
        return simclr_v1_head(in_dim, out_dim)
    if kind == "mlp3":
        return simclr_v2_head(in_dim, out_dim)
    if kind == "linear":
        return nn.Linear(in_dim, out_dim)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"head must be one of {HEADS}, got {kind!r}")


class ImageModel(nn.Module):
    """Backbone with an optional head, classifier, online probe and queue.

    ``classifier_detached`` says whether the classifier reads ``h.detach()`` (SupCon's joint
    classifier) or ``h`` (cross-entropy training).

    Shape:
        input: ``(B, C, H, W)`` float, normalised; output fields as in :class:`ModelOutput`.
    """

    def __init__(
        self,
        backbone: Backbone,
        *,
        head: nn.Module | None = None,
        num_classes: int = 0,
        classifier: Literal["none", "end_to_end", "detached"] = "none",
        online_probe: bool = False,
        queue: MemoryQueue | None = None,
    ) -> None:
        super().__init__()
        if classifier not in ("none", "end_to_end", "detached"):
            raise ValueError(f"classifier must be none, end_to_end or detached, got {classifier!r}")
        if (classifier != "none" or online_probe) and num_classes < 2:
            raise ValueError(f"a classifier or probe needs >= 2 classes, got {num_classes}")
        self.backbone = backbone
        self.head = head
        self.classifier_mode = classifier
        dim = backbone.feature_dim
        self.classifier = None if classifier == "none" else LinearHead(dim, num_classes)
        self.probe = LinearHead(dim, num_classes) if online_probe else None
        self.queue = queue

    @property
    def feature_dim(self) -> int:
        return self.backbone.feature_dim

    def forward(self, x: Tensor) -> ModelOutput:
        h = self.backbone(x)  # (B, feature_dim)
        z = None if self.head is None else self.head(h)  # (B, head_dim)
        logits = None
        if self.classifier is not None:
            detached = self.classifier_mode == "detached"
            logits = self.classifier(h.detach() if detached else h)  # (B, C)
        probe_logits = None if self.probe is None else self.probe(h.detach())  # (B, C)
        return ModelOutput(h, z, logits, probe_logits)
