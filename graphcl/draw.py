"""Pictures of molecules and of their augmented views (rdkit drawings).

An augmented view is a graph, not a valid molecule (nodes dropped, bonds added, atoms masked),
so it is turned back into an unsanitised rdkit ``Mol`` from its categorical features: masked or
out-of-vocabulary atoms are drawn as ``*``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PIL import Image
from rdkit import Chem
from rdkit.Chem import Draw, rdDepictor
from torch_geometric.data import Data
from torch_geometric.utils.smiles import e_map, x_map

from shared.checkpoint import atomic_write

__all__ = ["draw_grid", "graph_to_mol"]

_BOND_TYPES = {name: getattr(Chem.BondType, name) for name in e_map["bond_type"]}
# the pretrain-gnns layout's bond types, in its order (Hu et al. 2019)
_HU_BONDS = (
    Chem.BondType.SINGLE,
    Chem.BondType.DOUBLE,
    Chem.BondType.TRIPLE,
    Chem.BondType.AROMATIC,
)


def _atomic_number(index: int, layout: str) -> int:
    if layout == "pretrain-gnns":
        return index + 1 if index < 118 else 0  # Hu et al.: atomic numbers 1..118 from 0
    numbers = x_map["atomic_num"]
    return int(numbers[index]) if index < len(numbers) else 0


def _bond_type(index: int, layout: str) -> Chem.BondType:
    if layout == "pretrain-gnns":
        return _HU_BONDS[index] if index < len(_HU_BONDS) else Chem.BondType.UNSPECIFIED
    names = e_map["bond_type"]
    return _BOND_TYPES[names[index]] if index < len(names) else Chem.BondType.UNSPECIFIED


def graph_to_mol(graph: Data, layout: str = "pyg") -> Chem.Mol:
    """An unsanitised rdkit molecule with the graph's atoms and bonds, 2-D coordinates set."""
    mol = Chem.RWMol()
    x = graph.x.cpu()
    for row in x:
        atom = Chem.Atom(_atomic_number(int(row[0]), layout))
        atom.SetNoImplicit(True)
        mol.AddAtom(atom)
    edge_index = graph.edge_index.cpu()
    attrs = graph.edge_attr.cpu() if graph.edge_attr is not None else None
    for k in range(edge_index.shape[1]):
        i, j = int(edge_index[0, k]), int(edge_index[1, k])
        if i >= j or mol.GetBondBetweenAtoms(i, j) is not None:
            continue  # one rdkit bond per undirected pair
        kind = Chem.BondType.SINGLE if attrs is None else _bond_type(int(attrs[k, 0]), layout)
        mol.AddBond(i, j, kind)
        if kind == Chem.BondType.AROMATIC:
            mol.GetBondBetweenAtoms(i, j).SetIsAromatic(True)
            mol.GetAtomWithIdx(i).SetIsAromatic(True)
            mol.GetAtomWithIdx(j).SetIsAromatic(True)
    out = mol.GetMol()
    out.UpdatePropertyCache(strict=False)
    Chem.FastFindRings(out)  # ring information without sanitising
    rdDepictor.Compute2DCoords(out)
    return out


def draw_grid(
    graphs: Sequence[Data],
    legends: Sequence[str],
    path: Path,
    *,
    layout: str = "pyg",
    per_row: int = 4,
    size: int = 260,
) -> Path:
    """One PNG with a drawing of each graph and its legend."""
    mols = [graph_to_mol(graph, layout) for graph in graphs]
    options = Draw.MolDrawOptions()
    # views are not valid molecules: draw them as they are
    options.prepareMolsBeforeDrawing = False  # type: ignore[assignment]
    image = Draw.MolsToGridImage(  # type: ignore[no-untyped-call]
        mols,
        molsPerRow=per_row,
        subImgSize=(size, size),
        legends=list(legends),
        drawOptions=options,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:  # a full disk keeps the previous drawing whole
        image.save(handle, format=Image.registered_extensions().get(path.suffix.lower(), "PNG"))
    return path
