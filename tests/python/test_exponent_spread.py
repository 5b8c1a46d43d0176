#!/usr/bin/env python3
"""python/tools/exponent_spread.py's counting (issue 41, 3(d)) on hand-built codes and scales, with
the answers worked out here: a tile's spread is max - min E8M0 exponent over its groups holding a
non-zero code (all-zero groups and -0 codes ignored), a spread of exactly 3 still fits int8, and a
row block counts when any of its rows spreads too far. Also the WUSH transform step against a
float64 product. Numpy only (the models are the script's own run).

Usage: test_exponent_spread.py --library PATH/libwush.so
"""
import argparse
import os
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def packed(rows_of_nibbles):
    """codes (rows, k/2) from per-element nibbles (rows, k): element 2j in the low nibble."""
    n = np.asarray(rows_of_nibbles, np.uint8)
    return (n[:, 0::2] | (n[:, 1::2] << 4)).astype(np.uint8)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--library", required=True)
    args = p.parse_args()
    os.environ["WUSH_LIBRARY"] = args.library
    sys.path.insert(0, str(ROOT / "python" / "tools"))
    import exponent_spread as es

    G, k = 32, 256  # two 128-wide tiles of 4 groups
    nib = np.ones((3, k), np.uint8)                 # code 1 (0.5) everywhere
    nib[1, 3 * G:4 * G] = 8                         # row 1, tile 0, group 3: -0 codes only (ignored)
    nib[2, 4 * G:5 * G] = 0                         # row 2, tile 1, group 4: +0 codes only (ignored)
    scales = np.full((3, k // G), 127, np.uint8)
    scales[0, 1] = 130                              # row 0 tile 0: spread 3 (fits)
    scales[0, 5] = 131                              # row 0 tile 1: spread 4
    scales[1, 3] = 140                              # row 1 tile 0: the spread-13 group is all -0
    scales[2, 4] = 100                              # row 2 tile 1: the far group is all +0
    scales[2, 0] = 123                              # row 2 tile 0: spread 4 (127 - 123)
    e, nz = es.group_exponents(packed(nib), scales)
    assert nz.tolist() == [[True] * 8, [True] * 3 + [False] + [True] * 4, [True] * 4 + [False] + [True] * 3], nz
    s = es.tile_spreads(e, nz)
    assert s.tolist() == [[3, 4], [0, 0], [4, 0]], s.tolist()
    st = es.operand_stats(packed(nib), scales)
    assert st["max"] == 4 and abs(st["row_tile"] - 2 / 6) < 1e-12, st
    # 16-row blocks: a single block of 3 rows; both tiles hold a wide row.
    assert st["blk16"] == 1.0, st
    wide = np.zeros((40, 2), bool)
    wide[17, 1] = True  # block 1 (rows 16-31), tile 1 only
    assert abs(es.block_rate(wide, 16) - 1 / 6) < 1e-12 and abs(es.block_rate(wide, 128) - 1 / 2) < 1e-12
    # A 64-wide layer is one tile of two groups.
    s64 = es.tile_spreads(np.array([[120, 127]]), np.array([[True, True]]))
    assert s64.tolist() == [[7]], s64

    # The transform step: x_b T_b^T per 32-wide block, against float64.
    import wush
    rng = np.random.default_rng(3)
    t = wush.Transform.fixed("hadamard", 64, G)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    m = t.matrices().astype(np.float64)
    want = np.concatenate([x[:, b * G:(b + 1) * G].astype(np.float64) @ m[b].T for b in range(2)], axis=1)
    assert np.allclose(es.transformed(x, t), want, rtol=1e-6, atol=1e-6)
    print("test_exponent_spread: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
