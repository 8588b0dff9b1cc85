"""Pre-training throughput: ``graphcl pretrain`` against GraphCL's own pre-training loop.

GraphCL (You et al. 2020) pre-trains its transfer-learning GIN with
``transferLearning_MoleculeNet_PPI/chem/pretrain_graphcl.py`` of Shen-Lab/GraphCL. This script
imports that code from a checkout (``--graphcl-root``, the folder holding its ``loader.py``,
``model.py`` and ``pretrain_graphcl.py``; the code is not part of this repository) and runs its
``train`` epoch function beside our step on the same molecules:

- the same model: GIN 5 × 300 with a bond embedding per layer, batch norm, jk "last", mean
  pooling, projection head 300 -> 300 -> 300 (``--head-dim 300``), Adam lr 1e-3; ours with
  ``--conv hu``, their layer (linear messages, a self-loop bond embedding). The script copies
  their initial weights into our encoder and prints the largest difference of the two
  encoders' outputs on one batch, so "the same model" is checked, not assumed;
- the same molecules and features: our bundled corpus featurised with the ``pretrain-gnns``
  layout (atom type, chirality; bond type, direction), which is the layout of GraphCL's
  ``mol_to_graph_data_obj_simple``, fed to both;
- the same augmentation: node dropping at 20 % for both views (theirs: ``dropN``, their
  ``drop_nodes`` run per molecule in their dataset's ``get``; ours: ``drop_nodes`` on the
  collated batch). The atoms each view keeps on average are measured and printed for both;
- batch 256, the same number of steps, alternated over several repeats, the median reported.

Their code needs shims for today's libraries, applied at run time: ``torch_scatter`` (absent
here: ``scatter_add`` from ``torch_geometric.utils.scatter``), the removed
``torch_geometric.data.DataLoader`` (now ``torch_geometric.loader.DataLoader``), stub modules for
the ``splitters`` / ``tensorboardX`` imports that pre-training does not use, and torch_geometric
1.x's ``add_self_loops`` (the index alone) and ``propagate(aggr, ...)`` signature.

Each side's loader + augmentation share is measured by iterating its loaders alone for the same
steps (no model), divided by its full step time.

Usage: ``python benchmarks/graph_pretrain_speed.py --graphcl-root PATH [--steps 8 --repeats 3]``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data


def _import_theirs(root: Path) -> types.SimpleNamespace:
    """GraphCL's ``pretrain_graphcl``, ``model`` and ``loader`` modules, shimmed (module doc)."""
    import torch_geometric.data
    import torch_geometric.loader
    from torch_geometric.utils import scatter

    shim = types.ModuleType("torch_scatter")
    shim.scatter_add = lambda src, index, dim=0, dim_size=None: scatter(  # type: ignore[attr-defined]
        src, index, dim=dim, dim_size=dim_size, reduce="sum"
    )
    sys.modules.setdefault("torch_scatter", shim)
    splitters = types.ModuleType("splitters")
    for name in ("scaffold_split", "random_split", "random_scaffold_split"):
        setattr(splitters, name, None)
    sys.modules.setdefault("splitters", splitters)
    tensorboard = types.ModuleType("tensorboardX")
    tensorboard.SummaryWriter = None  # type: ignore[attr-defined]
    sys.modules.setdefault("tensorboardX", tensorboard)
    torch_geometric.data.DataLoader = torch_geometric.loader.DataLoader
    sys.path.insert(0, str(root))
    import loader
    import model
    import pretrain_graphcl
    from torch_geometric.nn import MessagePassing
    from torch_geometric.utils import add_self_loops

    # torch_geometric 1.x: add_self_loops returned the index alone, propagate took aggr first
    model.add_self_loops = lambda edge_index, num_nodes: add_self_loops(
        edge_index, num_nodes=num_nodes
    )[0]

    def propagate(self: MessagePassing, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], str):
            args = args[1:]
        return MessagePassing.propagate(self, *args, **kwargs)

    model.GINConv.propagate = propagate
    pretrain_graphcl.tqdm = lambda iterable, **_: iterable  # no progress bar in the timing
    return types.SimpleNamespace(loader=loader, model=model, pretrain=pretrain_graphcl)


