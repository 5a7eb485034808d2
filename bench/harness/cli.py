"""The command line every timed benchmark shares: one parser builder, so that an option that
means the same thing is spelled, typed, checked and explained the same way everywhere.

    parser = benchmark_parser(__doc__, sizes="1024,4096", dims="128", repeats=5)
    parser.add_argument(...)  # the benchmark's own options
    args = parser.parse_args(argv)  # args.sizes == [1024, 4096], args.out: a folder

--out is there for every benchmark that writes files; the other shared options are added when
named, with their default."""
import argparse

import torch

from .report import LOCAL_RESULTS


def int_list(text):
    """Positive integers separated by commas: "16,256" -> [16, 256]."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas, got {text!r}")
    return values


def name_list(text):
    names = [v for v in text.split(",") if v]
    if not names:
        raise argparse.ArgumentTypeError(f"expected names separated by commas, got {text!r}")
    return names


def choice_list(choices):
    """A type for names separated by commas, each one of ``choices``."""
    def parse(text):
        names = [v for v in text.split(",") if v]
        unknown = [v for v in names if v not in choices]
        if not names or unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {unknown or text!r}; choose from {sorted(choices)}")
        return names
    return parse


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


def fraction(text):
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}")
    return value


def float_list(text):
    """Numbers separated by commas: "0.1,0.01" -> [0.1, 0.01]."""
    try:
        values = [float(v) for v in text.split(",") if v]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}")
    return values


def default_device():
    return "cuda" if torch.cuda.is_available() else "cpu"


# name -> (flags, argparse keywords). %(default)s shows each benchmark's own default.
SHARED_OPTIONS = {
    "device": (("--device",), dict(help="torch device (default %(default)s)")),
    "sizes": (("--sizes",), dict(type=int_list, metavar="N,N,...",
                                 help="batch sizes N, comma-separated (default %(default)s)")),
    "dims": (("--dims",), dict(type=int_list, metavar="D,D,...",
                               help="row widths D, comma-separated (default %(default)s)")),
    "dtypes": (("--dtypes",), dict(type=name_list,
                                   help="dtypes, comma-separated (default %(default)s)")),
    "repeats": (("--repeats",), dict(type=positive_int,
                                     help="timings per measurement, their median reported "
                                          "(default %(default)s)")),
    "warmup": (("--warmup",), dict(type=non_negative_int,
                                   help="untimed calls before timing (default %(default)s)")),
    "max_seconds": (("--max-seconds",), dict(type=float,
                                             help="stop timing one measurement after this many "
                                                  "seconds, once 3 timings are in "
                                                  "(default %(default)s)")),
    "threads": (("--threads",), dict(type=positive_int,
                                     help="torch threads (default %(default)s; none: torch's)")),
    "seed": (("--seed",), dict(type=int, help="random inputs' seed (default %(default)s)")),
    "temperatures": (("--temperatures",), dict(
        type=float_list, metavar="T,T,...",
        help="temperatures; on the CPU 0.1 takes the symmetric schedule, 0.01 the plain one "
             "(default %(default)s)")),
    "dense_max": (("--dense-max",), dict(
        type=non_negative_int,
        help="the largest N the dense peer (backend='reference') runs at (default %(default)s)")),
    "quiet_threshold": (("--quiet-threshold",), dict(
        type=fraction, help="a timing counts only while other processes use less than this share "
                            "of all cores; 0 counts every timing (default %(default)s)")),
    "wait_quiet": (("--wait-quiet",), dict(
        type=float, metavar="SECONDS",
        help="wait at most this long in all for quiet spells (default %(default)s)")),
    "retries": (("--retries",), dict(type=int, choices=(0, 1),
                                     help="measure disturbed configurations once more at the "
                                          "end, keeping the less disturbed (default %(default)s)")),
}


def benchmark_parser(doc, *, writes_files=True, helps=None, **defaults):
    """An ArgumentParser for the benchmark whose module docstring is ``doc`` (its first paragraph
    is the description), with --out (unless it writes no files) and every shared option named in
    ``defaults``
    (name -> default); ``helps`` (name -> text) replaces a shared option's help where the
    benchmark means more by it. Abbreviated options are refused: ``--repeat`` is not
    ``--repeats``."""
    unknown = set(defaults) - set(SHARED_OPTIONS)
    if unknown:
        raise ValueError(f"no shared options {sorted(unknown)}; known: {sorted(SHARED_OPTIONS)}")
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], allow_abbrev=False)
    if writes_files:
        parser.add_argument("--out", default=LOCAL_RESULTS, metavar="DIR",
                            help="folder for the result files (default bench/results/local/, "
                                 "git-ignored, so that a run never overwrites the tracked "
                                 "results)")
    for name, default in defaults.items():
        flags, keywords = SHARED_OPTIONS[name]
        if helps and name in helps:
            keywords = {**keywords, "help": helps[name]}
        parser.add_argument(*flags, default=default, **keywords)
    return parser
