#!/usr/bin/env python3
"""Side-by-side table of a tests/gpu/loopback.sh log: per program and size,
each directory's microseconds (aligned, count one less, pointers one
element off) and the first directory's over each other's (>1: faster).

    python3 tests/gpu/loopback_table.py .gpu/out/loopback.txt
"""
import collections
import re
import sys


def parse(text):
    """{program: {kib: {dir: (aligned, count-1, offset)}}} and the dirs in order (the best of the passes)."""
    data = collections.defaultdict(lambda: collections.defaultdict(dict))
    dirs = []
    parts = re.split(r"== pass \d+ (\S+) (\S+)\n", text)
    for i in range(1, len(parts), 3):
        d, prog, body = parts[i], parts[i + 1], parts[i + 2]
        if d not in dirs:
            dirs.append(d)
        for line in body.splitlines():
            m = re.match(r"\s*(\d+) KiB: aligned (\S+), count -1 (\S+), pointers \+1 element (\S+)", line)
            if not m:
                continue
            row = tuple(float(x) for x in m.groups()[1:])
            old = data[prog][int(m.group(1))].get(d)
            data[prog][int(m.group(1))][d] = row if old is None else tuple(min(a, b) for a, b in zip(old, row))
    return data, dirs


def main():
    text = open(sys.argv[1]).read()
    data, dirs = parse(text)
    print("us: aligned / count -1 / pointers +1 element; ratio: %s over each other directory, aligned (offset)" % dirs[0])
    print("directories: " + ", ".join(dirs))
    for prog in sorted(data, key=lambda p: (int(p.rsplit("_w", 1)[1]), p)):
        print(prog)
        for kib in sorted(data[prog]):
            cells = []
            for d in dirs:
                r = data[prog][kib].get(d)
                cells.append("-" if r is None else "%.2f/%.2f/%.2f" % r)
            base = data[prog][kib].get(dirs[0])
            ratios = []
            for d in dirs[1:]:
                r = data[prog][kib].get(d)
                if base and r and min(base + r) > 0:
                    ratios.append("%.2fx (%.2fx)" % (base[0] / r[0], base[2] / r[2]))
            print("  %5d KiB  %s  %s" % (kib, "  ".join("%-20s" % c for c in cells), " ".join(ratios)))


if __name__ == "__main__":
    main()
