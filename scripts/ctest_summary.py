#!/usr/bin/env python3
"""Summary of a ctest run from its JUnit report (ctest --output-junit): how many tests passed, were skipped (with
each skip reason and its count) and failed. ctest's own last line ("100% tests passed ... out of N") counts a
skipped GPU test as passed, so a CPU run reads like a full one; scripts/test.sh prints this after it.

Usage: ctest_summary.py JUNIT_XML
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def skip_reason(output: str) -> str:
    """GTEST_SKIP()'s message: the line after "<file>:<line>: Skipped" (or "unknown reason")."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped") and i + 1 < len(lines) and lines[i + 1].strip():
            return lines[i + 1].strip()
    return "unknown reason (no GTEST_SKIP message)"


def summarize(path: str) -> list[str]:
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    passed, failed, reasons = 0, [], collections.Counter()
    total = 0
    for case in cases:
        total += 1
        if case.find("skipped") is not None or case.get("status") == "notrun":
            reasons[skip_reason(case.findtext("system-out") or "")] += 1
        elif case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail":
            failed.append(case.get("name"))
        else:
            passed += 1
    skipped = sum(reasons.values())
    out = [f"C++ tests (ctest): {total} tests, {passed} passed, {skipped} skipped, {len(failed)} failed"]
    out += [f"  {n} skipped: {reason}" for reason, n in reasons.most_common()]
    out += [f"  failed: {name}" for name in failed]
    if skipped:
        out.append(f"  ({skipped} of {total} did not run here: not a full run; the GPU tests run with "
                   "scripts/gpu_check.sh on a GPU machine)")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    print("\n".join(summarize(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
