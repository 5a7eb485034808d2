"""Compiled Triton kernels launched through their cached handles instead of the JIT's per-call
dispatch: on a GPU, under the triton releases whose launch path this repeats.

On every call the JIT (triton/runtime/jit.py, JITFunction.run, read in triton 3.6 to 3.9) binds the
arguments and computes their specialisation with its generated binder (each tensor's dtype and
16-byte alignment, each integer's width, divisibility by 16 and whether it is 1, the constexprs'
values, each tensor descriptor's dtype and block shape), turns that and the options into a string
key, looks the compiled kernel up, checks the globals the kernel read, asks for launch metadata
and calls the kernel's launcher. CompiledKernels keeps the binder, Triton's own, so that the
binary a call runs is exactly the one the JIT would choose, and keeps each kernel under the
binder's specialisation and options as a tuple; a hit calls the launcher as the JIT does. The
first call of each specialisation, and everything this was not written for, goes through the
JIT: another triton release, the interpreter (which has no compiled kernels), launch or pre-run
hooks (a profiler's, for one), a custom pass pipeline (triton 3.7 on: it enters the JIT's key), a
device the JIT has not launched on yet, a kernel compiled asynchronously, a changed global.
"""
import triton
from triton import knobs
from triton.compiler import CompiledKernel
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction


# The releases whose JITFunction.run `launch` repeats, checked against their source: the binder
# at device_caches[device][4] returning (bound arguments, specialisation, options), the options
# set from the knobs before binding, the stages-inspection hook that 3.7 adds to the key, and the
# launcher's arguments.
VERIFIED_RELEASES = {(3, 6), (3, 7), (3, 8), (3, 9)}
TRITON_RELEASE = tuple(int(part) for part in triton.__version__.split(".")[:2])  # the one running
# The compilation knobs JITFunction.run passes as options before binding: 3.9 adds the last.
OPTION_KNOBS = tuple(name for name in ("instrumentation_mode", "fpsan_homomorphic_casts")
                     if hasattr(knobs.compilation, name))
_MISSING = object()


class CompiledKernels:
    """The compiled kernels of one jit function by specialisation; `launch` starts one."""

    def __init__(self, fn, release=TRITON_RELEASE):
        self.fn = fn
        self.usable = isinstance(fn, JITFunction) and release in VERIFIED_RELEASES
        self.by_specialisation = {}

    def __call__(self, grid, *args, **kwargs):
        """fn[grid](*args, **kwargs), as for a jit function, without the proxy that fn[grid]
        makes on every call; grid a tuple."""
        return self.launch(grid, args, kwargs)

    def launch(self, grid, args, kwargs):
        """Starts the kernel over `grid` (a tuple) with positional `args` and keyword `kwargs`
        (the dict is the caller's to give: the options are added to it); returns what the JIT's
        launch returns."""
        fn, runtime = self.fn, knobs.runtime
        # Launch hooks and pre-run hooks take the JIT's path. The launch hooks are chains
        # (knobs.HookChain) that the JIT hands the launcher with launch metadata built for them;
        # while a chain holds no hook, calling it does nothing, and the launcher given None calls
        # nothing.
        if (not self.usable or runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls
                or fn.pre_run_hooks
                or getattr(runtime, "add_stages_inspection_hook", None) is not None):
            return fn.run(*args, grid=grid, warmup=False, **kwargs)
        active = driver.active
        device = active.get_current_device()
        caches = fn.device_caches.get(device)  # a defaultdict: get() creates nothing
        if caches is None:
            return fn.run(*args, grid=grid, warmup=False, **kwargs)
        kwargs["debug"] = kwargs.get("debug", fn.debug) or runtime.debug
        for name in OPTION_KNOBS:
            kwargs[name] = getattr(knobs.compilation, name)
        bound, specialisation, options = caches[4](*args, **kwargs)
        key = (device, tuple(specialisation), tuple(options.items()))
        kernel = self.by_specialisation.get(key)
        if kernel is None or (fn.used_global_vals and not self._globals_unchanged()):
            kernel = fn.run(*args, grid=grid, warmup=False, **kwargs)
            if isinstance(kernel, CompiledKernel):
                self.by_specialisation[key] = kernel
            return kernel
        launcher = kernel.run  # loads the binary on first use, as the JIT's launch does
        grid = (*grid, 1, 1)
        launcher(grid[0], grid[1], grid[2], active.get_current_stream(device), kernel.function,
                 kernel.packed_metadata, None, None, None, *bound.values())
        return kernel

    def _globals_unchanged(self):
        """The JIT's check that the globals the kernel read at compile time still hold; where
        one does not, the JIT's path raises its error."""
        return all(scope.get(name, _MISSING) == value
                   for (name, _), (value, scope) in self.fn.used_global_vals.items())
