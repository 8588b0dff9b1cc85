"""Speed and memory of our contrastive losses against the peers, side by side in one run.

    python benchmarks/losses.py                 # N = 1024, 4096, 16384 and the N = 65536 run
    python benchmarks/losses.py --sizes 4096 --big 0 --reps 5

Forward + backward of SupCon (10 classes) and NT-Xent at N rows (N/2 samples × 2 views),
D = 128, τ = 0.1, fp32 on CPU: ours (auto path and the blockwise path) against
pytorch-metric-learning's ``SupConLoss``, lightly's ``NTXentLoss`` and a dense reference written
the straightforward way (Khosla et al.'s masks). Times are medians over interleaved repetitions;
peak memory is the allocator's high-water mark above the inputs (torch profiler memory events).
The floor is the time of what any exact method must do: three N×N×D matrix products and two
N×N exponentials. At N = 65536 each method runs in a subprocess capped at ``--cap-gib`` of
address space above its start, so a peer that needs more fails instead of swapping.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared.losses import nt_xent_loss, supcon_loss

D, CLASSES, TAU = 128, 10, 0.1
BLOCK = 128  # rows per block for the blockwise runs: memory O(N·128)

LossFn = Callable[[Tensor, Tensor], Tensor]  # (features (N/2, 2, D), labels (N/2,)) -> loss


def dense_reference_supcon(features: Tensor, labels: Tensor) -> Tensor:
    """SupCon L_out the straightforward way: full N×N logits and float masks."""
    n, v, _ = features.shape
    z = F.normalize(features, dim=-1)
    contrast = torch.cat(torch.unbind(z, dim=1))  # (V·n, D)
    y = labels.repeat(v)
    logits = contrast @ contrast.T / TAU
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    not_self = 1.0 - torch.eye(n * v, device=z.device)
    positives = (y[:, None] == y[None, :]).float() * not_self
    exp_logits = torch.exp(logits) * not_self
    log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))
    return -((positives * log_prob).sum(1) / positives.sum(1)).mean()


def methods(peers: bool) -> dict[str, dict[str, LossFn]]:
    """Per task, name -> loss on (features, labels)."""
    tasks: dict[str, dict[str, LossFn]] = {
        "supcon": {
            "ours": lambda f, y: supcon_loss(f, y, temperature=TAU),
            "ours blockwise": lambda f, y: supcon_loss(f, y, temperature=TAU, block_size=BLOCK),
            "dense reference": dense_reference_supcon,
        },
        "nt_xent": {
            "ours": lambda f, y: nt_xent_loss(f[:, 0], f[:, 1], temperature=TAU),
            "ours blockwise": lambda f, y: nt_xent_loss(
                f[:, 0], f[:, 1], temperature=TAU, block_size=BLOCK
            ),
        },
    }
    if peers:
        from lightly.loss import NTXentLoss
        from pytorch_metric_learning.losses import SupConLoss

        pml = SupConLoss(temperature=TAU)
        lightly = NTXentLoss(temperature=TAU)
        tasks["supcon"]["pml SupConLoss"] = lambda f, y: pml(
            f.reshape(-1, f.shape[-1]), y.repeat_interleave(f.shape[1])
        )
        tasks["nt_xent"]["lightly NTXentLoss"] = lambda f, y: lightly(f[:, 0], f[:, 1])
    return tasks


def make_inputs(n_rows: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n_rows // 2, 2, D, generator=g).requires_grad_()
    labels = torch.randint(0, CLASSES, (n_rows // 2,), generator=g)
    return features, labels


def fwd_bwd(fn: LossFn, features: Tensor, labels: Tensor) -> float:
    features.grad = None
    loss = fn(features, labels)
    loss.backward()
    return float(loss.detach())


def floor_fn(n_rows: int) -> Callable[[], None]:
    """Three N×N×D products and two N×N exponentials, into preallocated outputs."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(n_rows, D, generator=g)
    square, out = torch.empty(n_rows, n_rows), torch.empty(n_rows, D)

    def run() -> None:
        torch.mm(a, a.T, out=square)
        torch.exp(square.mul_(0.01), out=square)
        torch.mm(square, a, out=out)
        torch.mm(square.T, a, out=out)
        torch.exp(square.mul_(0.01), out=square)

    return run


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """The profiler's C++ side prints to fd 2 (GPU probing); keep the table readable."""
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def peak_memory(fn: Callable[[], object]) -> int:
    """High-water mark of CPU allocations made while ``fn`` runs (bytes above the start)."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        current += e.nbytes()
        peak = max(peak, current)
    return peak


def time_side_by_side(runs: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Median seconds per call; the methods are interleaved so drift hits all alike."""
    for run in runs.values():
        run()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(reps):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in samples.items()}


