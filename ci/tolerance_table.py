#!/usr/bin/env python3
"""The GPU observed/bound table of docs/tolerances.md, from the GPU gate's gpu-tests.log.

Reads the summary lines gpu_vs_reference_test prints ([geometry], [oracle], [planted]) and prints
one markdown table: per comparison pair and geometry, the worst error/bound over the stages
(rel-RMS / max-rel, with the stage) and the logits' (rel-RMS / max-rel); for the oracle fixtures,
the worst over every fixture. Fails (exit 1) when the log has none of them.

Usage: ci/tolerance_table.py gpu-tests.log
"""
import re
import sys

SUMMARY = re.compile(
    r"^(?:\d+: )?\[(geometry|oracle)\] (\S+)\s+(bf16|fp8)\s+(\S+ vs \S+)\s+logits relRMS/bound ([\d.]+) maxRel/bound ([\d.]+); "
    r"worst relRMS ([\d.]+) \((\S+)\) maxRel ([\d.]+) \((\S+)\)")
PLANTED = re.compile(r"^(?:\d+: )?\[planted\] (\S+) (\S+) first divergence (\S+) \((\S+)\); worst error/bound ([\d.]+)")

PAIRS = [  # (row label, pair label in the log, modes)
    ("reference-bf16 vs CUDA bf16 (tight)", "reference-bf16 vs cuda-bf16"),
    ("reference-fp8 vs CUDA fp8 (tight)", "reference-fp8 vs cuda-fp8"),
    ("reference-bf16 vs CUDA fp8 (envelope)", "reference-bf16 vs cuda-fp8"),
    ("fixture fp64 vs CUDA bf16 / fp8", "fixture(fp64) vs cuda-"),
]
GEOMETRIES = ["Qwen3-8B-DFlash-b16", "Qwen3-4B-DFlash-b16", "gpt-oss-20b-DFlash", "Qwen3.8-27B-DFlash2"]


def cell(rows):
    """The worst of several summary rows: stage maxima and logits maxima, each with where."""
    if not rows:
        return "—"
    rms = max(rows, key=lambda r: r["rms"])
    mx = max(rows, key=lambda r: r["max"])
    lr = max(rows, key=lambda r: r["logits_rms"])
    lm = max(rows, key=lambda r: r["logits_max"])
    where = lambda r, stage: stage if len(rows) == 1 or "name" not in r else f"{r['name']} {stage}"
    return (f"{rms['rms']:.2f} ({where(rms, rms['rms_stage'])}) / {mx['max']:.2f} ({where(mx, mx['max_stage'])}); "
            f"logits {lr['logits_rms']:.2f} / {lm['logits_max']:.2f}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = []
    planted = []
    with open(sys.argv[1], encoding="utf-8") as f:
        for line in f:
            m = SUMMARY.match(line)
            if m:
                kind, name, mode, pair, lr, lm, rms, rms_stage, mx, max_stage = m.groups()
                rows.append(dict(kind=kind, name=name, mode=mode, pair=pair, logits_rms=float(lr),
                                 logits_max=float(lm), rms=float(rms), rms_stage=rms_stage, max=float(mx),
                                 max_stage=max_stage))
                continue
            m = PLANTED.match(line)
            if m:
                planted.append(m.groups())
    if not rows:
        sys.exit(f"{sys.argv[1]}: no [geometry] or [oracle] summary lines")
    # Batched runs of a geometry ("<geometry>-batch<N>", the gate's --batched-geometry call): a
    # column each, after the geometry columns, by batch size.
    batched = {r["name"] for r in rows if r["kind"] == "geometry" and re.search(r"-batch\d+$", r["name"])}
    columns = GEOMETRIES + sorted(batched, key=lambda g: (g.rsplit("-batch", 1)[0], int(g.rsplit("-batch", 1)[1])))
    print("| pair | " + " | ".join(re.sub(r"-DFlash(-b16)?(?=$|-batch)", "", g).replace("-batch", " batch ") for g in columns) +
          " | oracle fixtures (worst) |")
    print("|---|" + "---|" * (len(columns) + 1))
    for label, pair in PAIRS:
        match = lambda r: r["pair"].startswith(pair)
        geo = [cell([r for r in rows if r["kind"] == "geometry" and r["name"] == g and match(r)]) for g in columns]
        oracle = [dict(r) for r in rows if r["kind"] == "oracle" and match(r)]
        print(f"| {label} | " + " | ".join(geo) + f" | {cell(oracle)} |")
    for geometry, what, stage, criterion, ratio in planted:
        print(f"| planted {what} vs bf16 reference, {geometry} | first divergence {stage} ({criterion}), "
              f"error/bound {ratio} |" + " |" * len(columns))


if __name__ == "__main__":
    main()
