"""Our D2D-CE and 2C losses beside StudioGAN's own loss classes, run for real (float64, CPU).

    python benchmarks/studiogan_losses.py --studiogan runs/studiogan

``--studiogan DIR`` is a folder holding StudioGAN's ``src/utils/losses.py`` and what it imports
(``src/utils/ops.py``, ``src/utils/style_ops/``), and optionally ``losses_fd9e423.py``: that
file at commit fd9e423 (2021-07-20), the last one whose ``Conditional_Contrastive_loss`` has the
``pos_collected_numerator`` flag. From a clone of POSTECH-CVLab/PyTorch-StudioGAN (``MIRROR``)::

    git -C MIRROR archive HEAD src/utils/losses.py src/utils/ops.py src/utils/style_ops \\
        | tar -x -C DIR
    git -C MIRROR show fd9e423:src/utils/losses.py > DIR/losses_fd9e423.py

StudioGAN's code is imported from DIR, never copied here. One module is stubbed when it cannot
be imported: ``utils.style_ops.conv2d_gradfix`` (it needs ``pkg_resources``; StudioGAN's
losses use it only in the path-length regulariser, not in the loss classes compared here).

Compared, on random embeddings, a random proxy table indexed by random labels (its gradient
compared), several seeds, batch sizes and numbers of classes (repeated classes, all distinct,
all equal): ``Data2DataCrossEntropyLoss`` (current HEAD) against
:func:`shared.losses.data_to_data_cross_entropy_loss` (``form="studiogan"``; the ``"paper"``
form is listed too, to show the comparison can tell them apart), ``ConditionalContrastiveLoss``
against :func:`shared.losses.conditional_contrastive_loss`, and the old class with
``pos_collected_numerator`` False / True against ``positives="proxy"`` / ``"all"``. The old
class returns −log(τ·num/den), our value − log τ: the constant is added to ours before the
values are compared (the gradients need nothing). Batches have at least 2 samples: StudioGAN's
D2D-CE takes a max over an empty row at N = 1.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared.losses import conditional_contrastive_loss, data_to_data_cross_entropy_loss

SEEDS = (0, 1, 2, 3, 4)
SIZES = (2, 5, 16, 64, 128)  # batch sizes N
CLASSES = (1, 3, 10, None)  # None: as many classes as samples (labels mostly distinct)
D = 32
HOW_TO = (
    "StudioGAN's code is not here: export it with `git -C MIRROR archive HEAD src/utils/losses.py "
    "src/utils/ops.py src/utils/style_ops | tar -x -C DIR` and pass --studiogan DIR "
    "(see this file's docstring)"
)

# (embeddings, proxies, labels, classes) -> loss
LossFn = Callable[[Tensor, Tensor, Tensor, int], Tensor]


def import_studiogan(folder: Path) -> tuple[types.ModuleType, types.ModuleType | None, list[str]]:
    """StudioGAN's ``utils.losses`` (HEAD), the fd9e423 file if present, and what was stubbed."""
    sys.path.insert(0, str(folder / "src"))
    stubbed = []
    try:
        importlib.import_module("utils.style_ops.conv2d_gradfix")
    except ImportError:
        stub = types.ModuleType("utils.style_ops.conv2d_gradfix")
        stub.no_weight_gradients = None  # type: ignore[attr-defined]
        sys.modules["utils.style_ops.conv2d_gradfix"] = stub
        stubbed.append("utils.style_ops.conv2d_gradfix")
    head = importlib.import_module("utils.losses")
    old = None
    old_file = folder / "losses_fd9e423.py"
    if old_file.is_file():
        spec = importlib.util.spec_from_file_location("studiogan_losses_fd9e423", old_file)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    return head, old, stubbed


