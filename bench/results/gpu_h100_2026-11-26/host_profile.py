"""Where the host's time goes in one Triton forward + backward at N = 16,384 (bf16, D = 128)."""
import cProfile, pstats, statistics, time
import torch
import scl_kernels

n, d = 16384, 128
g = torch.Generator().manual_seed(0)
x = torch.randn(n, d, generator=g).to("cuda", torch.bfloat16).requires_grad_()
y = torch.randint(0, 100, (n,), generator=g).cuda()

def fwd():
    return scl_kernels.supcon_loss(x, y, 0.1, backend="triton")

for _ in range(5):
    torch.autograd.grad(fwd(), [x])
torch.cuda.synchronize()
f_ms, b_ms, w_ms = [], [], []
for _ in range(20):
    t0 = time.perf_counter(); loss = fwd(); t1 = time.perf_counter()
    torch.autograd.grad(loss, [x]); t2 = time.perf_counter(); torch.cuda.synchronize(); t3 = time.perf_counter()
    f_ms.append(1e3 * (t1 - t0)); b_ms.append(1e3 * (t2 - t1)); w_ms.append(1e3 * (t3 - t0))
print(f"host issue: forward {statistics.median(f_ms):.3f} ms, backward {statistics.median(b_ms):.3f} ms; wall {statistics.median(w_ms):.3f} ms")
prof = cProfile.Profile()
prof.enable()
for _ in range(20):
    torch.autograd.grad(fwd(), [x])
torch.cuda.synchronize()
prof.disable()
st = pstats.Stats(prof); st.sort_stats("tottime").print_stats(30)
st.sort_stats("cumulative").print_stats(45)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
    for _ in range(5):
        torch.autograd.grad(fwd(), [x])
    torch.cuda.synchronize()
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
