"""The build shows its progress on the terminal also under pip (which captures its output): one
line per compiled file, written to /dev/tty only, so that captured output, logs and builds
without a terminal stay as they were (setup.py's TerminalProgress and tee_stdout)."""
import importlib.util
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(ROOT, "setup.py")


def _setup_module():
    spec = importlib.util.spec_from_file_location("scl_setup", SETUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not __main__: setup() does not run
    return module


NINJA_OUTPUT = [
    f"[1/3] c++ -MMD -MF {ROOT}/build/x/csrc/a.o.d -O3 -c {ROOT}/csrc/cpu/a.cpp -o {ROOT}/a.o",
    "csrc/cpu/a.cpp: In function 'f': warning: unused variable",
    f"[2/3] /usr/local/cuda/bin/nvcc -I{ROOT}/csrc -c {ROOT}/csrc/cuda/b.cu -o {ROOT}/b.o",
    "[3/3] ln -sf x y",
]


def test_one_line_per_finished_step_with_the_source_and_the_time():
    setup = _setup_module()
    written, now = [], iter([100.0, 105.0, 171.0, 200.0, 230.0, 240.0])
    progress = setup.TerminalProgress(written.append, root=ROOT, clock=lambda: next(now))
    progress.begin()
    for line in NINJA_OUTPUT:
        progress.line(line)
    progress.end()
    assert written[0].startswith("\nscl_kernels build (0:05): building the C++ extension")
    assert written[1:] == [
        "\rscl_kernels build (1:11): [1/3] csrc/cpu/a.cpp done\n",
        "\rscl_kernels build (1:40): [2/3] csrc/cuda/b.cu done\n",
        "\rscl_kernels build (2:10): [3/3] a step done\n",
        "\rscl_kernels build (2:20): ninja done; linking and installing\n"]


def test_an_up_to_date_build_says_so():
    setup = _setup_module()
    written = []
    setup.TerminalProgress(written.append).line("ninja: no work to do.")
    assert len(written) == 1 and "nothing to compile" in written[0]


TEE_PROBE = textwrap.dedent("""
    import importlib.util, os, subprocess, sys
    spec = importlib.util.spec_from_file_location("scl_setup", sys.argv[1])
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    lines = sys.argv[3:]
    log = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)  # stdout is a log file, as under pip or CI

    class Collect:
        seen = []
        def line(self, text):
            self.seen.append(text)

    progress = Collect()
    # as torch runs ninja: a child process writing to file descriptor 1
    script = "import sys; sys.stdout.write(sys.argv[1])"
    done = setup.tee_stdout(progress, lambda: subprocess.run(
        [sys.executable, "-c", script, "\\n".join(lines) + "\\n"], stdout=1, check=True)
        .returncode)
    print("after the build")
    sys.stdout.flush()
    sys.stderr.write(repr((done, progress.seen)))
""")


def test_the_build_output_reaches_stdout_unchanged_while_progress_reads_it(tmp_path):
    log = tmp_path / "build.log"
    done = subprocess.run([sys.executable, "-c", TEE_PROBE, SETUP, str(log), *NINJA_OUTPUT],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert log.read_text() == "\n".join(NINJA_OUTPUT) + "\n" + "after the build\n"
    assert done.stderr.strip().splitlines()[-1] == repr((0, NINJA_OUTPUT))


QUIET_PROBE = textwrap.dedent("""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("scl_setup", sys.argv[1])
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    print(setup.TerminalProgress.to_terminal())
""")


def test_no_terminal_or_turned_off_means_no_progress_lines():
    # A new session has no controlling terminal (CI, a detached job): /dev/tty cannot be opened.
    detached = subprocess.run([sys.executable, "-c", QUIET_PROBE, SETUP], capture_output=True,
                              text=True, timeout=300, start_new_session=True)
    assert detached.stdout.strip().splitlines()[-1] == "None", detached.stderr
    off = subprocess.run([sys.executable, "-c", QUIET_PROBE, SETUP], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, SCL_BUILD_PROGRESS="0"))
    assert off.stdout.strip().splitlines()[-1] == "None", off.stderr
