"""What the test files share: input builders (layouts), the float64 references (reference64,
chunked_reference64), the multi-process harness (spawned_ranks, distributed_cases), tiny Hugging
Face models (tiny_models), a probe of Triton's interpreter (triton_probe), and the pytest plugin
that runs every backend test on every backend (backend_matrix).

pytest.ini puts python_tests/ on sys.path (``pythonpath``), so tests import ``support.<module>``;
processes spawned by torch.multiprocessing inherit that path and import the same modules."""
