#!/usr/bin/env python3
"""The instruction mix of a CUDA kernel's loops, from its SASS (no GPU needed).

Reads `cuobjdump -sass` output (a file, or an object / binary run through cuobjdump when --obj is given) and, for each
function whose mangled name matches --kernel, lists every loop: a backward branch whose body spans at least
--min-body instructions. For each loop it prints the address range, the instruction count and the most frequent
opcodes (the mnemonic before the first dot, predicates dropped), so that a change to a kernel's hot loop can be
counted on the CPU machine before it costs device time.

cuobjdump and nvdisasm come from PyPI: `pip download --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`, unzip the
wheels, and put their nvidia/cu13/bin on PATH.

  python3 bench/sass/mix.py dump.sass --kernel fp4_mma_gemv
  python3 bench/sass/mix.py --obj build/src/cuda/CMakeFiles/deepinfer_cuda.dir/linear_gemv_fp8.cu.o --kernel walk
  python3 bench/sass/mix.py dump.sass --kernel fp4_mma_gemv --dump 0x9580   # that loop's instructions, one a line
"""
import argparse
import collections
import re
import signal
import subprocess
import sys

INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
FUNC = re.compile(r"Function : (\S+)")
BRANCH = re.compile(r"\bBRA\b(?:\.\w+)*\s+(?:`\(.*?\)\s*)?(?:0x)?([0-9a-f]+)")


def parse(text):
    """[(function name, [(address, instruction text)])] in file order."""
    funcs = []
    for line in text.splitlines():
        m = FUNC.search(line)
        if m:
            funcs.append((m.group(1), []))
            continue
        m = INSTR.match(line)
        if m and funcs:
            funcs[-1][1].append((int(m.group(1), 16), m.group(2)))
    return funcs


def opcode(text):
    text = re.sub(r"^@!?U?P\w+\s+", "", text)  # predicate
    return text.split()[0].split(".")[0] if text else ""


def loops(instrs, min_body):
    """(start, end, Counter of opcodes) for each backward branch spanning min_body instructions or more."""
    out = []
    for addr, text in instrs:
        if opcode(text) != "BRA":
            continue
        m = BRANCH.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr:
            continue
        body = [t for a, t in instrs if target <= a <= addr]
        if len(body) >= min_body:
            out.append((target, addr, collections.Counter(opcode(t) for t in body)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", nargs="?", help="cuobjdump -sass output (default: run cuobjdump on --obj)")
    ap.add_argument("--obj", help="an object or binary to disassemble with cuobjdump -sass")
    ap.add_argument("--kernel", default="", help="regular expression on the mangled function name")
    ap.add_argument("--min-body", type=int, default=48, help="instructions a loop body must span")
    ap.add_argument("--top", type=int, default=16, help="opcodes listed per loop")
    ap.add_argument("--dump", help="print the instructions of the loop that starts at this address (hex)")
    a = ap.parse_args()
    if a.obj:
        text = subprocess.run(["cuobjdump", "-sass", a.obj], capture_output=True, text=True, check=True).stdout
    elif a.sass:
        with open(a.sass, encoding="utf-8", errors="replace") as f:
            text = f.read()
    else:
        ap.error("give a SASS file or --obj")
    pattern = re.compile(a.kernel)
    found = False
    for name, instrs in parse(text):
        if not pattern.search(name):
            continue
        found = True
        print(f"{name}: {len(instrs)} instructions")
        for start, end, ops in loops(instrs, a.min_body):
            n = sum(ops.values())
            mix = ", ".join(f"{op} {c}" for op, c in ops.most_common(a.top))
            print(f"  loop {start:#x}-{end:#x}: {n} instructions: {mix}")
            if a.dump is not None and start == int(a.dump, 16):
                for addr, t in instrs:
                    if start <= addr <= end:
                        print(f"    {addr:#07x}  {t}")
    if not found:
        print(f"no function matches '{a.kernel}'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    sys.exit(main())
