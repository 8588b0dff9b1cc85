"""One training step of each ``graphcl`` method, for ``shared.train.fit``.

:func:`pretrain_step` is GraphCL (You et al. 2020): two augmented views of every graph of the
batch, made on the device (:mod:`graphcl.augment`; :func:`view_maker` turns an augmentation name
into a view), encoded in one forward pass (:func:`concat_batches`), projected and contrasted
with ``graphcl_loss`` (the paper's form: one direction, positive left out of the denominator),
the symmetric ``nt_xent_loss``, or with a queue of past keys ``two_view_info_nce_loss``. With
JOAO (``--adaptive``, You et al. 2021) the pair of augmentations of each step is drawn from the
model's sampler, and :func:`joao_end_epoch` is the per-epoch update of that sampler, run by
``fit``'s ``end_epoch`` hook. :func:`finetune_step` is the supervised step of fine-tuning
(the masked task loss of :mod:`graphcl.tasks`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch

from graphcl.augment import AUGMENTATIONS, random_choice
from graphcl.config import PretrainConfig
from graphcl.features import LAYOUTS
from graphcl.models import SamplerState
from graphcl.tasks import Task, task_loss
from shared.losses import graphcl_loss, nt_xent_loss, two_view_info_nce_loss
from shared.runtime import unwrap

__all__ = ["concat_batches", "finetune_step", "joao_end_epoch", "pretrain_step", "view_maker"]


def concat_batches(a: Batch, b: Batch) -> Batch:
    """One batch holding ``a``'s graphs, then ``b``'s: both views in a single forward pass.

    Its ``ptr`` gives ``num_graphs`` (no collation metadata: the batch is not split again).
    """
    offset = a.num_nodes
    return Batch(
        x=torch.cat([a.x, b.x]),
        edge_index=torch.cat([a.edge_index, b.edge_index + offset], dim=1),
        edge_attr=torch.cat([a.edge_attr, b.edge_attr]),
        batch=torch.cat([a.batch, b.batch + a.num_graphs]),
        ptr=torch.cat([a.ptr, b.ptr[1:] + offset]),
    )


def view_maker(name: str, cfg: PretrainConfig) -> Callable[[Batch], Batch]:
    """A view maker ``batch -> batch`` for one augmentation name of
    :data:`graphcl.config.AUGMENT_CHOICES` (global RNG, per rank); ``"random"`` is node
    dropping or subgraph, 50/50 per graph."""
    mask = torch.tensor(LAYOUTS[cfg.layout].atom_mask)
    kwargs = {"mask_index": mask} if name == "mask_attributes" else {}
    if name == "random":
        pair = [AUGMENTATIONS["drop_nodes"], AUGMENTATIONS["subgraph"]]
        return functools.partial(random_choice, pair, p=cfg.aug_ratio)
    return functools.partial(AUGMENTATIONS[name], p=cfg.aug_ratio, **kwargs)


def pretrain_step(
    model: nn.Module,
    batch: Batch,
    *,
    cfg: PretrainConfig,
    views: tuple[Callable[[Batch], Batch], ...],
    gather: bool,
) -> dict[str, Tensor]:
    """Two views per graph, one forward pass, the contrastive loss.

    ``views`` holds one view maker per augmentation name; with ``--adaptive`` the pair is
    drawn from the model's sampler (and the step's loss recorded for it), else it is
    ``(augment1, augment2)``. ``gather``: contrast against every rank's graphs (DDP).
    """
    inner = unwrap(model)
    joao = getattr(inner, "joao", None)
    sampler = None if joao is None else joao.sampler
    i, j = (0, 1) if sampler is None else sampler.sample()
    v1, v2 = views[i](batch), views[j](batch)
    G = batch.num_graphs
    _, z = model(concat_batches(v1, v2))  # (2G, head_dim)
    z1, z2 = z[:G], z[G:]
    queue = getattr(inner, "queue", None)
    if queue is not None:
        loss = two_view_info_nce_loss(
            z1, z2, queue.negatives(), temperature=cfg.temperature, gather=gather
        )
        queue.enqueue(z.detach())
    elif cfg.loss == "nt_xent":
        loss = nt_xent_loss(z1, z2, temperature=cfg.temperature, gather=gather)
    else:
        loss = graphcl_loss(z1, z2, temperature=cfg.temperature, gather=gather)
    if sampler is not None:
        sampler.record(i, j, loss.detach())
    # a fill, not a copy of a host number: no host→device transfer in the step
    nodes_per_view = v1.x.new_full((), v1.num_nodes / G, dtype=torch.float)
    return {"loss": loss, "nodes_per_view": nodes_per_view}


def joao_end_epoch(model: nn.Module) -> Callable[[int], Mapping[str, float]] | None:
    """JOAO's per-epoch update of ``model``'s augmentation-pair sampler, for ``fit``'s
    ``end_epoch`` hook (train mode, after the epoch's last step, on every rank: the update
    sums every rank's recorded losses); ``None`` without a sampler (no ``--adaptive``).

    The hook logs ``joao_max_pair_probability``, the largest pair probability after the update.
    """
    joao = getattr(unwrap(model), "joao", None)
    if joao is None:
        return None
    assert isinstance(joao, SamplerState)
    sampler = joao.sampler

    def end_epoch(epoch: int) -> dict[str, float]:
        probabilities = sampler.update()
        return {"joao_max_pair_probability": float(probabilities.max())}

    return end_epoch


def finetune_step(model: nn.Module, batch: Batch, *, task: Task) -> dict[str, Tensor]:
    """The masked task loss of the model's outputs against ``batch.y`` (``(G, T)``)."""
    return {"loss": task_loss(task, model(batch), batch.y.view(batch.num_graphs, -1).float())}
