#!/usr/bin/env python3
"""Checks that two `dflash-harness replay --json` reports of the same fixtures give the same
verdicts: per fixture the verdict, the first divergence, and every pair's stage metrics bit for bit
(the drafters are deterministic, so a variable that changes nothing leaves the numbers equal).

usage: ci/same_verdicts.py [--verdicts] A.json B.json
--verdicts: compare only each fixture's verdict, drafter fault and first divergence (step, sequence,
stage, criterion), for two different drafters of the same numbers (the CUDA drafter in process and
as a plugin), and list the verdicts.
Exit 0 when they agree, 1 naming the first difference, 2 on bad input."""
import json
import sys


def verdicts(doc):
    out = {}
    for result in doc.get("results", []):
        first = result.get("first_divergence") or {}
        out[result["fixture"]] = {
            "verdict": result.get("verdict"),
            "drafter_fault": (result.get("drafter_fault") or {}).get("event"),
            "first_divergence": [first.get(k) for k in ("step", "seq", "stage", "criterion")],
        }
    for error in doc.get("errors", []):
        out[error["fixture"]] = {"error": error.get("error"), "exit_code": error.get("exit_code")}
    return out


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
    args = sys.argv[1:]
    only_verdicts = bool(args) and args[0] == "--verdicts"
    if only_verdicts:
        args = args[1:]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        a, b = ((verdicts if only_verdicts else essence)(json.load(open(p))) for p in args)
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
    if only_verdicts:
        for fixture in sorted(a):
            v = a[fixture]
            print(f"  {fixture}: {v.get('verdict', 'error')}"
                  + (f" at {v['first_divergence'][2]}" if v.get("first_divergence", [None] * 3)[2] else ""))
    print(f"{len(a)} fixture(s): same verdicts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
