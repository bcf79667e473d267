#!/usr/bin/env python3
"""Code lines per file: lines that are neither blank nor comments (issue 17's measure).
Usage: python3 scripts/code-lines.py src/programs/*.ts"""
import re, sys

def code_lines(text):
    count, in_block = 0, False
    for line in text.splitlines():
        s = line.strip()
        if in_block:
            if "*/" in s:
                in_block = False
                s = s.split("*/", 1)[1].strip()
            else:
                continue
        if s.startswith("/*"):
            if "*/" not in s:
                in_block = True
                continue
            s = s.split("*/", 1)[1].strip()
        if not s or s.startswith("//"):
            continue
        count += 1
    return count

for path in sys.argv[1:]:
    print(f"{code_lines(open(path).read()):5d}  {path}")
