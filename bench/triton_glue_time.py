"""The Triton backend's per-call host overhead, measured on the CPU: microseconds per call of its
Python launchers (everything around the kernels: tensor descriptors, per-column terms, partial-sum
buffers, the float64 finish) and of a whole forward + backward of `supcon_loss`, with every Triton
kernel replaced by a no-op, so that only the host's work is left. In Triton's interpreter (the
launchers are the ones a GPU runs; only the kernels' execution differs), the shared core on the
device's path. Medians of --repeats timings of --calls calls each.

    python -m bench.triton_glue_time            # N = 256, D = 128

The outputs of the stubbed kernels are garbage: this times the host, it checks nothing.
"""
import argparse
import statistics
import sys
import time

from bench.harness.interpreter import in_interpreter_child, rerun_in_interpreter


def microseconds_per_call(fn, calls, repeats):
    fn()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        timings.append((time.perf_counter() - start) / calls)
    return 1e6 * statistics.median(timings)


def measure(n, d, calls, repeats):
    """{what: microseconds per call} with the kernels stubbed out."""
    import torch
    from triton.runtime import interpreter
    import scl_kernels
    from scl_kernels.backends.triton import tiles

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g)
    labels = torch.randint(0, 100, (n,), generator=g)
    inv_norm = x.norm(dim=1).reciprocal()
    coef = torch.rand(n, generator=g)
    features = x.clone().requires_grad_()
    host_temperature = x.new_empty(0)  # 1/t comes as the float, as for a float temperature

    def step():
        loss = scl_kernels.supcon_loss(features, labels, 0.1, backend="triton")
        torch.autograd.grad(loss, [features])

    launchers = {
        "lse launcher (symmetric)": lambda: tiles.lse_tiles(
            x, x, inv_norm, inv_norm, 10.0, host_temperature, 0, True),
        "grad launcher (symmetric)": lambda: tiles.grad_tiles(
            x, x, inv_norm, inv_norm, 10.0, host_temperature, 0, True, coef, coef, coef),
        "forward + backward of supcon_loss": step,
    }
    original = interpreter.InterpretedFunction.run
    interpreter.InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: None
    try:
        return {name: microseconds_per_call(fn, calls, repeats) for name, fn in launchers.items()}
    finally:
        interpreter.InterpretedFunction.run = original


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--n", type=int, default=256, help="rows (default %(default)s)")
    parser.add_argument("--d", type=int, default=128, help="row width (default %(default)s)")
    parser.add_argument("--calls", type=int, default=50, help="calls per timing (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=7, help="timings (default %(default)s)")
    args = parser.parse_args(argv)
    if not in_interpreter_child():
        return rerun_in_interpreter("bench.triton_glue_time", argv)
    for name, micros in measure(args.n, args.d, args.calls, args.repeats).items():
        print(f"{name}: {micros:.0f} us per call (N = {args.n}, D = {args.d}, kernels stubbed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