class TheirDataset(torch.utils.data.Dataset[Data]):
    """What their ``train`` needs of ``MoleculeDataset_aug``: ``aug``, ``aug_ratio``,
    ``shuffle()`` and a ``get`` that augments one molecule with their functions."""

    def __init__(self, graphs: Sequence[Data], augment: dict[str, Any]) -> None:
        self.graphs = graphs
        self.augment = augment
        self.aug = "none"
        self.aug_ratio = 0.2
        self.kept: list[int] = []  # atoms of every view served

    def shuffle(self) -> TheirDataset:
        order = torch.randperm(len(self.graphs)).tolist()
        return TheirDataset([self.graphs[i] for i in order], self.augment)

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, index: int) -> Data:
        g = self.graphs[index]
        data = Data(x=g.x.clone(), edge_index=g.edge_index.clone(), edge_attr=g.edge_attr.clone())
        if self.aug != "none":
            data = self.augment[self.aug](data, self.aug_ratio)
        self.kept.append(int(data.x.shape[0]))
        return data


def _same_model(gnn: Any, encoder: Any, graphs: Sequence[Data]) -> float:
    """Copy their GNN's weights into a copy of our encoder; the largest difference of the mean-
    pooled node embeddings of the two on one batch (training mode, as in pre-training; float64)."""
    from torch_geometric.data import Batch
    from torch_geometric.nn import global_mean_pool

    ours = copy.deepcopy(encoder).double()
    gnn = copy.deepcopy(gnn).double().train()
    with torch.no_grad():
        for table, theirs in zip(
            ours.atom_embedding.embeddings, (gnn.x_embedding1, gnn.x_embedding2), strict=True
        ):
            table.weight[: theirs.weight.shape[0]] = theirs.weight
        for conv, their_conv, norm, their_norm in zip(
            ours.convs, gnn.gnns, ours.norms, gnn.batch_norms, strict=True
        ):
            conv.mlp.load_state_dict(their_conv.mlp.state_dict())
            norm.load_state_dict(their_norm.state_dict())
            bond_type, direction = conv.edge_embedding.embeddings
            bond_type.weight[:6] = their_conv.edge_embedding1.weight
            direction.weight[:3] = their_conv.edge_embedding2.weight
            # their self-loop: bond type 4, direction 0
            conv.self_loop.copy_(
                their_conv.edge_embedding1.weight[4] + their_conv.edge_embedding2.weight[0]
            )
    batch = Batch.from_data_list(graphs)
    with torch.no_grad():
        nodes = gnn(batch.x, batch.edge_index, batch.edge_attr)
        theirs = global_mean_pool(nodes, batch.batch)
        return float((ours.train()(batch) - theirs).abs().max())


