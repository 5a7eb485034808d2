"""Reading a compiled kernel's machine code (SASS) without a GPU: disassembly with the tools that
Triton's wheel bundles, resource usage, loops, and instructions sorted into the classes that
compete for an SM's issue slots (bench/static/issue_slots.py).

Loops are the natural loops of the control-flow graph; they nest by containment. The per-tile count of a kernel is what one trip of its outermost matrix loop issues, inner loops
(the K steps of large D) counted once per trip they make."""
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field


_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")
_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
# Opcode (before its first dot) -> class. What is not listed is "other".
CLASSES = {
    "tensor": ("HGMMA", "HMMA", "IMMA"),
    "mufu": ("MUFU",),
    "fp32": ("FADD", "FMUL", "FFMA", "FMNMX", "FSETP", "FSEL", "FCHK", "FSET", "FMUL2",
             "FADD2", "FFMA2"),
    "convert": ("F2F", "F2FP", "F2I", "I2F", "I2FP", "FRND"),
    "integer": ("IADD3", "IMAD", "ISETP", "LOP3", "SHF", "LEA", "SEL", "IMNMX",
                "IABS", "VIADD", "VIMNMX", "PLOP3", "P2R", "R2P", "SGXT", "BMSK", "POPC",
                "FLO", "PRMT", "IADD", "IMUL", "ULDC", "UIADD3", "UIMAD", "ULOP3", "USHF",
                "ULEA", "UISETP", "USEL", "UMOV", "UPRMT", "USGXT", "UBMSK", "UFLO", "UPOPC",
                "UPLOP3", "UIMNMX", "UVIADD", "UP2UR", "UR2UP"),
    "move": ("MOV", "MOVM", "S2R", "S2UR", "CS2R", "R2UR", "LDC", "SHFL", "VOTE", "VOTEU",
             "MATCH", "REDUX"),
    "global": ("LDG", "STG", "LDGSTS", "LDGDEPBAR", "RED", "ATOM", "ATOMG", "REDG", "LD", "ST",
               "UTMALDG", "UTMASTG", "UTMAPF", "UBLKCP", "CCTL"),
    "shared": ("LDS", "STS", "LDSM", "STSM", "ATOMS", "SYNCS", "UCGABAR_ARV", "UCGABAR_WAIT"),
    "local": ("LDL", "STL"),
    "sync": ("BAR", "DEPBAR", "WARPGROUP", "WARPSYNC", "MEMBAR", "BSYNC", "BSSY", "NOP",
             "ERRBAR", "FENCE", "ARRIVES", "WARPGROUPSET"),
    "control": ("BRA", "EXIT", "RET", "CALL", "YIELD", "BREAK", "BPT", "JMP"),
}
_CLASS_OF = {op: name for name, ops in CLASSES.items() for op in ops}


def opcode_class(opcode):
    """The class of an opcode with or without its modifiers (HGMMA.64x128x16.F32.BF16: tensor)."""
    return _CLASS_OF.get(opcode.split(".")[0], "other")


@dataclass
class Instruction:
    address: int
    opcode: str          # with its modifiers, e.g. HGMMA.64x128x16.F32.BF16
    operands: str
    predicated: bool = False

    @property
    def base(self):
        return self.opcode.split(".")[0]

    @property
    def kind(self):
        return opcode_class(self.opcode)


@dataclass
class Loop:
    header: int                          # address of the loop's first block
    body: set                            # addresses of its instructions
    children: list = field(default_factory=list)

    def contains(self, address):
        return address in self.body


