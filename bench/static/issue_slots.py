"""An issue-slot model of an SM, to turn a kernel's machine code into a predicted time without a
GPU. Per tile, the SM is busy for the longest of three things that can overlap:
- its tensor cores: the tile's multiply-adds at TENSOR_FMA_PER_CLOCK;
- its exp units (MUFU): 32 lanes per warp instruction at MUFU_LANES_PER_CLOCK;
- its four warp schedulers: every warp instruction, MUFU and matrix ones included, at
  ISSUE_PER_CLOCK.
A kernel's time is the sum over its tiles and, for what runs once per program (prologue and
epilogue), over its programs, spread evenly over the SMs.

Every number it gives is a prediction. It models no latency (a loop that waits on memory or on a
dependency chain is slower than its issue count), no occupancy or wave quantisation, no memory
bandwidth, no launch overhead and no contention between warps for the same unit; it assumes the
tensor, exp and issue work of a tile overlap perfectly, which Triton's software pipelining
only approaches. bench/decisions/2026-11-22-triton-machine-code.md ("What the check does,
and the model's limits") says how to read it.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    name: str
    sms: int
    clock_hz: float
    tensor_fma_per_clock: dict  # per SM, by input type of the matrix instructions
    mufu_lanes_per_clock: int   # per SM
    issue_per_clock: int        # warp instructions per SM (one per scheduler)


# H100 SXM5: 989 dense bf16 TFLOP/s at 1.83 GHz is 2,048 FMA per clock per SM; the model runs
# it at the 1.75 GHz an H100 sustains under a long tensor-core load.
H100 = Machine("H100 SXM5 (model)", sms=132, clock_hz=1.75e9,
               tensor_fma_per_clock={"BF16": 2048, "F16": 2048, "TF32": 1024},
               mufu_lanes_per_clock=16, issue_per_clock=4)


@dataclass(frozen=True)
class TileCost:
    tensor: float   # cycles of each resource for one tile (or one program's prologue/epilogue)
    mufu: float
    issue: float

    @property
    def cycles(self):
        return max(self.tensor, self.mufu, self.issue)

    @property
    def bound(self):
        return max(("tensor", self.tensor), ("mufu", self.mufu), ("issue", self.issue),
                   key=lambda kv: kv[1])[0]


def cost(per_warp_counts, fmas, input_type, warps, machine=H100):
    """Cycles of one SM for `per_warp_counts` ({class: warp instructions of one warp}) run by
    `warps` warps, with `fmas` tensor multiply-adds of `input_type`."""
    tensor = fmas / machine.tensor_fma_per_clock[input_type] if fmas else 0.0
    mufu = per_warp_counts.get("mufu", 0) * warps * 32 / machine.mufu_lanes_per_clock
    issue = sum(per_warp_counts.values()) * warps / machine.issue_per_clock
    return TileCost(tensor, mufu, issue)


def seconds(tiles, tile_cost, programs, program_cost, machine=H100):
    """A kernel's predicted time: its tiles and programs spread evenly over the SMs."""
    cycles = tiles * tile_cost.cycles + programs * program_cost.cycles
    return cycles / (machine.sms * machine.clock_hz)


def floor_seconds(fmas, exps, input_type="BF16", machine=H100):
    """The time of the work itself: the longer of the multiply-adds at full tensor rate and the
    exps at full MUFU rate, with nothing else issued."""
    tensor = fmas / (machine.tensor_fma_per_clock[input_type] * machine.sms * machine.clock_hz)
    mufu = exps / (machine.mufu_lanes_per_clock * machine.sms * machine.clock_hz)
    return max(tensor, mufu)
