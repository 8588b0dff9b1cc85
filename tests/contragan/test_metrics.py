"""contragan.metrics, .distances, .extractor(_cache): the offline GAN figures as specifications.

Analytic cases (FD of a shifted set, density of a set against itself, a hand-computed 1-D
example), float64 loop oracles for the k-NN figures, the label-shuffle meta-test on real digits,
the extractor cache (spy on training, corrupt files), the refusal below the accuracy threshold and
the input contracts. The extractor is trained on 16-pixel digits for a few epochs (a second or two);
the full-size accuracy check is marked slow.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.linalg
import torch
from torchmetrics.image.fid import FrechetInceptionDistance

import contragan.distances as distances_module
import contragan.extractor_cache as cache_module
import contragan.metrics as metrics_module
import imagecl.digits_m as digits_m_module
from contragan.data import ImageData, images_and_labels, load_data, to_signed_unit
from contragan.extractor import (
    ExtractorRecipe,
    FeatureExtractor,
    _random_shift,
    fresh_backgrounds,
    new_classifier,
    recipe_for,
    train_extractor,
)
from contragan.extractor_cache import load_or_train_extractor
from contragan.metrics import (
    classification_accuracy_score,
    density_coverage,
    evaluate_samples,
    extract_features,
    frechet_distance,
    gan_test_accuracy,
    inception_fid,
    intra_class_fd,
    kernel_distance,
    precision_recall,
    real_vs_real,
)

FIGURES = ("fd", "kid_mean", "kid_std", "precision", "recall", "density", "coverage")
FIGURES += ("gan_test_acc", "cas_acc", "intra_fd_mean")


@pytest.fixture(scope="module")
def digits16() -> ImageData:
    return load_data("digits", image_size=16)


@pytest.fixture(scope="module")
def extractor16(digits16: ImageData) -> FeatureExtractor:
    model, accuracy = train_extractor(digits16, seed=0, epochs=4)
    assert accuracy > 0.9  # the meta-test below needs a classifier that works
    return model


def gaussian(n: int, dim: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=generator, dtype=torch.float64) + shift


# --------------------------------------------------------------------------- Fréchet distance


def test_fd_of_a_set_with_itself_is_zero() -> None:
    features = gaussian(300, 16, seed=0)
    assert abs(frechet_distance(features, features)) < 1e-8


def test_fd_of_a_shifted_set_is_the_squared_shift() -> None:
    # Y = X + μ has X's covariance exactly, so FD = ‖μ‖² with no sampling error.
    features = gaussian(400, 8, seed=1) @ gaussian(8, 8, seed=2)  # correlated dimensions
    for scale in (0.1, 1.0, 5.0):
        mu = scale * torch.linspace(-1.0, 1.0, 8, dtype=torch.float64)
        assert frechet_distance(features, features + mu) == pytest.approx(
            float(mu.square().sum()), rel=1e-6, abs=1e-8
        )


def test_fd_equals_the_closed_form_on_gaussian_samples() -> None:
    # scipy's matrix square root on the sample statistics: the float64 oracle of Eq. 6
    distances = []
    for shift in (0.0, 0.5, 1.0, 2.0):
        real, fake = gaussian(500, 6, seed=3), gaussian(500, 6, seed=4, shift=shift)
        mu_r, mu_f = real.mean(0).numpy(), fake.mean(0).numpy()
        cov_r, cov_f = np.cov(real.numpy(), rowvar=False), np.cov(fake.numpy(), rowvar=False)
        root = scipy.linalg.sqrtm(cov_r @ cov_f).real
        expected = ((mu_r - mu_f) ** 2).sum() + np.trace(cov_r + cov_f - 2 * root)
        distances.append(frechet_distance(real, fake))
        assert distances[-1] == pytest.approx(expected, rel=1e-6, abs=1e-8)
        # and near the population value 6·shift² (identity covariances)
        assert distances[-1] == pytest.approx(6 * shift**2, abs=0.2 + 0.1 * shift**2)
    assert distances == sorted(distances)  # grows with the mean shift


def test_extractor_plugs_into_torchmetrics_fid_directly(
    digits16: ImageData, extractor16: FeatureExtractor
) -> None:
    # the route torchmetrics documents (feature=<module>, images in) equals ours (features in)
    images = to_signed_unit(images_and_labels(digits16.test)[0])
    real, fake = images[:150], images[150:300]
    metric = FrechetInceptionDistance(feature=extractor16, normalize=True)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    real_features, fake_features = (
        extract_features(extractor16, real),
        extract_features(extractor16, fake),
    )
    ours = frechet_distance(real_features, fake_features)
    assert float(metric.compute()) == pytest.approx(ours, rel=1e-4)


# --------------------------------------------------------------------------- k-NN figures


def loop_knn_figures(real: torch.Tensor, fake: torch.Tensor, k: int) -> tuple[float, ...]:
    """Eqs. 1–2 of Kynkäänniemi et al. and 3–4 of Naeem et al., one pair at a time."""

    def radius(points: torch.Tensor, i: int) -> float:
        others = sorted(float((points[i] - points[j]).norm()) for j in range(len(points)) if j != i)
        return others[k - 1]

    r_real = [radius(real, i) for i in range(len(real))]
    r_fake = [radius(fake, j) for j in range(len(fake))]
    dist = [[float((x - y).norm()) for y in fake] for x in real]  # dist[i][j]
    N, M = len(real), len(fake)
    precision = sum(any(dist[i][j] <= r_real[i] for i in range(N)) for j in range(M)) / M
    recall = sum(any(dist[i][j] <= r_fake[j] for j in range(M)) for i in range(N)) / N
    density = sum(dist[i][j] < r_real[i] for i in range(N) for j in range(M)) / (k * M)
    coverage = sum(any(dist[i][j] < r_real[i] for j in range(M)) for i in range(N)) / N
    return precision, recall, density, coverage


@pytest.mark.parametrize(("n", "m", "k", "seed"), [(12, 9, 1, 0), (20, 25, 3, 1), (30, 30, 5, 2)])
def test_knn_figures_match_the_loop_oracle(
    n: int, m: int, k: int, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(distances_module, "_BLOCK", 7)  # several row blocks, a ragged last one
    real, fake = gaussian(n, 3, seed), gaussian(m, 3, seed + 10, shift=0.3)
    got = (*precision_recall(real, fake, k=k), *density_coverage(real, fake, k=k))
    assert got == pytest.approx(loop_knn_figures(real, fake, k), abs=1e-12)


def test_knn_figures_of_identical_sets() -> None:
    features = gaussian(200, 10, seed=5)
    assert precision_recall(features, features) == (1.0, 1.0)
    density, coverage = density_coverage(features, features)
    # open balls: each real ball holds its centre and its k − 1 nearest neighbours, so k of M
    assert density == pytest.approx(1.0, abs=1e-12)
    assert coverage == 1.0


def test_knn_figures_of_far_apart_sets() -> None:
    real, fake = gaussian(100, 4, seed=6), gaussian(100, 4, seed=7, shift=1000.0)
    assert precision_recall(real, fake) == (0.0, 0.0)
    assert density_coverage(real, fake) == (0.0, 0.0)


def test_knn_figures_by_hand() -> None:
    # k = 1. Real radii (nearest other real): 0→1, 1→1, 2→1, 10→8.
    # Fake radii: 0.5→0.4, 0.9→0.4, 5→4.1, 20→15.
    real = torch.tensor([[0.0], [1.0], [2.0], [10.0]], dtype=torch.float64)
    fake = torch.tensor([[0.5], [5.0], [20.0], [0.9]], dtype=torch.float64)
    # precision: 0.5 (in B(0,1)), 5 (in B(10,8)), 0.9 (in B(0,1)) are in; 20 is not → 3/4
    # recall: 1 (0.9 within 0.4), 2 (5 within 4.1), 10 (20 within 15) are in; 0 is not → 3/4
    assert precision_recall(real, fake, k=1) == (0.75, 0.75)
    # density: 0.5 in B(0,1), B(1,1); 5 in B(10,8); 20 in none; 0.9 in B(0,1), B(1,1) → 5/(1·4)
    # coverage: B(0,1) ∋ 0.5, B(1,1) ∋ 0.9, B(10,8) ∋ 5; B(2,1) holds no fake (0.9 is 1.1 away)
    assert density_coverage(real, fake, k=1) == pytest.approx((1.25, 0.75))


# --------------------------------------------------------------------------- KID


def test_kid_of_one_distribution_is_near_zero_and_seeded() -> None:
    real, same = gaussian(400, 16, seed=8), gaussian(400, 16, seed=9)
    mean, std = kernel_distance(real, same, subset_size=200, subsets=50, seed=0)
    assert abs(mean) < 0.01 and std > 0.0
    assert kernel_distance(real, same, subset_size=200, subsets=50, seed=0) == (mean, std)
    shifted, _ = kernel_distance(real, same + 1.0, subset_size=200, subsets=50, seed=0)
    assert shifted > 0.5 and shifted > 20 * abs(mean)


def test_kid_subset_larger_than_a_set_is_refused() -> None:
    with pytest.raises(ValueError, match=r"subset_size must be in \[2, 50\]"):
        kernel_distance(gaussian(50, 4, 0), gaussian(80, 4, 1), subset_size=60)


# --------------------------------------------------------------------------- the meta-test


def test_shuffled_labels_keep_fd_but_break_gan_test_and_cas(
    digits16: ImageData, extractor16: FeatureExtractor
) -> None:
    # Real test images play the generated samples; the real reference set and CAS's test set
    # are train images with the same per-class counts. Shuffling the conditioning labels must
    # leave every class-blind figure unchanged and drive the class-aware ones to chance (0.1).
    fake, fake_y = images_and_labels(digits16.test)
    train_x, train_y = images_and_labels(digits16.train)
    index = metrics_module._class_matched_subset(train_y, fake_y, seed=0)
    real, real_y = train_x[index], train_y[index]
    shuffled = fake_y[torch.randperm(len(fake_y), generator=torch.Generator().manual_seed(0))]
    true, wrong = (
        evaluate_samples(
            extractor16,
            real,
            real_y,
            fake,
            labels,
            test_images=real,
            test_labels=real_y,
            seed=0,
            cas_epochs=6,
            kid_subsets=20,
        )
        for labels in (fake_y, shuffled)
    )
    for key in ("fd", "kid_mean", "kid_std", "precision", "recall", "density", "coverage"):
        assert wrong[key] == pytest.approx(true[key], rel=1e-9, abs=1e-12), key
    # measured: GAN-test 0.99 → 0.07, CAS 0.96 → 0.10, intra-class FD 1.6 → 99
    assert true["gan_test_acc"] > 0.9 and wrong["gan_test_acc"] < 0.25
    assert true["cas_acc"] > 0.85 and wrong["cas_acc"] < 0.25
    assert wrong["intra_fd_mean"] > 10 * true["intra_fd_mean"]


def test_real_vs_real_reports_every_figure_with_its_spread(
    digits16: ImageData, extractor16: FeatureExtractor
) -> None:
    baseline = real_vs_real(extractor16, digits16, seeds=(0, 1), cas_epochs=2, kid_subsets=10)
    assert set(FIGURES) <= set(baseline)
    assert {f"intra_fd/{c}" for c in range(10)} <= set(baseline)
    assert baseline["num_samples"] == (len(digits16.test), 0.0)
    assert all(math.isfinite(mean) and std >= 0.0 for mean, std in baseline.values())
    assert baseline["gan_test_acc"][0] > 0.9  # the extractor on its own training images
    assert baseline["fd"][1] > 0.0  # the seeds draw different train subsets


def _stand_in_sets(digits16: ImageData) -> dict[str, torch.Tensor]:
    """Test images as the "generated" set, a class-matched train subset as the real/test set."""
    fake, fake_y = images_and_labels(digits16.test)
    train_x, train_y = images_and_labels(digits16.train)
    index = metrics_module._class_matched_subset(train_y, fake_y, seed=0)
    return {
        "real_images": train_x[index],
        "real_labels": train_y[index],
        "fake_images": fake,
        "fake_labels": fake_y,
        "test_images": train_x[index],
        "test_labels": train_y[index],
    }


def test_cas_trains_on_the_cas_set_and_nothing_else_moves(
    digits16: ImageData, extractor16: FeatureExtractor
) -> None:
    sets = _stand_in_sets(digits16)
    train_x, train_y = images_and_labels(digits16.train)
    wrong_y = train_y[torch.randperm(len(train_y), generator=torch.Generator().manual_seed(1))]
    common: dict[str, Any] = {"seed": 0, "cas_epochs": 3, "kid_subsets": 10}
    default = evaluate_samples(extractor16, **sets, **common)
    explicit = evaluate_samples(
        extractor16,
        **sets,
        cas_images=sets["fake_images"],
        cas_labels=sets["fake_labels"],
        **common,
    )
    larger = evaluate_samples(extractor16, **sets, cas_images=train_x, cas_labels=train_y, **common)
    shuffled = evaluate_samples(
        extractor16, **sets, cas_images=train_x, cas_labels=wrong_y, **common
    )
    # the default CAS set is the scored set itself
    assert explicit == default
    assert default["cas_num_samples"] == default["num_samples"] == len(sets["fake_labels"])
    assert larger["cas_num_samples"] == shuffled["cas_num_samples"] == len(train_y)
    # oracle: the CAS figure is the classifier trained on the CAS set, with the run's seed
    oracle = classification_accuracy_score(
        extractor16, train_x, train_y, sets["test_images"], sets["test_labels"], epochs=3, seed=0
    )
    assert larger["cas_acc"] == oracle
    # shuffled CAS labels drive CAS to chance and leave every figure of the scored set alone
    assert larger["cas_acc"] > 0.85 and shuffled["cas_acc"] < 0.25
    for key in set(default) - {"cas_acc", "cas_num_samples"}:
        assert shuffled[key] == default[key] == larger[key], key


def test_cas_set_contract(digits16: ImageData, extractor16: FeatureExtractor) -> None:
    sets = _stand_in_sets(digits16)
    x, y = sets["fake_images"], sets["fake_labels"]
    with pytest.raises(ValueError, match="cas_images and cas_labels together"):
        evaluate_samples(extractor16, **sets, cas_images=x)
    with pytest.raises(ValueError, match="cas_labels"):
        evaluate_samples(extractor16, **sets, cas_images=x, cas_labels=y[:-1])
    with pytest.raises(ValueError, match="cas_samples must be 'test' or 'train', got 'all'"):
        real_vs_real(extractor16, digits16, seeds=(0,), cas_samples="all")  # type: ignore[arg-type]


def test_real_vs_real_cas_on_the_whole_train_split(
    digits16: ImageData, extractor16: FeatureExtractor
) -> None:
    common: dict[str, Any] = {"seeds": (0, 1), "cas_epochs": 2, "kid_subsets": 10}
    subset = real_vs_real(extractor16, digits16, **common)
    whole = real_vs_real(extractor16, digits16, cas_samples="train", **common)
    assert subset["cas_num_samples"] == (len(digits16.test), 0.0)
    assert whole["cas_num_samples"] == (len(digits16.train), 0.0)
    # the scored subsets are the same draws: only CAS differs
    for key in set(subset) - {"cas_acc", "cas_num_samples"}:
        assert whole[key] == subset[key], key
    assert whole["cas_acc"] != subset["cas_acc"]


# --------------------------------------------------------------------------- the extractor


@pytest.mark.parametrize(("channels", "size"), [(1, 16), (3, 32), (1, 64)])
def test_extractor_shapes_and_gradients(channels: int, size: int) -> None:
    model = FeatureExtractor(channels, 7, size)
    x = torch.rand(4, channels, size, size) * 2 - 1
    features, logits = model(x), model.logits(x)
    assert features.shape == (4, model.num_features) and logits.shape == (4, 7)
    logits.square().sum().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and bool(torch.isfinite(parameter.grad).all()), name


def test_extractor_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="image_size must be >= 8"):
        FeatureExtractor(1, 10, 4)
    with pytest.raises(ValueError, match="num_classes must be >= 2"):
        FeatureExtractor(1, 1, 32)


def test_random_shift_contract() -> None:
    images = torch.rand(6, 3, 16, 16)
    before = images.clone()
    first = _random_shift(images, 2, torch.Generator().manual_seed(0))
    again = _random_shift(images, 2, torch.Generator().manual_seed(0))
    assert torch.equal(images, before)  # input untouched
    assert first.shape == images.shape and first.dtype == images.dtype
    assert torch.equal(first, again)  # seeded
    assert torch.equal(_random_shift(images, 0, torch.Generator()), images)
    # each output is a translate of its input: the centre 12×12 crop appears in the padded input
    centre = first[:, :, 2:14, 2:14]
    windows = images.unfold(2, 12, 1).unfold(3, 12, 1)  # (N, C, 5, 5, 12, 12)
    for n in range(6):
        match = (windows[n] == centre[n][:, None, None]).flatten(3).all(dim=3).all(dim=0)
        assert bool(match.any())


def test_to_signed_unit_range() -> None:
    images = torch.tensor([0, 255, 128], dtype=torch.uint8).reshape(1, 1, 1, 3)
    expected = [-1.0, 1.0, 0.5 / 127.5]
    assert to_signed_unit(images).flatten().tolist() == pytest.approx(expected, abs=1e-6)


class TrainingSpy:
    """Stands in for train_extractor: counts calls, returns an untrained net and a set accuracy."""

    def __init__(self, accuracy: float) -> None:
        self.accuracy, self.calls = accuracy, 0
        self.epochs: list[int] = []
        self.data_seeds: list[int | None] = []

    def __call__(self, data: ImageData, **kwargs: Any) -> tuple[FeatureExtractor, float]:
        self.calls += 1
        self.epochs.append(kwargs["epochs"])
        self.data_seeds.append(kwargs["data_seed"])
        return new_classifier(data, seed=kwargs["seed"]).eval(), self.accuracy


def test_extractor_cache_loads_without_training(
    digits16: ImageData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = TrainingSpy(accuracy=0.97)
    monkeypatch.setattr(cache_module, "train_extractor", spy)
    first = load_or_train_extractor(digits16, "digits16", cache_dir=tmp_path, seed=3)
    second = load_or_train_extractor(digits16, "digits16", cache_dir=tmp_path, seed=3)
    assert spy.calls == 1 and not first.from_cache and second.from_cache
    assert second.test_accuracy == 0.97 and second.weights_path == first.weights_path
    first_state, second_state = first.extractor.state_dict(), second.extractor.state_dict()
    assert all(torch.equal(first_state[key], second_state[key]) for key in first_state)
    assert not second.extractor.training
    load_or_train_extractor(digits16, "digits16", cache_dir=tmp_path, seed=4)  # another key
    load_or_train_extractor(digits16, "digits16", cache_dir=tmp_path, seed=3, epochs=2)
    assert spy.calls == 3


@pytest.mark.parametrize("damaged", ["safetensors", "json", "truncated"])
def test_corrupt_cache_is_retrained_with_a_warning(
    damaged: str, digits16: ImageData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = TrainingSpy(accuracy=0.97)
    monkeypatch.setattr(cache_module, "train_extractor", spy)
    weights = load_or_train_extractor(digits16, cache_dir=tmp_path).weights_path
    if damaged == "safetensors":
        weights.write_bytes(b"not a safetensors file")
    elif damaged == "json":
        weights.with_suffix(".json").write_text("{ broken")
    else:
        weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.warns(RuntimeWarning, match="unreadable.*retraining"):
        again = load_or_train_extractor(digits16, cache_dir=tmp_path)
    assert spy.calls == 2 and not again.from_cache
    assert load_or_train_extractor(digits16, cache_dir=tmp_path).from_cache  # repaired


def test_weak_extractor_is_refused_with_a_clear_message(
    digits16: ImageData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = TrainingSpy(accuracy=0.5)
    monkeypatch.setattr(cache_module, "train_extractor", spy)
    with pytest.raises(ValueError, match="digits16") as raised:
        load_or_train_extractor(digits16, "digits16", cache_dir=tmp_path, min_accuracy=0.95)
    message = str(raised.value)
    for part in ("0.5000", "0.9500", "epochs=24", "--min-extractor-accuracy", "min_accuracy=0.50"):
        assert part in message
    # the weights stayed cached: a lower threshold accepts them without retraining
    accepted = load_or_train_extractor(digits16, "digits16", cache_dir=tmp_path, min_accuracy=0.4)
    assert accepted.from_cache and spy.calls == 1


@pytest.mark.slow
def test_extractor_reaches_97_percent_on_digits_m() -> None:
    # digits-m's recipe (width 48, label smoothing 0.1, its training digits on four more sets of
    # backgrounds, 15 epochs) at the benchmark's 16 px, on the split of seed 3, the hardest of
    # seeds 0-6 for the earlier recipe without the extra backgrounds (96.0 % there)
    data = load_data("digits-m", seed=3, image_size=16)
    model, accuracy = train_extractor(data, seed=3, data_seed=3)
    assert model.width == 48
    assert accuracy >= 0.97


def test_fresh_backgrounds_carry_the_training_digits_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # over a black photograph a blend is the digit itself on all three channels, so every copy
    # must be the training split's grayscale digits, in the training split's order (its labels)
    black = (np.zeros((40, 40, 3), dtype=np.uint8),)
    monkeypatch.setattr(digits_m_module, "background_photos", lambda: black)
    data = load_data("digits-m", seed=1, image_size=8)
    extra = fresh_backgrounds(data, 1, copies=2, seed=0)
    digits = images_and_labels(load_data("digits", seed=1, image_size=8).train)[0]  # (N, 1, 8, 8)
    assert extra.dtype == torch.uint8 and extra.shape == (2 * len(digits), 3, 8, 8)
    assert torch.equal(extra, digits.expand(-1, 3, -1, -1).repeat(2, 1, 1, 1))


def test_fresh_backgrounds_are_new_and_follow_the_seed() -> None:
    data = load_data("digits-m", seed=0, image_size=8)
    train = images_and_labels(data.train)[0]  # (N, 3, 8, 8)
    copies = fresh_backgrounds(data, 0, copies=2, seed=0)
    assert torch.equal(copies, fresh_backgrounds(data, 0, copies=2, seed=0))
    assert not torch.equal(copies, fresh_backgrounds(data, 0, copies=2, seed=1))
    first, second = copies.chunk(2)
    for other in (train, second):  # nearly every image sits on another crop
        assert (first != other).flatten(1).any(dim=1).float().mean() > 0.95


def test_fresh_backgrounds_refuse_a_split_they_cannot_rebuild() -> None:
    data = load_data("digits-m", seed=0, image_size=8)
    with pytest.raises(ValueError, match="pass data_seed"):
        fresh_backgrounds(data, None, copies=1)
    with pytest.raises(ValueError, match="data_seed 1 does not rebuild"):
        fresh_backgrounds(data, 1, copies=1)
    with pytest.raises(ValueError, match="copies must be >= 1"):
        fresh_backgrounds(data, 0, copies=0)
    with pytest.raises(ValueError, match="digits-m's recipe, not 'digits'"):
        fresh_backgrounds(load_data("digits", image_size=8), 0, copies=1)
    with pytest.raises(ValueError, match="pass data_seed"):  # before any training
        train_extractor(data, seed=0)


def test_the_extractor_recipe_is_the_data_sets() -> None:
    assert recipe_for("digits") == ExtractorRecipe()  # width 32, 12 epochs, no smoothing
    assert recipe_for("digits-m").width > recipe_for("digits").width
    assert recipe_for("digits-m").reblends > recipe_for("digits").reblends == 0


def test_the_cache_trains_with_the_recipes_epochs_unless_told(
    digits16: ImageData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = TrainingSpy(accuracy=0.99)
    monkeypatch.setattr(cache_module, "train_extractor", spy)
    load_or_train_extractor(digits16, cache_dir=tmp_path)
    load_or_train_extractor(digits16, cache_dir=tmp_path, epochs=3, data_seed=5)
    assert spy.epochs == [recipe_for(digits16.name).epochs, 3]
    assert spy.data_seeds == [None, 5]  # handed on to train_extractor


@pytest.mark.slow
def test_extractor_reaches_the_required_accuracy_on_digits() -> None:
    # the default recipe at full size: ≈ 99 % (≥ 95 % is what evaluation demands)
    _, accuracy = train_extractor(load_data("digits"), seed=0)
    assert accuracy >= 0.95


# --------------------------------------------------------------------------- input contracts


@pytest.fixture(scope="module")
def small_set(digits16: ImageData) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = images_and_labels(digits16.test)
    return to_signed_unit(images[:40]), labels[:40]


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("channels", r"fake_images must be \(N, 1, 16, 16\)"),
        ("size", r"fake_images must be \(N, 1, 16, 16\)"),
        ("range", r"must lie in \[-1, 1\]"),
        ("nan", "NaN or infinite"),
        ("int", "must be float in"),
        ("count", "equal size"),
        ("label_range", r"fake_labels must be in \[0, 10\)"),
        ("label_negative", r"fake_labels must be in \[0, 10\)"),
        ("label_float", "fake_labels must be integers"),
        ("label_shape", r"fake_labels must be \(40,\)"),
    ],
)
def test_bad_inputs_are_refused(
    change: str,
    match: str,
    extractor16: FeatureExtractor,
    small_set: tuple[torch.Tensor, torch.Tensor],
) -> None:
    images, labels = small_set
    fake, fake_y = images.clone(), labels.clone()
    if change == "channels":
        fake = fake.expand(-1, 3, -1, -1)
    elif change == "size":
        fake = fake[:, :, :8, :8]
    elif change == "range":
        fake = (fake + 1.0) * 127.5  # [0, 255] floats
    elif change == "nan":
        fake[0, 0, 0, 0] = math.nan
    elif change == "int":
        fake = fake.to(torch.int32)
    elif change == "count":
        fake, fake_y = fake[:30], fake_y[:30]
    elif change == "label_range":
        fake_y[3] = 10
    elif change == "label_negative":
        fake_y[3] = -1
    elif change == "label_float":
        fake_y = fake_y.to(torch.float32)
    else:
        fake_y = fake_y[:, None]
    with pytest.raises(ValueError, match=match):
        evaluate_samples(
            extractor16, images, labels, fake, fake_y, test_images=images, test_labels=labels
        )


def test_feature_level_inputs_are_checked() -> None:
    good = gaussian(10, 4, 0)
    with pytest.raises(ValueError, match=r"must be \(N, D\)"):
        frechet_distance(good, good[None])
    with pytest.raises(ValueError, match="feature sizes differ"):
        frechet_distance(good, good[:, :3])
    with pytest.raises(ValueError, match="at least 6 rows"):
        precision_recall(good, good[:5], k=5)
    with pytest.raises(ValueError, match="NaN or infinite"):
        density_coverage(good, torch.full((3, 4), math.inf))


def test_gan_test_and_intra_fd_edge_cases(
    extractor16: FeatureExtractor, small_set: tuple[torch.Tensor, torch.Tensor]
) -> None:
    images, labels = small_set
    assert gan_test_accuracy(extractor16, images, labels) > 0.8
    uint8 = ((images + 1) * 127.5).round().to(torch.uint8)  # uint8 is accepted as x/127.5 − 1
    assert gan_test_accuracy(extractor16, uint8, labels) == gan_test_accuracy(
        extractor16, images, labels
    )
    features = gaussian(6, 3, 0)
    per_class = intra_class_fd(
        features, torch.tensor([0, 0, 0, 1, 1, 2]), features, torch.tensor([0, 0, 1, 1, 1, 1]), 3
    )
    assert math.isfinite(per_class[0]) and math.isfinite(per_class[1])
    assert math.isnan(per_class[2])  # class 2: one real sample, no generated one


# --------------------------------------------------------------------------- Inception FID


def test_inception_fid_names_a_missing_weights_file(tmp_path: Path) -> None:
    images = torch.zeros(4, 3, 32, 32)
    missing = tmp_path / "no-such-weights.pth"
    with pytest.raises(FileNotFoundError, match=r"no-such-weights\.pth"):
        inception_fid(images, images, missing, "cpu")


def test_inception_fid_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = tmp_path / "weights.pth"
    weights.write_bytes(b"")
    monkeypatch.setattr(metrics_module, "_torch_fidelity_available", lambda: False)
    with pytest.raises(ModuleNotFoundError, match="pip install torch-fidelity"):
        inception_fid(torch.zeros(4, 3, 32, 32), torch.zeros(4, 3, 32, 32), weights, "cpu")
