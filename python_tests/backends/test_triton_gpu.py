"""The Triton backend on a CUDA GPU at GPU sizes (skipped without one): every layout and awkward
sizes across several 128-wide tiles and the column split, large N against a chunked float64
reference, stability at t = 0.02 in bf16, and opcheck of torch.ops.scl.supcon's CUDA kernel.
The conformance suite (test_conformance*.py) runs everything else on CUDA too, at small sizes."""
import pytest
import torch

from support.chunked_reference64 import chunked_supcon64
from support.layouts import LAYOUTS, make_layout
from support.reference64 import check_against_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_on_gpu(layout, dtype, cuda_randn, cuda_randint, gen):
    kw = make_layout(layout, cuda_randn, cuda_randint, dtype=dtype, n=1000, d=200)
    check_against_reference("triton", generator=gen, **kw)


@pytest.mark.parametrize("n,d", [(1, 1), (17, 5), (127, 2048), (3000, 768), (4099, 130)])
@pytest.mark.parametrize("temperature", [0.02, 0.1, 10.0])
def test_awkward_sizes_on_gpu(n, d, temperature, cuda_randn, cuda_randint, gen):
    check_against_reference("triton", cuda_randn(n, d), cuda_randint(0, 7, (n,)), temperature,
                            generator=gen)


@pytest.mark.parametrize("n", [16384, 65536])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-4), (torch.bfloat16, 2e-2)])
def test_large_batch_against_chunked_reference(n, dtype, tol, cuda_randn, cuda_randint):
    import scl_kernels
    x = cuda_randn(n, 128, dtype=dtype).requires_grad_(True)
    labels = cuda_randint(0, 1000, (n,))
    loss = scl_kernels.supcon_loss(x, labels, 0.1, backend="triton")
    loss.backward()
    want_loss, want_grad = chunked_supcon64(x.detach(), labels, 0.1)
    assert abs(loss.item() - want_loss.item()) <= tol * abs(want_loss.item())
    err = (x.grad.double() - want_grad).abs().max() / want_grad.abs().max()
    assert err.item() <= tol * 10


def test_bf16_low_temperature_has_no_nan(cuda_randn, cuda_randint):
    import scl_kernels
    x = cuda_randn(8192, 128, dtype=torch.bfloat16).requires_grad_(True)
    loss = scl_kernels.supcon_loss(x, cuda_randint(0, 10, (8192,)), 0.02, backend="triton")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


def _sample_args(cuda_randn, cuda_randint):
    x = cuda_randn(300, 70).requires_grad_(True)
    labels = cuda_randint(0, 5, (300,))
    t = torch.tensor(0.1, device="cuda")
    c = cuda_randn(310, 70).requires_grad_(True)
    cl = cuda_randint(-1, 5, (310,))
    return [(x, labels, None, None, t, 300, True), (x, labels, None, None, t, 100, False),
            (x, labels, c, cl, t, 300, True)]


@pytest.mark.parametrize("op_name", ["supcon", "supcon_triton"])
def test_opcheck_on_gpu(op_name, cuda_randn, cuda_randint):
    import scl_kernels  # noqa: F401  (registers the CUDA kernels)
    for args in _sample_args(cuda_randn, cuda_randint):
        torch.library.opcheck(getattr(torch.ops.scl, op_name).default, args)

