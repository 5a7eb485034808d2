"""The main job: SupCon loss and gradient on a large batch, fused against dense PyTorch.

    python -m scl_kernels.demo [--n 16384] [--dim 128] [--classes 100] [--device cpu]

Prints the time and peak memory of each and how far apart their losses and gradients are.
"""
import argparse
import time

import torch

from .backends import available_backends
from .loss import supcon_loss
from .profiling import PeakMemory


def run(features, labels, temperature, backend):
    """Loss and gradient by one backend, with wall time and peak memory growth."""
    x = features.detach().clone().requires_grad_(True)
    with PeakMemory(x.device) as peak:
        start = time.perf_counter()
        loss = supcon_loss(x, labels, temperature, backend=backend)
        loss.backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return loss.detach(), x.grad, seconds, peak.peak_bytes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16384, help="batch size (rows)")
    parser.add_argument("--dim", type=int, default=128, help="embedding dimension")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--skip-dense", action="store_true", help="only run the fused backend")
    args = parser.parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(args.n, args.dim, generator=generator).to(args.device)
    labels = torch.randint(0, args.classes, (args.n,), generator=generator).to(args.device)
    fused = available_backends(args.device)[0]
    print(f"SupCon, N={args.n}, D={args.dim}, {args.classes} classes, t={args.temperature}, "
          f"float32 on {args.device} ({torch.get_num_threads()} threads)", flush=True)

    # A small warm-up call, so that one-time set-up is not charged to either side.
    supcon_loss(features[:256], labels[:256], args.temperature, backend=fused)
    results = {}
    for name, backend in [("fused (" + fused + ")", fused)] + ([] if args.skip_dense else [("dense PyTorch", "reference")]):
        print(f"  running {name} ...", flush=True)
        results[name] = run(features, labels, args.temperature, backend)

    print("\n| implementation | loss | fwd+bwd s | peak memory MB |\n|---|---|---|---|")
    for name, (loss, _, seconds, peak) in results.items():
        print(f"| {name} | {loss.item():.6f} | {seconds:.3f} | {peak / 2**20:.0f} |")
    if len(results) == 2:
        (loss_a, grad_a, sec_a, mem_a), (loss_b, grad_b, sec_b, mem_b) = results.values()
        grad_err = ((grad_a - grad_b).abs().max() / grad_b.abs().max()).item()
        print(f"\nfused is {sec_b / sec_a:.1f}x faster and uses {mem_b / max(mem_a, 1):.0f}x less "
              f"memory; |loss diff| = {abs(loss_a - loss_b).item():.2e}, max grad diff / max grad "
              f"= {grad_err:.2e}")


if __name__ == "__main__":
    main()
