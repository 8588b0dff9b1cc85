"""Molecule → graph featurisation: two categorical layouts, each with "other" and mask rows.

Every feature is an integer index into an embedding table. For a feature whose vocabulary lists
``k`` values, the table has ``k + 2`` rows: rows ``0..k-1`` are the listed values in their
reference order, row ``k`` is the **other** bucket (any value outside the list, so an unusual
molecule never crashes the featuriser) and row ``k + 1`` is the **mask** index that attribute
masking writes (one per categorical feature). :class:`FeatureLayout` records the row counts and mask
indices; :data:`LAYOUTS` holds the two layouts:

- ``"pyg"`` (default): the 9 atom + 3 bond features of PyG's
  :func:`torch_geometric.utils.from_smiles`, built on PyG's own ``x_map`` / ``e_map`` so that an
  in-map value gets exactly PyG's index and PyG's ``MoleculeNet`` data feeds our encoders
  unchanged. Atoms: atomic_num, chirality, degree (total, with Hs), formal_charge, num_hs,
  num_radical_electrons, hybridization, is_aromatic, is_in_ring; bonds: bond_type, stereo,
  is_conjugated. Older PyG releases list fewer values (e.g. no ``DATIVE`` bond, which one
  molecule of rdkit's NCI ``first_5K.smi`` has): such values land in the other bucket, and the
  layout's ``version`` hashes the maps, so caches built against other maps are not reused.
- ``"pretrain-gnns"``: the 2 + 2 layout of Hu et al. 2019 ("Strategies for Pre-training Graph
  Neural Networks", ``chem/loader.py::mol_to_graph_data_obj_simple``), used by GraphCL's transfer
  experiments. Atom type: atomic number 1..118 → 0..117, other 118, mask 119 (120 rows, Hu's
  ``num_atom_type = 120`` with mask 119, the dummy atom ``*`` goes to other); chirality tag:
  CHI_UNSPECIFIED, CW, CCW, CHI_OTHER → 0..3, other 4, mask 5; bond type: SINGLE, DOUBLE,
  TRIPLE, AROMATIC → 0..3, 4 reserved for the self-loop edges a GIN encoder adds
  (:data:`PRETRAIN_GNNS_SELF_LOOP_BOND`, never produced here), other 5, mask 6; bond direction:
  NONE, ENDUPRIGHT, ENDDOWNRIGHT → 0..2, other 3, mask 4.

  Deviations from Hu et al., all from the rule "other, then mask, as the last two rows": their
  bond-type mask is 5 and their table has 6 rows (ours: other 5, mask 6, 7 rows); their
  chirality and direction tables have 3 rows (CHI_OTHER = 3 would index out of range there) and
  no mask (their attribute masking writes chirality 0; ours has mask rows 5 and 4). Their loader
  raises on a value outside the lists; ours uses the other bucket. Atom indices 0..117 and 119,
  chirality 0..2, bond type 0..4 and direction 0..2 match theirs exactly.

Edges are stored in both directions, sorted by ``(source, target)`` as ``from_smiles`` does, with
``edge_attr`` row ``e`` describing edge ``edge_index[:, e]``. No self-loops are added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
from rdkit import Chem, rdBase
from torch_geometric.data import Data
from torch_geometric.utils.smiles import e_map, x_map

__all__ = [
    "LAYOUTS",
    "PRETRAIN_GNNS_SELF_LOOP_BOND",
    "FeatureLayout",
    "featurize",
    "quiet_rdkit",
]

_FORMAT = "1"  # bump when the featurisation code changes; part of every layout's version

PRETRAIN_GNNS_SELF_LOOP_BOND = 4  # bond-type index of self-loops in Hu et al.'s GIN


class FeatureLayout(NamedTuple):
    """Row counts and mask indices of one categorical layout (see the module docstring).

    ``atom_vocab[f]`` is the number of embedding rows of atom feature ``f``, the other bucket and
    the mask index included; ``atom_mask[f] == atom_vocab[f] - 1`` (the last row). The same holds
    for bonds. ``version`` changes whenever the featurisation changes and keys the data cache.
    """

    name: str
    atom_vocab: tuple[int, ...]
    bond_vocab: tuple[int, ...]
    atom_mask: tuple[int, ...]
    bond_mask: tuple[int, ...]
    version: str


class _Feature(NamedTuple):
    """One categorical feature: value → index table, the other index, and how to read it."""

    name: str
    table: dict[Any, int]
    other: int
    read: Callable[[Any], Any]


def _enum_table(enum: Any, names: Sequence[str]) -> dict[Any, int]:
    """``{rdkit enum member: position in names}``; names this rdkit lacks keep their slot."""
    return {getattr(enum, name): i for i, name in enumerate(names) if hasattr(enum, name)}


def _feature(
    name: str, values: Sequence[Any], read: Callable[[Any], Any], enum: Any = None
) -> _Feature:
    """A feature whose listed ``values`` take rows ``0..k-1``; other = k, mask = k + 1."""
    table = _enum_table(enum, values) if enum is not None else {v: i for i, v in enumerate(values)}
    return _Feature(name, table, len(values), read)


_rdchem = Chem.rdchem

# PyG's from_rdmol, feature by feature, on PyG's own value lists (torch_geometric.utils.smiles).
_PYG_ATOM = (
    _feature("atomic_num", x_map["atomic_num"], lambda a: a.GetAtomicNum()),
    _feature("chirality", x_map["chirality"], lambda a: a.GetChiralTag(), _rdchem.ChiralType),
    _feature("degree", x_map["degree"], lambda a: a.GetTotalDegree()),
    _feature("formal_charge", x_map["formal_charge"], lambda a: a.GetFormalCharge()),
    _feature("num_hs", x_map["num_hs"], lambda a: a.GetTotalNumHs()),
    _feature(
        "num_radical_electrons",
        x_map["num_radical_electrons"],
        lambda a: a.GetNumRadicalElectrons(),
    ),
    _feature(
        "hybridization",
        x_map["hybridization"],
        lambda a: a.GetHybridization(),
        _rdchem.HybridizationType,
    ),
    _feature("is_aromatic", x_map["is_aromatic"], lambda a: a.GetIsAromatic()),
    _feature("is_in_ring", x_map["is_in_ring"], lambda a: a.IsInRing()),
)
_PYG_BOND = (
    _feature("bond_type", e_map["bond_type"], lambda b: b.GetBondType(), _rdchem.BondType),
    _feature("stereo", e_map["stereo"], lambda b: b.GetStereo(), _rdchem.BondStereo),
    _feature("is_conjugated", e_map["is_conjugated"], lambda b: b.GetIsConjugated()),
)

# Hu et al. 2019, chem/loader.py allowable_features; bond type slot 4 is their self-loop.
_HU_ATOM = (
    _feature("atom_type", range(1, 119), lambda a: a.GetAtomicNum()),
    _feature(
        "chirality",
        ("CHI_UNSPECIFIED", "CHI_TETRAHEDRAL_CW", "CHI_TETRAHEDRAL_CCW", "CHI_OTHER"),
        lambda a: a.GetChiralTag(),
        _rdchem.ChiralType,
    ),
)
_HU_BOND = (
    _feature(
        "bond_type",
        ("SINGLE", "DOUBLE", "TRIPLE", "AROMATIC", "<self-loop>"),
        lambda b: b.GetBondType(),
        _rdchem.BondType,
    ),
    _feature(
        "bond_direction",
        ("NONE", "ENDUPRIGHT", "ENDDOWNRIGHT"),
        lambda b: b.GetBondDir(),
        _rdchem.BondDir,
    ),
)


def _make_layout(
    name: str, atom: Sequence[_Feature], bond: Sequence[_Feature], salt: str
) -> FeatureLayout:
    atom_vocab = tuple(f.other + 2 for f in atom)
    bond_vocab = tuple(f.other + 2 for f in bond)
    digest = hashlib.sha256(salt.encode()).hexdigest()[:10]
    return FeatureLayout(
        name=name,
        atom_vocab=atom_vocab,
        bond_vocab=bond_vocab,
        atom_mask=tuple(v - 1 for v in atom_vocab),
        bond_mask=tuple(v - 1 for v in bond_vocab),
        version=f"{name}-{_FORMAT}-{digest}",
    )


LAYOUTS: dict[str, FeatureLayout] = {
    "pyg": _make_layout("pyg", _PYG_ATOM, _PYG_BOND, repr((x_map, e_map))),
    "pretrain-gnns": _make_layout("pretrain-gnns", _HU_ATOM, _HU_BOND, "hu2019"),
}
_FEATURES: dict[str, tuple[tuple[_Feature, ...], tuple[_Feature, ...]]] = {
    "pyg": (_PYG_ATOM, _PYG_BOND),
    "pretrain-gnns": (_HU_ATOM, _HU_BOND),
}


@contextmanager
def quiet_rdkit() -> Iterator[None]:
    """Silence rdkit's log (parse errors, valence complaints) inside the block; the previous
    log settings come back afterwards (``rdBase.BlockLogs``)."""
    block = rdBase.BlockLogs()
    try:
        yield
    finally:
        del block


def _codes(item: Any, features: Sequence[_Feature]) -> list[int]:
    return [f.table.get(f.read(item), f.other) for f in features]


def featurize(smiles_or_mol: str | Chem.Mol, layout: str = "pyg") -> Data | None:
    """Turn a SMILES string or an rdkit ``Mol`` into a graph of categorical features.

    The graph keeps the molecule's atom order (heavy atoms; hydrogens only where the molecule
    holds them explicitly), every bond in both directions sorted by ``(source, target)``, and the
    canonical isomeric SMILES. Returns ``None`` when the SMILES does not parse (rdkit's log is
    silenced meanwhile) or the molecule has no atoms. A ``Mol`` is not modified.

    Shape:
        returns ``Data(x=(n, F_atom) long, edge_index=(2, 2m) long, edge_attr=(2m, F_bond) long,
        smiles=str, num_nodes=n)`` for n atoms and m bonds (methane: edge_index ``(2, 0)``)
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown feature layout {layout!r}; choose one of {sorted(LAYOUTS)}")
    if isinstance(smiles_or_mol, str):
        with quiet_rdkit():
            mol = Chem.MolFromSmiles(smiles_or_mol)
        if mol is None:
            return None
    elif isinstance(smiles_or_mol, Chem.Mol):
        mol = smiles_or_mol
        if mol.NeedsUpdatePropertyCache():  # an unsanitised Mol: compute valences on a copy
            mol = Chem.Mol(mol)
            with quiet_rdkit():
                mol.UpdatePropertyCache(strict=False)
    else:
        raise TypeError(f"featurize takes a SMILES str or an rdkit Mol, not {type(smiles_or_mol)}")
    n = mol.GetNumAtoms()
    if n == 0:
        return None
    atom_features, bond_features = _FEATURES[layout]
    x = torch.tensor([_codes(atom, atom_features) for atom in mol.GetAtoms()], dtype=torch.long)

    pairs: list[tuple[int, int]] = []
    attrs: list[list[int]] = []
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        codes = _codes(bond, bond_features)
        pairs += [(i, j), (j, i)]
        attrs += [codes, codes]
    edge_index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).t()  # (2, 2m)
    edge_attr = torch.tensor(attrs, dtype=torch.long).reshape(-1, len(bond_features))  # (2m, F)
    if pairs:  # from_smiles's order; keys are unique (one bond per atom pair)
        order = (edge_index[0] * n + edge_index[1]).argsort()
        edge_index, edge_attr = edge_index[:, order].contiguous(), edge_attr[order]
    smiles = Chem.MolToSmiles(mol)
    return Data(x=x, edge_index=edge_index, edge_attr=edge_attr, smiles=smiles, num_nodes=n)
