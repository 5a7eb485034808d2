"""python step.py STEPS MODE: a warm-up, then STEPS forward + backward steps of bench.triton_glue_time's
setup (N = 256, D = 128, backend="triton", every Triton kernel a no-op in Triton's interpreter,
one thread, the shared core on the device's path); MODE "replay" replays each Triton stage op's
first outputs, so no launcher Python runs. The package under $PKG_ROOT runs when it is set (an old
revision in a worktree, with its own built library), else the installed one. count.sh runs this
under cachegrind."""
import contextlib
import gc
import os
import sys

# The bench's own replay of the stage ops, from this checkout, before an old revision's package
# goes ahead of it on the path.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3)))
from bench.triton_glue_time import replay_stage_ops  # noqa: E402

root = os.environ.get("PKG_ROOT")
if root:
    sys.path.insert(0, root)

import torch  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import scl_kernels  # noqa: E402

print(f"package: {scl_kernels.__file__}", file=sys.stderr)
if os.path.exists(os.path.join(os.path.dirname(scl_kernels.__file__), "_testing.py")):
    from scl_kernels._testing import test_hooks
    device_path = lambda: test_hooks(device_preparation=True)  # noqa: E731
else:  # revisions before the test-hooks API (7e9aeeb) read an environment variable
    os.environ["SCL_DEVICE_PREPARATION"] = "1"
    device_path = contextlib.nullcontext

steps, mode = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x = torch.randn(256, 128, generator=g)
labels = torch.randint(0, 100, (256,), generator=g)
features = x.clone().requires_grad_()

if mode == "replay":
    replay_stage_ops()


def step():
    loss = scl_kernels.supcon_loss(features, labels, 0.1, backend="triton")
    torch.autograd.grad(loss, [features])


interpreter.InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: None
with device_path():
    for _ in range(30):
        step()
    gc.collect()
    gc.freeze()  # a full collection over torch's objects would fall in one run's window only
    for _ in range(steps):
        step()
