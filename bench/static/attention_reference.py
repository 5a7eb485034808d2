"""The yardstick of bench.static.gpu_static: a plain fused-attention forward (online softmax,
S = Q K^T then O += P V, 128 x 128 tiles, head dim 128, bf16, TMA descriptors) written the way
Triton's own tutorial writes it, compiled for sm_90 like our kernels. Its loop issues what a
well-fed Triton kernel with one exp per two-GEMM tile issues; our loops are compared with it per
1,000 tensor multiply-adds. It is only compiled, never run."""
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, HEAD_DIM, WARPS, STAGES = 128, 128, 128, 8, 3


@triton.jit
def attention_forward(q_desc, k_desc, v_desc, o_desc, seq_len, scale_log2,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    row0 = tl.program_id(0) * BLOCK_M
    q = q_desc.load([row0, 0])
    run_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), dtype=tl.float32)
    for c0 in range(0, seq_len, BLOCK_N):
        k = k_desc.load([c0, 0])
        s = tl.dot(q, tl.trans(k))
        new_max = tl.maximum(run_max, tl.max(s, axis=1) * scale_log2)
        p = tl.exp2(s * scale_log2 - new_max[:, None])
        alpha = tl.exp2(run_max - new_max)
        run_sum = run_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        v = v_desc.load([c0, 0])
        acc = tl.dot(p.to(tl.bfloat16), v, acc)
        run_max = new_max
    o_desc.store([row0, 0], (acc / run_sum[:, None]).to(tl.bfloat16))


def source():
    """(kernel, signature, constexprs, warps, stages) for bench.static.gpu_static's compiler."""
    desc = f"tensordesc<bf16[{BLOCK_M}, {HEAD_DIM}]>"
    kv = f"tensordesc<bf16[{BLOCK_N}, {HEAD_DIM}]>"
    signature = {"q_desc": desc, "k_desc": kv, "v_desc": kv, "o_desc": desc, "seq_len": "i32",
                 "scale_log2": "fp32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                 "HEAD_DIM": "constexpr"}
    constexprs = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "HEAD_DIM": HEAD_DIM}
    return attention_forward, signature, constexprs, WARPS, STAGES
