"""What every timed benchmark shares: timing (timing.py, other_processes.py), memory (memory.py),
the machine a run measured (machine.py), result files (report.py) and the command line (cli.py)."""
