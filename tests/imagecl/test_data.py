"""imagecl.data: every source on data that exists offline (sklearn digits, scikit-image photos) or
that the test writes in the source's own on-disk format (CIFAR pickles, STL-10 binaries, folders
of PNG/JPEG files). Nothing is downloaded."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

from imagecl.data import (
    DATASETS,
    ImageData,
    TensorImageDataset,
    channel_stats,
    collate_uint8,
    images_and_labels,
    load_data,
)
from imagecl.digits_m import BACKGROUND_PHOTOS, blend_digits, random_background_crops
from imagecl.sources import digit_images, stratified_split


@pytest.fixture(scope="module")
def digits() -> ImageData:
    return load_data("digits")


@pytest.fixture(scope="module")
def digits_m() -> ImageData:
    return load_data("digits-m")


def check_image_data(data: ImageData, channels: int, size: int) -> None:
    """The contract every source keeps: uint8 (C, S, S) items, long labels, stats in [0, 1]."""
    assert data.channels == channels and data.image_size == size
    assert len(data.mean) == len(data.std) == channels
    assert all(0.0 <= m <= 1.0 for m in data.mean) and all(0.0 < s <= 0.5 for s in data.std)
    for split in (data.train, data.test, data.pretrain):
        if len(split) == 0:
            continue
        image, label = split[0]
        assert image.dtype == torch.uint8 and image.shape == (channels, size, size)
        assert isinstance(label, int)
        images, labels = images_and_labels(split)
        assert images.shape == (len(split), channels, size, size)
        assert labels.dtype == torch.long and labels.shape == (len(split),)


def float_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = images.to(torch.float64) / 255.0  # (N, C, H, W)
    return x.mean(dim=(0, 2, 3)), x.std(dim=(0, 2, 3), unbiased=False)


# --------------------------------------------------------------------------- digits


def test_digits_shapes_dtypes_ranges(digits: ImageData) -> None:
    check_image_data(digits, channels=1, size=32)
    assert digits.name == "digits" and digits.num_classes == 10 and digits.skipped == ()
    assert len(digits.train) + len(digits.test) == 1797
    assert digits.pretrain is digits.train
    images, labels = images_and_labels(digits.train)
    assert int(images.min()) == 0 and int(images.max()) == 255  # 0..16 scaled to 0..255
    assert set(labels.tolist()) == set(range(10))
    mean, std = float_stats(images)  # statistics come from the train split
    assert digits.mean == pytest.approx(mean.tolist(), abs=1e-12)
    assert digits.std == pytest.approx(std.tolist(), abs=1e-12)


def test_digits_upsampling_keeps_the_8x8_digit() -> None:
    from sklearn.datasets import load_digits

    images, labels = digit_images(32)
    assert images.shape == (1797, 1, 32, 32) and labels.shape == (1797,)
    # average-pooling 4×4 blocks of the (smooth) bilinear upsample gives back the 8×8 digits
    pooled = torch.nn.functional.avg_pool2d(images.double(), 4).flatten()  # (N·64,)
    original = torch.from_numpy(load_digits().images).flatten()  # (N·64,)
    assert torch.corrcoef(torch.stack([pooled, original]))[0, 1] > 0.95
    small = load_data("digits", image_size=16)
    check_image_data(small, channels=1, size=16)


def test_digits_m_shapes_colour_and_split(digits: ImageData, digits_m: ImageData) -> None:
    check_image_data(digits_m, channels=3, size=32)
    assert digits_m.num_classes == 10
    # same seed, same split: the labels of both sources line up
    for a, b in ((digits.train, digits_m.train), (digits.test, digits_m.test)):
        assert torch.equal(images_and_labels(a)[1], images_and_labels(b)[1])
    gray, _ = images_and_labels(digits.train)
    colour, _ = images_and_labels(digits_m.train)
    assert not torch.equal(colour, gray.expand_as(colour))
    # colour matters: in nearly every image the three channels differ
    channels_differ = (colour[:, 0] != colour[:, 1]).flatten(1).any(dim=1)
    assert channels_differ.float().mean() > 0.9
    # and the digit is still there: |background − digit| differs from the background alone
    assert len(digits_m.std) == 3 and len(set(digits_m.mean)) == 3


def test_digits_m_is_the_mnist_m_blend() -> None:
    images, _ = digit_images(32)
    subset = images[:50]
    backgrounds = random_background_crops(50, 32, seed=3)  # (50, 3, 32, 32)
    expected = (backgrounds.int() - subset.int()).abs().to(torch.uint8)  # digit broadcast
    assert torch.equal(blend_digits(subset, seed=3), expected)
    blank = torch.zeros(4, 1, 32, 32, dtype=torch.uint8)
    assert torch.equal(blend_digits(blank, seed=3), random_background_crops(4, 32, seed=3))
    full = torch.full((4, 1, 32, 32), 255, dtype=torch.uint8)
    assert torch.equal(blend_digits(full, seed=3), 255 - random_background_crops(4, 32, seed=3))


def test_digits_m_backgrounds_are_crops_of_the_photos() -> None:
    from imagecl.digits_m import background_photos

    photos = background_photos()
    assert len(photos) == len(BACKGROUND_PHOTOS) >= 5
    assert all(p.ndim == 3 and p.shape[2] == 3 and p.dtype == np.uint8 for p in photos)
    crop = random_background_crops(1, 8, seed=0)[0].permute(1, 2, 0).numpy()  # (8, 8, 3)
    windows = (
        np.lib.stride_tricks.sliding_window_view(p, (8, 8, 3))[..., 0, :, :, :] for p in photos
    )
    assert any((w == crop).all(axis=(-3, -2, -1)).any() for w in windows)


def test_digits_m_determinism() -> None:
    a, b, c = load_data("digits-m", seed=5), load_data("digits-m", seed=5), load_data("digits-m")
    for split in ("train", "test"):
        x_a, y_a = images_and_labels(getattr(a, split))
        x_b, y_b = images_and_labels(getattr(b, split))
        assert torch.equal(x_a, x_b) and torch.equal(y_a, y_b)
    # a different seed draws different backgrounds for the very same digits
    digits, _ = digit_images(32)
    assert not torch.equal(blend_digits(digits, seed=0), blend_digits(digits, seed=1))
    assert not torch.equal(images_and_labels(a.train)[0], images_and_labels(c.train)[0])
    with pytest.raises(ValueError, match="image_size"):
        random_background_crops(2, 10_000, seed=0)


def test_stratified_split_every_class_in_test() -> None:
    data = load_data("digits", test_fraction=0.1, seed=2)
    train_labels = images_and_labels(data.train)[1]
    test_labels = images_and_labels(data.test)[1]
    assert set(test_labels.tolist()) == set(range(10)) == set(train_labels.tolist())
    counts = torch.bincount(train_labels, minlength=10) + torch.bincount(test_labels, minlength=10)
    expected = torch.tensor([max(1, round(0.1 * int(n))) for n in counts])
    assert torch.equal(torch.bincount(test_labels, minlength=10), expected)


def test_stratified_split_is_a_seeded_partition() -> None:
    labels = torch.tensor([0] * 7 + [1] * 2 + [2] * 1 + [3] * 30)
    train, test = stratified_split(labels, 0.25, seed=0)
    assert torch.equal(torch.sort(torch.cat([train, test])).values, torch.arange(40))
    assert set(labels[test].tolist()) == {0, 1, 3}  # a class of one stays in train
    assert torch.equal(stratified_split(labels, 0.25, seed=0)[1], test)
    assert not torch.equal(stratified_split(labels, 0.25, seed=1)[1], test)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "mnist"}, "'mnist'.*digits, digits-m, cifar10"),
        ({"name": "digits", "test_fraction": 0.0}, "test_fraction.*0.0"),
        ({"name": "digits", "test_fraction": 1.0}, "test_fraction.*1.0"),
        ({"name": "digits", "image_size": 0}, "image_size.*0"),
        ({"name": "digits", "seed": -1}, "seed.*-1"),
        ({"name": "cifar10"}, "cifar10 needs root="),
        ({"name": "imagefolder"}, "imagefolder needs root="),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=match):
        load_data(str(name), **kwargs)  # type: ignore[arg-type]


def test_datasets_list() -> None:
    assert DATASETS == (
        "digits",
        "digits-m",
        "cifar10",
        "cifar100",
        "stl10",
        "imagefolder",
        "unlabeled",
    )


# --------------------------------------------------------------------------- torchvision sets


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_cifar(
    root: Path, cls: Any, monkeypatch: pytest.MonkeyPatch
) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Tiny CIFAR files in torchvision's layout; their md5s patched into the class's lists."""
    cifar100 = cls is torchvision.datasets.CIFAR100
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    label_key = "fine_labels" if cifar100 else "labels"
    written: dict[str, tuple[np.ndarray, list[int]]] = {}
    for name, _ in cls.train_list + cls.test_list:
        n = 5
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)  # rows are CHW flattened
        labels = rng.integers(0, 100 if cifar100 else 10, size=n).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, label_key: labels}, f)
        written[name] = (data.reshape(n, 3, 32, 32), labels)
    meta = dict(cls.meta)
    names = [f"class{i}" for i in range(100 if cifar100 else 10)]
    with open(folder / meta["filename"], "wb") as f:
        pickle.dump({meta["key"]: names}, f)
    for attr in ("train_list", "test_list"):
        files = [[name, md5(folder / name)] for name, _ in getattr(cls, attr)]
        monkeypatch.setattr(cls, attr, files)
    monkeypatch.setattr(cls, "meta", {**meta, "md5": md5(folder / meta["filename"])})
    return written