def comparisons(
    head: types.ModuleType, old: types.ModuleType | None
) -> list[tuple[str, LossFn, LossFn]]:
    """(row name, StudioGAN's loss, ours)."""
    rows: list[tuple[str, LossFn, LossFn]] = []
    for tau, m_p in ((0.5, 0.98), (0.1, 0.9), (1.0, 0.5)):

        def theirs(
            e: Tensor, p: Tensor, y: Tensor, c: int, tau: float = tau, m_p: float = m_p
        ) -> Tensor:
            loss: Tensor = head.Data2DataCrossEntropyLoss(c, tau, m_p, "cpu", False)(e, p, y)
            return loss

        for form in ("studiogan", "paper"):

            def ours(
                e: Tensor,
                p: Tensor,
                y: Tensor,
                c: int,
                tau: float = tau,
                m_p: float = m_p,
                form: Any = form,
            ) -> Tensor:
                return data_to_data_cross_entropy_loss(
                    e, p, y, temperature=tau, margin_pos=m_p, form=form
                )

            rows.append((f"D2D-CE τ={tau} m_p={m_p}, ours form={form}", theirs, ours))
    for tau in (1.0, 0.1):

        def theirs_2c(e: Tensor, p: Tensor, y: Tensor, c: int, tau: float = tau) -> Tensor:
            loss: Tensor = head.ConditionalContrastiveLoss(c, tau, "cpu", False)(e, p, y)
            return loss

        def ours_2c(e: Tensor, p: Tensor, y: Tensor, c: int, tau: float = tau) -> Tensor:
            return conditional_contrastive_loss(e, p, y, temperature=tau)

        rows.append((f"2C τ={tau} (HEAD), ours positives=all", theirs_2c, ours_2c))
        if old is None:
            continue
        for collected, positives in ((False, "proxy"), (True, "all")):

            def theirs_old(
                e: Tensor,
                p: Tensor,
                y: Tensor,
                c: int,
                tau: float = tau,
                collected: bool = collected,
            ) -> Tensor:
                same_class = torch.zeros(c, len(y), dtype=torch.long)  # its make_mask(..., True)
                same_class[y, torch.arange(len(y))] = 1
                module = old.Conditional_Contrastive_loss("cpu", len(y), collected)
                loss: Tensor = module(e, p, same_class, y, tau, 0.0)
                return loss

            def ours_old(
                e: Tensor,
                p: Tensor,
                y: Tensor,
                c: int,
                tau: float = tau,
                positives: Any = positives,
            ) -> Tensor:
                value = conditional_contrastive_loss(e, p, y, temperature=tau, positives=positives)
                return value - math.log(tau)  # the old class's −log τ

            name = f"2C τ={tau} (fd9e423, pos_collected_numerator={collected})"
            name += f", ours positives={positives}"
            rows.append((name, theirs_old, ours_old))
    return rows


def run(theirs: LossFn, ours: LossFn) -> tuple[int, float, float, float, float, float]:
    """Cases, max |Δ value|, max |Δ ∂/∂embeddings|, max |Δ ∂/∂proxy table|, and StudioGAN's
    max |value| and max |∂/∂embeddings| (the scale of the differences)."""
    cases, worst, scale, grad_scale = 0, [0.0, 0.0, 0.0], 0.0, 0.0
    for seed in SEEDS:
        for n in SIZES:
            for classes in CLASSES:
                c = n if classes is None else classes
                g = torch.Generator().manual_seed(seed * 1000 + n * 10 + c)
                emb = torch.randn(n, D, generator=g, dtype=torch.float64)
                table = torch.randn(c, D, generator=g, dtype=torch.float64)
                labels = torch.randint(0, c, (n,), generator=g)
                results = []
                for fn in (theirs, ours):
                    e, t = emb.clone().requires_grad_(), table.clone().requires_grad_()
                    value = fn(e, t[labels], labels, c)
                    grads = torch.autograd.grad(value, (e, t))
                    results.append((value.detach(), *grads))
                (v0, ge0, gt0), (v1, ge1, gt1) = results
                deltas = ((v0 - v1).abs(), (ge0 - ge1).abs().max(), (gt0 - gt1).abs().max())
                worst = [max(w, float(d)) for w, d in zip(worst, deltas, strict=True)]
                scale = max(scale, float(v0.abs()))
                grad_scale = max(grad_scale, float(ge0.abs().max()))
                cases += 1
    return cases, worst[0], worst[1], worst[2], scale, grad_scale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--studiogan", type=Path, required=True, help="folder with StudioGAN's src/utils/losses.py"
    )
    args = parser.parse_args(argv)
    if not (args.studiogan / "src" / "utils" / "losses.py").is_file():
        print(f"{args.studiogan}/src/utils/losses.py not found. {HOW_TO}")
        return 0
    head, old, stubbed = import_studiogan(args.studiogan.resolve())
    torch.set_num_threads(1)
    print(
        f"StudioGAN from {args.studiogan}; stubbed: {', '.join(stubbed) or 'nothing'}; "
        f"{'with' if old else 'without'} losses_fd9e423.py"
    )
    print(f"float64, D = {D}, seeds {SEEDS}, N {SIZES}, classes {CLASSES} (None: N)")
    print()
    columns = (
        "cases",
        "max abs Δ value",
        "max abs Δ ∂/∂emb",
        "max abs Δ ∂/∂proxy",
        "max abs value",
        "max abs ∂/∂emb",
    )
    print("| comparison | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, theirs, ours in comparisons(head, old):
        cases, dv, de, dp, scale, grad_scale = run(theirs, ours)
        cells = [
            str(cases),
            f"{dv:.1e}",
            f"{de:.1e}",
            f"{dp:.1e}",
            f"{scale:.3g}",
            f"{grad_scale:.2g}",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
