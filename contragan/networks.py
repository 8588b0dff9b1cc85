"""The class-conditional generator and discriminator of ContraGAN and its baselines.

BigGAN-style ResNets (Brock et al. 2019) as StudioGAN configures them for CIFAR-10 (Kang & Park
2020): the generator maps z and a class to an image through up-sampling residual blocks with
conditional batch norm (a shared class embedding, plus a chunk of z per block under
hierarchical z); the discriminator's trunk of down-sampling residual blocks ends in ReLU and a
global *sum* pool, giving h, read by an unconditional linear logit and by one of three
class-conditioning heads:

- ``"contra"`` (ContraGAN) and ``"reacgan"`` (ReACGAN, Kang et al. 2021): a projection head
  ``l = W h + b`` and a class embedding ``e(y)``, the embedding and proxy of the 2C loss (Kang &
  Park 2020, Eq. 8) or of D2D-CE; the adversarial logit stays unconditional. StudioGAN builds
  the same head for both (``d_cond_mtd`` "2C" and "D2DCE"). With ``arch.proj_adv`` the logit
  gains ProjGAN's ``⟨v(y), h⟩`` from a table of its own (an option of this project).
- ``"proj"`` (ProjGAN, Miyato & Koyama 2018, Eq. 3): the adversarial logit gains ``⟨e(y), h⟩``.
- ``"ac"`` (ACGAN, Odena et al. 2017): class logits ``W h`` for an auxiliary cross-entropy.

Spectral norm on every weight of both networks (except the generator's shared embedding and
its batch norms, as in BigGAN) and orthogonal initialisation with zero biases
(:func:`contragan.models.build_gan`). Sizes and plans: :class:`contragan.arch.GanArch`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from contragan.arch import CONTRASTIVE_LOSSES, GanArch
from contragan.layers import DiscBlock, GenBlock, SelfAttention, sn_conv2d, sn_embedding, sn_linear

__all__ = ["DiscOutput", "Discriminator", "Generator"]


class DiscOutput(NamedTuple):
    """What the discriminator returns.

    ``embedding`` and ``proxy`` are the pair whose agreement conditions the discriminator on
    the class: for ``"contra"`` and ``"reacgan"`` the projection-head output ``l`` (before L2
    normalisation) and the class embedding ``e(y)`` of the 2C loss or D2D-CE; for ``"proj"`` h
    and the projection embedding ``e(y)`` (the adversarial logit holds their dot product); for
    ``"ac"`` h and the classifier
    row ``w_y`` (``class_logits[i, y_i] = ⟨w_{y_i}, h_i⟩``). Their width D is always
    ``arch.embed_dim``, which :class:`GanArch` sets to the trunk width for proj/ac.

    ``fake_proxy`` is the second proxy of the class, the one fakes are assigned to, when the
    head has two per class (``arch.adc``); else None.

    Shape:
        adv: ``(N,)``; embedding: ``(N, D)``; proxy: ``(N, D)``; class_logits: ``(N, C)`` for
        ``"ac"``, else None; fake_proxy: ``(N, D)`` or None.
    """

    adv: Tensor
    embedding: Tensor
    proxy: Tensor
    class_logits: Tensor | None
    fake_proxy: Tensor | None = None


class Generator(nn.Module):
    """``G(z, y)``: a class-conditional BigGAN-style ResNet generator, images in [-1, 1].

    Input linear (z or its first chunk) → ``(width, b, b)``; up-blocks with conditional batch
    norm; self-attention after the first block at >= ``attention_side``; BN, ReLU, 3×3 conv,
    tanh.

    Shape:
        - z: ``(N, z_dim)``; y: ``(N,)`` long class indices
        - output: ``(N, channels, image_size, image_size)``
    """

    def __init__(self, arch: GanArch) -> None:
        super().__init__()
        self.arch = arch
        self.z_dim, self.num_classes = arch.z_dim, arch.num_classes
        widths, chunks, bottom = arch.g_widths, arch.z_chunks, arch.bottom_size
        # BigGAN's shared embedding is a plain table (no spectral norm)
        self.shared = nn.Embedding(arch.num_classes, arch.shared_dim)
        self.linear = sn_linear(chunks[0], widths[0] * bottom * bottom)
        if arch.hierarchical_z:
            cond_dims = [arch.shared_dim + chunk for chunk in chunks[1:]]
        else:
            cond_dims = [arch.shared_dim] * arch.num_ups
        self.blocks = nn.ModuleList(
            GenBlock(widths[i], widths[i + 1], cond_dims[i]) for i in range(arch.num_ups)
        )
        sides = [bottom * 2 ** (i + 1) for i in range(arch.num_ups)]
        self.attention_index = next(
            (i for i, side in enumerate(sides) if side >= arch.attention_side), len(sides) - 1
        )
        self.attention = SelfAttention(widths[self.attention_index + 1]) if arch.attention else None
        self.bn = nn.BatchNorm2d(widths[-1])
        self.conv_out = sn_conv2d(widths[-1], arch.channels, 3, padding=1)

    def forward(self, z: Tensor, y: Tensor) -> Tensor:
        N = z.shape[0]
        if z.shape != (N, self.z_dim) or y.shape != (N,):
            raise ValueError(
                f"Generator expects z of shape (N, {self.z_dim}) and y of shape (N,), got "
                f"{tuple(z.shape)} and {tuple(y.shape)}"
            )
        chunks = torch.split(z, list(self.arch.z_chunks), dim=1)
        shared = self.shared(y)  # (N, shared_dim)
        if self.arch.hierarchical_z:
            conds = [torch.cat([shared, chunk], dim=1) for chunk in chunks[1:]]  # (N, S + c_i)
        else:
            conds = [shared] * len(self.blocks)
        side, width = self.arch.bottom_size, self.arch.g_widths[0]
        h = self.linear(chunks[0]).view(N, width, side, side)  # (N, width, b, b)
        for i, block in enumerate(self.blocks):
            h = block(h, conds[i])  # (N, width_i, b·2^(i+1), b·2^(i+1))
            if self.attention is not None and i == self.attention_index:
                h = self.attention(h)
        images: Tensor = torch.tanh(self.conv_out(F.relu(self.bn(h))))  # (N, channels, S, S)
        return images


def _projection(e: Tensor, h: Tensor) -> Tensor:
    """ProjGAN's class term ``⟨e(y), h⟩`` per sample: ``(N, F), (N, F) -> (N,)``."""
    return (e * h).sum(dim=1)


