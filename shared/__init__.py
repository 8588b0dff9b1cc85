"""What every pipeline shares.

- :mod:`shared.losses` — the contrastive core (dense or blockwise masked log-softmax) and the
  named losses: SupCon, NT-Xent, GraphCL, N-pairs, triplet, generalized, 2C; alignment/uniformity.
- :mod:`shared.distributed` — the gradient-correct all-gather (the only ``torch.distributed``
  calls of the losses).
- :mod:`shared.config`, :mod:`shared.runtime`, :mod:`shared.runs`, :mod:`shared.checkpoint`,
  :mod:`shared.train` — configs, devices and torchrun, run folders, safe checkpoints, the loop
  (``fit``, ``fit_updater``; its parts: :mod:`shared.loop`, :mod:`shared.loop_config`,
  :mod:`shared.resume`, :mod:`shared.updaters`; the config's field types and help:
  :mod:`shared.field_types`, :mod:`shared.field_notes`).
- :mod:`shared.optim`, :mod:`shared.heads`, :mod:`shared.probes`, :mod:`shared.plots` — LARS and
  schedules, projection heads, frozen-feature probes, plots.
"""
