"""The loss in CUDA graphs the two ways docs/BACKENDS.md ("CUDA graphs") shows users: through
torch.cuda.make_graphed_callables and through torch.compile(mode="reduce-overhead"), on each GPU
backend, in float32 and bfloat16. Every replay runs on new features and labels, copied into the
captured tensors in place or passed as new tensors that the graphed callable copies in, and
must give what an eager call gives on those values: a replay that read stale inputs would give
the previous batch's loss, which the test checks is different. Skipped without a CUDA GPU.
(test_host_reads.py captures a whole step with torch.cuda.graph.)"""
import pytest
import torch

import scl_kernels

GPU_FUSED = [name for name in ("triton", "cuda")
             if torch.cuda.is_available() and name in scl_kernels.available_backends("cuda")]
pytestmark = pytest.mark.skipif(not GPU_FUSED, reason="needs a CUDA GPU and a fused GPU backend")

N, D, CLASSES = 512, 64, 10
# torch.compile's CUDA graphs run the first call eagerly and record the second: six batches
# leave four replays.
BATCHES = 6
# A learnable temperature as an optimiser would move it, one value a batch.
TEMPERATURES = (0.1, 0.12, 0.15, 0.2, 0.3, 0.5)
LOSS_TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # float32 losses on both dtypes
GRAD_TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-6),
                  torch.bfloat16: dict(rtol=2e-2, atol=1e-3)}  # bf16 gradients' rounding
TEMPERATURE_GRAD_TOLERANCE = dict(rtol=1e-3, atol=1e-5)
DTYPES = [torch.float32, torch.bfloat16]


def batches(dtype, generator):
    """(features, labels) on the GPU, each batch more clustered than the one before, so that
    consecutive losses differ by far more than the tolerance."""
    for index in range(BATCHES):
        labels = torch.randint(0, CLASSES, (N,), generator=generator)
        centres = torch.randn(CLASSES, D, generator=generator)
        features = 0.5 * index * centres[labels] + torch.randn(N, D, generator=generator)
        yield features.to(dtype).cuda(), labels.cuda()


def inputs_of(batch):
    """Copies of a batch as a training step's inputs: the features requiring grad."""
    features, labels = batch
    return features.clone().requires_grad_(), labels.clone()


def eager_loss_and_grads(backend, features, labels, temperature):
    """(loss, features' gradient, temperature's gradient or None) of an eager call on copies."""
    x = features.detach().clone().requires_grad_()
    t = (temperature.detach().clone().requires_grad_(temperature.requires_grad)
         if isinstance(temperature, torch.Tensor) else temperature)
    loss = scl_kernels.supcon_loss(x, labels.clone(), t, backend=backend)
    loss.backward()
    return loss.detach(), x.grad, t.grad if isinstance(t, torch.Tensor) else None


def replay_each_batch(run, captured, data, backend, dtype, temperature):
    """Calls ``run(features, labels)`` (forward and backward) once a batch of ``data``: on even
    batches with the batch's values copied into ``captured`` (the tensors captured with the
    graph), on odd ones with new tensors. Checks the loss and the gradients against eager calls,
    and that each batch's eager loss differs from the one before."""
    learnable = isinstance(temperature, torch.Tensor) and temperature.requires_grad
    previous = None
    for index, batch in enumerate(data):
        if index % 2 == 0:
            with torch.no_grad():
                for tensor, values in zip(captured, batch):
                    tensor.copy_(values)
            inputs = captured
        else:
            inputs = inputs_of(batch)
        if learnable:
            with torch.no_grad():
                temperature.fill_(TEMPERATURES[index])
        loss = run(*inputs)
        loss.backward()
        # Copies, and no reference left, before the next replay overwrites the graph's outputs.
        got = (loss.detach().clone(), inputs[0].grad.clone(),
               temperature.grad.clone() if learnable else None)
        del loss
        inputs[0].grad = None
        if learnable:
            temperature.grad = None
        want = eager_loss_and_grads(backend, *batch, temperature)
        torch.testing.assert_close(got[0], want[0], **LOSS_TOLERANCE)
        torch.testing.assert_close(got[1].float(), want[1].float(), **GRAD_TOLERANCE[dtype])
        if learnable:
            torch.testing.assert_close(got[2], want[2], **TEMPERATURE_GRAD_TOLERANCE)
        if previous is not None:  # a stale replay could not pass
            assert not torch.allclose(want[0], previous, **LOSS_TOLERANCE)
        previous = want[0]


@pytest.mark.parametrize("backend_name", GPU_FUSED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("learnable", [False, True], ids=["float-temperature", "gpu-parameter"])
def test_make_graphed_callables_gives_the_eager_loss(backend_name, dtype, learnable, gen):
    """A float temperature is fixed when captured; a parameter on the GPU is read by the
    kernels at each replay, and its gradient comes back like the rows'."""
    temperature = (torch.nn.Parameter(torch.tensor(TEMPERATURES[0], device="cuda")) if learnable
                   else TEMPERATURES[0])
    criterion = scl_kernels.SupConLoss(temperature, backend=backend_name)
    data = list(batches(dtype, gen))
    captured = inputs_of(data[0])
    graphed = torch.cuda.make_graphed_callables(criterion, captured)
    replay_each_batch(graphed, captured, data, backend_name, dtype, temperature)


@pytest.fixture
def fresh_compiler():
    """Each test compiles its own function, with the recompile limit and caches untouched by
    the others."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend_name", GPU_FUSED)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("temperature_kind", ["gpu-tensor", "float"])
def test_reduce_overhead_compile_gives_the_eager_loss(backend_name, dtype, temperature_kind, gen,
                                                      fresh_compiler):
    """A 0-dim temperature on the GPU keeps the whole loss in CUDA graphs (no skip). A float
    puts a CPU tensor in the traced graph, which torch's CUDA graphs may skip or partition
    around (docs/BACKENDS.md): the values must be right either way."""
    from torch._dynamo.utils import counters  # here: importing torch._dynamo takes seconds

    temperature = (torch.tensor(TEMPERATURES[0], device="cuda")
                   if temperature_kind == "gpu-tensor" else TEMPERATURES[0])

    @torch.compile(mode="reduce-overhead", fullgraph=True)
    def batch_loss(features, labels):
        return scl_kernels.supcon_loss(features, labels, temperature, backend=backend_name)

    data = list(batches(dtype, gen))
    skips = counters["inductor"]["cudagraph_skips"]
    replay_each_batch(batch_loss, inputs_of(data[0]), data, backend_name, dtype, temperature)
    if temperature_kind == "gpu-tensor":
        assert counters["inductor"]["cudagraph_skips"] == skips
