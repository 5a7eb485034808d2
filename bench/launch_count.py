"""The launch ledger: the launches and host waits of one forward + backward of `supcon_loss`, counted
without a GPU.

Triton: the step runs in Triton's interpreter on CPU tensors, with the shared core on the device's
path (the test hook device_preparation: no host reads, flags deferred as on a GPU; the library
must be a test build, SCL_BUILD_TESTS=1, as the dry run below needs too). Counted: each Triton
kernel launch, and each top-level ATen call that would launch work on a GPU (views, reshapes
and allocations are free; a call counts once, although some are several GPU kernels: a CUDA sort
is about sixteen; the copy of the finiteness flag to pinned memory, a GPU-only call, is not seen
here); the ATen calls the interpreter makes to run a kernel are not counted. Host waits: the
core's waits for its value checks (`scl::host_wait_for_value_checks`: only under
SCL_VALUE_CHECKS=end_of_call since the default reads the verdict when it has landed) and every
ATen call that reads a device value on the host (item, nonzero, unique, bincount,
masked_select). Not counted either: the calls inside the core's host-only scopes (the zero
gradient of a float's temperature, a host tensor on a GPU too).

CUDA C++: the library built without CUDA holds the CUDA backend's host code as a dry run
(csrc/cuda_dry_run: the op scl::supcon_cuda_dry_run on CPU tensors): the same ATen glue and launch
choices, for an H100 (compute capability 9.0, 132 SMs), with each kernel launch recorded as a
profiler event instead of made. Counted: those events and the launching top-level ATen calls, as
for Triton, at the headline size itself (N = 65,536, D = 128, bfloat16 rows: the wgmma kernels'
path), since the dry run computes no tiles. The fused O(N*D) stages (csrc/cuda/row_stages.h) run
their row code on the CPU; the tiles' outputs stay as allocated, so the values mean nothing and
only the structure is counted. A CUDA build has no dry run: the ledger then says so (`python -m
bench.gpu.profile` counts on the GPU).

Triton's counts are taken at two sizes (--n and 2 --n) and must agree: the call's structure does
not depend on N, so the count at the headline N = 65,536 is the same.

    python -m bench.launch_count                 # N = 256 and 512, D = 128

The last line: ``fwd+bwd launches: triton T, cuda C; host waits: triton Ht, cuda Hc``.
"""
import argparse
import collections
import sys

from bench.harness.interpreter import in_interpreter_child, rerun_in_interpreter

# ATen calls that launch nothing on a GPU: views, metadata and allocations.
NO_LAUNCH = frozenset(f"aten::{name}" for name in (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "slice", "select",
    "narrow", "expand", "expand_as", "unsqueeze", "squeeze", "t", "transpose", "permute",
    "detach", "alias", "lift_fresh", "detach_", "empty", "empty_like", "new_empty",
    "empty_strided", "resize_", "result_type", "unbind", "split", "split_with_sizes", "chunk",
    "view_as", "flatten", "unflatten", "numpy_T", "contiguous", "to", "_to_copy", "clone",
    "type_as", "set_"))
# ATen calls whose result the host must read from the device.
HOST_READS = frozenset(f"aten::{name}" for name in (
    "item", "_local_scalar_dense", "nonzero", "_unique2", "unique_dim", "unique_consecutive",
    "bincount", "masked_select", "is_nonzero"))
VALUE_CHECK_WAIT = "scl::host_wait_for_value_checks"
# The core's scopes around work on host tensors that a GPU step keeps on the host (a float's
# temperature): their ATen calls launch nothing there.
HOST_ONLY_SCOPES = frozenset({"scl::host_temperature_grad"})
KERNEL_SCOPE = "triton_kernel::"
CUDA_KERNEL_SCOPE = "cuda_kernel::"  # csrc/cuda_dry_run's launch events
HEADLINE_N, HEADLINE_D = 65536, 128  # the GPU targets are stated at this size


def launches_work(event, children):
    """Whether an ATen call would launch at least one GPU kernel: a call that only views or
    allocates does not, unless something it calls does (`to` copies, `contiguous` of a strided
    view, `clone`)."""
    if event.name in NO_LAUNCH:
        return any(c.name.startswith("aten::") and launches_work(c, children)
                   for c in children.get(id(event), ()))
    return True


def ledger_of(events):
    """{"kernels": Counter of Triton kernels, "aten": Counter of launching top-level ATen calls,
    "waits": Counter of host waits} of one profiled step."""
    children = collections.defaultdict(list)
    for e in events:
        if e.cpu_parent is not None:
            children[id(e.cpu_parent)].append(e)

    def ancestors(e):
        parent = e.cpu_parent
        while parent is not None:
            yield parent
            parent = parent.cpu_parent

    kernels, aten, waits = collections.Counter(), collections.Counter(), collections.Counter()
    for e in events:
        above = list(ancestors(e))
        if any(a.name.startswith(KERNEL_SCOPE) or a.name in HOST_ONLY_SCOPES for a in above):
            continue  # the interpreter running a kernel, or host work on a GPU too
        scope = next((s for s in (KERNEL_SCOPE, CUDA_KERNEL_SCOPE) if e.name.startswith(s)), None)
        if scope is not None:
            kernels[e.name[len(scope):]] += 1
        elif e.name == VALUE_CHECK_WAIT or e.name in HOST_READS:
            if not any(a.name in HOST_READS for a in above):  # item calls _local_scalar_dense
                waits[e.name] += 1
        elif (e.name.startswith("aten::") and not any(a.name.startswith("aten::") for a in above)
              and launches_work(e, children)):
            aten[e.name] += 1
    return {"kernels": kernels, "aten": aten, "waits": waits}


