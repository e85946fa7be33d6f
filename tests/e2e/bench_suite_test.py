#!/usr/bin/env python3
"""The parts of bench/run.sh's tooling that can be checked without timing anything:

- shardmix-bench-posix-reader reads every file of a tiny dataset exactly once per epoch,
  in an order that changes between epochs and repeats for the same seed, and names the
  file it could not read;
- shardmix-bench-inplace accounts for every byte of the dataset across its processes;
- bench/suite_report.py turns a fixture of raw lines (figures chosen so each verdict is
  known) into latest.json / latest.md with the expected keys, the span aggregation, the
  DataLoader's best configurations and the met/missed verdicts, and merges a colleague's
  part (JSON with a "markdown" field) or says it is absent.

    python3 tests/e2e/bench_suite_test.py BUILD_DIR [-v]
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("SHARDMIX_BUILD_DIR", os.path.join(REPO, "build"))


def run(*cmd, ok=True):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if ok and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def json_lines(stdout):
    return [json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("JSON ")]


class Tools(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="smx-bench-suite-")
        cls.data = os.path.join(cls.tmp.name, "data")
        run(os.path.join(BUILD, "tools/shardmix-gen"), "--out", cls.data, "--samples", 257, "--classes", 5,
            "--median-kib", 2, "--seed", 3, "-q")
        cls.files = {}
        for dirpath, _, names in os.walk(cls.data):
            for n in names:
                full = os.path.join(dirpath, n)
                cls.files[os.path.relpath(full, cls.data)] = os.path.getsize(full)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def reader(self, *extra):
        listing = os.path.join(self.tmp.name, "list.tsv")
        proc = run(os.path.join(BUILD, "bench/shardmix-bench-posix-reader"), "--dataset", self.data, "--list", listing,
                   *extra)
        with open(listing) as f:
            rows = [line.rstrip("\n").split("\t") for line in f]
        return proc, rows

    def test_posix_reader_reads_every_file_once_per_epoch(self):
        proc, rows = self.reader("--threads", 4, "--epochs", 3, "--seed", 7)
        per_epoch = {}
        for epoch, path in rows:
            per_epoch.setdefault(int(epoch), []).append(path)
        self.assertEqual(sorted(per_epoch), [0, 1, 2])
        for epoch, paths in per_epoch.items():
            counts = Counter(paths)
            self.assertEqual(set(counts), set(self.files), f"epoch {epoch}: files missed or unknown")
            self.assertEqual(max(counts.values()), 1, f"epoch {epoch}: a file read twice")
        stats = json_lines(proc.stdout)
        self.assertEqual(len(stats), 3)
        for s in stats:
            self.assertEqual(s["samples"], len(self.files))
            self.assertEqual(s["bytes"], sum(self.files.values()))

    def test_posix_reader_order_is_seeded_and_changes_per_epoch(self):
        # One thread, so the listing is the order itself.
        _, first = self.reader("--threads", 1, "--epochs", 2, "--seed", 11)
        _, again = self.reader("--threads", 1, "--epochs", 2, "--seed", 11)
        self.assertEqual(first, again)
        epoch0 = [p for e, p in first if e == "0"]
        epoch1 = [p for e, p in first if e == "1"]
        self.assertNotEqual(epoch0, epoch1)

    def test_posix_reader_names_a_missing_dataset(self):
        missing = os.path.join(self.tmp.name, "no-such-dataset")
        proc = run(os.path.join(BUILD, "bench/shardmix-bench-posix-reader"), "--dataset", missing, ok=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("no-such-dataset", proc.stderr)

    def test_inplace_accounts_for_every_byte(self):
        proc = run(os.path.join(BUILD, "bench/shardmix-bench-inplace"), "--dataset", self.data, "--processes", 3,
                   "--passes", 2)
        (stats,) = json_lines(proc.stdout)
        self.assertEqual(stats["processes"], 3)
        self.assertEqual(stats["bytes"], sum(self.files.values()))
        self.assertLessEqual(stats["gbps_min"], stats["gbps_median"])
        self.assertLessEqual(stats["gbps_median"], stats["gbps_max"])


def ranked(bench, ranks, epoch, t0, seconds, samples, nbytes, **fields):
    """Per-rank epoch records that all span [t0, t0 + seconds]: the aggregate is known."""
    return [dict(bench=bench, rank=r, epoch=epoch, samples=samples // ranks, bytes=nbytes // ranks,
                 t_start=t0, t_end=t0 + seconds, **fields) for r in range(ranks)]


def fixture():
    """Raw lines for 4 nodes/ranks, one provider. Every measured epoch of a system has the
    same span, so its median is exact; epoch 0 is deliberately absurd (must be ignored)."""
    rows = [{"phase": "start", "phase_loadavg": "1.00 1.00 1.00"}]
    ds = {"dataset": "mixed"}
    for rep, gbps in enumerate((8.0, 10.0, 12.0)):  # three repetitions: median 10
        rows.append(dict(bench="memcpy", threads=1, rep=rep, gbps_median=gbps, gbps_min=gbps - 1, gbps_max=gbps + 1,
                         samples_per_s_median=gbps * 8000, **ds))
    for p in (1, 4):
        rows.append(dict(bench="inplace", processes=p, gbps_median=10.0, gbps_min=9.0, gbps_max=11.0,
                         samples_per_s_median=80000.0, **ds))
    rows.append(dict(bench="fabric_read", provider_run="shm", ranks=4, total_gbps=4.0, total_ops_per_s=30000.0, **ds))

    def sm(nodes, q, touch, cache, samples_per_s, gbps, peer_gbps=0.0, rep=0):
        # Each repetition's clock starts far from the others': merging two repetitions'
        # epochs into one span would show as a rate near zero.
        out = []
        for epoch in range(4):
            secs = 100.0 if epoch == 0 else 1.0
            out += ranked("shardmix", nodes, epoch, 10000.0 * rep + 10.0 * epoch, secs, int(samples_per_s),
                          int(gbps * 1e9), peer_bytes=int(peer_gbps * 1e9) // nodes, provider="shm", nodes=nodes,
                          q=q, touch=touch, cache=cache, rep=rep, **ds)
        return out
    rows += sm(1, 0, "copy", "warm", 72000, 9.0)           # local vs memcpy 0.9: met
    rows += sm(4, 0, "copy", "warm", 56000, 7.0)           # local vs in-place 0.7: missed
    rows += sm(4, 1, "copy", "warm", 40000, 5.0)
    rows += sm(4, 1, "copy", "warm", 40000, 5.0, rep=1)
    rows += sm(4, 1, "copy", "dropped", 40000, 5.0)
    rows += sm(4, 1, "none", "warm", 40000, 5.0, 3.0)      # peer vs fi_read 0.75: missed

    def dl(world, workers, collate, cache, samples_per_s):
        out = []
        for epoch in range(4):
            secs = 100.0 if epoch == 0 else 2.0
            out += ranked("torch", world, epoch, 10.0 * epoch, secs, int(samples_per_s * secs),
                          int(samples_per_s * secs * 100000), workers=workers, collate=collate, world=world,
                          drop_caches=cache == "dropped", **ds)
        return out
    rows += dl(4, 0, "default", "dropped", 3000)           # best dropped: 40000 / 3000 = 13.3: met
    rows += dl(4, 2, "concat", "dropped", 2000)
    rows += dl(4, 0, "concat", "warm", 20000)              # best warm: 2.0: met
    rows += dl(4, 1, "default", "warm", 16000)             # best overlapping: 2.5 < 3: missed
    for epoch in range(3):
        rows.append(dict(bench="posix_reader", epoch=epoch, threads=16, drop_caches=False, samples=4, bytes=4,
                         seconds=1, samples_per_s=1000.0 * (epoch + 1), gbps=0.1 * (epoch + 1), t_start=0, t_end=1, **ds))
    rows.append({"phase": "end", "phase_loadavg": "2.00 2.00 2.00"})
    return rows


class Report(unittest.TestCase):
    def report(self, *extra):
        tmp = tempfile.mkdtemp(prefix="smx-suite-report-")
        raw = os.path.join(tmp, "raw.jsonl")
        with open(raw, "w") as f:
            for row in fixture():
                f.write(json.dumps(row) + "\n")
        out = os.path.join(tmp, "out")
        run(sys.executable, os.path.join(REPO, "bench/suite_report.py"), "--raw", raw, "--out-dir", out,
            "--no-plots", "--quick", 1, "--samples", 16384, "--repo", REPO, *extra)
        with open(os.path.join(out, "latest.json")) as f:
            result = json.load(f)
        with open(os.path.join(out, "latest.md")) as f:
            md = f.read()
        return tmp, result, md

    def test_keys_aggregation_and_verdicts(self):
        _, result, md = self.report("--part-absent", "stall")
        for key in ("meta", "results", "targets", "markdown", "parts_missing"):
            self.assertIn(key, result)
        for key in ("date", "machine", "command", "loadavg_start", "loadavg_end"):
            self.assertIn(key, result["meta"])
        for key in ("nproc", "cpu", "ram_gib", "kernel", "git_commit"):
            self.assertIn(key, result["meta"]["machine"])
        mixed = result["results"]["mixed"]
        q1 = mixed["shardmix"]["shm"]["4"]["q1_copy_warm"]
        self.assertAlmostEqual(q1["samples_per_s"]["median"], 40000, delta=1)
        self.assertAlmostEqual(q1["samples_per_s"]["min"], 40000, delta=1)  # repetitions' spans kept apart
        self.assertEqual(q1["samples_per_s"]["n"], 6)  # 2 repetitions x epochs 1..3; epoch 0 left out
        self.assertEqual(mixed["memcpy_1t"]["gbps"], {"median": 10.0, "min": 8.0, "max": 12.0, "n": 3})
        warm = mixed["dataloader"]["4"]["warm"]
        self.assertEqual((warm["best"], warm["best_overlapping"]), ("0:concat", "1:default"))
        self.assertEqual(mixed["dataloader"]["4"]["dropped"]["best"], "0:default")
        posix = mixed["posix"]["16"]["warm"]["samples_per_s"]
        self.assertEqual((posix["median"], posix["n"]), (2500.0, 2))
        verdicts = {(t["target"], t["nodes"]): (round(t["ratio"], 3), t["met"]) for t in result["targets"]}
        self.assertEqual(verdicts, {
            ("local_vs_memcpy", 1): (0.9, True),
            ("local_vs_inplace", 1): (0.9, True),
            ("local_vs_inplace", 4): (0.7, False),
            ("peer_vs_fi_read", 4): (0.75, False),
            ("cold_vs_dataloader", 4): (13.333, True),
            ("warm_vs_dataloader", 4): (2.0, True),
            ("warm_vs_overlapping", 4): (2.5, False),
        })
        self.assertIn("**missed**", md)
        self.assertIn("| met |", md)
        self.assertIn("stall: not run", md)
        self.assertEqual(result["meta"]["loadavg_start"], "1.00 1.00 1.00")

    def test_merges_a_colleagues_part(self):
        tmp = tempfile.mkdtemp(prefix="smx-suite-part-")
        part = os.path.join(tmp, "cost.json")
        with open(part, "w") as f:
            json.dump({"markdown": "| cost | 1 |\n|---|---|", "cpu_seconds_per_gb": 0.5}, f)
        _, result, md = self.report("--part", f"cost={part}")
        self.assertEqual(result["cost"]["cpu_seconds_per_gb"], 0.5)
        self.assertIn("| cost | 1 |", md)

    def test_a_reused_part_says_so_with_its_date(self):
        tmp = tempfile.mkdtemp(prefix="smx-suite-part-")
        part = os.path.join(tmp, "stall-latest.json")
        with open(part, "w") as f:
            json.dump({"markdown": "| stall | 2% |", "date": "2026-01-02 03:04 UTC"}, f)
        _, result, md = self.report("--part", f"stall={part}", "--reused", "stall")
        self.assertIn("stall-latest.json", result["stall"]["reused_from"])
        self.assertIn("Not re-run by this run", md)
        self.assertIn("2026-01-02 03:04 UTC", md)
        _, fresh, fresh_md = self.report("--part", f"stall={part}")
        self.assertNotIn("reused_from", fresh["stall"])
        self.assertNotIn("Not re-run by this run", fresh_md)

    def test_a_part_without_markdown_is_reported_missing(self):
        tmp = tempfile.mkdtemp(prefix="smx-suite-part-")
        part = os.path.join(tmp, "startup.json")
        with open(part, "w") as f:
            json.dump({"seconds": 3}, f)
        _, result, _ = self.report("--part", f"startup={part}")
        self.assertNotIn("startup", result)
        self.assertIn("markdown", result["parts_missing"]["startup"])


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        BUILD = sys.argv.pop(1)
    unittest.main()