def disassemble(cubin: bytes):
    """The SASS of a cubin as Instructions, in address order, and its resource usage
    (registers, stack, shared and local bytes per thread) as ptxas reports them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = _tool("cuobjdump", "-sass", f.name)
        usage = _tool("cuobjdump", "-res-usage", f.name)
    return parse_sass(sass), parse_resources(usage)


def _tool(name, *args):
    import triton  # its wheel bundles the disassemblers; imported late so --help needs no triton
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return subprocess.run([os.path.join(tools, name), *args], check=True, capture_output=True,
                          text=True).stdout


def parse_sass(text):
    instructions = []
    for match in _LINE.finditer(text):
        address, predicate, opcode, operands = match.groups()
        predicated = bool(predicate) and predicate.strip() not in ("@PT", "@UPT")
        instructions.append(Instruction(int(address, 16), opcode, operands.strip(), predicated))
    return instructions


def parse_resources(text):
    match = _RESOURCES.search(text)
    if not match:
        raise ValueError(f"no resource usage in: {text[:400]}")
    registers, stack, shared, local = map(int, match.groups())
    return {"registers": registers, "stack_bytes": stack, "shared_bytes": shared,
            "local_bytes": local}


def _blocks(instructions):
    """Basic blocks as (first index, last index) and the successor block indices of each."""
    index_of = {ins.address: i for i, ins in enumerate(instructions)}
    leaders = {0}
    for i, ins in enumerate(instructions):
        if ins.base in ("BRA", "EXIT", "RET"):
            leaders.add(i + 1)
            target = _BRANCH_TARGET.search(ins.operands) if ins.base == "BRA" else None
            if target and int(target.group(1), 16) in index_of:
                leaders.add(index_of[int(target.group(1), 16)])
    starts = sorted(i for i in leaders if i < len(instructions))
    block_of = {}
    spans = []
    for b, first in enumerate(starts):
        last = (starts[b + 1] if b + 1 < len(starts) else len(instructions)) - 1
        spans.append((first, last))
        for i in range(first, last + 1):
            block_of[i] = b
    successors = []
    for b, (first, last) in enumerate(spans):
        ins = instructions[last]
        out = []
        # BRA.DIV branches only when the warp has diverged, to the slow path of a warp-level
        # operation (shuffle, warp sync), which rejoins further on: it falls through otherwise.
        conditional = ins.predicated or ins.opcode.startswith("BRA.DIV")
        if ins.base == "BRA":
            target = _BRANCH_TARGET.search(ins.operands)
            if target and int(target.group(1), 16) in index_of:
                out.append(block_of[index_of[int(target.group(1), 16)]])
        if (ins.base not in ("BRA", "EXIT", "RET") or conditional) and last + 1 < len(instructions):
            out.append(block_of[last + 1])
        successors.append(out)
    return spans, successors


def _dominators(successors):
    count = len(successors)
    predecessors = [[] for _ in range(count)]
    for b, out in enumerate(successors):
        for s in out:
            predecessors[s].append(b)
    everything = set(range(count))
    dom = [everything.copy() for _ in range(count)]
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in range(1, count):
            preds = [dom[p] for p in predecessors[b]]
            new = ({b} | set.intersection(*preds)) if preds else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom, predecessors


def loops(instructions):
    """The outermost natural loops (back edges to a dominating block), each with its nested
    loops in .children. Blocks placed out of line (the waits on TMA barriers) belong to the loop
    whose paths pass through them."""
    if not instructions:
        return []
    spans, successors = _blocks(instructions)
    dom, predecessors = _dominators(successors)
    bodies = {}
    for latch, out in enumerate(successors):
        for header in out:
            if header in dom[latch]:
                body = bodies.setdefault(header, {header})
                stack = [latch]
                while stack:
                    b = stack.pop()
                    if b not in body:
                        body.add(b)
                        stack.extend(predecessors[b])
    found = [Loop(instructions[spans[h][0]].address,
                  {instructions[i].address for b in body for i in range(spans[b][0], spans[b][1] + 1)})
             for h, body in bodies.items()]
    found.sort(key=lambda loop: -len(loop.body))
    roots = []
    for loop in found:
        siblings = roots
        while True:
            parent = next((p for p in siblings if loop.body <= p.body), None)
            if parent is None:
                siblings.append(loop)
                break
            siblings = parent.children
    return roots


def _uses_tensor_cores(instructions, loop):
    return any(i.kind == "tensor" and loop.contains(i.address) for i in instructions)


def tile_loop(instructions):
    """The steady-state tile loop: of the outermost loops holding matrix instructions, the one
    with the fewest instructions (a kernel may hold a lean loop for its unmasked tiles beside
    fuller copies for masked ones), among those with K steps nested inside when any has them
    (a single tile outside the column loop, e.g. a diagonal one, has a K loop of its own).
    None for a kernel without matrix instructions."""
    candidates = [loop for loop in loops(instructions) if _uses_tensor_cores(instructions, loop)]
    nested = [loop for loop in candidates
              if any(_uses_tensor_cores(instructions, c) for c in loop.children)]
    return min(nested or candidates, key=lambda loop: len(loop.body), default=None)


def weighted_counts(instructions, loop, inner_trips):
    """{opcode: count} for one trip of `loop`: its nested loops that hold matrix instructions
    (the K steps of one tile) counted inner_trips times; other nested loops (waits on barriers)
    once."""
    steps = [c for c in loop.children if _uses_tensor_cores(instructions, c)]
    counts = {}
    for ins in instructions:
        if loop.contains(ins.address):
            weight = inner_trips if any(c.contains(ins.address) for c in steps) else 1
            counts[ins.opcode] = counts.get(ins.opcode, 0) + weight
    return counts


def tensor_loops(instructions):
    """The outermost loops holding matrix instructions: a kernel's tile loops (its lean steady
    state and any fuller copies, e.g. for masked tiles)."""
    return [loop for loop in loops(instructions) if _uses_tensor_cores(instructions, loop)]


def outside_counts(instructions):
    """{opcode: count} of what runs once per program: everything outside the tile loops (whose
    trips are counted as tiles)."""
    tile_loops = tensor_loops(instructions)
    counts = {}
    for ins in instructions:
        if not any(loop.contains(ins.address) for loop in tile_loops):
            counts[ins.opcode] = counts.get(ins.opcode, 0) + 1
    return counts


def by_class(counts):
    classes = {}
    for opcode, count in counts.items():
        kind = opcode_class(opcode)
        classes[kind] = classes.get(kind, 0) + count
    return classes


def tensor_fmas(counts, warps):
    """Multiply-adds of the tensor instructions in `counts` for one program of `warps` warps:
    an HGMMA.MxNxK is issued once per warp and computes M x N x K for its warpgroup of 4 warps;
    an HMMA.MNK (e.g. HMMA.16816) computes M x N x K for its warp."""
    total = 0
    for opcode, count in counts.items():
        parts = opcode.split(".")
        if parts[0] == "HGMMA":
            m, n, k = map(int, parts[1].split("x"))
            total += count * m * n * k * (warps // 4)
        elif parts[0] == "HMMA":
            digits = parts[1]
            m, n, k = int(digits[:2]), int(digits[2]), int(digits[3:])
            total += count * m * n * k * warps
    return total


def tensor_input(counts):
    """The input type of the tensor instructions (BF16, F16, TF32, ...); None without them."""
    for opcode in counts:
        parts = opcode.split(".")
        if parts[0] in ("HGMMA", "HMMA") and len(parts) >= 4:
            return parts[3]
    return None
