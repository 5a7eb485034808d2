"""The benchmarks' command lines: the shared parser (bench/harness/cli.py), where results go by
default, and the static tools' --help without their optional dependencies."""
import os
import shutil
import subprocess
import sys

import pytest

from bench.harness import cli
from bench.harness.report import LOCAL_RESULTS, REPO_ROOT


def test_shared_options_are_typed_and_checked():
    parser = cli.benchmark_parser("A benchmark.\n\nMore.", sizes="16,256", repeats=5)
    args = parser.parse_args(["--sizes", "32,64"])
    assert args.sizes == [32, 64] and args.repeats == 5 and args.out == LOCAL_RESULTS
    assert parser.parse_args([]).sizes == [16, 256]  # string defaults go through the type too
    for bad in (["--sizes", "0"], ["--sizes", "a,b"], ["--repeats", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_abbreviated_options_are_refused():
    parser = cli.benchmark_parser("A benchmark.", repeats=5)
    with pytest.raises(SystemExit):
        parser.parse_args(["--repeat", "3"])


def test_unknown_shared_option_is_a_clear_error():
    with pytest.raises(ValueError, match="no shared options"):
        cli.benchmark_parser("A benchmark.", rounds=3)


def test_choice_list_names_the_choices():
    parse = cli.choice_list({"fwd", "bwd"})
    assert parse("fwd,bwd") == ["fwd", "bwd"]
    with pytest.raises(Exception, match="choose from"):
        parse("fwd,both")


@pytest.mark.skipif(shutil.which("git") is None
                    or not os.path.exists(os.path.join(REPO_ROOT, ".git")),
                    reason="needs a git checkout")
def test_default_output_folder_is_git_ignored():
    probe = os.path.join(os.path.relpath(LOCAL_RESULTS, REPO_ROOT), "any_result.md")
    done = subprocess.run(["git", "check-ignore", "-q", probe], cwd=REPO_ROOT)
    assert done.returncode == 0, f"{probe} is not ignored: a run would add untracked files"


# triton absent: an entry of None in sys.modules makes `import triton` fail and find_spec say so.
WITHOUT_TRITON = ("import runpy, sys; sys.modules['triton'] = None; sys.argv = [sys.argv[1]] + "
                  "sys.argv[2:]; runpy.run_module(sys.argv[0], run_name='__main__')")


def _run_without_triton(module, *args):
    return subprocess.run([sys.executable, "-c", WITHOUT_TRITON, module, *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module", ["bench.static.gpu_static", "bench.static.cuda_static"])
def test_static_tools_help_says_what_they_need_without_triton(module):
    done = _run_without_triton(module, "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "triton==3.6.0" in text and "nvidia-cutlass==4.2.0.0" in text


def test_gpu_static_without_triton_fails_with_one_clear_line():
    done = _run_without_triton("bench.static.gpu_static")
    assert done.returncode == 2
    assert "triton is not installed" in done.stderr and "pip install triton==3.6.0" in done.stderr
    assert "Traceback" not in done.stderr


def test_cuda_static_without_triton_says_why_it_checks_nothing():
    done = _run_without_triton("bench.static.cuda_static")
    assert "CUDA kernels not checked: triton is not installed" in done.stdout, done.stderr
