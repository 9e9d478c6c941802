"""ci/ab_bench.py against fake benchmarks that write known tables: the ABBA order, the median over
rounds, the ratio, one binary under two environments, and the refusals (a failing run, tables that
disagree on their rows, a missing binary, an environment entry without '=')."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AB_BENCH = os.path.join(ROOT, "ci", "ab_bench.py")

# A fake cuda_propose_bench: logs its name (plus $FAKE_SUFFIX), then writes the table of its next run from MEDIANS
# (one "fp8 batch 1" median per run, "fp8 batch 8" twice that), or fails as FAIL says.
FAKE = textwrap.dedent("""\
    #!{python}
    import os, sys
    name, log = {name!r} + os.environ.get("FAKE_SUFFIX", ""), {log!r}
    with open(log, "a") as f:
        f.write(name + "\\n")
    runs = open(log).read().split().count(name)
    medians = {medians!r}
    if {fail!r}:
        print("no device", file=sys.stderr)
        sys.exit(3)
    median = medians[(runs - 1) % len(medians)]
    rows = [("fp8", 1, median), ("fp8", 8, 2 * median)] + ([("bf16", 1, 5.0)] if {extra_row!r} else [])
    out = sys.argv[sys.argv.index("--markdown") + 1]
    with open(out, "w") as f:
        f.write("Measured today on a fake GPU.\\n\\n| precision | batch | context | median µs | p10–p90 µs |\\n")
        f.write("|---|---|---|---|---|\\n")
        for precision, batch, m in rows:
            f.write(f"| {{precision}} | {{batch}} | 1024 | {{m:.1f}} | 1.0–2.0 |\\n")
    """)


class AbBench(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.log = os.path.join(self.dir.name, "order.log")

    def tearDown(self):
        self.dir.cleanup()

    def fake(self, name, medians, fail=False, extra_row=False):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(FAKE.format(python=sys.executable, name=name, log=self.log, medians=medians, fail=fail,
                                extra_row=extra_row))
        os.chmod(path, 0o755)
        return path

    def ab(self, base, new, *extra):
        return subprocess.run([sys.executable, AB_BENCH, base, new, *extra, "--", "--batches", "1", "8"],
                              capture_output=True, text=True)

    def test_abba_order_medians_over_rounds_and_ratio(self):
        base = self.fake("base", [100.0, 130.0, 90.0])
        new = self.fake("new", [110.0, 99.0, 121.0])
        out = os.path.join(self.dir.name, "ab.md")
        done = self.ab(base, new, "--rounds", "3", "--out", out)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.log) as f:
            self.assertEqual(f.read().split(), ["base", "new", "new", "base", "base", "new"])
        # medians over the rounds: base 100 (of 100, 130, 90), new 110 (of 110, 99, 121).
        self.assertIn("| fp8 | 1 | 1024 | 100.0 | 110.0 | 1.100 |", done.stdout)
        self.assertIn("| fp8 | 8 | 1024 | 200.0 | 220.0 | 1.100 |", done.stdout)
        self.assertIn("cuda_propose_bench --batches 1 8", done.stdout)
        with open(out) as f:
            self.assertEqual(f.read(), done.stdout[done.stdout.index("A/B of"):])

    def test_one_binary_under_two_environments(self):
        # The same fake twice: each side's runs see only their own variable (the log names them).
        fake = self.fake("bench", [100.0])
        done = self.ab(fake, fake, "--base-env", "FAKE_SUFFIX=-cublaslt", "--new-env", "FAKE_SUFFIX=-cutlass")
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.log) as f:
            self.assertEqual(f.read().split(), ["bench-cublaslt", "bench-cutlass", "bench-cutlass", "bench-cublaslt"])
        self.assertIn("base FAKE_SUFFIX=-cublaslt", done.stdout)
        self.assertIn("new FAKE_SUFFIX=-cutlass", done.stdout)
        bad = self.ab(fake, fake, "--new-env", "NOEQUALS")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--new-env 'NOEQUALS': expected K=V", bad.stderr)

    def test_a_failing_run_is_named(self):
        done = self.ab(self.fake("base", [100.0]), self.fake("new", [100.0], fail=True))
        self.assertEqual(done.returncode, 1)
        self.assertIn("new exited 3", done.stderr)
        self.assertIn("no device", done.stderr)

    def test_tables_with_other_rows_are_refused(self):
        done = self.ab(self.fake("base", [100.0]), self.fake("new", [100.0], extra_row=True))
        self.assertEqual(done.returncode, 1)
        self.assertIn("new run 1 has rows", done.stderr)

    def test_a_missing_binary_is_refused(self):
        done = self.ab(os.path.join(self.dir.name, "absent"), self.fake("new", [1.0]))
        self.assertEqual(done.returncode, 2)
        self.assertIn("absent: not an executable", done.stderr)


if __name__ == "__main__":
    unittest.main()
