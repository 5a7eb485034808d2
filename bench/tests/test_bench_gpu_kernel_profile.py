"""bench/gpu/kernel_profile.py without a GPU: its kernel filter takes the tile kernels and only
them, under either name ncu may report, and a CPU run does its steps (the GPU session runs it
under Nsight Compute: bench/gpu/gpu_session.sh, phase "kernels")."""
import re

from bench.gpu import kernel_profile

# Names as the 2026-11-27 H100 profile reported them (bench/results/gpu_h100_2026-11-27b).
TILE = ["lse_symmetric_kernel", "grad_rows_kernel", "lse_plain_kernel", "grad_cols_kernel",
        "walk_kernel",
        "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)5, 128>"
        "(scl::cuda::TileArgs)"]
OTHERS = ["prepare_rows_kernel", "anchor_weights_kernel", "anchor_losses_kernel",
          "assemble_backward_kernel", "column_terms_kernel",
          "void scl::cuda::row_stages::(anonymous namespace)::warp_rows_kernel<scl::cuda::"
          "row_stages::LseMerge>(scl::cuda::row_stages::LseMerge)",
          "scl::cuda::row_stages::(anonymous namespace)::anchor_mean_kernel(scl::cuda::"
          "row_stages::AnchorLosses)",
          "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
          "void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortOnesweepKernel<>"]


def test_the_filter_takes_the_tile_kernels_alone():
    pattern = re.compile(kernel_profile.tile_kernel_regex())
    assert all(pattern.fullmatch(name) for name in TILE)
    assert not any(pattern.search(name) for name in OTHERS)


def test_prints_the_filter(capsys):
    assert kernel_profile.main(["--print-tile-kernel-regex"]) == []
    assert capsys.readouterr().out.strip() == kernel_profile.tile_kernel_regex()


def test_cpu_run_does_each_step():
    done = kernel_profile.main(["--device", "cpu", "--backends", "cpu,reference", "--sizes",
                                "40,70", "--dims", "6", "--dtype", "fp32", "--layouts",
                                "single,cross"])
    assert len(done) == 8 and ("reference", "cross", 70, 6) in done
