"""imagecl finetune's parts: the fine-tuning config and the clean branch of a dual batch norm."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from imagecl.backbones import build_backbone
from imagecl.config import ENCODER_FIELDS, Config, FinetuneConfig, finetune_config
from imagecl.dual_bn import DualBatchNorm2d, adversarial_rows, convert_dual_bn, revert_dual_bn

ENCODER = {
    "data": "digits",
    "image_size": 16,
    "backbone": "resnet18",
    "cifar_stem": False,
    "width": 8,
    "augment": "small_gray",
}
# training settings that an earlier fine-tuning config copied and Config then refused for "ce"
TRAINED = [
    {"method": "simclr"},
    {"method": "clae", "adv_eps": 0.03},
    {"method": "supcon", "adversarial": True, "views": 3, "joint_classifier": True},
    {"method": "simclr", "loss": "nt_logistic"},
    {"method": "simclr", "loss": "generalized", "prior": "normal", "lam": 0.5},
    {"method": "simclr", "queue_size": 64, "head": "none"},
    {"method": "loco", "overlap": 0, "stages": 2, "end_to_end": False},
    {"method": "simclr", "compile": True, "amp": "off", "temperature": 0.2},
]


@pytest.mark.parametrize("settings", TRAINED)
def test_finetune_config_comes_from_the_encoder_and_the_finetune_settings(
    settings: dict[str, object],
) -> None:
    trained = Config(**ENCODER, **settings)  # type: ignore[arg-type]
    cfg = FinetuneConfig(checkpoint=Path("run/checkpoints/last.pt"), lr=0.01, seed=3)
    made = finetune_config(trained, cfg, epochs=7, batch_size=32)
    reference = finetune_config(Config(**ENCODER), cfg, epochs=7, batch_size=32)  # type: ignore[arg-type]
    assert made == reference  # whatever the run trained with, the same fine-tuning
    assert {name: getattr(made, name) for name in ENCODER} == ENCODER
    assert set(ENCODER) | {"data_root"} == set(ENCODER_FIELDS)
    expected = {
        "method": "ce",
        "epochs": 7,
        "batch_size": 32,
        "max_steps": cfg.steps,
        "lr": 0.01,
        "seed": 3,
        "optimizer": cfg.optimizer,
        "online_probe": False,
        "adversarial": False,
        "queue_size": 0,
        "compile": False,
    }
    assert {name: getattr(made, name) for name in expected} == expected


def test_finetune_config_takes_the_data_root_override() -> None:
    trained = Config(data="imagefolder", data_root=Path("/old/machine/images"))
    moved = FinetuneConfig(checkpoint=Path("last.pt"), data_root=Path("/here/images"))
    assert finetune_config(trained, moved, epochs=1, batch_size=8).data_root == moved.data_root
    kept = dataclasses.replace(moved, data_root=None)
    assert finetune_config(trained, kept, epochs=1, batch_size=8).data_root == trained.data_root


def test_revert_dual_bn_gives_the_plain_network_with_the_clean_statistics() -> None:
    torch.manual_seed(0)
    plain = build_backbone("small_cnn", in_channels=3, width=4)
    dual = convert_dual_bn(copy.deepcopy(plain))
    x = torch.randn(12, 3, 8, 8)
    with adversarial_rows(dual, 4):  # both branches see their own rows and update their stats
        dual.train()(x + torch.cat([torch.zeros(8, 3, 8, 8), 3 * torch.ones(4, 3, 8, 8)]))
    layers = [m for m in dual.modules() if isinstance(m, DualBatchNorm2d)]
    first = layers[0]
    assert not torch.equal(
        first.clean.state_dict()["running_mean"], first.adversarial.state_dict()["running_mean"]
    )
    with torch.no_grad():
        expected = dual.eval()(x)  # outside adversarial_rows: the clean branch
    clean_stats = [m.clean.state_dict()["running_mean"].clone() for m in layers]

    reverted = revert_dual_bn(dual)
    assert reverted is dual
    assert not any(isinstance(m, DualBatchNorm2d) for m in reverted.modules())
    assert reverted.state_dict().keys() == plain.state_dict().keys()
    plain.load_state_dict(reverted.state_dict())  # loads into a network built without dual BN
    bns = [m for m in plain.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn, stats in zip(bns, clean_stats, strict=True):
        assert torch.equal(bn.state_dict()["running_mean"], stats)
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(x), expected, rtol=0, atol=0)
