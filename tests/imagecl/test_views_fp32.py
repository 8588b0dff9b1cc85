"""The augmentations of a training step run in fp32 and stay on the device.

Two properties of every augmentation entry point a training step calls
(:class:`imagecl.augment.SimCLRViews`, :func:`imagecl.colour.color_jitter`,
:func:`contragan.diffaug.diff_augment`):

* **fp32 whatever the loop's precision**: the loop runs every forward under a bf16 autocast on
  a GPU, and the views must not depend on it (the crop's ``affine_grid`` and the blur's
  convolution would otherwise run in bf16 and shift the crops). CPU autocast stands in for CUDA's.
* **no host→device traffic**: after the first call, a call builds no tensor from host data and
  copies nothing between devices (on a GPU each such copy waits for the queue). Proven on the
  CPU twice: by counting the ops that construct tensors from host data in a
  ``TorchDispatchMode`` (:class:`HostTraffic`), and on a fake CUDA device
  (``FakeTensorMode``: shapes and devices without a GPU), where the same mode also catches
  any CPU tensor fed to a CUDA op and any read of a value back to the host.

And evaluation draws the views of a test split a chunk at a time, not all at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from contragan.diffaug import diff_augment
from imagecl import colour, evaluate
from imagecl.augment import PRESETS, SimCLRViews
from imagecl.backbones import build_backbone
from imagecl.colour import ColorJitterParams, color_jitter
from imagecl.data import load_data

aten = torch.ops.aten
# ops that turn host data (a Python list or scalar) into a tensor
LIFTS = {aten.lift_fresh.default, aten.lift_fresh_copy.default, aten.scalar_tensor.default}


def _devices(args: Any) -> set[torch.device]:
    flat = args if isinstance(args, (list, tuple)) else [args]
    out: set[torch.device] = set()
    for a in flat:
        if isinstance(a, Tensor):
            out.add(a.device)
        elif isinstance(a, (list, tuple)):
            out |= _devices(a)
    return out


class HostTraffic(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every op that brings host data to ``device`` or moves a tensor between devices.

    Counted: tensors built from host data (``lift_fresh``, ``lift_fresh_copy``,
    ``scalar_tensor``), ``_to_copy``/``copy_`` whose source and destination devices differ,
    factory calls (``device=`` keyword) for a device other than ``device``, and any op whose
    tensor arguments live on more than one device (a CPU scalar fed to a device kernel).
    ``host_draws`` lists factory calls on the CPU separately when ``device`` is not the CPU.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.device = device
        self.events: list[str] = []
        self.host_draws: list[str] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        inputs = _devices(list(args))
        if func in LIFTS:
            self.events.append(name)
        elif func is aten._to_copy.default:
            target = torch.device(kwargs.get("device") or args[0].device)
            if target != args[0].device:
                self.events.append(f"{name} {args[0].device} -> {target}")
        elif func is aten.copy_.default:
            if args[0].device != args[1].device:
                self.events.append(f"{name} {args[1].device} -> {args[0].device}")
        elif kwargs.get("device") is not None and torch.device(kwargs["device"]) != self.device:
            self.host_draws.append(name)
        elif len(inputs) > 1:
            self.events.append(f"{name} mixes {sorted(map(str, inputs))}")
        return func(*args, **kwargs)


def _images(n: int, channels: int, side: int, device: torch.device | str = "cpu") -> Tensor:
    return torch.randint(0, 256, (n, channels, side, side), dtype=torch.uint8, device=device)


def _jitter_inputs(n: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    x = torch.rand(n, 3, 8, 8, device=device)
    factors, _ = ColorJitterParams(0.4, 0.4, 0.4, 0.1, 1.0)(n, x.device)  # (n, 4)
    return x, factors


# an entry point: prepare() builds it on the host (outside any fake mode), and the function it
# returns places it on a device and returns one call of it there
Place = Callable[[torch.device], Callable[[], Tensor]]
Entry = Callable[[], Place]


def _views(preset: str, channels: int) -> Entry:
    def prepare() -> Place:
        aug = SimCLRViews(16, [0.5] * channels, [0.25] * channels, preset)

        def place(device: torch.device) -> Callable[[], Tensor]:
            moved, images = aug.to(device), _images(4, channels, 20, device)
            return lambda: moved(images)

        return place

    return prepare


def _jitter() -> Place:
    def place(device: torch.device) -> Callable[[], Tensor]:
        x, factors = _jitter_inputs(4, device)
        return lambda: color_jitter(x, factors, (3, 2, 1, 0))

    return place


def _diffaug() -> Place:
    def place(device: torch.device) -> Callable[[], Tensor]:
        x = torch.rand(4, 3, 16, 16, device=device) * 2 - 1
        return lambda: diff_augment(x, "color,translation,cutout")

    return place


ENTRIES: dict[str, Entry] = {
    **{f"views-{preset}-{c}ch": _views(preset, c) for preset in sorted(PRESETS) for c in (1, 3, 5)},
    "color_jitter": _jitter,
    "diff_augment": _diffaug,
}


@pytest.mark.parametrize("channels", [1, 3, 5])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_views_are_the_same_with_and_without_bf16_autocast(preset: str, channels: int) -> None:
    """The loop's bf16 autocast does not reach the views: same seed, same views, bit for bit."""
    mean, std = [0.5] * channels, [0.25] * channels
    aug = SimCLRViews(16, mean, std, preset)
    images = _images(6, channels, 24)
    fp32 = aug(images, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = aug(images, generator=torch.Generator().manual_seed(0))
    assert amp.dtype == torch.float32
    assert torch.equal(amp, fp32), f"views moved by {float((amp - fp32).abs().max()):.3g}"


def test_colour_ops_and_diffaug_are_the_same_under_bf16_autocast() -> None:
    x, factors = _jitter_inputs(5)
    expected = color_jitter(x, factors, (0, 1, 2, 3))
    g = torch.Generator().manual_seed(0)
    y = torch.rand(4, 3, 16, 16, generator=g) * 2 - 1
    augmented = diff_augment(y, generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(color_jitter(x, factors, (0, 1, 2, 3)), expected)
        assert torch.equal(diff_augment(y, generator=torch.Generator().manual_seed(1)), augmented)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_a_call_builds_no_tensor_from_host_data(name: str) -> None:
    """After the first call, no op of a call lifts host data into a tensor or copies across
    devices (the CPU proxy of "no host→device copy on a GPU")."""
    run = ENTRIES[name]()(torch.device("cpu"))
    run()  # the first call may set things up
    with HostTraffic(torch.device("cpu")) as traffic:
        run()
    assert traffic.events == []


def test_a_seeded_call_builds_no_tensor_from_host_data() -> None:
    """With a generator too: the seed is read from it on its own device (the CPU here)."""
    aug = SimCLRViews(16, [0.5] * 3, [0.25] * 3, "simclr_imagenet")
    images = _images(4, 3, 20)
    aug(images, generator=torch.Generator().manual_seed(0))
    with HostTraffic(torch.device("cpu")) as traffic:
        aug(images, generator=torch.Generator().manual_seed(1))
    assert traffic.events == []


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_on_a_fake_cuda_device_nothing_crosses_from_the_host(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a (fake) CUDA device: the module's constants moved with ``.to``, every parameter drawn
    there, no CPU tensor fed to a CUDA op, no copy between devices, no value read back (a fake
    tensor has no value: reading one raises). The jitter order is the one deliberate host-side
    draw (a CPU permutation that decides which kernels run, never a tensor on the device); a
    fake tensor cannot be read, so the order is fixed here."""
    monkeypatch.setattr(colour, "jitter_order", lambda: [0, 1, 2, 3])
    cuda = torch.device("cuda", 0)
    place = ENTRIES[name]()
    with FakeTensorMode(allow_non_fake_inputs=True):
        run = place(cuda)
        run()
        with HostTraffic(cuda) as traffic:
            out = run()
    assert out.device == cuda and out.dtype == torch.float32
    assert traffic.events == []
    assert traffic.host_draws == []


# --- evaluation: the views of a test split, a chunk at a time ---------------------------------


class _RecordingViews(SimCLRViews):
    """SimCLRViews that records how many images each call augments."""

    def __init__(self) -> None:
        super().__init__(16, [0.45], [0.22], "small_gray")
        self.sizes: list[int] = []

    def forward(self, images: Tensor, generator: torch.Generator | None = None) -> Tensor:
        self.sizes.append(images.shape[0])
        return super().forward(images, generator)


def test_encode_views_augments_chunk_by_chunk() -> None:
    views, images = _RecordingViews(), _images(10, 1, 16)
    encoder = nn.Sequential(nn.Flatten(), nn.Linear(256, 4))
    cpu = torch.device("cpu")
    z1, z2 = evaluate.encode_views(encoder, images, views, cpu, seed=0, batch_size=4)
    assert views.sizes == [4, 4, 2]
    assert z1.shape == z2.shape == (10, 4) and not torch.equal(z1, z2)
    again = evaluate.encode_views(encoder, images, views, cpu, seed=0, batch_size=4)
    assert torch.equal(again[0], z1) and torch.equal(again[1], z2)  # seeded


def test_evaluate_encoder_never_augments_the_whole_test_split_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The alignment/uniformity views (2 per test image: 1.8 GB for STL-10's test split in one
    call) are drawn in chunks, as ``encode`` does for the features."""
    data = load_data("digits", seed=0)  # 450 test images
    monkeypatch.setattr(
        evaluate, "encode_views", functools.partial(evaluate.encode_views, batch_size=100)
    )
    views = _RecordingViews()
    torch.manual_seed(0)
    out = evaluate.evaluate_encoder(
        build_backbone("small_cnn", in_channels=1, width=4),
        data,
        device=torch.device("cpu"),
        knn_k=(),
        views=views,
    )
    assert views.sizes == [100, 100, 100, 100, 50]
    assert {"alignment", "uniformity"} <= set(out)
