"""A training step with a cross-batch memory on the CPU: SupConLoss's forward + backward and
enqueue for one batch against memories of growing size, fused against the dense formula.

    python -m bench.memory                                   # B = 64, D = 384, M = 0 .. 65,536
    python -m bench.memory --memory-sizes 0,4096 --repeats 3 # quick

Per memory size M: a memory filled with M random rows (float32, 10 classes), one batch of B
float32 rows, then the median over --repeats timed steps of ``SupConLoss(memory=...)``: the
batch's anchors against (batch ∪ memory), backward, and the enqueue of the batch (the memory
stays full and keeps turning). Fused is ``backend="cpu"``; dense is ``backend="reference"``, the
library's dense PyTorch formula on the same rows (its logits are B x (B + M), so it fits here:
the memory's anchors are the batch only). Peak memory is the process's resident set above the
level before the step (scl_kernels.profiling.PeakMemory on the CPU: RSS, not tracemalloc, since
torch's tensors live outside Python's allocator); the memory's own storage, allocated before,
is listed apart. Writes memory_cpu_<date>_<time>.md to --out (bench/results/local/ by default).
"""
import torch

from scl_kernels.nn import SupConLoss, SupConMemory

from .harness import cli, report
from .harness.machine import load_average, machine_description
from .harness.memory import PeakMemory
from .harness.timing import median_seconds

BACKENDS = {"fused": "cpu", "dense": "reference"}
CLASSES = 10
TEMPERATURE = 0.1


def filled_memory(size, dim, generator):
    memory = SupConMemory(max(size, 1), dim)
    if size:
        memory.enqueue(torch.randn(size, dim, generator=generator),
                       torch.randint(0, CLASSES, (size,), generator=generator))
    return memory


def measure(batch, dim, size, backend, repeats, seed):
    """(median seconds per step, peak bytes of one step above the level before it)."""
    generator = torch.Generator().manual_seed(seed)
    memory = filled_memory(size, dim, generator)
    criterion = SupConLoss(TEMPERATURE, backend=backend, memory=memory if size else None)
    features = torch.randn(batch, dim, generator=generator, requires_grad=True)
    labels = torch.randint(0, CLASSES, (batch,), generator=generator)

    def step():
        features.grad = None
        criterion(features, labels).backward()

    seconds = median_seconds(step, "cpu", warmup=1, repeats=repeats)
    with PeakMemory("cpu") as peak:
        step()
    return seconds, peak.peak_bytes


def parse_args(argv):
    parser = cli.benchmark_parser(__doc__, repeats=5, threads=None, seed=0)
    parser.add_argument("--batch", type=cli.positive_int, default=64,
                        help="rows per batch, all anchors (default %(default)s)")
    parser.add_argument("--dim", type=cli.positive_int, default=384,
                        help="embedding width D (default %(default)s, MiniLM's)")
    parser.add_argument("--memory-sizes", type=lambda text: [int(v) for v in text.split(",")],
                        default="0,1024,4096,16384,65536",
                        help="memory sizes M; 0 is no memory (default %(default)s)")
    parser.add_argument("--implementations", type=cli.choice_list(set(BACKENDS)),
                        default="fused,dense", help="fused, dense (default %(default)s)")
    args = parser.parse_args(argv)
    if any(size < 0 for size in args.memory_sizes):
        parser.error("--memory-sizes must be >= 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = machine_description("cpu")
    rows = []
    for size in args.memory_sizes:
        row = [size, size * args.dim * 4 / 2**20]
        for name in args.implementations:
            seconds, peak = measure(args.batch, args.dim, size, BACKENDS[name], args.repeats,
                                    args.seed)
            row += [seconds * 1e3, peak / 2**20]
        rows.append(row)
        print(", ".join(report.fmt(value) for value in row), flush=True)
    base = report.result_stem(args.out, f"memory_cpu_{report.timestamp()}")
    parts = report.markdown_header("Cross-batch memory: one training step on the CPU", machine, {
        "command": report.command_line("bench.memory", argv),
        "batch": f"B = {args.batch} anchors, D = {args.dim}, float32, {CLASSES} classes",
        "repeats": args.repeats, "torch threads": torch.get_num_threads(),
        "load average at the end": load_average()})
    parts += ["", "Step: forward + backward of SupConLoss(memory=...) and the enqueue, ms "
              "(median). Peak: resident set above the level before the step, MB. Storage: the "
              "memory's rows, M x D x 4 bytes, allocated before.", ""]
    header = ["memory M", "storage MB"]
    for name in args.implementations:
        header += [f"{name} step ms", f"{name} peak MB"]
    parts.append(report.markdown_table(header, rows))
    with open(base + ".md", "w") as out:
        out.write("\n".join(parts) + "\n")
    print(f"wrote {base}.md")


if __name__ == "__main__":
    main()
