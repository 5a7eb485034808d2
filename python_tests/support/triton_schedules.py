"""Which schedule each forward of the Triton backend takes, recorded by wrapping its launchers."""


def schedules_taken(monkeypatch):
    """The list that each later forward appends its log-sum-exp launcher's name to:
    "lse_symmetric" or "lse_plain"."""
    from scl_kernels.backends.triton import launch
    calls = []
    for name in ("lse_symmetric", "lse_plain"):
        original = getattr(launch, name)

        def spy(*args, _name=name, _original=original):
            calls.append(_name)
            return _original(*args)
        monkeypatch.setattr(launch, name, spy)
    return calls
