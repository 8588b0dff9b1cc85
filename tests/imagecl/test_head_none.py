"""``--head none``: z = h, so the contrastive loss acts on exactly the h that is probed.

Pins what the investigation of issue 15 item 10 found: the "none" path is what it claims (the
loss contrasts the very h the online probe, the kNN monitor and ``imagecl eval`` read), and h
is a non-negative vector (ReLU, then average pooling), so every cosine between two h lies in
[0, 1]: NT-Xent on z = h can never push two images further apart than orthogonal.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

# needs the image extra (kornia): skipped without it, not a collection error
pytest.importorskip("kornia")

from imagecl import config, models, steps
from imagecl.backbones import build_backbone
from imagecl.data import load_data
from imagecl.networks import ImageModel
from imagecl.studies import head
from imagecl.studies.runner import CellResult
from shared.losses import nt_xent_loss
from shared.runs import RunDir
from shared.runtime import unwrap

CPU = torch.device("cpu")


class FixedViews:
    """The views of a training step, fixed: ``views(images)`` always returns ``x``."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, x: torch.Tensor) -> None:
        self.mean, self.std, self.x = mean, std, x

    def __call__(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return self.x


def test_head_none_contrasts_exactly_the_h_that_is_probed() -> None:
    """The step's contrastive loss is NT-Xent on backbone(x) of the two views, the online
    probe reads that same h, and the model's z is h itself (no copy, no normalisation)."""
    cfg = config.Config(
        **{**config.QUICK, "device": "cpu", "width": 8, "batch_size": 16, "head": "none"}
    )
    data = load_data("digits-m", seed=0)
    built = models.build(cfg, device=CPU, data=data)
    model = unwrap(built.model)
    assert isinstance(model, ImageModel) and model.probe is not None
    images, labels = next(iter(built.loader))
    x = built.views(images, generator=torch.Generator().manual_seed(0))  # (N, 2, C, S, S)
    views = FixedViews(built.views.mean, built.views.std, x)
    torch.manual_seed(0)
    out = steps.train_step(model, (images, labels), cfg=cfg, views=views, gather=False)  # type: ignore[arg-type]
    torch.manual_seed(0)
    forward = model(x.flatten(0, 1))  # the same train-mode forward, rows n·2 + v
    assert forward.z is forward.h
    h = model.backbone(x.flatten(0, 1)).view(x.shape[0], 2, -1)  # (N, 2, D) the evaluated h
    expected = nt_xent_loss(h[:, 0], h[:, 1], temperature=cfg.tau)
    torch.testing.assert_close(out["contrastive_loss"], expected)
    probe_logits = model.probe(h.flatten(0, 1))  # (2N, C)
    accuracy = (probe_logits.argmax(1) == labels.repeat_interleave(2)).float().mean()
    torch.testing.assert_close(out["probe_acc"], accuracy)


@pytest.mark.parametrize("name", ["small_cnn", "resnet18"])
def test_h_is_non_negative_so_every_cosine_lies_in_0_1(name: str) -> None:
    """ReLU then average pooling: h >= 0, so cos(h_i, h_j) ∈ [0, 1] for every pair, in train
    and eval mode, whatever the input; at init h of different images are nearly parallel."""
    torch.manual_seed(0)
    backbone = build_backbone(name, in_channels=3, width=8)
    x = 3 * torch.randn(24, 3, 16, 16)  # far outside the data: the bound holds anyway
    for training in (True, False):
        backbone.train(training)
        with torch.no_grad():
            h = backbone(x)  # (24, D)
        assert (h >= 0).all()
        cosine = F.normalize(h, dim=1) @ F.normalize(h, dim=1).T  # (24, 24)
        assert cosine.min() >= 0 and cosine.max() <= 1 + 1e-5
    off_diagonal = cosine[~torch.eye(24, dtype=torch.bool)]
    assert off_diagonal.mean() > 0.5  # a shared positive mean direction dominates at init


def test_mean_cosine_is_the_mean_over_pairs_of_different_images() -> None:
    torch.manual_seed(0)
    h = torch.rand(5, 3, dtype=torch.float64)
    pairs = [
        float(F.cosine_similarity(h[i], h[j], dim=0))
        for i, j in itertools.permutations(range(5), 2)
    ]
    assert head.mean_cosine(h) == pytest.approx(sum(pairs) / len(pairs), abs=1e-12)
    assert head.mean_cosine(torch.ones(4, 3)) == pytest.approx(1.0)  # all parallel
    assert head.mean_cosine(torch.eye(4)) == pytest.approx(0.0)  # orthogonal: the floor for h >= 0


def test_head_study_report_explains_the_no_head_cell(tmp_path: Path) -> None:
    """The head study's report carries the "none" cell's numbers next to the random-init
    encoder's and the reason: h is non-negative, so its cosines lie in [0, 1]."""
    results = [
        CellResult(
            "none",
            {"head": "none", "head_dim": 0},
            {"probe_h": 0.38, "probe_z": 0.38, "cosine_h": 0.44},
            "ok",
        ),
        CellResult(
            "mlp",
            {"head": "mlp", "head_dim": 128},
            {"probe_h": 0.50, "probe_z": 0.45, "cosine_h": 0.67},
            "ok",
        ),
    ]
    run = RunDir(tmp_path / "study")
    run.plots.mkdir(parents=True)
    sections = head.summarise(results, {"probe_h": 0.402}, run)
    note = sections["No head (z = h)"]
    assert "h 38.0 % against 40.2 % for the random-init encoder" in note
    assert "mean cosine between h of different test images 0.44" in note
    assert "mlp → 128: 0.67" in note and "[0, 1]" in note
    without = head.summarise(results[1:], {"probe_h": 0.402}, run)
    assert "No head (z = h)" not in without
