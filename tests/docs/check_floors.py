#!/usr/bin/python3
"""The floors table of docs/architecture.md against the sources: every
`#include "..."` of a folder's files must name a header of its own folder
or of a folder on a lower floor. Prints each include that runs up or
sideways (file:line, the two folders and floors) and each folder with
sources that the table lacks. Exit 0 when there is none, 1 otherwise.

Usage: check_floors.py SOURCE_DIR [ARCHITECTURE.md]
"""
import os
import re
import sys

ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([a-z_/]+/)`\s*\|")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
# Generated headers, by the folder whose sources generate them.
GENERATED = {"lockstep/proto/": "proto/", "lockstep/build_config.h": None}


def floors(table_path):
    found = {}
    with open(table_path, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line)
            if m:
                found[m.group(2)] = int(m.group(1))
    return found


def folder_of(path, table):
    """The table's folder holding `path` (the longest that is a prefix), or None."""
    best = None
    for folder in table:
        if path.startswith(folder) and (best is None or len(folder) > len(best)):
            best = folder
    return best


def main():
    source = sys.argv[1]
    table_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(source, "docs", "architecture.md")
    table = floors(table_path)
    if len(table) < 5:
        print(f"{table_path}: no floors table found (rows like | 0 | `runtime/base/` | ...)")
        return 1
    problems = []
    for top in ["runtime", "optim", "proto", "report", "coordinator", "worker", "cli"]:
        for root, _, files in os.walk(os.path.join(source, top)):
            for name in sorted(files):
                if not name.endswith((".cpp", ".h")):
                    continue
                path = os.path.relpath(os.path.join(root, name), source)
                own = folder_of(path, table)
                if own is None:
                    problems.append(f"{path}: its folder is on no floor of {table_path}")
                    continue
                with open(os.path.join(source, path), encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        target = m.group(1)
                        for prefix, folder in GENERATED.items():
                            if target.startswith(prefix):
                                target = folder
                                break
                        if target is None:
                            continue
                        other = folder_of(target, table)
                        if other is None or other == own:
                            continue  # a system or third-party header, or its own folder
                        if table[other] >= table[own]:
                            problems.append(f"{path}:{number}: includes {m.group(1)} ({other}, floor "
                                            f"{table[other]}) from {own} on floor {table[own]}")
    print("\n".join(problems) if problems else f"every include of {len(table)} folders runs down a floor")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
