"""Probes on frozen features: linear (lbfgs, adam), weighted kNN, alignment/uniformity, features."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from shared.probes import (
    ProbeResult,
    alignment_uniformity,
    extract_features,
    knn_probe,
    linear_probe,
    train_val_split,
)


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    """Thousands of tiny full-batch steps: with workers sharing the cores (pytest -n 2 on 2 CPUs),
    OpenMP threads spin against each other and a 1-second fit takes 20 seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _blobs(
    num_per_class: int, num_classes: int, dim: int, spread: float, seed: int
) -> tuple[Tensor, Tensor]:
    """Gaussian blobs around random centres at distance ~`spread`; unit noise."""
    generator = torch.Generator().manual_seed(seed)
    centres = spread * torch.nn.functional.normalize(
        torch.randn(num_classes, dim, generator=generator), dim=1
    )  # (C, D)
    y = torch.arange(num_classes).repeat_interleave(num_per_class)  # (N,)
    x = centres[y] + torch.randn(y.shape[0], dim, generator=generator)  # (N, D)
    order = torch.randperm(y.shape[0], generator=generator)
    return x[order], y[order]


def _train_test(spread: float, seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    x, y = _blobs(100, 3, 10, spread, seed)
    return x[:200], y[:200], x[200:], y[200:]


def test_linear_probe_separable_blobs() -> None:
    train_x, train_y, test_x, test_y = _train_test(spread=8.0)
    result = linear_probe(train_x, train_y, test_x, test_y)
    assert isinstance(result, ProbeResult)
    assert result.accuracy > 0.95 and result.val_accuracy > 0.95
    assert result.weight_decay in {10.0**e for e in range(-6, 1)}


@pytest.mark.parametrize("standardize", [True, False])
def test_the_fitted_probe_reproduces_its_test_accuracy(standardize: bool) -> None:
    """The refit model comes back, to classify other features (e.g. of corrupted images)."""
    train_x, train_y, test_x, test_y = _train_test(spread=1.0)
    result = linear_probe(train_x, train_y, test_x, test_y, standardize=standardize)
    assert result.model is not None
    assert result.model.logits(test_x).shape == (test_x.shape[0], 3)
    accuracy = (result.model.predict(test_x) == test_y).double().mean().item()
    assert accuracy == pytest.approx(result.accuracy)
    assert 0.4 < result.accuracy < 1.0  # overlapping blobs: a real check, not a trivial one


def test_linear_probe_random_labels_is_near_chance() -> None:
    train_x, _, test_x, _ = _train_test(spread=8.0)
    generator = torch.Generator().manual_seed(1)
    train_y = torch.randint(0, 3, (train_x.shape[0],), generator=generator)
    test_y = torch.randint(0, 3, (test_x.shape[0],), generator=generator)
    result = linear_probe(train_x, train_y, test_x, test_y, max_iter=100)
    # 100 test points, chance 1/3, binomial std 0.047: 0.2 is a > 4 std margin.
    assert abs(result.accuracy - 1 / 3) < 0.2


def test_lbfgs_and_adam_agree() -> None:
    # Overlapping blobs (accuracy well below 1) so that agreement means something.
    train_x, train_y, test_x, test_y = _train_test(spread=2.0, seed=3)
    lbfgs = linear_probe(train_x, train_y, test_x, test_y, optimizer="lbfgs", weight_decay=1e-2)
    adam = linear_probe(
        train_x, train_y, test_x, test_y, optimizer="adam", weight_decay=1e-2, max_iter=1000
    )
    assert 0.5 < lbfgs.accuracy < 0.97
    assert abs(lbfgs.accuracy - adam.accuracy) <= 0.03
    assert abs(lbfgs.val_accuracy - adam.val_accuracy) <= 0.06


def test_linear_probe_is_deterministic_and_leaves_inputs_alone() -> None:
    tensors = _train_test(spread=2.0, seed=4)
    copies = [t.clone() for t in tensors]
    first = linear_probe(*tensors, weight_decay=(1e-4, 1e-1), seed=7)
    second = linear_probe(*tensors, weight_decay=(1e-4, 1e-1), seed=7)
    assert first[:3] == second[:3]
    assert first.model is not None and second.model is not None
    for a, b in zip(first.model, second.model, strict=True):
        assert torch.equal(a, b)
    for t, c in zip(tensors, copies, strict=True):
        assert torch.equal(t, c)


def test_linear_probe_single_weight_decay_without_validation() -> None:
    result = linear_probe(*_train_test(spread=8.0), weight_decay=1e-3, val_fraction=0.0)
    assert result.weight_decay == 1e-3 and math.isnan(result.val_accuracy)
    assert result.accuracy > 0.95


def test_standardized_probe_ignores_per_feature_affine_maps() -> None:
    """Standardisation (fit statistics applied to train and test alike) undoes x * a + b."""
    train_x, train_y, test_x, test_y = _train_test(spread=2.0, seed=6)
    generator = torch.Generator().manual_seed(0)
    scale = torch.rand(10, generator=generator, dtype=torch.float64) * 50 + 0.1  # (D,)
    shift = torch.randn(10, generator=generator, dtype=torch.float64) * 100  # (D,)
    plain = linear_probe(train_x.double(), train_y, test_x.double(), test_y, weight_decay=1e-2)
    moved = linear_probe(
        train_x * scale + shift, train_y, test_x * scale + shift, test_y, weight_decay=1e-2
    )
    assert 0.5 < plain.accuracy < 0.97
    assert moved.accuracy == pytest.approx(plain.accuracy, abs=0.011)
    assert moved.val_accuracy == pytest.approx(plain.val_accuracy, abs=0.051)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_linear_probe_dtypes(dtype: torch.dtype) -> None:
    train_x, train_y, test_x, test_y = _train_test(spread=8.0)
    result = linear_probe(
        train_x.to(dtype), train_y, test_x.to(dtype), test_y, weight_decay=1e-3, max_iter=100
    )
    assert result.accuracy > 0.95


def test_split_is_disjoint_complete_and_seeded() -> None:
    split = train_val_split(50, 0.2, seed=3)
    assert split.val.numel() == 10 and split.fit.numel() == 40
    assert set(split.fit.tolist()).isdisjoint(split.val.tolist())
    assert sorted(split.fit.tolist() + split.val.tolist()) == list(range(50))
    again = train_val_split(50, 0.2, seed=3)
    assert torch.equal(split.fit, again.fit) and torch.equal(split.val, again.val)
    assert not torch.equal(split.val, train_val_split(50, 0.2, seed=4).val)
    assert train_val_split(5, 0.01).val.numel() == 1  # at least one held-out sample


def test_knn_on_clustered_data() -> None:
    train_x, train_y, test_x, test_y = _train_test(spread=8.0)
    assert knn_probe(train_x, train_y, test_x, test_y, k=20) > 0.9
    assert knn_probe(train_x, train_y, test_x, test_y, k=5, weighted=False) > 0.9


def _slow_knn_prediction(
    train_x: Tensor, train_y: Tensor, query: Tensor, k: int, temperature: float, weighted: bool
) -> int:
    """The InstDisc kNN vote written out as loops in float64."""
    sims = []
    for j in range(train_x.shape[0]):
        a, b = query.tolist(), train_x[j].tolist()
        dot = sum(u * v for u, v in zip(a, b, strict=True))
        sims.append(dot / math.sqrt(sum(u * u for u in a) * sum(v * v for v in b)))
    neighbours = sorted(range(len(sims)), key=lambda j: -sims[j])[:k]
    scores = [0.0] * (int(train_y.max()) + 1)
    for j in neighbours:
        scores[int(train_y[j])] += math.exp(sims[j] / temperature) if weighted else 1.0
    return max(range(len(scores)), key=lambda c: scores[c])  # first max: smallest class


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize(("seed", "k"), [(0, 1), (1, 4), (2, 7)])
def test_knn_vote_matches_slow_loop(seed: int, k: int, weighted: bool) -> None:
    generator = torch.Generator().manual_seed(seed)
    train_x = torch.randn(12, 3, generator=generator, dtype=torch.float64)
    train_y = torch.randint(0, 3, (12,), generator=generator)
    train_y[:3] = torch.arange(3)  # every class present
    test_x = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    for query in test_x:
        expected = _slow_knn_prediction(train_x, train_y, query, k, 0.5, weighted)
        # The probe returns an accuracy; probing every candidate label recovers its prediction.
        hits = [
            knn_probe(
                train_x,
                train_y,
                query[None],
                torch.tensor([c]),
                k=k,
                temperature=0.5,
                weighted=weighted,
            )
            for c in range(3)
        ]
        assert hits == [float(c == expected) for c in range(3)]


def test_weighted_vote_differs_from_majority() -> None:
    """One very close neighbour of class 0 outvotes two far ones of class 1 only when weighted."""
    train_x = torch.tensor([[1.0, 0.0], [0.5, 1.0], [0.5, -1.0], [-1.0, 0.0]])
    train_y = torch.tensor([0, 1, 1, 0])
    query, label0 = torch.tensor([[1.0, 0.01]]), torch.tensor([0])
    assert knn_probe(train_x, train_y, query, label0, k=3, temperature=0.1) == 1.0
    assert knn_probe(train_x, train_y, query, label0, k=3, weighted=False) == 0.0


def test_knn_chunking_does_not_change_the_result() -> None:
    tensors = _train_test(spread=2.0, seed=5)
    copies = [t.clone() for t in tensors]
    results = {knn_probe(*tensors, k=7, chunk_size=size) for size in (1, 13, 10_000)}
    assert len(results) == 1
    for t, c in zip(tensors, copies, strict=True):
        assert torch.equal(t, c)


@pytest.mark.parametrize(
    ("call", "bad"),
    [
        (lambda t: knn_probe(*t, k=0), "got 0"),
        (lambda t: knn_probe(*t, k=201), "got 201"),
        (lambda t: knn_probe(*t, temperature=-0.1), "-0.1"),
        (lambda t: linear_probe(*t, optimizer="sgd"), "'sgd'"),
        (lambda t: linear_probe(*t, weight_decay=-1.0), "-1.0"),
        (lambda t: linear_probe(*t, val_fraction=0.0), "val_fraction > 0, got 0.0"),
        (lambda t: linear_probe(t[0], t[1].float(), t[2], t[3]), "torch.float32"),
        (lambda t: linear_probe(t[0][:, :5], t[1], t[2], t[3]), "5 vs 10"),
        (lambda t: knn_probe(*t, num_classes=2), "num_classes=2"),
    ],
)
def test_probes_reject_bad_arguments(call: Any, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        call(_train_test(spread=8.0))


def test_alignment_uniformity_calls_the_losses() -> None:
    from shared.losses import alignment, uniformity

    generator = torch.Generator().manual_seed(0)
    z1 = torch.randn(16, 5, generator=generator, dtype=torch.float64)
    z2 = z1 + 0.1 * torch.randn(16, 5, generator=generator, dtype=torch.float64)
    result = alignment_uniformity(z1, z2)
    assert set(result) == {"alignment", "uniformity"}
    assert result["alignment"] == pytest.approx(float(alignment(z1, z2)))
    expected = 0.5 * (float(uniformity(z1)) + float(uniformity(z2)))
    assert result["uniformity"] == pytest.approx(expected)
    # Identical views are perfectly aligned; rescaling rows changes nothing (inputs normalised).
    same = alignment_uniformity(z1, 3.0 * z1)
    assert same["alignment"] == pytest.approx(0.0, abs=1e-12)
    assert same["uniformity"] == pytest.approx(float(uniformity(z1)))


class _GraphLikeBatch:
    """Stands in for a PyG Batch: moved with .to(), labels in .y."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def to(self, device: torch.device | str) -> _GraphLikeBatch:
        return _GraphLikeBatch(self.x.to(device), self.y)


class _GraphEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, batch: _GraphLikeBatch) -> Tensor:
        out: Tensor = self.lin(batch.x)
        return out


def _encoder() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 3))


def test_extract_features_eval_mode_no_grad_and_mode_restored() -> None:
    encoder = _encoder().train()
    encoder[1].eval()  # a frozen BN inside a training model must stay frozen afterwards
    generator = torch.Generator().manual_seed(0)
    xs = [torch.randn(5, 4, generator=generator) for _ in range(3)]
    ys = [torch.randint(0, 3, (5,), generator=generator) for _ in range(3)]
    loader = list(zip(xs, ys, strict=True))
    running_mean = encoder[1].running_mean.clone()
    features, labels = extract_features(encoder, loader, "cpu")
    assert features.shape == (15, 3) and labels.shape == (15,)
    assert not features.requires_grad
    assert torch.equal(labels, torch.cat(ys))
    assert [m.training for m in encoder.modules()] == [True, True, False, True, True]
    assert torch.equal(encoder[1].running_mean, running_mean)  # BN statistics untouched
    reference = _encoder().eval()  # same weights (same seed), eval: dropout off
    with torch.no_grad():
        torch.testing.assert_close(features, reference(torch.cat(xs)))


def test_extract_features_graph_batches() -> None:
    encoder = _GraphEncoder().eval()
    batches = [_GraphLikeBatch(torch.randn(2, 4), torch.tensor([1, 0])) for _ in range(2)]
    features, labels = extract_features(encoder, batches, torch.device("cpu"))
    assert features.shape == (4, 3) and labels.tolist() == [1, 0, 1, 0]
    assert not encoder.training


def test_extract_features_restores_mode_on_error() -> None:
    encoder = _encoder().train()
    with pytest.raises(ValueError, match=r"\(B, D\)"):
        extract_features(nn.Flatten(0), [(torch.randn(2, 4), torch.zeros(2))], "cpu")
    with pytest.raises(ValueError, match="labels"):
        extract_features(encoder, [torch.randn(2, 4)], "cpu")
    assert all(m.training for m in encoder.modules())


class _DeviceRecorder(nn.Module):
    """Records the device of every tensor it is given, in tuples and dicts too; returns (B, 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.device] = []

    def forward(self, inputs: Any) -> Tensor:
        leaves = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
        self.seen += [leaf.device for leaf in leaves]
        return torch.zeros(leaves[0].shape[0], 3)


@pytest.mark.parametrize("container", ["tuple", "dict"])
def test_extract_features_moves_inputs_inside_containers(container: str) -> None:
    # "meta" stands in for an accelerator: a move is visible on a CPU-only machine
    xs = (torch.randn(2, 4), torch.randn(2, 5))
    inputs = xs if container == "tuple" else {"x": xs[0], "edge": xs[1]}
    encoder = _DeviceRecorder()
    features, labels = extract_features(encoder, [(inputs, torch.tensor([0, 1]))] * 2, "meta")
    assert encoder.seen == [torch.device("meta")] * 4
    assert features.shape == (4, 3) and labels.tolist() == [0, 1, 0, 1]
    assert all(x.device.type == "cpu" for x in xs)  # the caller's tensors are not moved
