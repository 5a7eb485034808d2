"""bench/memory.py on a tiny case: it runs, writes its table, and refuses a negative size."""
import pytest

from bench import memory as bench_memory
from support import needs


@needs.library
def test_tiny_run_writes_the_table(tmp_path, capsys):
    bench_memory.main(["--memory-sizes", "0,24", "--batch", "6", "--dim", "5", "--repeats", "1",
                       "--out", str(tmp_path)])
    (written,) = tmp_path.glob("memory_cpu_*.md")
    table = [line for line in written.read_text().splitlines() if line.startswith("| ")]
    assert table[0].startswith("| memory M | storage MB | fused step ms")
    assert [line.split(" | ")[0] for line in table[1:]] == ["| 0", "| 24"]


def test_negative_memory_size_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench_memory.parse_args(["--memory-sizes", "-1"])
    assert "--memory-sizes must be >= 0" in capsys.readouterr().err
