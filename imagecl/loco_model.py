"""LoCo's model: a backbone cut into stages, grouped into local units with their own heads.

The backbone is cut into stages (:func:`split_stages`). Each *local unit* runs some stages on an
input detached from the previous unit's graph, pools, and projects with its own head (global
average pool → Linear → ReLU → Linear, SimCLR v1's head):

* ``overlap=0`` — Greedy InfoMax (Löwe et al. 2019): unit k is stage k. No gradient crosses a
  stage boundary ("gradient isolation").
* ``overlap=1`` — LoCo (Xiong, Ren & Urtasun 2020): unit k is stage k followed by stage k+1,
  which is *shared* with unit k+1 and acts as unit k's decoder; the last unit is the last stage
  alone. Stage k+1 therefore learns from losses k and k+1, and unit k+1's loss reaches stage k+1
  but never stage k, as the unit's input is detached.
* ``end_to_end=True`` — one unit, the whole backbone with one head, nothing detached: SimCLR on
  the same model, the baseline.

Cost of the overlap: the shared stage k+1 runs twice per step, once in unit k on the attached
output of stage k (so that loss k reaches stage k) and once in unit k+1 on the detached one (so
that loss k+1 does not). One pass cannot give both, since the gradient into the input of a stage
is that of *all* the losses downstream of its output. The first pass does not update batch-norm
running statistics, so every batch-norm layer sees each batch once, as in end-to-end training.

``--compile``: the per-unit training path (:mod:`imagecl.loco`) calls the stages, decoders and
heads one by one, never the model's or the backbone's ``forward``, so
:meth:`LoCoModel.compile_units` compiles each of them in place (``nn.Module.compile``: the
state-dict keys do not change).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from imagecl.backbones import ResNetBackbone, SmallCNN
from imagecl.dual_bn import frozen_bn_statistics
from shared.heads import simclr_v1_head

__all__ = [
    "MAX_STAGES",
    "LoCoModel",
    "LoCoOutput",
    "LocalUnit",
    "UnitOutput",
    "check_unit_weights",
    "split_stages",
    "unstack_views",
]

Overlap = Literal[0, 1]
# ResNet: stem + layer1, layer2, layer3, layer4 (the split of GIM and LoCo); SmallCNN: its blocks
MAX_STAGES = 4


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _group_sizes(total: int, groups: int) -> list[int]:
    """Sizes of ``groups`` contiguous groups of ``total`` items; the first ones take the rest."""
    base, rest = divmod(total, groups)
    return [base + (1 if i < rest else 0) for i in range(groups)]


def split_stages(backbone: nn.Module, stages: int) -> list[nn.Module]:
    """The backbone's stages, in order: modules that share the backbone's own layers (no copy).

    ResNet (:class:`~imagecl.backbones.ResNetBackbone`): ``[stem + layer1, layer2, layer3,
    layer4]`` for ``stages=4``, the split of GIM and LoCo; :class:`~imagecl.backbones.SmallCNN`:
    its four conv-BN-ReLU blocks. Fewer stages merge neighbours into contiguous groups, the
    earlier groups taking the extra stage (ResNet with 3: ``[stem..layer2, layer3, layer4]``).
    Pooling is not part of a stage; the heads and :meth:`LoCoModel.readout` pool.

    Shape:
        stage k: ``(B, C_{k-1}, H_{k-1}, W_{k-1}) -> (B, C_k, H_k, W_k)``, ``C_{-1}`` the image's.
    """
    if not _is_int(stages) or not 1 <= stages <= MAX_STAGES:
        raise ValueError(f"stages must be an int in [1, {MAX_STAGES}], got {stages!r}")
    base: list[nn.Module]
    if isinstance(backbone, ResNetBackbone):
        r = backbone.resnet
        stem = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool, r.layer1)
        base = [stem, r.layer2, r.layer3, r.layer4]
    elif isinstance(backbone, SmallCNN):
        blocks = backbone.features  # conv, BN, ReLU per block
        base = [blocks[3 * i : 3 * i + 3] for i in range(MAX_STAGES)]
    else:
        raise ValueError(
            f"split_stages supports ResNetBackbone and SmallCNN, got {type(backbone).__name__}"
        )
    out: list[nn.Module] = []
    start = 0
    for size in _group_sizes(MAX_STAGES, stages):
        group = base[start : start + size]
        out.append(group[0] if size == 1 else nn.Sequential(*group))
        start += size
    return out


def _out_channels(stage: nn.Module) -> int:
    """Channels of a stage's output: those of its last batch norm (or convolution)."""
    for module in reversed(list(stage.modules())):
        if isinstance(module, nn.BatchNorm2d):
            return module.num_features
        if isinstance(module, nn.Conv2d):
            return module.out_channels
    raise ValueError(f"cannot tell the output channels of stage {type(stage).__name__}")