class _ContrastiveHead(nn.Module):
    """ContraGAN's and ReACGAN's head: ``l = W h + b`` and the class embedding ``e(y)``, both
    spectrally normalised (StudioGAN); the adversarial logit is left unconditional.

    With ``adc`` the table has ``2C`` rows, as StudioGAN's: row ``2y`` is class y's proxy for
    real images, row ``2y + 1`` its proxy for fakes (``DiscOutput.fake_proxy``).

    With ``proj_adv`` a second table ``v`` (``class_adv``, width of h) makes the adversarial
    logit ProjGAN's, ``adv + ⟨v(y), h⟩``; the proxies stay the class term's alone."""

    def __init__(
        self, feature_dim: int, num_classes: int, embed_dim: int, adc: bool, proj_adv: bool
    ) -> None:
        super().__init__()
        self.adc = adc
        self.projection = sn_linear(feature_dim, embed_dim)
        self.proxies = sn_embedding(num_classes * (2 if adc else 1), embed_dim)
        self.class_adv = sn_embedding(num_classes, feature_dim) if proj_adv else None

    def forward(self, h: Tensor, y: Tensor, adv: Tensor) -> DiscOutput:
        if self.class_adv is not None:
            adv = adv + _projection(self.class_adv(y), h)
        embedding = self.projection(h)  # (N, D)
        if not self.adc:
            return DiscOutput(adv, embedding, self.proxies(y), None)
        # one lookup: in training mode each access of the normalised table runs a power iteration
        real_proxy, fake_proxy = self.proxies(torch.stack([2 * y, 2 * y + 1])).unbind(0)
        return DiscOutput(adv, embedding, real_proxy, None, fake_proxy)


