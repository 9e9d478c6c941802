#!/usr/bin/env python3
"""Two builds of the propose benchmark timed in one call: which of two commits is faster.

    ci/ab_bench.py BASE NEW [--base-env K=V]... [--new-env K=V]... [--rounds N] [--out FILE] -- BENCH_ARGS...

BASE and NEW are cuda_propose_bench binaries (ci/gpu-remote.sh stage --baseline REV packs REV's as
build-baseline/release/bench/cuda_propose_bench), or one binary twice with environments of its own
(--base-env DFLASH_CUDA_KERNELS=w8a8_m64=cublaslt --new-env DFLASH_CUDA_KERNELS=w8a8_m64=cutlass:
which lever value is faster). Each round runs both with BENCH_ARGS, in the order
BASE NEW, then NEW BASE, and so on (ABBA), so that a machine that drifts through the call weighs on
both alike. Every run's table must hold the same rows (precision, batch, context); a row's medians
are the median over the rounds of each run's median. Prints, and writes to --out, a markdown table
of both medians and NEW / BASE per row. Exit 1 when a run fails or the tables disagree on their rows.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile


def parse_table(path):
    """{(precision, batch, context): median µs} and the table's first line (device, peaks)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    rows, header = {}, lines[0] if lines else ""
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) < 4 or cells[0] == "precision" or cells[0].startswith("---"):
            continue
        rows[(cells[0], int(cells[1]), int(cells[2]))] = float(cells[3])
    if not rows:
        raise ValueError(f"{path}: no result rows")
    return rows, header


def run(binary, args, env, scratch, index):
    table = os.path.join(scratch, f"run{index}.md")
    done = subprocess.run([binary, *args, "--markdown", table], capture_output=True, text=True,
                          env={**os.environ, **env})
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
        raise RuntimeError(f"{binary} exited {done.returncode}:\n{tail}")
    return parse_table(table)


def main():
    argv = sys.argv[1:]
    bench_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--base-env", action="append", default=[], metavar="K=V", help="set for BASE's runs")
    parser.add_argument("--new-env", action="append", default=[], metavar="K=V", help="set for NEW's runs")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each binary (default 2)")
    parser.add_argument("--out", help="also write the table here")
    opts = parser.parse_args(own)
    if opts.rounds < 1:
        parser.error("--rounds must be at least 1")
    for binary in (opts.base, opts.new):
        if not os.access(binary, os.X_OK):
            parser.error(f"{binary}: not an executable")
    envs = {}
    for side, pairs in (("base", opts.base_env), ("new", opts.new_env)):
        bad = [p for p in pairs if "=" not in p or p.startswith("=")]
        if bad:
            parser.error(f"--{side}-env {bad[0]!r}: expected K=V")
        envs[side] = dict(p.split("=", 1) for p in pairs)

    medians = {"base": [], "new": []}
    header = ""
    with tempfile.TemporaryDirectory() as scratch:
        index = 0
        for r in range(opts.rounds):
            for side in (("base", "new") if r % 2 == 0 else ("new", "base")):
                binary = opts.base if side == "base" else opts.new
                print(f"ab_bench: round {r + 1}, {side} ({binary})", flush=True)
                try:
                    rows, header = run(binary, bench_args, envs[side], scratch, index)
                except (RuntimeError, ValueError) as error:
                    print(f"ab_bench: {error}", file=sys.stderr)
                    return 1
                medians[side].append(rows)
                index += 1
    keys = list(medians["base"][0])
    for side, runs in medians.items():
        for i, rows in enumerate(runs):
            if set(rows) != set(keys):
                print(f"ab_bench: {side} run {i + 1} has rows {sorted(rows)}, the first base run {sorted(keys)}",
                      file=sys.stderr)
                return 1

    def named(side, binary):
        return " ".join([f"{k}={v}" for k, v in envs[side].items()] + [binary])

    out = [f"A/B of cuda_propose_bench {' '.join(bench_args)}: base {named('base', opts.base)}, "
           f"new {named('new', opts.new)}, "
           f"{opts.rounds} run(s) each in ABBA order; last table's line: {header}", "",
           "| precision | batch | context | base median µs | new median µs | new / base |",
           "|---|---|---|---|---|---|"]
    for key in keys:
        base = statistics.median(rows[key] for rows in medians["base"])
        new = statistics.median(rows[key] for rows in medians["new"])
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {base:.1f} | {new:.1f} | {new / base:.3f} |")
    text = "\n".join(out) + "\n"
    print(text, end="")
    if opts.out:
        with open(opts.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
