"""The host-sync counter itself: what it counts and what it leaves alone."""

from __future__ import annotations

import torch

from tests.sync_counts import count_syncs


def test_item_counts_one() -> None:
    x = torch.randn(4)
    with count_syncs() as syncs:
        x.sum().item()
    assert syncs == {"aten._local_scalar_dense": 1}


def test_float_and_bool_of_a_tensor_count() -> None:
    x = torch.randn(4)
    with count_syncs() as syncs:
        float(x.sum())
        bool(torch.isfinite(x).all())
    assert syncs == {"aten._local_scalar_dense": 2}


def test_boolean_mask_indexing_counts() -> None:
    x = torch.randn(8)
    with count_syncs() as syncs:
        x[x > 0]
    assert syncs == {"aten.index": 1}


def test_boolean_mask_assignment_counts() -> None:
    x = torch.randn(8)
    with count_syncs() as syncs:
        x[x > 0] = 0.0
    assert syncs == {"aten.index_put_": 1}


def test_data_dependent_shapes_count() -> None:
    y = torch.tensor([0, 1, 1, 2])
    with count_syncs() as syncs:
        torch.unique(y)
        torch.equal(y, y)
        torch.nonzero(y)
        torch.repeat_interleave(y, y)
    assert syncs["aten.equal"] == 1
    assert syncs["aten.nonzero"] == 1
    assert syncs["aten.repeat_interleave"] == 1
    assert sum(count for name, count in syncs.items() if "unique" in name) == 1


def test_static_shapes_count_zero() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    y = torch.tensor([0, 2, 1, 0])
    with count_syncs() as syncs:
        z = (x @ x.T).softmax(-1)
        loss = torch.nn.functional.cross_entropy(z, y[:4] % 4) + x[torch.arange(2)].sum()
        torch.repeat_interleave(y, 2)  # scalar repeats: size known on the host
        torch.where(z > 0.5, z, 0.0).sum()
        torch.autograd.backward(loss)
    assert sum(syncs.values()) == 0, syncs


def test_optimizer_step_counters_are_left_out() -> None:
    param = torch.nn.Parameter(torch.randn(3))
    optimizer = torch.optim.Adam([param])
    torch.autograd.backward(param.sum())
    optimizer.step()  # the first step creates the state
    torch.autograd.backward(param.sum())
    with count_syncs() as syncs:
        optimizer.step()
    assert sum(syncs.values()) == 0, syncs
    with count_syncs(ignore_modules=()) as all_syncs:
        optimizer.step()
    assert sum(all_syncs.values()) >= 1  # Adam reads its host step counter


def test_averaged_model_counter_is_counted_inside_torch_optim() -> None:
    """AveragedModel keeps ``n_averaged`` on the model's device and reads it on the host in
    every ``update_parameters``: a real wait per call on CUDA, though under ``torch.optim``."""
    model = torch.nn.Linear(3, 2)
    ema = torch.optim.swa_utils.AveragedModel(model)
    ema.update_parameters(model)
    with count_syncs() as syncs:
        ema.update_parameters(model)
    assert syncs["aten._local_scalar_dense"] >= 1, syncs