def _pool(fmap: Tensor) -> Tensor:
    return fmap.mean(dim=(2, 3))  # (B, C, H, W) -> (B, C): global average pooling


def _decoder(channels: int, depth: int) -> nn.Module:
    """``depth`` extra 3×3 conv-BN-ReLU layers before a unit's head (LoCo's deeper decoder)."""
    if depth == 0:
        return nn.Identity()
    layers: list[nn.Module] = []
    for _ in range(depth):
        conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        layers += [conv, nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


class LocalUnit(NamedTuple):
    """One local unit: what it runs between its (possibly detached) input and its head."""

    stages: tuple[int, ...]  # stages it owns, in order; the last one's output feeds the next unit
    decoder: tuple[int, ...]  # shared stages run after them (LoCo: the next unit's first stage)
    detach_input: bool  # gradient isolation from the units below


class UnitOutput(NamedTuple):
    """What :meth:`LoCoModel.forward_unit` computes."""

    output: Tensor  # (B, C, H', W') output of the unit's last own stage: the next unit's input
    features: list[Tensor]  # (B, C_s) pooled output of each stage the unit owns
    projection: Tensor  # (B, head_dim) z of the unit's head, the one contrasted


class LoCoOutput(NamedTuple):
    """What one forward of :class:`LoCoModel` computes."""

    features: list[Tensor]  # per stage, (B, C_k) pooled output, for readout (not detached)
    projections: list[Tensor]  # per unit, (B, head_dim)


def check_unit_weights(weights: Sequence[float] | None, units: int) -> tuple[float, ...]:
    """The ``units`` loss weights w_k as floats, 1 each when ``weights`` is None.

    Raises ``ValueError`` unless there is one finite weight >= 0 per unit.
    """
    if weights is None:
        return (1.0,) * units
    values = tuple(weights)
    if len(values) != units:
        raise ValueError(f"expected {units} unit weights, got {len(values)}: {values}")
    for w in values:
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"unit weights must be finite numbers >= 0, got {values}")
    return tuple(float(w) for w in values)


