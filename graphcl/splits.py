"""Train/valid/test splits of a molecule set: scaffold (the transfer protocol), random, stratified.

All three return a :class:`Split` of sorted long index tensors that together cover ``0..N-1``
exactly once. The scaffold split is deterministic; the others draw from a ``torch.Generator``
seeded with ``seed``, so the same seed gives the same split on every machine.
:func:`make_split` picks one by name, as ``--split`` does, and can keep a seeded fraction of
the training labels."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from rdkit import Chem
from rdkit.Chem.Scaffolds import MurckoScaffold
from torch import Tensor

from graphcl.features import quiet_rdkit

__all__ = [
    "Split",
    "draw_subset",
    "make_split",
    "murcko_scaffold",
    "random_split",
    "scaffold_split",
    "stratified_split",
]

Fractions = tuple[float, float, float]
_murcko_smiles: Callable[..., str] = MurckoScaffold.MurckoScaffoldSmiles


class Split(NamedTuple):
    """Index tensors (long, sorted) of the three parts."""

    train: Tensor
    valid: Tensor
    test: Tensor


def _check_fractions(fractions: Sequence[float]) -> Fractions:
    if len(fractions) != 3:
        raise ValueError(f"fractions must be (train, valid, test), got {tuple(fractions)}")
    train, valid, test = (float(f) for f in fractions)
    if min(train, valid, test) < 0.0 or abs(train + valid + test - 1.0) > 1e-6:
        raise ValueError(
            f"fractions must be non-negative and sum to 1, got {tuple(fractions)} "
            f"(sum {train + valid + test:g})"
        )
    return train, valid, test


def _split(
    train: Sequence[int] | Tensor, valid: Sequence[int] | Tensor, test: Sequence[int] | Tensor
) -> Split:
    def part(index: Sequence[int] | Tensor) -> Tensor:
        return torch.as_tensor(index, dtype=torch.long).reshape(-1).sort().values

    return Split(part(train), part(valid), part(test))


def murcko_scaffold(smiles: str, *, include_chirality: bool = True) -> str:
    """The Bemis–Murcko scaffold SMILES of a molecule ("" for an acyclic one).

    Raises:
        ValueError: the SMILES is empty (e.g. a TU graph: split those randomly) or does not parse
    """
    if not smiles:
        raise ValueError("cannot compute the scaffold of an empty SMILES (TU graphs have none)")
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"cannot compute the scaffold of an invalid SMILES {smiles!r}")
    return _murcko_smiles(mol=mol, includeChirality=include_chirality)


def scaffold_split(smiles: Sequence[str], fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> Split:
    """Bemis–Murcko scaffold split, the transfer protocol of MoleculeNet and Hu et al. 2019.

    Molecules are grouped by scaffold (with chirality, as ``chem/splitters.py`` of Hu et al.;
    acyclic molecules share the scaffold "" and form one group). Groups are visited from the
    largest to the smallest, ties by the group's first index in *descending* order (their
    ``sorted(..., key=(len, first index), reverse=True)``, as in DeepChem); a group goes to
    train if train stays within ``fractions[0]·N``, else to valid if train + valid stay within
    ``(fractions[0] + fractions[1])·N``, else to test. So test holds the rarest scaffolds and a
    scaffold never spans two parts. Deterministic: no seed.

    Shape:
        smiles: N strings; returns three sorted long index tensors
    """
    frac_train, frac_valid, _ = _check_fractions(fractions)
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(smiles):
        groups.setdefault(murcko_scaffold(text), []).append(i)
    ordered = sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)
    train_cutoff = frac_train * len(smiles)
    valid_cutoff = (frac_train + frac_valid) * len(smiles)
    train: list[int] = []
    valid: list[int] = []
    test: list[int] = []
    for group in ordered:
        if len(train) + len(group) <= train_cutoff:
            train += group
        elif len(train) + len(valid) + len(group) <= valid_cutoff:
            valid += group
        else:
            test += group
    return _split(train, valid, test)


def random_split(n: int, fractions: Sequence[float] = (0.8, 0.1, 0.1), *, seed: int) -> Split:
    """Seeded uniform split: ``int(f_train·n)`` to train, ``int(f_valid·n)`` to valid, the rest
    to test (Hu et al.'s ``random_split`` sizes).

    Shape:
        returns three sorted long index tensors covering ``0..n-1``
    """
    frac_train, frac_valid, _ = _check_fractions(fractions)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator)  # (n,)
    n_train, n_valid = int(frac_train * n), int(frac_valid * n)
    return _split(order[:n_train], order[n_train : n_train + n_valid], order[n_train + n_valid :])


def stratified_split(
    labels: Tensor, fractions: Sequence[float] = (0.8, 0.1, 0.1), *, seed: int
) -> Split:
    """Seeded per-class split: each class is shuffled and cut at ``round(f_train·n_c)`` and
    ``round((f_train + f_valid)·n_c)``, so every part keeps the class proportions up to rounding.

    Shape:
        labels: ``(N,)`` integer class labels (any integer dtype, or float holding integers, no
        NaN); returns three sorted long index tensors covering ``0..N-1``
    """
    frac_train, frac_valid, _ = _check_fractions(fractions)
    if labels.dim() != 1:
        raise ValueError(f"labels must be 1-D (N,), got shape {tuple(labels.shape)}")
    if labels.is_floating_point() and not bool((labels == labels.round()).all()):
        raise ValueError("labels must hold integer class ids (no NaN, no fractions)")
    generator = torch.Generator().manual_seed(seed)
    parts: tuple[list[Tensor], list[Tensor], list[Tensor]] = ([], [], [])
    for label in torch.unique(labels.detach().cpu(), sorted=True):
        members = (labels.detach().cpu() == label).nonzero().flatten()  # (n_c,)
        members = members[torch.randperm(members.numel(), generator=generator)]
        cut_train = round(frac_train * members.numel())
        cut_valid = round((frac_train + frac_valid) * members.numel())
        for part, chunk in zip(
            parts,
            (members[:cut_train], members[cut_train:cut_valid], members[cut_valid:]),
            strict=True,
        ):
            part.append(chunk)
    empty = torch.empty(0, dtype=torch.long)
    return _split(*(torch.cat([empty, *part]) for part in parts))


def make_split(
    kind: str,
    smiles: Sequence[str],
    targets: Tensor | None = None,
    *,
    seed: int,
    label_fraction: float = 1.0,
) -> Split:
    """The ``--split`` of a fine-tuning or probing run: ``"scaffold"`` (of ``smiles``),
    ``"random"`` (seeded) or ``"stratified"`` (seeded, by the class of the first target, a
    missing label being its own class). ``label_fraction < 1`` keeps
    ``max(1, round(label_fraction · n_train))`` seeded training rows (the semi-supervised
    setting); valid and test are kept whole.

    Shape:
        targets: ``(N, T)`` with NaN for a missing label (``"stratified"`` only).
    """
    if kind == "scaffold":
        split = scaffold_split(smiles)
    elif kind == "random":
        split = random_split(len(smiles), seed=seed)
    elif kind == "stratified":
        if targets is None:
            raise ValueError("a stratified split needs targets")
        split = stratified_split(targets[:, 0].nan_to_num(-1).long(), seed=seed)
    else:
        raise ValueError(f"split must be scaffold, random or stratified, got {kind!r}")
    train = split.train
    if label_fraction < 1:
        generator = torch.Generator().manual_seed(seed)
        keep = max(1, round(label_fraction * train.numel()))
        train = train[torch.randperm(train.numel(), generator=generator)[:keep]].sort().values
    return Split(train, split.valid, split.test)


def draw_subset(total: int, count: int, seed: int) -> np.ndarray:
    """``count`` of ``range(total)`` drawn without replacement with numpy's ``default_rng(seed)``,
    sorted (so a subset keeps its source's order); how ``--max-molecules`` picks molecules."""
    return np.sort(np.random.default_rng(seed).choice(total, size=count, replace=False))