class _ProjectionHead(nn.Module):
    """ProjGAN's class term: ``adv + ⟨e(y), h⟩`` (Miyato & Koyama 2018, Eq. 3)."""

    def __init__(self, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = sn_embedding(num_classes, feature_dim)

    def forward(self, h: Tensor, y: Tensor, adv: Tensor) -> DiscOutput:
        e = self.embedding(y)  # (N, F)
        return DiscOutput(adv + _projection(e, h), h, e, None)


class _ClassifierHead(nn.Module):
    """ACGAN's auxiliary classifier ``W h``, bias-free as in StudioGAN, so the proxy ``w_y``
    and h give the logit of the conditioning class: ``class_logits[i, y_i] = ⟨w_{y_i}, h_i⟩``."""

    def __init__(self, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.classifier = sn_linear(feature_dim, num_classes, bias=False)

    def forward(self, h: Tensor, y: Tensor, adv: Tensor) -> DiscOutput:
        # one access of the spectrally normalised weight: in training mode each access runs a
        # power iteration
        weight = self.classifier.weight  # (C, F)
        return DiscOutput(adv, h, weight[y], h @ weight.T)  # logits (N, C)


class Discriminator(nn.Module):
    """``D(x, y)``: BigGAN-style ResNet trunk, ReLU, global sum pool, then the heads.

    Shape:
        - x: ``(N, channels, image_size, image_size)``; y: ``(N,)`` long class indices
        - output: :class:`DiscOutput` with ``D = embed_dim``
    """

    def __init__(self, arch: GanArch) -> None:
        super().__init__()
        self.arch = arch
        plan = arch.d_plan
        self.blocks = nn.ModuleList(
            DiscBlock(c_in, c_out, downsample=down, first=i == 0)
            for i, (c_in, c_out, down) in enumerate(plan)
        )
        side, sides = arch.image_size, []
        for _, _, down in plan:
            side = side // 2 if down else side
            sides.append(side)
        self.attention_index = next(
            (i for i, s in enumerate(sides) if s <= arch.attention_side), len(sides) - 1
        )
        self.attention = SelfAttention(plan[self.attention_index][1]) if arch.attention else None
        width = arch.feature_dim
        self.linear = sn_linear(width, 1)
        self.head: nn.Module
        if arch.loss in CONTRASTIVE_LOSSES:
            self.head = _ContrastiveHead(
                width, arch.num_classes, arch.embed_dim, arch.adc, arch.proj_adv
            )
        elif arch.loss == "proj":
            self.head = _ProjectionHead(width, arch.num_classes)
        else:
            self.head = _ClassifierHead(width, arch.num_classes)

    def forward(self, x: Tensor, y: Tensor) -> DiscOutput:
        arch = self.arch
        expected = (arch.channels, arch.image_size, arch.image_size)
        if x.ndim != 4 or tuple(x.shape[1:]) != expected or y.shape != (x.shape[0],):
            raise ValueError(
                f"Discriminator expects x of shape (N, {', '.join(map(str, expected))}) and y "
                f"of shape (N,), got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        h = x
        for i, block in enumerate(self.blocks):
            h = block(h)  # (N, width_i, side_i, side_i)
            if self.attention is not None and i == self.attention_index:
                h = self.attention(h)
        h = F.relu(h).sum(dim=(2, 3))  # (N, F): global sum pool
        adv = self.linear(h).squeeze(1)  # (N,)
        out: DiscOutput = self.head(h, y, adv)
        return out
