"""Tests of bench/sass/mix.py (the instruction mix of a kernel's loops from cuobjdump's SASS), on a synthetic listing
whose loops and counts are known.

Run: python3 -m pytest -q tests/python/test_sass_mix.py
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIX = os.path.join(ROOT, "bench", "sass", "mix.py")


def listing():
    """Two functions. kern_a: 2 setup instructions, a loop 0x0020-0x00a0 (9 instructions: 4 FFMA, 2 LDS, a predicated
    IADD3, ISETP, the backward BRA), a forward branch, EXIT. kern_b: a short loop (3 instructions)."""
    a = [
        "MOV R1, c[0x0][0x28]",
        "S2R R0, SR_TID.X",
        "LDS.128 R4, [R2]",
        "FFMA R8, R4, R5, R8",
        "FFMA R9, R6, R7, R9",
        "LDS R10, [R3]",
        "FFMA R8, R10, R5, R8",
        "FFMA R9, R10, R7, R9",
        "@P0 IADD3 R2, R2, 0x10, RZ",
        "ISETP.NE.AND P0, PT, R2, R11, PT",
        "@P0 BRA 0x20",
        "BRA 0xc0",
        "EXIT",
    ]
    b = ["IMAD R0, R1, R2, R3", "ISETP.GT.AND P0, PT, R0, RZ, PT", "@P0 BRA 0x0", "EXIT"]
    lines = ["\t\tFunction : _Z6kern_av"]
    lines += [f"        /*{16 * i:04x}*/                   {t} ;   /* 0x000 */" for i, t in enumerate(a)]
    lines += ["\t\tFunction : _Z6kern_bv"]
    lines += [f"        /*{16 * i:04x}*/                   {t} ;   /* 0x000 */" for i, t in enumerate(b)]
    return "\n".join(lines) + "\n"


def run(tmp_path, *args):
    path = tmp_path / "dump.sass"
    path.write_text(listing())
    return subprocess.run([sys.executable, MIX, str(path), *args], capture_output=True, text=True)


def test_loop_body_and_opcode_counts(tmp_path):
    r = run(tmp_path, "--kernel", "kern_a", "--min-body", "4")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "_Z6kern_av: 13 instructions" in out
    # The backward branch at 0xa0 to 0x20: instructions 0x20 .. 0xa0 inclusive, 9 of them.
    assert "loop 0x20-0xa0: 9 instructions: FFMA 4, LDS 2," in out
    assert "IADD3 1" in out and "ISETP 1" in out and "BRA 1" in out
    # The forward branch is not a loop, and kern_b is not listed.
    assert out.count("loop ") == 1 and "kern_b" not in out


def test_min_body_filters_short_loops(tmp_path):
    r = run(tmp_path, "--kernel", "kern_b", "--min-body", "4")
    assert r.returncode == 0 and "loop " not in r.stdout
    r = run(tmp_path, "--kernel", "kern_b", "--min-body", "2")
    assert "loop 0x0-0x20: 3 instructions: IMAD 1, ISETP 1, BRA 1" in r.stdout


def test_no_matching_kernel_is_an_error(tmp_path):
    r = run(tmp_path, "--kernel", "nothing_like_this")
    assert r.returncode == 1 and "no function matches" in r.stderr


def test_dump_prints_the_loop_body(tmp_path):
    r = run(tmp_path, "--kernel", "kern_a", "--min-body", "4", "--dump", "0x20")
    assert r.returncode == 0, r.stderr
    body = [line for line in r.stdout.splitlines() if line.startswith("    0x")]
    assert len(body) == 9
    assert body[0].split()[1:] == ["LDS.128", "R4,", "[R2]"] and body[-1].endswith("@P0 BRA 0x20")
    # An address where no loop starts prints no body.
    r = run(tmp_path, "--kernel", "kern_a", "--min-body", "4", "--dump", "0x30")
    assert not [line for line in r.stdout.splitlines() if line.startswith("    0x")]
