"""Throughput of the SimCLR view transform: ours on the batch against torchvision per image and
plain kornia, side by side in one run.

    python benchmarks/image_augment.py                    # 512 images, 32×32, simclr_cifar, 2 views
    python benchmarks/image_augment.py --device cuda --images 4096
    python benchmarks/image_augment.py --preset simclr_imagenet --side 96 --repeats 7

Each method turns the same ``--images`` uint8 images into ``--views`` normalised float32 views:

* ours: :class:`imagecl.augment.SimCLRViews` on the whole batch, moved to ``--device`` once;
* plain kornia: the same ops built directly as ``kornia.augmentation.AugmentationSequential``
  (crop, flip, jitter, grayscale, blur when the preset has it, normalise) on the float batch
  repeated ``V`` times, on ``--device`` — no wrapper;
* torchvision v2 per image: :func:`imagecl.augment.torchvision_views` called in a Python loop
  over the images, on uint8 tensors and on PIL images, then stacked (what a DataLoader worker
  and its collate do), always on the CPU.

Times are medians over ``--repeats`` interleaved repetitions after one warm-up; the table gives
views per second and the ratio to torchvision per image on tensors. CPU runs use
``--threads`` intra-op threads (2 by default).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import kornia.augmentation as K
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from imagecl.augment import (
    BLUR_SIGMA,
    SimCLRViews,
    blur_kernel_size,
    torchvision_views,
    view_config,
)

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)  # CIFAR-10 channel statistics
BASELINE = "torchvision v2 per image, tensor"


def plain_kornia(size: int, preset: str, views: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The recipe written directly with kornia's defaults (slice cropping): one
    AugmentationSequential on the float batch repeated ``views`` times."""
    cfg = view_config(preset)
    s = cfg.jitter_strength
    ops: list[K.AugmentationBase2D] = [
        K.RandomResizedCrop((size, size), cfg.crop_scale, cfg.crop_ratio, resample="bicubic"),
        K.RandomHorizontalFlip(p=cfg.flip_p),
        K.ColorJitter(0.8 * s, 0.8 * s, 0.8 * s, 0.2 * s, p=cfg.jitter_p),
        K.RandomGrayscale(p=cfg.gray_p),
    ]
    if cfg.blur_p > 0:
        k = blur_kernel_size(size)
        ops.append(K.RandomGaussianBlur((k, k), BLUR_SIGMA, p=cfg.blur_p))
    ops.append(K.Normalize(torch.tensor(MEAN), torch.tensor(STD)))
    pipeline = K.AugmentationSequential(*ops)

    def run(images: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = pipeline(images.float().div(255).repeat_interleave(views, dim=0))
        return out

    return run


def methods(args: argparse.Namespace) -> dict[str, tuple[Callable[[], object], torch.device]]:
    """Name -> (one batch of views, the device it runs on)."""
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    cpu_images = torch.randint(0, 256, (args.images, 3, args.side, args.side), generator=g)
    cpu_images = cpu_images.to(torch.uint8)
    pil_images = [Image.fromarray(im.permute(1, 2, 0).numpy()) for im in cpu_images]
    images = cpu_images.to(device)

    ours = SimCLRViews(args.size, MEAN, STD, args.preset, views=args.views).to(device)
    kornia_run = plain_kornia(args.size, args.preset, args.views)
    per_image = torchvision_views(args.size, MEAN, STD, args.preset, views=args.views)
    cpu = torch.device("cpu")
    return {
        "ours (SimCLRViews, batch)": (lambda: ours(images), device),
        "plain kornia (AugmentationSequential)": (lambda: kornia_run(images), device),
        BASELINE: (lambda: torch.stack([per_image(im) for im in cpu_images]), cpu),
        "torchvision v2 per image, PIL": (
            lambda: torch.stack([per_image(im) for im in pil_images]),
            cpu,
        ),
    }


def timer(run: Callable[[], object], device: torch.device) -> Callable[[], float]:
    """Seconds of one call of ``run``, the device synchronised on both sides."""

    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    return once


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--images", type=int, default=512, help="images per batch (default 512)")
    parser.add_argument("--side", type=int, default=32, help="input image side (default 32)")
    parser.add_argument("--size", type=int, default=None, help="view side (default: --side)")
    parser.add_argument("--views", type=int, default=2, help="views per image (default 2)")
    parser.add_argument("--preset", default="simclr_cifar", help="view preset (simclr_cifar)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="CPU intra-op threads (default 2)")
    args = parser.parse_args(argv)
    args.size = args.size or args.side
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda was requested but CUDA is not available here")
    torch.set_num_threads(args.threads)

    runs = methods(args)
    timers = {name: timer(run, device) for name, (run, device) in runs.items()}
    for once in timers.values():  # warm-up (kernels, caches, lazy CUDA init)
        once()
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(args.repeats):  # interleaved, so a busy moment hits every method alike
        for name, once in timers.items():
            times[name].append(once())

    total = args.images * args.views
    median = {name: statistics.median(t) for name, t in times.items()}
    print(
        f"{args.images} images {args.side}×{args.side} -> {args.views} views of "
        f"{args.size}×{args.size}, preset {args.preset}, {args.threads} CPU threads, "
        f"median of {args.repeats}"
    )
    print(f"{'method':<40} {'device':<7} {'ms/batch':>9} {'views/s':>10} {'× tv tensor':>11}")
    for name, seconds in median.items():
        ratio = median[BASELINE] / seconds
        print(
            f"{name:<40} {runs[name][1]!s:<7} {seconds * 1e3:>9.1f} {total / seconds:>10.0f} "
            f"{ratio:>11.2f}"
        )


if __name__ == "__main__":
    main()