def bench_size(n_rows: int, reps: int, peers: bool) -> list[dict[str, object]]:
    features, labels = make_inputs(n_rows)
    rows: list[dict[str, object]] = []
    floor = time_side_by_side({"floor": floor_fn(n_rows)}, reps)["floor"]
    for task, fns in methods(peers).items():
        runs = {name: (lambda fn=fn: fwd_bwd(fn, features, labels)) for name, fn in fns.items()}
        times = time_side_by_side(runs, reps)
        reference = fwd_bwd(fns["ours"], features, labels)
        for name, fn in fns.items():
            value = fwd_bwd(fn, features, labels)
            rows.append(
                {
                    "N": n_rows,
                    "task": task,
                    "method": name,
                    "seconds": times[name],
                    "peak_mib": peak_memory(runs[name]) / 2**20,
                    "floor": floor,
                    "loss_diff": abs(value - reference),
                }
            )
    return rows


def big_run(method: str, n_rows: int, cap_gib: float) -> dict[str, object]:
    """One method at a size beyond the peers, in a subprocess with an address-space cap."""
    cmd = [sys.executable, __file__, "--child", method, "--child-n", str(n_rows)]
    soft = None
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                soft = int(line.split()[1]) * 1024
    cap = int((soft or 0) + cap_gib * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return dict(json.loads(lines[-1]))
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    asked = re.search(r"allocate (\d+) bytes", tail)
    if asked:
        gib = int(asked.group(1)) / 2**30
        return {"method": method, "N": n_rows, "error": f"out of memory (asked for {gib:.1f} GiB)"}
    return {"method": method, "N": n_rows, "error": tail[:160]}


def child(method: str, n_rows: int) -> None:
    task, name = method.split(":", 1)
    fn = methods(peers=name not in ("ours", "ours blockwise", "dense reference"))[task][name]
    features, labels = make_inputs(n_rows)
    start = time.perf_counter()
    fwd_bwd(fn, features, labels)
    seconds = time.perf_counter() - start
    grad = features.grad
    finite = bool(grad is not None and torch.isfinite(grad).all())
    with open("/proc/self/status") as status:  # peak resident memory of this whole process
        hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    result = {"method": method, "N": n_rows, "seconds": round(seconds, 1), "finite_grad": finite}
    print(json.dumps({**result, "process_peak_rss_gib": round(hwm / 2**20, 2)}))


def print_table(rows: list[dict[str, object]]) -> None:
    print(
        f"\n{'N':>6} {'task':8} {'method':20} {'ms':>9} {'peak MiB':>9} "
        f"{'x floor':>8} {'x fastest peer':>15} {'|Δloss|':>9}"
    )
    for n in sorted({int(r["N"]) for r in rows}):  # type: ignore[call-overload]
        for task in ("supcon", "nt_xent"):
            group = [r for r in rows if r["N"] == n and r["task"] == task]
            peers = [r for r in group if not str(r["method"]).startswith("ours")]
            fastest = min((float(r["seconds"]) for r in peers), default=float("nan"))  # type: ignore[arg-type]
            least_mem = min((float(r["peak_mib"]) for r in peers), default=float("nan"))  # type: ignore[arg-type]
            for r in group:
                sec = float(r["seconds"])  # type: ignore[arg-type]
                print(
                    f"{n:>6} {task:8} {r['method']!s:20} {sec * 1e3:9.1f} "
                    f"{float(r['peak_mib']):9.1f} {sec / float(r['floor']):8.2f} "  # type: ignore[arg-type]
                    f"{sec / fastest:15.2f} {float(r['loss_diff']):9.1e}"  # type: ignore[arg-type]
                )
            ours_block = next(r for r in group if r["method"] == "ours blockwise")
            print(
                f"{'':>6} {task:8} {'-> floor':20} {float(group[0]['floor']) * 1e3:9.1f}"  # type: ignore[arg-type]
                f"   blockwise memory / least peer memory = "
                f"{float(ours_block['peak_mib']) / least_mem:.3f}"  # type: ignore[arg-type]
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--big", type=int, default=65536, help="0 skips the beyond-peers run")
    parser.add_argument("--cap-gib", type=float, default=20.0)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.child_n)
        return
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, D={D}, τ={TAU}, "
        f"{CLASSES} classes, fp32 CPU, forward+backward"
    )
    rows: list[dict[str, object]] = []
    for n in args.sizes:
        reps = args.reps if n <= 4096 else max(2, args.reps // 2)
        rows += bench_size(n, reps, peers=not args.no_peers)
        print(f"  done N={n}", flush=True)
    print_table(rows)
    if args.big:
        print(f"\nN={args.big}: each method alone, address space capped at {args.cap_gib} GiB")
        names = ["supcon:ours", "supcon:dense reference"]
        if not args.no_peers:
            names += ["supcon:pml SupConLoss", "nt_xent:lightly NTXentLoss", "nt_xent:ours"]
        for name in names:
            print(" ", big_run(name, args.big, args.cap_gib), flush=True)


if __name__ == "__main__":
    main()
