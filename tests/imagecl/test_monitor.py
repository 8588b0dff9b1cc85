"""The kNN monitor of ``imagecl train`` scores every class: image-folder splits are ordered by
class, so the monitor's cap on the number of images takes a seeded, class-stratified subset
(``imagecl.data.stratified_subset``) of each split, never its first images."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from imagecl import evaluate
from imagecl.config import Config
from imagecl.data import ImageData, TensorImageDataset, stratified_subset
from imagecl.models import build_model
from shared.probes import knn_probe

CPU = torch.device("cpu")


def class_ordered(sizes: list[int]) -> Tensor:
    """Labels ``0, 0, ..., 1, 1, ...`` with ``sizes[c]`` items of class ``c``."""
    return torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))


@pytest.mark.parametrize(
    ("sizes", "cap"),
    [
        ([10, 20, 30, 40, 3], 5),
        ([10, 20, 30, 40, 3], 50),
        ([500] * 10, 99),
        ([1000, 1, 1, 7, 300], 50),
        ([3, 3, 3], 8),
    ],
)
def test_the_subset_covers_every_class_in_proportion(sizes: list[int], cap: int) -> None:
    labels = class_ordered(sizes)
    N, C = labels.numel(), len(sizes)
    keep = stratified_subset(labels, cap, seed=0)
    assert keep.numel() == cap and len(set(keep.tolist())) == cap
    assert torch.equal(keep, keep.sort().values) and 0 <= int(keep.min()) <= int(keep.max()) < N
    counts = torch.bincount(labels[keep], minlength=C)
    assert bool((counts >= 1).all())  # cap >= number of classes: every class is there
    for n_c, count in zip(sizes, counts.tolist(), strict=True):
        # the documented bound: between (cap - C)·n_c / N and cap·n_c / N + 1
        assert (cap - C) * n_c / N <= count <= cap * n_c / N + 1
    assert torch.equal(keep, stratified_subset(labels, cap, seed=0))  # seeded


def test_the_subset_is_random_within_a_class_and_keeps_small_splits_whole() -> None:
    labels = class_ordered([100, 100])
    first, second = stratified_subset(labels, 20, seed=0), stratified_subset(labels, 20, seed=1)
    assert not torch.equal(first, second)
    assert torch.equal(stratified_subset(labels, 200, seed=0), torch.arange(200))
    with pytest.raises(ValueError, match="max_count must be >= 1"):
        stratified_subset(labels, 0, seed=0)


def _class_ordered_data(per_class_train: int, per_class_test: int, classes: int) -> ImageData:
    generator = torch.Generator().manual_seed(0)

    def split(per_class: int) -> TensorImageDataset:
        labels = torch.arange(classes).repeat_interleave(per_class)  # ordered by class
        images = torch.randint(0, 256, (labels.numel(), 3, 8, 8), generator=generator)
        return TensorImageDataset(images.to(torch.uint8), labels)

    train = split(per_class_train)
    mean, std = (0.5,) * 3, (0.29,) * 3
    return ImageData("folder", train, split(per_class_test), train, classes, 3, 8, mean, std, ())


def test_the_run_monitor_on_class_ordered_data_sees_every_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More images than the cap, ordered by class: the first 60 would be classes 0-1 only."""
    data = _class_ordered_data(per_class_train=30, per_class_test=30, classes=10)
    cfg = Config(data="imagefolder", backbone="small_cnn", width=8, online_probe=False)
    seen: dict[str, Tensor] = {}

    def recording(
        train_h: Tensor, train_y: Tensor, test_h: Tensor, test_y: Tensor, **kw: Any
    ) -> float:
        seen["train"], seen["test"] = train_y, test_y
        return knn_probe(train_h, train_y, test_h, test_y, **kw)

    monkeypatch.setattr(evaluate, "knn_probe", recording)
    monitor = evaluate.make_monitor(data, CPU, seed=cfg.seed, where="test", max_images=60)
    assert monitor is not None
    numbers = monitor(build_model(cfg, data))
    assert set(numbers) == {"knn20_acc", "feature_std"}
    for split in ("train", "test"):
        assert seen[split].numel() == 60
        assert torch.bincount(seen[split], minlength=10).tolist() == [6] * 10, split
