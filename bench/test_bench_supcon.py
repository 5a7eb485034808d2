"""pytest-benchmark: supcon_loss against the PyTorch baselines, forward and forward+backward.

    SCL_BENCH_SIZES=1024x128,4096x128 python -m pytest bench/test_bench_supcon.py --benchmark-only

Environment: SCL_BENCH_SIZES (NxD list, default small so a plain run is quick), SCL_BENCH_DTYPES
(default float32), SCL_BENCH_BACKENDS (supcon_loss backends, default auto). Runs on CUDA too when
it is available. One group per device, dtype, size and pass; extra_info holds the peak memory a
call adds on top of its inputs, the resolved backend and the loss value (all implementations
compute the same loss, so a differing value flags a bug).
"""
import os

import pytest
import torch

from bench.harness.memory import PeakMemory
from bench.harness.timing import make_step
from bench.implementations import (FUSED_BACKENDS, TEMPERATURE, implementations, make_inputs,
                                   skip_reason)

pytest.importorskip("pytest_benchmark")


def _sizes():
    spec = os.environ.get("SCL_BENCH_SIZES", "512x128,1024x128")
    return [tuple(int(v) for v in item.lower().split("x")) for item in spec.split(",") if item]


def _list(name, default):
    return [item for item in os.environ.get(name, default).split(",") if item]


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = _list("SCL_BENCH_DTYPES", "float32")
BACKENDS = tuple(_list("SCL_BENCH_BACKENDS", ",".join(FUSED_BACKENDS)))


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("impl", implementations(BACKENDS), ids=lambda impl: impl.name)
@pytest.mark.parametrize("size", _sizes(), ids=lambda size: f"N{size[0]}xD{size[1]}")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_supcon(benchmark, device, dtype, size, impl, backward):
    n, d = size
    reason = skip_reason(impl, n, d, device)
    if reason:
        pytest.skip(reason)
    features, labels = make_inputs(n, d, getattr(torch, dtype), device)
    step = make_step(impl.loss, features, labels, TEMPERATURE, backward=backward)
    step()  # first call: lazy initialisation and compilation stay out of the numbers
    with PeakMemory(device) as memory:
        loss = step()

    benchmark.group = f"{device} {dtype} N={n} D={d} {'fwd+bwd' if backward else 'fwd'}"
    benchmark.extra_info.update({
        "implementation": impl.name, "backend": impl.resolved_backend(device), "n": n, "d": d,
        "dtype": dtype, "device": device, "pass": "fwd+bwd" if backward else "fwd",
        "peak_mb": memory.peak_bytes / 2**20, "loss": float(loss)})
    benchmark(step)
