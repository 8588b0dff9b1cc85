"""Image backbones: timm's test_model_backward over every backbone, the CIFAR stem, the errors."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from imagecl.backbones import (
    BACKBONES,
    Backbone,
    ResNetBackbone,
    build_backbone,
    to_channels_last,
)

FEATURE_DIMS = {"resnet18": 512, "resnet50": 2048, "small_cnn": 4 * 32}


@pytest.mark.parametrize("in_channels", [1, 3, 5])
@pytest.mark.parametrize("name", BACKBONES)
def test_backbone_backward(name: str, in_channels: int) -> None:
    """Output (N, feature_dim), finite, input untouched; every parameter gets a finite gradient."""
    torch.manual_seed(0)
    model = build_backbone(name, in_channels=in_channels).train()
    assert isinstance(model, Backbone)
    assert model.feature_dim == FEATURE_DIMS[name]
    x = torch.randn(2, in_channels, 16, 16)  # tiny, so that ResNet-50 stays fast
    x_before = x.clone()
    h = model(x)
    assert h.shape == (2, model.feature_dim) and h.dtype == x.dtype
    assert torch.isfinite(h).all()
    torch.testing.assert_close(x, x_before, rtol=0, atol=0)
    # a random readout: every feature, hence every parameter, takes part in the loss
    (h * torch.randn_like(h)).sum().backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None, f"{name}: {param_name} got no gradient"
        assert torch.isfinite(param.grad).all(), f"{name}: {param_name} has a non-finite gradient"


@pytest.mark.parametrize("in_channels", [1, 3, 5])
@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnet_stems(name: str, in_channels: int) -> None:
    """cifar_stem: 3×3 stride-1 conv1 without bias and no max-pool; otherwise the ImageNet stem."""
    cifar = build_backbone(name, in_channels=in_channels, cifar_stem=True)
    imagenet = build_backbone(name, in_channels=in_channels, cifar_stem=False)
    assert isinstance(cifar, ResNetBackbone) and isinstance(imagenet, ResNetBackbone)
    conv = cifar.resnet.conv1
    assert (conv.in_channels, conv.out_channels) == (in_channels, 64)
    assert conv.kernel_size == (3, 3) and conv.stride == (1, 1) and conv.padding == (1, 1)
    assert conv.bias is None
    assert isinstance(cifar.resnet.maxpool, nn.Identity)
    conv = imagenet.resnet.conv1
    assert (conv.in_channels, conv.out_channels) == (in_channels, 64)
    assert conv.kernel_size == (7, 7) and conv.stride == (2, 2) and conv.bias is None
    assert isinstance(imagenet.resnet.maxpool, nn.MaxPool2d)
    assert isinstance(cifar.resnet.fc, nn.Identity) and isinstance(imagenet.resnet.fc, nn.Identity)


def test_stem_downsampling() -> None:
    """The CIFAR stem keeps 32 px at full resolution into layer1; the ImageNet stem divides by 4."""
    seen: dict[bool, torch.Size] = {}
    for cifar_stem in (True, False):
        model = build_backbone("resnet18", cifar_stem=cifar_stem).eval()
        assert isinstance(model, ResNetBackbone)
        model.resnet.layer1.register_forward_hook(
            lambda _m, _i, out, key=cifar_stem: seen.__setitem__(key, out.shape)
        )
        with torch.no_grad():
            assert model(torch.randn(2, 3, 32, 32)).shape == (2, 512)
    assert seen[True] == (2, 64, 32, 32)
    assert seen[False] == (2, 64, 8, 8)


@pytest.mark.parametrize("width", [4, 16])
def test_small_cnn_width(width: int) -> None:
    """feature_dim is the last block's 4·width; 8 px digits and 32 px images both work."""
    model = build_backbone("small_cnn", in_channels=1, width=width).eval()
    assert model.feature_dim == 4 * width
    with torch.no_grad():
        for size in (8, 32):
            assert model(torch.randn(3, 1, size, size)).shape == (3, 4 * width)


@pytest.mark.parametrize("name", BACKBONES)
def test_eval_mode_is_deterministic(name: str) -> None:
    """In eval mode h is a function of the image: repeated calls agree, batched equals unbatched."""
    torch.manual_seed(0)
    model = build_backbone(name).eval()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        h = model(x)
        torch.testing.assert_close(model(x), h, rtol=0, atol=0)
        single = torch.cat([model(x[i : i + 1]) for i in range(3)])  # (N, feature_dim)
    torch.testing.assert_close(single, h, rtol=1e-4, atol=1e-5)


def test_no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights are random: building any backbone never reaches torch.hub."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a backbone tried to download weights")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    for name in BACKBONES:
        build_backbone(name)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"'vit'.*resnet18, resnet50, small_cnn"):
        build_backbone("vit")
    with pytest.raises(ValueError, match="in_channels must be >= 1, got 0"):
        build_backbone("small_cnn", in_channels=0)
    with pytest.raises(ValueError, match="width must be >= 1, got 0"):
        build_backbone("small_cnn", width=0)


def test_channels_last_is_a_no_op_on_cpu() -> None:
    model = build_backbone("small_cnn")
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert to_channels_last(model, "cpu") is model
    assert to_channels_last(model, torch.device("cpu")) is model
    for key, value in model.state_dict().items():
        assert value.is_contiguous(), key  # NCHW kept
        torch.testing.assert_close(value, weights[key], rtol=0, atol=0)


# GPU check, in the manner of tests/shared/test_cuda.py: CONTRASTKIT_TEST_DEVICE=cpu runs the body
# on the CPU.
DEVICE = torch.device(os.environ.get("CONTRASTKIT_TEST_DEVICE", "cuda"))


@pytest.mark.cuda
@pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="CUDA is not available: run on a GPU, or set CONTRASTKIT_TEST_DEVICE=cpu",
)
@pytest.mark.parametrize("name", BACKBONES)
def test_channels_last_on_device(name: str) -> None:
    """On CUDA the conv weights become channels-last and h does not change (fp32, cuDNN)."""
    torch.manual_seed(0)
    model = build_backbone(name).to(DEVICE).eval()
    x = torch.randn(4, 3, 16, 16, device=DEVICE)
    # TF32 off: with it, ResNet-50's two layouts differ by 1e-2 (seen on an H200), which would
    # hide a layout bug; in plain fp32 only the convolution algorithms differ
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            h = model(x)
            converted = to_channels_last(model, DEVICE)
            h_converted = converted(x.to(memory_format=torch.channels_last))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    assert converted is model
    for key, value in model.state_dict().items():
        if value.dim() == 4:
            layout = torch.channels_last if DEVICE.type == "cuda" else torch.contiguous_format
            assert value.is_contiguous(memory_format=layout), key
    torch.testing.assert_close(h_converted, h, rtol=1e-3, atol=1e-4)
