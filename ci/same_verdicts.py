#!/usr/bin/env python3
"""Checks that two `dflash-harness replay --json` reports of the same fixtures give the same
verdicts: per fixture the verdict, the first divergence, and every pair's stage metrics bit for bit
(the drafters are deterministic, so a variable that changes nothing leaves the numbers equal).

usage: ci/same_verdicts.py A.json B.json
Exit 0 when they agree, 1 naming the first difference, 2 on bad input."""
import json
import sys


def essence(doc):
    out = {}
    for result in doc.get("results", []):
        out[result["fixture"]] = {
            "verdict": result.get("verdict"),
            "first_divergence": result.get("first_divergence"),
            "pairs": result.get("pairs"),
            "sequences": result.get("sequences"),
            "invariant_failures": result.get("invariant_failures"),
        }
    for error in doc.get("errors", []):
        out[error["fixture"]] = {"error": error.get("error"), "exit_code": error.get("exit_code")}
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        a, b = (essence(json.load(open(p))) for p in sys.argv[1:])
    except (OSError, ValueError, KeyError) as e:
        print(f"error: same_verdicts.py: {e}", file=sys.stderr)
        return 2
    if a.keys() != b.keys():
        print(f"different fixtures: {sorted(a.keys() ^ b.keys())}")
        return 1
    for fixture in sorted(a):
        for key in a[fixture].keys() | b[fixture].keys():
            if a[fixture].get(key) != b[fixture].get(key):
                print(f"{fixture}: '{key}' differs")
                return 1
    print(f"{len(a)} fixture(s): same verdicts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