def profiled_ledger(step):
    """The ledger of step()'s second call (the first fills caches)."""
    import torch
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    return ledger_of(prof.events())


def count_triton_step(n, d, classes=100):
    """The ledger of one forward + backward on the Triton backend (in the interpreter)."""
    import torch
    from triton.runtime import interpreter
    import scl_kernels
    from scl_kernels._testing import test_hooks

    original = interpreter.InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        with torch.profiler.record_function(KERNEL_SCOPE + self.__name__):
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    g = torch.Generator().manual_seed(n)
    features = torch.randn(n, d, generator=g).requires_grad_()
    labels = torch.randint(0, classes, (n,), generator=g)

    def step():
        loss = scl_kernels.supcon_loss(features, labels, 0.1, backend="triton")
        return torch.autograd.grad(loss, [features])

    interpreter.InterpretedFunction.run = run
    try:
        with test_hooks(device_preparation=True):
            return profiled_ledger(step)
    finally:
        interpreter.InterpretedFunction.run = original


def count_cuda_dry_run_step(n, d, classes=100):
    """The ledger of one forward + backward of the CUDA C++ backend's host code, in its dry run
    (None when this library was built with CUDA and so has no dry run)."""
    import torch
    from scl_kernels._testing import cuda_dry_run_built, test_hooks

    if not cuda_dry_run_built():
        return None
    g = torch.Generator().manual_seed(n)
    features = torch.randn(n, d, generator=g).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, classes, (n,), generator=g)
    temperature = torch.tensor(0.1, dtype=torch.float64)  # as supcon_loss passes a float's

    def step():  # what supcon_loss(reduction="mean") does with scl::supcon on a CUDA tensor
        loss, _lse, _num_positives = torch.ops.scl.supcon_cuda_dry_run(
            features, labels, None, None, temperature, n, True, 0, 0.0, True)
        return torch.autograd.grad(loss, [features])

    # The tiles are not computed (at this size on the CPU they would take hours): the count is
    # the same either way.
    with test_hooks(device_preparation=True, dry_run_skips_tiles=True):
        return profiled_ledger(step)


def total(ledger, part):
    return sum(ledger[part].values())


def describe(name, ledger):
    lines = [f"{name}: {total(ledger, 'kernels')} kernel launches "
             f"({', '.join(f'{k} {v}' for k, v in sorted(ledger['kernels'].items()))}), "
             f"{total(ledger, 'aten')} ATen calls that launch work, "
             f"{total(ledger, 'waits')} host waits"
             + (f" ({', '.join(f'{k} {v}' for k, v in sorted(ledger['waits'].items()))})"
                if ledger["waits"] else "")]
    lines.append("  ATen calls: " + ", ".join(f"{k.removeprefix('aten::')} {v}"
                                              for k, v in ledger["aten"].most_common()))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--n", type=int, default=256,
                        help="rows of the smaller count (the other is twice it; default %(default)s)")
    parser.add_argument("--d", type=int, default=128, help="row width (default %(default)s)")
    args = parser.parse_args(argv)
    if not in_interpreter_child():
        return rerun_in_interpreter("bench.launch_count", argv)
    counts = {}
    small, large = count_triton_step(args.n, args.d), count_triton_step(2 * args.n, args.d)
    for n, ledger in ((args.n, small), (2 * args.n, large)):
        print("\n".join(describe(f"triton, N = {n}, D = {args.d}", ledger)))
    if any(small[part] != large[part] for part in ("kernels", "aten", "waits")):
        print(f"triton: the counts differ between N = {args.n} and {2 * args.n}: the count at "
              "N = 65,536 is not known from these")
        return 1
    counts["triton"] = (total(small, "kernels") + total(small, "aten"), total(small, "waits"))
    # The dry run computes no tiles: it counts at the headline size itself.
    cuda = count_cuda_dry_run_step(HEADLINE_N, HEADLINE_D)
    if cuda is None:
        print("cuda: not counted here (this library was built with CUDA, so it has no dry run of "
              "the CUDA host code); python -m bench.gpu.profile counts it on a GPU")
    else:
        print("\n".join(describe(f"cuda (dry run), N = {HEADLINE_N}, D = {HEADLINE_D}, bfloat16",
                                 cuda)))
        counts["cuda"] = (total(cuda, "kernels") + total(cuda, "aten"), total(cuda, "waits"))

    def shown(backend, part):
        return str(counts[backend][part]) if backend in counts else "not counted"
    print(f"fwd+bwd launches: triton {shown('triton', 0)}, cuda {shown('cuda', 0)}; "
          f"host waits: triton {shown('triton', 1)}, cuda {shown('cuda', 1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