@pytest.mark.parametrize(
    ("name", "cls"),
    [("cifar10", torchvision.datasets.CIFAR10), ("cifar100", torchvision.datasets.CIFAR100)],
)
def test_cifar_from_files(
    name: str, cls: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = write_cifar(tmp_path, cls, monkeypatch)
    data = load_data(name, root=tmp_path)
    check_image_data(data, channels=3, size=32)
    assert data.num_classes == (100 if name == "cifar100" else 10)
    train_files = [file for file, _ in cls.train_list]
    images, labels = images_and_labels(data.train)
    expected = torch.from_numpy(np.concatenate([written[f][0] for f in train_files]))
    assert torch.equal(images, expected)  # CHW rows come back as CHW images
    assert labels.tolist() == [label for f in train_files for label in written[f][1]]
    test_file = cls.test_list[0][0]
    assert torch.equal(images_and_labels(data.test)[0], torch.from_numpy(written[test_file][0]))
    assert data.pretrain is data.train
    mean, std = float_stats(images)
    assert data.mean == pytest.approx(mean.tolist()) and data.std == pytest.approx(std.tolist())
    check_image_data(load_data(name, root=tmp_path, image_size=16), channels=3, size=16)


def test_cifar_download_is_passed_through_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = torchvision.datasets.CIFAR10
    write_cifar(tmp_path, cls, monkeypatch)
    calls: list[str] = []
    monkeypatch.setattr(cls, "download", lambda self: calls.append(str(self.root)))
    load_data("cifar10", root=tmp_path)
    assert calls == []
    load_data("cifar10", root=tmp_path, download=True)
    assert calls == [str(tmp_path)]


def test_missing_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_data("cifar10", root=tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert str(tmp_path / "cifar-10-batches-py") in message and "--download" in message
    assert torchvision.datasets.CIFAR10.url in message
    with pytest.raises(FileNotFoundError, match=r"stl10_binary.*--download.*stl10_binary\.tar\.gz"):
        load_data("stl10", root=tmp_path)


def test_corrupted_dataset_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cls = torchvision.datasets.CIFAR10
    write_cifar(tmp_path, cls, monkeypatch)
    monkeypatch.undo()  # the real md5s: the tiny files fail torchvision's integrity check
    with pytest.raises(ValueError, match=r"md5 check.*--download"):
        load_data("cifar10", root=tmp_path)


def write_stl10(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    """Tiny STL-10 binaries: column-major (N, 3, 96, 96) uint8 images, labels 1..10."""
    cls = torchvision.datasets.STL10
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    arrays = {}
    for split, n in (("train", 6), ("test", 4), ("unlabeled", 3)):
        images = rng.integers(0, 256, size=(n, 3, 96, 96), dtype=np.uint8)
        (folder / f"{split}_X.bin").write_bytes(images.transpose(0, 1, 3, 2).tobytes())
        arrays[f"{split}_X"] = images
        if split != "unlabeled":
            labels = rng.integers(0, 10, size=n).astype(np.uint8)
            (folder / f"{split}_y.bin").write_bytes((labels + 1).tobytes())  # 1-based on disk
            arrays[f"{split}_y"] = labels
    (folder / "class_names.txt").write_text("\n".join(f"class{i}" for i in range(10)) + "\n")
    for attr in ("train_list", "test_list"):
        files = [[name, md5(folder / name)] for name, _ in getattr(cls, attr)]
        monkeypatch.setattr(cls, attr, files)
    return arrays


def test_stl10_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = write_stl10(tmp_path, monkeypatch)
    data = load_data("stl10", root=tmp_path)
    check_image_data(data, channels=3, size=96)
    assert data.num_classes == 10
    for split in ("train", "test"):
        images, labels = images_and_labels(getattr(data, split))
        assert torch.equal(images, torch.from_numpy(arrays[f"{split}_X"]))
        assert labels.tolist() == arrays[f"{split}_y"].tolist()
    images, labels = images_and_labels(data.pretrain)  # train, then the unlabeled split
    expected = np.concatenate([arrays["train_X"], arrays["unlabeled_X"]])
    assert torch.equal(images, torch.from_numpy(expected))
    assert labels.tolist() == arrays["train_y"].tolist() + [-1] * 3
    assert data.pretrain[7][1] == -1
    batch, _ = collate_uint8([data.pretrain[i] for i in range(len(data.pretrain))])
    assert torch.equal(batch, images)
    check_image_data(load_data("stl10", root=tmp_path, image_size=64), channels=3, size=64)


# --------------------------------------------------------------------------- image folders


def save(path: Path, image: Image.Image) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def write_class_folders(root: Path, per_class: int = 4) -> None:
    colours = {"cat": (255, 0, 0), "dog": (0, 255, 0), "eel": (0, 0, 255)}
    for name, colour in colours.items():
        for i in range(per_class):
            save(root / name / f"{i}.png", Image.new("RGB", (40 + i, 20), colour))
    save(root / "cat" / "gray.png", Image.new("L", (30, 30), 128))
    palette = Image.new("P", (10, 10), 0)
    palette.info["transparency"] = b"\x00"
    save(root / "dog" / "palette.png", palette)


def add_bad_files(root: Path) -> None:
    jpeg = root / "cat" / "truncated.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)).save(jpeg)
    jpeg.write_bytes(jpeg.read_bytes()[:400])
    (root / "dog" / "notes.png").write_text("not an image")
    (root / "eel" / "README.txt").write_text("ignored: not an image extension")


def test_imagefolder_skips_unreadable_files(tmp_path: Path) -> None:
    write_class_folders(tmp_path)
    add_bad_files(tmp_path)
    data = load_data("imagefolder", root=tmp_path, seed=1)
    check_image_data(data, channels=3, size=32)
    assert data.num_classes == 3 and len(data.train) + len(data.test) == 14
    skipped = dict(data.skipped)
    assert set(skipped) == {
        str(tmp_path / "cat" / "truncated.jpg"),
        str(tmp_path / "dog" / "notes.png"),
    }
    assert "truncated" in skipped[str(tmp_path / "cat" / "truncated.jpg")].lower()
    assert "UnidentifiedImageError" in skipped[str(tmp_path / "dog" / "notes.png")]
    test_labels = images_and_labels(data.test)[1]
    assert set(test_labels.tolist()) == {0, 1, 2}  # stratified: every class in test
    # solid images decode to their colour, cropped and resized to 32×32
    images, labels = images_and_labels(data.train)
    eel = images[labels == 2]
    assert torch.equal(
        eel, torch.tensor([0, 0, 255], dtype=torch.uint8).view(1, 3, 1, 1).expand_as(eel)
    )
    assert data.pretrain is data.train
    check_image_data(load_data("imagefolder", root=tmp_path, image_size=8), channels=3, size=8)


def test_imagefolder_train_test_layout(tmp_path: Path) -> None:
    write_class_folders(tmp_path / "train", per_class=2)
    save(tmp_path / "test" / "eel" / "0.png", Image.new("RGB", (8, 8), (0, 0, 255)))
    data = load_data("imagefolder", root=tmp_path)
    assert data.num_classes == 3 and len(data.train) == 8 and len(data.test) == 1
    assert images_and_labels(data.test)[1].tolist() == [2]  # the train folder's class index
    save(tmp_path / "test" / "fox" / "0.png", Image.new("RGB", (8, 8)))
    with pytest.raises(ValueError, match=r"\['fox'\]"):
        load_data("imagefolder", root=tmp_path)


def test_imagefolder_nothing_readable(tmp_path: Path) -> None:
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "a.png").write_text("text")
    with pytest.raises(ValueError, match=f"no readable image in {tmp_path}"):
        load_data("imagefolder", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_data("imagefolder", root=tmp_path / "missing")


def test_unlabeled_folder(tmp_path: Path) -> None:
    save(tmp_path / "a.png", Image.new("RGB", (50, 40), (10, 20, 30)))
    save(tmp_path / "deep" / "er" / "b.jpg", Image.new("RGB", (20, 20), (200, 100, 0)))
    save(tmp_path / "deep" / "c.PNG", Image.new("L", (16, 16), 7))
    (tmp_path / "deep" / "broken.png").write_bytes(b"\x89PNG\r\n")
    data = load_data("unlabeled", root=tmp_path, image_size=16)
    check_image_data(data, channels=3, size=16)
    assert data.num_classes == 0 and len(data.train) == len(data.test) == 0
    assert images_and_labels(data.train)[0].shape == (0, 3, 16, 16)
    images, labels = images_and_labels(data.pretrain)
    assert images.shape == (3, 3, 16, 16) and labels.tolist() == [-1, -1, -1]
    assert [Path(file).name for file, _ in data.skipped] == ["broken.png"]
    mean, _ = float_stats(images)  # no train split: statistics of the pretrain images
    assert data.mean == pytest.approx(mean.tolist())


# --------------------------------------------------------------------------- helpers


def test_collate_uint8(digits_m: ImageData) -> None:
    loader = DataLoader(digits_m.train, batch_size=8, collate_fn=collate_uint8)
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.uint8
    assert labels.shape == (8,) and labels.dtype == torch.long
    assert torch.equal(images, images_and_labels(digits_m.train)[0][:8])
    with pytest.raises(ValueError, match="empty"):
        collate_uint8([])
    with pytest.raises(ValueError, match="float32"):
        collate_uint8([(torch.zeros(1, 2, 2), 0)])


class ListDataset(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, items: list[tuple[torch.Tensor, int]]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.items[index]


def test_images_and_labels_paths_agree() -> None:
    images = torch.randint(0, 256, (6, 3, 4, 4), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0, 1, -1])
    dataset = TensorImageDataset(images, labels)
    got = images_and_labels(dataset)
    assert got[0] is dataset.images and torch.equal(got[1], labels)  # no copy
    generic = ListDataset([dataset[i] for i in range(6)])
    for other, index in (
        (generic, list(range(6))),
        (Subset(dataset, [4, 0, 2]), [4, 0, 2]),
        (ConcatDataset([dataset, Subset(dataset, [1])]), [*range(6), 1]),
    ):
        x, y = images_and_labels(other)
        assert torch.equal(x, images[index]) and torch.equal(y, labels[index])
    with pytest.raises(ValueError, match="empty"):
        images_and_labels(ListDataset([]))


def test_tensor_image_dataset_checks() -> None:
    with pytest.raises(ValueError, match="float32"):
        TensorImageDataset(torch.zeros(2, 1, 4, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(2,\)"):
        TensorImageDataset(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(3))
    with pytest.raises(ValueError, match="integers"):
        TensorImageDataset(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(2))
    dataset = TensorImageDataset(
        torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.int32)
    )
    assert dataset.labels.dtype == torch.long and dataset[1][1] == 4 and len(dataset) == 2


def test_channel_stats_oracle() -> None:
    images = torch.randint(0, 256, (37, 3, 9, 9), dtype=torch.uint8)
    mean, std = channel_stats(images)
    expected_mean, expected_std = float_stats(images)
    assert mean == pytest.approx(expected_mean.tolist(), abs=1e-12)
    assert std == pytest.approx(expected_std.tolist(), abs=1e-12)
    assert channel_stats(torch.full((2, 1, 3, 3), 255, dtype=torch.uint8)) == ((1.0,), (0.0,))
