#!/usr/bin/env python3
"""Checks that a CUDA replay judged the graph path: in a `dflash-harness replay --json` report,
every propose of a cuda-* drafter whose (block width, batch size) was proposed more than WARMUP
times before it is a graph replay, and the replays over all fixtures number at least one.

usage: ci/graph_replays.py REPORT.json WARMUP
Prints one line per fixture; exit 0 when every fixture holds, 1 otherwise, 2 on bad input."""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(sys.argv[1]) as f:
            doc = json.load(f)
        warmup = int(sys.argv[2])
    except (OSError, ValueError) as e:
        print(f"graph_replays.py: {e}", file=sys.stderr)
        return 2
    ok, replays = True, 0
    for result in doc.get("results", []):
        seen, expected, got, bad = {}, 0, 0, []
        for path in result.get("paths", []):
            if not path["proposer"].startswith("cuda-"):
                continue
            shape = (path["block_width"], path["batch"])
            seen[shape] = seen.get(shape, 0) + 1
            should_replay = seen[shape] > warmup + 1
            expected += should_replay
            got += path["mode"] == "graph-replay"
            if should_replay != (path["mode"] == "graph-replay"):
                bad.append(f"step {path['step']} {shape}: {path['mode']}")
        replays += got
        verdict = "ok" if not bad else "FAIL"
        ok = ok and not bad
        print(f"{verdict} {result['fixture']}: {got} graph replays (expected {expected})"
              + ("; " + ", ".join(bad) if bad else ""))
    if replays == 0:
        print("FAIL no CUDA propose replayed a graph")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
