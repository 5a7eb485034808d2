"""bench.static.argument_paths counts a file only where its code names the value."""
from bench.static.argument_paths import count, names_in


def test_comments_and_docstrings_do_not_count():
    cpp = ("// temperature in a comment\n/* inv_t\n in a block */\n"
           "struct S { double inv_t; };\nconst char* schema = \"Tensor temperature\";\n")
    assert names_in("a.h", cpp, ["temperature", "inv_t", "gamma"]) == ["temperature", "inv_t"]
    python = ('"""temperature in a docstring."""\n'
              "def f(x):\n    \"\"\"inv_t here too.\"\"\"\n    # gamma\n    return x.gamma\n")
    assert names_in("a.py", python, ["temperature", "inv_t", "gamma"]) == ["gamma"]


def test_whole_words_only():
    assert names_in("a.cpp", "int focal_gamma_squared = 0;", ["focal_gamma"]) == []


def test_every_backend_path_holds_its_routing_files():
    found = count(["focal_gamma"])
    assert set(found) == {"cpu", "triton", "cuda"}
    for backend, rows in found.items():
        paths = [path for path, _ in rows]
        assert "csrc/scl_ops.cpp" in paths and "csrc/autograd.cpp" in paths, backend
        assert "csrc/core/call_arguments.h" in paths, backend
    assert "scl_kernels/backends/triton/registration.py" in [p for p, _ in found["triton"]]
