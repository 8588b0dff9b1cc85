"""Configs: dataclass -> argparse, --config files, unknown keys, round-trips."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from shared.config import (
    FieldNote,
    config_to_dict,
    field_notes,
    load_config,
    parse_config,
    save_config,
)


@dataclass(frozen=True)
class Demo:
    """A demo pipeline config.

    The second paragraph is not part of the CLI description.
    """

    lr: float = 0.3
    epochs: int = 10
    name: str = "demo"
    augment: bool = True
    optimizer: Literal["sgd", "adam", "lars"] = "lars"
    views: Literal[2, 4] = 2
    dims: tuple[int, ...] = (512, 128)
    betas: tuple[float, float] = (0.9, 0.999)
    temperature: float | None = None
    milestones: tuple[int, ...] | None = None
    crop: tuple[int, int] | None = None
    data_dir: Path = Path("data")
    label_smoothing: float = field(default=0.0, metadata={"help": "CE smoothing"})

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass(frozen=True)
class Required:
    seed: int
    width: int = 2


def test_defaults_without_arguments() -> None:
    assert parse_config(Demo, []) == Demo()


def test_command_line_types() -> None:
    argv = (
        "--lr 0.1 --epochs 3 --no-augment --optimizer adam --views 4 --dims 64 32 16 "
        "--betas 0.5 0.6 --temperature 0.07 --milestones 5 8 --data-dir somewhere"
    )
    cfg = parse_config(Demo, argv.split())
    assert cfg == Demo(
        lr=0.1,
        epochs=3,
        augment=False,
        optimizer="adam",
        views=4,
        dims=(64, 32, 16),
        betas=(0.5, 0.6),
        temperature=0.07,
        milestones=(5, 8),
        data_dir=Path("somewhere"),
    )
    assert isinstance(cfg.dims, tuple) and isinstance(cfg.views, int)


def test_none_on_the_command_line() -> None:
    base = Demo(temperature=0.5, milestones=(1,))
    assert parse_config(Demo, ["--temperature", "0.5", "--milestones", "1"]) == base
    cfg = parse_config(Demo, ["--temperature", "none", "--milestones", "None"])
    assert cfg.temperature is None and cfg.milestones is None


def test_literal_choices_enforced(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_config(Demo, ["--optimizer", "rmsprop"])
    assert excinfo.value.code == 2
    assert "invalid choice: 'rmsprop'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(Demo, ["--views", "3"])


def test_unknown_flag_and_bad_value_exit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(Demo, ["--learning-rate", "0.1"])
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(Demo, ["--epochs", "ten"])
    assert "invalid int value: 'ten'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(Demo, ["--temp", "0.1"])  # no silent prefix match for --temperature
    assert "unrecognized arguments: --temp" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(Demo, ["--betas", "0.1"])
    assert "--betas: expected 2 arguments" in capsys.readouterr().err
    assert parse_config(Demo, ["--crop", "3", "4"]).crop == (3, 4)
    with pytest.raises(SystemExit):
        parse_config(Demo, ["--crop", "3", "4", "5"])  # optional: nargs="+", checked after
    assert "--crop: expected 2 values, got [3, 4, 5]" in capsys.readouterr().err


def test_post_init_validation_runs() -> None:
    with pytest.raises(ValueError, match=r"lr must be > 0, got -1\.0"):
        parse_config(Demo, ["--lr", "-1"])


def test_required_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_config(Required, [])
    assert "--seed" in capsys.readouterr().err
    assert parse_config(Required, ["--seed", "4"]) == Required(seed=4)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"seed": 9}))
    assert parse_config(Required, ["--config", str(path)]) == Required(seed=9)


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_round_trip_through_files(tmp_path: Path, suffix: str) -> None:
    cfg = Demo(lr=0.01, optimizer="sgd", dims=(8,), temperature=0.2, data_dir=Path("x/y"))
    plain = config_to_dict(cfg)
    assert plain["dims"] == [8] and plain["data_dir"] == "x/y"
    path = tmp_path / f"cfg{suffix}"
    text = yaml.safe_dump(plain) if suffix != ".json" else json.dumps(plain)
    path.write_text(text)
    assert load_config(Demo, path) == cfg
    assert parse_config(Demo, ["--config", str(path)]) == cfg


def test_save_config_writes_config_json(tmp_path: Path) -> None:
    cfg = Demo(milestones=(3, 6), betas=(0.1, 0.2))
    written = save_config(cfg, tmp_path)
    assert written == tmp_path / "config.json"
    assert json.loads(written.read_text())["milestones"] == [3, 6]
    assert load_config(Demo, written) == cfg
    other = save_config(cfg, tmp_path / "other.json")
    assert load_config(Demo, other) == cfg


def test_command_line_overrides_file(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("lr: 0.05\nepochs: 7\naugment: false\n")
    cfg = parse_config(Demo, ["--epochs", "2", "--config", str(path)])
    assert (cfg.lr, cfg.epochs, cfg.augment) == (0.05, 2, False)
    cfg = parse_config(Demo, ["--config", str(path), "--augment"])
    assert cfg.augment is True


def test_unknown_key_in_file_names_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text("lr: 0.1\nlearning_rate: 0.2\n")
    with pytest.raises(ValueError, match=r"cfg\.yaml.*'learning_rate'.*valid keys.*'lr'"):
        parse_config(Demo, ["--config", str(path)])
    with pytest.raises(ValueError, match="learning_rate"):
        load_config(Demo, path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("optimizer: rmsprop\n", "'rmsprop' is not one of"),
        ("epochs: 2.5\n", "key 'epochs': expected int"),
        ("augment: 1\n", "key 'augment': expected bool"),
        ("betas: [0.1]\n", "key 'betas': expected 2 values"),
        ("lr: null\n", "key 'lr': None is not allowed"),
        ("- 1\n- 2\n", "must hold a mapping"),
    ],
)
def test_bad_file_values(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as excinfo:
        load_config(Demo, path)
    assert "bad.yaml" in str(excinfo.value)


def test_yaml_exponent_without_dot_is_a_float(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-3\ndims: [4, 2]\n")  # YAML 1.1 reads 1e-3 as a string
    cfg = load_config(Demo, path)
    assert cfg.lr == 0.001 and cfg.dims == (4, 2)


def test_empty_file_and_bad_suffix(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(Demo, empty) == Demo()
    toml = tmp_path / "cfg.toml"
    toml.write_text("lr = 1")
    with pytest.raises(ValueError, match=r"cfg\.toml.*suffix"):
        load_config(Demo, toml)
    with pytest.raises(FileNotFoundError, match=r"absent\.yaml"):
        parse_config(Demo, ["--config", str(tmp_path / "absent.yaml")])


def test_unsupported_field_types_are_refused() -> None:
    @dataclass
    class Bad:
        sizes: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match=r"Bad\.sizes"):
        parse_config(Bad, [])

    @dataclass
    class Clash:
        config: str = "x"

    with pytest.raises(TypeError, match="'config'"):
        parse_config(Clash, [])


def test_help_lists_fields(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_config(Demo, ["--help"], prog="demo")
    assert excinfo.value.code == 0
    out = capsys.readouterr().out
    assert "A demo pipeline config." in out and "second paragraph" not in out
    assert "--no-augment" in out and "{sgd,adam,lars}" in out
    assert "CE smoothing (default: 0.0)" in out and "--data-dir" in out


@dataclass(frozen=True)
class Documented:
    """A config whose help sits next to its fields."""

    # group: run
    seed: int = 0  # random seed; any integer >= 0
    # group: data
    data_root: Path = Path("data")
    """the folder of the images,
    read once"""
    image_size: int = 32  # ignored: the docstring below wins
    "image side in pixels, >= 1"
    # group: optimisation
    lr: float = field(default=0.1, metadata={"help": "learning rate, > 0 (metadata wins)"})
    # group: extras
    notes: str = ""
    undocumented: int = 3

    def __post_init__(self) -> None:
        """A method: neither a field nor a docstring of one."""


@dataclass(frozen=True)
class Child(Documented):
    width: int = 8  # channels of the first layer, >= 1


def test_help_is_read_next_to_each_field() -> None:
    notes = field_notes(Documented)
    assert notes["seed"] == FieldNote("random seed; any integer >= 0", "run")
    assert notes["data_root"] == FieldNote("the folder of the images, read once", "data")
    assert notes["image_size"] == FieldNote("image side in pixels, >= 1", "data")
    assert notes["lr"] == FieldNote("learning rate, > 0 (metadata wins)", "optimisation")
    assert notes["notes"] == FieldNote("", "extras") and "undocumented" in notes
    inherited = field_notes(Child)
    assert inherited["width"] == FieldNote("channels of the first layer, >= 1", "")
    assert inherited["seed"] == notes["seed"]  # read from the base class's source


def test_help_spells_each_flag_once_and_groups_the_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_config(Documented, ["--help"], prog="documented")
    out = capsys.readouterr().out
    assert "--data_root" not in out and out.count("  --data-root PATH") == 1
    assert "the folder of the images, read once (default: data)" in out
    assert "--seed INT " in out and "--config FILE" in out
    # the canonical groups in their order (data, optimisation, run), then the others
    headings = [line for line in out.splitlines() if line.endswith(":") and " " not in line]
    assert headings == ["options:", "data:", "optimisation:", "run:", "extras:"]
    assert "--undocumented INT  (default: 3)" in out
    with pytest.raises(SystemExit):
        parse_config(Documented, ["--data_root", "x"])  # one spelling: dashes
    assert "unrecognized arguments: --data_root" in capsys.readouterr().err
    assert parse_config(Documented, ["--data-root", "x"]).data_root == Path("x")


def test_a_preset_sets_defaults_below_file_and_flags(tmp_path: Path) -> None:
    presets = {"quick": {"epochs": 2, "lr": 0.5}}
    assert parse_config(Demo, [], presets=presets).epochs == Demo().epochs
    quick = parse_config(Demo, ["--quick"], presets=presets)
    assert (quick.epochs, quick.lr) == (2, 0.5)
    assert parse_config(Demo, ["--quick", "--epochs", "7"], presets=presets).epochs == 7
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"epochs": 5}))
    from_file = parse_config(Demo, ["--quick", "--config", str(path)], presets=presets)
    assert (from_file.epochs, from_file.lr) == (5, 0.5)
    with pytest.raises(ValueError, match="unknown"):
        parse_config(Demo, ["--quick"], presets={"quick": {"nope": 1}})
    two = {"quick": {"epochs": 2}, "tiny": {"epochs": 1}}
    with pytest.raises(ValueError, match="choose one preset"):
        parse_config(Demo, ["--quick", "--tiny"], presets=two)
