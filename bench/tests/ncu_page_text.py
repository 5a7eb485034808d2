"""Nsight Compute's pages as the readers (bench/gpu/ncu_pages.py) assume them, for the tests and
for conftest.py's ncu stand-in: the walk kernels' demangled names, a raw page and a source page."""

TRIANGLE = "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)5, 128>(scl::cuda::sm90::Params)"
ROWS = "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)3, 128>(scl::cuda::sm90::Params)"
ASYNC = "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)6, 128>(scl::cuda::sm90::Params)"
FORWARD = "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)1, 128>(scl::cuda::sm90::Params)"

# The raw page (ncu --page raw --csv) as assumed: metric names, a row of units, a row per kernel
# (numbers with thousands separators).
RAW = "\n".join([
    '"ID","Process ID","Kernel Name","gpu__time_duration.sum",'
    '"sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",'
    '"sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",'
    '"smsp__average_warp_latency_per_inst_issued.ratio",'
    '"smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio"',
    '"","","","usecond","%","%","cycle","ratio","ratio","ratio","ratio"',
    f'"0","42","{FORWARD}","1,356.00","45.0","55.0","4","0","1","1","2"',
    f'"1","42","{TRIANGLE}","5,777.00","30.0","20.0","10","3","2","1","4"',
    f'"2","42","{FORWARD}","1,350.00","45.0","55.0","4","0","1","1","2"',
    f'"3","42","{ROWS}","4,900.00","52.0","30.0","10","0","2","1","7"',
])
# What ncu prints before a page when its log goes to the same stream (a stray quote included).
PREAMBLE = '==PROF== Connected to process 42 (/usr/bin/python3.12)\n==WARNING== "odd quote\n'

# One kernel's SASS as the source page may list it (absolute addresses and branch targets): a
# tile loop holding the wgmma, a CTA- and a GPU-scope fence, a cluster-scope acquire wait (try-
# wait, then CCTL.IVALL), a stage wait and a turn barrier; the exit barrier's fence lies outside.
BASE = 0x7F0000001000
LOOP = [("MOV R1, c[0x0][0x28]", 1), ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x19800], R5", 6),
        ("BAR.SYNC.DEFER_BLOCKING R9, 0x100", 4), ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24", 20),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 10), ("REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU desc[UR24][R10.64], R28", 5),
        ("MEMBAR.ALL.CTA", 2), ("MEMBAR.ALL.GPU", 15), ("SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [R23+URZ], RZ", 7),
        ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R19+URZ+0x17ff8], R20", 9), ("@P0 CCTL.IVALL", 3),
        ("FFMA R2, R2, R3, R4", 8), ("@!P1 BRA {loop}", 1), ("MEMBAR.ALL.GPU", 9), ("EXIT", 0)]


def source_page(kernels):
    lines = []
    for k in range(kernels):
        lines += [f'"Kernel Name","kernel {k}"',
                  '"# Address","Source","Warp Stall Sampling (All Samples)",'
                  '"Warp Stall Sampling (Not-issued Samples)"']
        for i, (text, samples) in enumerate(LOOP):
            text = text.format(loop=hex(BASE + 0x10))
            lines.append(f'"{hex(BASE + 0x10 * i)}","{text}","{samples}","{samples}"')
    return "\n".join(lines)