class LoCoModel(nn.Module):
    """A backbone cut into local units, each with its own pooled MLP projection head.

    See the module docstring for the units of ``overlap`` 0 (GIM) and 1 (LoCo) and of
    ``end_to_end``. ``self.backbone`` is the backbone itself (the stages are its own modules),
    so the encoder is evaluated and exported as for any other method.

    Args:
        backbone: a :class:`~imagecl.backbones.ResNetBackbone` or
            :class:`~imagecl.backbones.SmallCNN`.
        stages: how many stages to cut it into (1–4, :func:`split_stages`).
        overlap: 0 for Greedy InfoMax's disjoint units, 1 for LoCo's overlapping units.
        head_dim: width of every head's projection z (128, SimCLR).
        decoder_depth: extra conv-BN-ReLU layers of each unit, not shared, before its head
            (LoCo's study of deeper decoders).
        unit_weights: w_k of each unit's loss, one per unit (default 1 each).
        end_to_end: one unit, the whole backbone and one head, no detaching: SimCLR.

    Shape:
        - Input: x of shape (B, C, H, W), float, normalised
        - Output: :class:`LoCoOutput`, ``features[k]`` of shape (B, C_k) for each stage,
          ``projections[u]`` of shape (B, head_dim) for each unit
    """

    def __init__(
        self,
        backbone: nn.Module,
        *,
        stages: int = 4,
        overlap: Overlap = 1,
        head_dim: int = 128,  # SimCLR's z (Chen et al. 2020, Sec. 2.1)
        decoder_depth: int = 0,
        unit_weights: Sequence[float] | None = None,
        end_to_end: bool = False,
    ) -> None:
        super().__init__()
        if not _is_int(overlap) or overlap not in (0, 1):
            raise ValueError(f"overlap must be 0 (GIM) or 1 (LoCo), got {overlap!r}")
        if not _is_int(head_dim) or head_dim < 1:
            raise ValueError(f"head_dim must be an int >= 1, got {head_dim!r}")
        if not _is_int(decoder_depth) or decoder_depth < 0:
            raise ValueError(f"decoder_depth must be an int >= 0, got {decoder_depth!r}")
        if not isinstance(end_to_end, bool):
            raise ValueError(f"end_to_end must be a bool, got {end_to_end!r}")
        stage_modules = split_stages(backbone, stages)
        self.backbone = backbone
        # a plain tuple, not registered: the modules are the backbone's (registered there), so
        # state_dict keys and checkpoints are those of the backbone, with no duplicates
        self._stages: tuple[nn.Module, ...] = tuple(stage_modules)
        self.stage_dims: tuple[int, ...] = tuple(_out_channels(s) for s in stage_modules)
        self.feature_dim = self.stage_dims[-1]  # h of the whole backbone, as Backbone's
        self.overlap, self.end_to_end = overlap, end_to_end
        K = len(stage_modules)
        if end_to_end:
            units = [LocalUnit(tuple(range(K)), (), detach_input=False)]
        else:
            units = [
                LocalUnit((k,), (k + 1,) if overlap and k + 1 < K else (), detach_input=True)
                for k in range(K)
            ]
        self.units: tuple[LocalUnit, ...] = tuple(units)
        widths = [self.stage_dims[(u.decoder or u.stages)[-1]] for u in units]
        self.decoders = nn.ModuleList(_decoder(c, decoder_depth) for c in widths)
        self.heads = nn.ModuleList(simclr_v1_head(c, head_dim) for c in widths)
        self.unit_weights = check_unit_weights(unit_weights, len(units))

    @property
    def stages(self) -> tuple[nn.Module, ...]:
        """The stages, in order (modules of ``self.backbone``)."""
        return self._stages

    def compile_units(self, **kwargs: Any) -> None:
        """Compile, in place, every module the per-unit path calls: stages, decoders, heads.

        :meth:`forward_unit` calls them one by one, so compiling ``forward`` or the backbone
        would leave training uncompiled. Each gets ``nn.Module.compile(**kwargs)`` (the
        arguments of ``torch.compile``), which keeps the state-dict keys unchanged.

        Every module compiled this way is one more cache entry of the same frame (the modules'
        shared call), and each may need a few (train and eval mode, the shared stage's pass with
        frozen statistics, inputs with and without gradient): dynamo's per-frame recompile limit
        (8 by default) would leave the later modules uncompiled, so it is raised to fit them.
        """
        modules = (*self._stages, *self.decoders, *self.heads)
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, 4 * len(modules) + 8)
        for module in modules:
            module.compile(**kwargs)

    def forward_unit(self, unit: int, x: Tensor) -> UnitOutput:
        """Run unit ``unit`` on ``x``, the previous unit's output (or the images, for unit 0).

        Shape:
            x: ``(B, C, H, W)``; see :class:`UnitOutput`.
        """
        spec = self.units[unit]
        h = x.detach() if spec.detach_input else x  # gradient isolation
        features = []
        for s in spec.stages:
            h = self._stages[s](h)  # (B, C_s, H_s, W_s)
            features.append(_pool(h))  # (B, C_s)
        decoded = h
        for s in spec.decoder:  # LoCo: the next unit's stage, on the attached output
            with frozen_bn_statistics(self._stages[s]):
                decoded = self._stages[s](decoded)  # (B, C_s, H_s, W_s)
        decoded = self.decoders[unit](decoded)  # (B, C, H', W')
        z = self.heads[unit](_pool(decoded))  # (B, head_dim)
        return UnitOutput(h, features, z)

    def forward(self, x: Tensor) -> LoCoOutput:
        features: list[Tensor] = []
        projections: list[Tensor] = []
        h = x
        for unit in range(len(self.units)):
            h, unit_features, z = self.forward_unit(unit, h)
            features += unit_features
            projections.append(z)
        return LoCoOutput(features, projections)

    def readout(self, x: Tensor, stage: int) -> Tensor:
        """Pooled features of stage ``stage`` (0-based): stages 0..stage, no head, no decoder.

        For linear evaluation of any stage; call it in ``eval()`` mode and under
        ``torch.no_grad()`` for frozen features (the caller decides, as with ``backbone``).

        Shape:
            x: ``(B, C, H, W)``; result: ``(B, stage_dims[stage])``.
        """
        if not _is_int(stage) or not 0 <= stage < len(self._stages):
            raise ValueError(f"stage must be an int in [0, {len(self._stages) - 1}], got {stage!r}")
        h = x
        for s in range(stage + 1):
            h = self._stages[s](h)  # (B, C_s, H_s, W_s)
        return _pool(h)  # (B, C_stage)


def unstack_views(out: LoCoOutput, views: int = 2) -> list[LoCoOutput]:
    """Split the output of a forward over stacked views (rows ``n·V + v``) into one per view.

    Shape:
        out fields: ``(N·V, D)``; result: V outputs with fields ``(N, D)``.
    """
    if not _is_int(views) or views < 1:
        raise ValueError(f"views must be an int >= 1, got {views!r}")

    def take(t: Tensor, v: int) -> Tensor:
        return t.view(-1, views, t.shape[-1])[:, v]  # (N, V, D) -> (N, D)

    return [
        LoCoOutput([take(f, v) for f in out.features], [take(z, v) for z in out.projections])
        for v in range(views)
    ]