def _args(aug: str, batch_size: int, workers: int) -> argparse.Namespace:
    return argparse.Namespace(
        aug1=aug,
        aug2=aug,
        aug_ratio1=0.2,
        aug_ratio2=0.2,
        batch_size=batch_size,
        num_workers=workers,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphcl-root", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=8, help="steps per timed run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--their-workers",
        type=int,
        default=0,
        help="their DataLoader's worker processes (their script's default is 8; 0: augment in "
        "the training process, so their loader share is measured inside their step)",
    )
    parser.add_argument(
        "--conv",
        nargs="+",
        choices=["hu", "gine"],
        default=["hu"],
        help="our GIN layer: hu (theirs) or gine (a ReLU on each message); several are timed "
        "in turn, in the same repeats",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from graphcl.commands.pretrain import Config, build
    from graphcl.data import load_molecules
    from graphcl.encoders import GINConvKind
    from graphcl.steps import pretrain_step

    theirs = _import_theirs(args.graphcl_root.resolve())
    data = load_molecules("bundled", layout="pretrain-gnns")
    n = args.steps * args.batch_size
    graphs = data.graphs[:n]
    if len(graphs) < n:
        raise ValueError(f"--steps {args.steps} needs {n} molecules, the corpus has {len(graphs)}")
    atoms = float(np.mean([g.num_nodes for g in graphs]))

    # theirs
    torch.manual_seed(0)
    np.random.seed(0)  # noqa: NPY002  # their augmentations draw from numpy's global RNG
    gnn = theirs.model.GNN(5, 300, JK="last", drop_ratio=0.0, gnn_type="gin")
    their_model = theirs.pretrain.graphcl(gnn)
    their_opt = torch.optim.Adam(their_model.parameters(), lr=1e-3)
    their_data = TheirDataset(graphs, {"dropN": theirs.loader.drop_nodes})
    targs = _args("dropN", args.batch_size, args.their_workers)

    def their_run() -> float:
        start = time.perf_counter()
        theirs.pretrain.train(targs, their_model, torch.device("cpu"), their_data, their_opt)
        return time.perf_counter() - start

    def their_loader_run() -> tuple[float, list[int]]:
        d1 = their_data.shuffle()
        d2 = copy.deepcopy(d1)
        d1.aug = d2.aug = "dropN"
        loader = theirs.pretrain.DataLoader
        start = time.perf_counter()
        for _ in zip(
            loader(d1, batch_size=args.batch_size),
            loader(d2, batch_size=args.batch_size),
            strict=True,
        ):
            pass
        return time.perf_counter() - start, d1.kept + d2.kept

    # ours, one model per layer kind
    def ours(conv: GINConvKind) -> tuple[Any, Any]:
        cfg = Config(
            layout="pretrain-gnns",
            augment1="drop_nodes",
            augment2="drop_nodes",
            aug_ratio=0.2,
            batch_size=args.batch_size,
            head_dim=300,
            lr=1e-3,
            conv=conv,
        )
        torch.manual_seed(0)
        built = build(cfg, device=torch.device("cpu"), data=data._replace(graphs=graphs))
        if conv == "hu":
            difference = _same_model(gnn, built.model.encoder, graphs[: args.batch_size])
            print(f"their encoder vs ours (hu) with their weights, float64: {difference:.2e}")

        def run() -> float:
            built.model.train()
            start = time.perf_counter()
            for batch in built.loader:
                out = pretrain_step(built.model, batch, cfg=cfg, views=built.views, gather=False)
                built.optimizer.zero_grad(set_to_none=True)
                out["loss"].backward()  # type: ignore[no-untyped-call]
                built.optimizer.step()
                float(out["loss"].detach())  # the loop's logged value
            return time.perf_counter() - start

        def loader_run() -> float:
            start = time.perf_counter()
            for batch in built.loader:
                v1, v2 = built.views[0](batch), built.views[1](batch)
                our_kept.append((v1.num_nodes + v2.num_nodes) / (2 * batch.num_graphs))
            return time.perf_counter() - start

        return run, loader_run

    our_kept: list[float] = []
    sides = {conv: ours(conv) for conv in args.conv}
    their_times: list[float] = []
    their_load: list[float] = []
    their_kept: list[int] = []
    our_times: dict[str, list[float]] = {conv: [] for conv in sides}
    our_load: dict[str, list[float]] = {conv: [] for conv in sides}
    for _ in range(args.repeats):
        their_times.append(their_run())
        t, kept = their_loader_run()
        their_load.append(t)
        their_kept += kept
        for conv, (run, loader_run) in sides.items():
            our_times[conv].append(run())
            our_load[conv].append(loader_run())

    def row(name: str, times: list[float], load: list[float], kept: float) -> tuple[str, float]:
        step = statistics.median(times) / args.steps
        rate = args.batch_size / step
        share = statistics.median(load) / statistics.median(times)
        return f"{name:<10} {rate:>12.1f} {step:>10.3f} {100 * share:>14.1f} {kept:>14.2f}", rate

    print(
        f"{len(graphs)} molecules, {atoms:.2f} atoms each, batch {args.batch_size}, "
        f"{args.steps} steps × {args.repeats} repeats (median), {args.threads} threads, "
        f"node dropping 20 % on both views, their loader's workers: {args.their_workers}"
    )
    print(f"{'':<10} {'molecules/s':>12} {'s/step':>10} {'loader+aug %':>14} {'atoms/view':>14}")
    line, their_rate = row("GraphCL", their_times, their_load, float(np.mean(their_kept)))
    print(line)
    for conv in sides:
        line, our_rate = row(
            f"ours {conv}", our_times[conv], our_load[conv], float(np.mean(our_kept))
        )
        print(f"{line}   {our_rate / their_rate:.2f}× GraphCL")


if __name__ == "__main__":
    main()
