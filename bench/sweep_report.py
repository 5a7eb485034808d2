"""The sweep's report (bench/sweep.py): its CSV columns, a markdown table with the ratios to dense
PyTorch and to the floor, and a log-log plot of time and memory against N."""
from .harness.report import markdown_header, markdown_table

FIELDS = ("implementation", "backend", "device", "n", "d", "dtype", "status", "fwd_ms",
          "fwd_bwd_ms", "fwd_peak_mb", "peak_mb", "loss", "time_vs_dense", "memory_vs_dense",
          "gemm_pass_ms", "exp_n2_ms", "plain_floor_ms", "symmetric_floor_ms", "vs_plain_floor",
          "vs_symmetric_floor")


def write_markdown(path, rows, *, title, machine, settings, notes):
    parts = markdown_header(title, machine, settings)
    parts += ["", *notes, ""]
    parts.append(markdown_table(
        ("implementation", "backend", "N", "D", "dtype", "fwd ms", "fwd+bwd ms", "fwd peak MB",
         "fwd+bwd peak MB", "time / dense", "memory / dense", "status"),
        [(r["implementation"], r.get("backend"), r["n"], r["d"], r["dtype"], r.get("fwd_ms"),
          r.get("fwd_bwd_ms"), r.get("fwd_peak_mb"), r.get("peak_mb"), r.get("time_vs_dense"),
          r.get("memory_vs_dense"), r["status"]) for r in rows]))
    floored = [r for r in rows if r.get("plain_floor_ms") is not None and r.get("backend")]
    if floored:
        parts += ["", "## Against the floor (bench/floor.py, docs/MATH.md section 5)", "",
                  "Floor = the GEMM passes through torch.mm plus the exps through torch.exp; "
                  "plain: 4 passes + 2 N² exps, symmetric: 2 passes + N² exps.", ""]
        parts.append(markdown_table(
            ("implementation", "N", "D", "dtype", "GEMM pass ms", "N² exps ms", "plain floor ms",
             "symmetric floor ms", "fwd+bwd ms", "/ plain floor", "/ symmetric floor"),
            [(r["implementation"], r["n"], r["d"], r["dtype"], r["gemm_pass_ms"], r["exp_n2_ms"],
              r["plain_floor_ms"], r["symmetric_floor_ms"], r.get("fwd_bwd_ms"),
              r.get("vs_plain_floor"), r.get("vs_symmetric_floor")) for r in floored]))
    with open(path, "w") as out:
        out.write("\n".join(parts) + "\n")


def write_plot(path, rows, *, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    series = sorted({(r["implementation"], r["d"], r["dtype"]) for r in rows})
    label_extra = len({(d, dtype) for _, d, dtype in series}) > 1
    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(13, 5))
    for impl, d, dtype in series:
        done = sorted((r for r in rows if r.get("fwd_bwd_ms")
                       and (r["implementation"], r["d"], r["dtype"]) == (impl, d, dtype)),
                      key=lambda r: r["n"])
        if not done:
            continue
        label = f"{impl} D={d} {dtype}" if label_extra else impl
        time_ax.plot([r["n"] for r in done], [r["fwd_bwd_ms"] for r in done], "o-", label=label)
        memory = [r for r in done if r.get("peak_mb")]
        mem_ax.plot([r["n"] for r in memory], [r["peak_mb"] for r in memory], "o-", label=label)
    floors = {(r["n"], r["d"], r["dtype"]): r for r in rows if r.get("plain_floor_ms") is not None}
    for d, dtype in sorted({(d, dtype) for _, d, dtype in floors}):
        points = sorted(((n, r) for (n, dd, dt), r in floors.items() if (dd, dt) == (d, dtype)),
                        key=lambda point: point[0])
        suffix = f" D={d} {dtype}" if label_extra else ""
        for key, style in (("plain_floor_ms", "k--"), ("symmetric_floor_ms", "k:")):
            time_ax.plot([n for n, _ in points], [r[key] for _, r in points], style,
                         label=key.replace("_ms", "").replace("_", " ") + suffix)
    for ax, ylabel in ((time_ax, "forward+backward time (ms)"),
                       (mem_ax, "peak memory above inputs (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain_numbers = matplotlib.ticker.FuncFormatter(
            lambda value, _: f"{value:.0f}" if value >= 1 else f"{value:g}")
        ax.xaxis.set_major_formatter(plain_numbers)
        ax.yaxis.set_major_formatter(plain_numbers)
        # Minor ticks get labels only when the axis spans about a decade or less.
        ax.yaxis.set_minor_formatter(matplotlib.ticker.LogFormatter(labelOnlyBase=False))
        ax.set_xlabel("N (rows)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
