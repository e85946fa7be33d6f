#!/usr/bin/env python3
"""Fixture tests of bench/costs_report.py: the arithmetic behind bench/stall.sh,
bench/cost.sh and bench/startup.sh (stall fraction, CPU per GB, bytes per sample, the
start-up phases and targets), and the parser of shardmixd's report lines."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import costs_report as cr  # noqa: E402


def epoch_rows(kind, loader, fraction, run, epoch, t_start, seconds, samples=100, ranks=4):
    return [{"kind": kind, "loader": loader, "fraction": fraction, "run": run, "epoch": epoch, "rank": r,
             "samples": samples, "t_start": t_start + 0.01 * r, "t_end": t_start + seconds} for r in range(ranks)]


class ParseTest(unittest.TestCase):
    def test_report_line_behind_a_log_prefix(self):
        line = "2026-11-24T15:26:55.989 I [rank 2][daemon] startup: rank=2 t_begin=10.5 scan=0.196 total=0.926"
        self.assertEqual(cr.parse_report_line(line, "startup"),
                         {"rank": "2", "t_begin": "10.5", "scan": "0.196", "total": "0.926"})
        self.assertIsNone(cr.parse_report_line("restartup: a=1", "startup"))
        self.assertIsNone(cr.parse_report_line("memory: rss=1", "startup"))
        with self.assertRaisesRegex(ValueError, "'load'"):
            cr.parse_report_line("startup: scan=1 load", "startup")

    def test_daemon_reports_by_rank_as_numbers(self):
        log = "x startup: rank=0 scan=1.5\nnoise\ny startup: rank=1 scan=2\nz memory: rank=0 rss_bytes=na\n"
        self.assertEqual(cr.daemon_reports(log, "startup"), {0: {"rank": 0.0, "scan": 1.5}, 1: {"rank": 1.0, "scan": 2.0}})
        self.assertEqual(cr.daemon_reports(log, "memory")[0]["rss_bytes"], "na")


class StallTest(unittest.TestCase):
    def test_stall_is_fed_minus_synthetic_over_fed_and_shardmix_epoch_0_is_left_out(self):
        rows = []
        # Peak: epoch 0 slow (set-up), epochs 1, 2: 400 samples in 0.1 s = 4000/s.
        rows += epoch_rows("peak", "shardmix", None, 0, 0, 0.0, 5.0)
        rows += epoch_rows("peak", "shardmix", None, 0, 1, 10.0, 0.1)
        rows += epoch_rows("peak", "shardmix", None, 0, 2, 20.0, 0.1)
        rows.append({"kind": "compute", "fraction": 0.8, "compute_ms": 10.0})
        # ShardMix fed: epoch 0 (ignored) 9 s, epochs 1-2 take 1.0 and 1.02 s; synthetic 1.0 s.
        rows += epoch_rows("fed", "shardmix", 0.8, 0, 0, 30.0, 9.0)
        rows += epoch_rows("fed", "shardmix", 0.8, 0, 1, 40.0, 1.0)
        rows += epoch_rows("fed", "shardmix", 0.8, 0, 2, 50.0, 1.02)
        rows += epoch_rows("synthetic", "shardmix", 0.8, 0, 0, 60.0, 1.0, samples=0)
        rows += epoch_rows("synthetic", "shardmix", 0.8, 0, 1, 70.0, 1.0, samples=0)
        # DataLoader: epoch 0 (workers starting) left out too; 2 s against 1 s synthetic = 50% stall.
        rows += epoch_rows("fed", "dataloader", 0.8, 0, 0, 75.0, 4.0)
        rows += epoch_rows("fed", "dataloader", 0.8, 0, 1, 80.0, 2.0)
        rows += epoch_rows("synthetic", "dataloader", 0.8, 0, 0, 90.0, 1.0, samples=0)
        # The DataLoader's probes at no compute: one run per worker count, epoch 0 left out.
        for workers, seconds in ((1, 0.4), (2, 0.2)):
            for epoch in (0, 1):
                rows += [dict(r, config=f"{workers} workers")
                         for r in epoch_rows("torch_probe", "dataloader", None, workers, epoch, 100.0 + epoch, seconds)]
        result = cr.summarize_stall(rows)
        self.assertAlmostEqual(result["shardmix_peak_samples_per_s"]["median"], 4000.0)
        probes = result["dataloader_no_compute_samples_per_s"]
        self.assertAlmostEqual(probes["1 workers"]["median"], 1000.0)
        self.assertAlmostEqual(probes["2 workers"]["median"], 2000.0)
        sm = result["loaders"]["shardmix"]["0.8"]["stall_fraction"]
        self.assertEqual(sm["n"], 2)
        self.assertAlmostEqual(sm["min"], 0.0)
        self.assertAlmostEqual(sm["max"], 0.02 / 1.02)
        self.assertAlmostEqual(result["loaders"]["dataloader"]["0.8"]["stall_fraction"]["median"], 0.5)
        self.assertTrue(result["target_met"])  # median 0.98% < 1%
        self.assertEqual(result["loaders"]["shardmix"]["0.8"]["trainer_wait_fraction"]["n"], 0)  # no stall_seconds
        self.assertIn("**met**", result["markdown"])

    def test_a_fed_epoch_faster_than_synthetic_is_zero_stall_and_a_miss_is_reported(self):
        rows = epoch_rows("peak", "shardmix", None, 0, 1, 0.0, 0.1)
        rows.append({"kind": "compute", "fraction": 0.8, "compute_ms": 10.0})
        rows += [dict(r, stall_seconds=0.3) for r in epoch_rows("fed", "shardmix", 0.8, 0, 1, 10.0, 1.5)]
        rows += epoch_rows("synthetic", "shardmix", 0.8, 0, 0, 20.0, 1.0, samples=0)
        result = cr.summarize_stall(rows)
        self.assertAlmostEqual(result["loaders"]["shardmix"]["0.8"]["stall_fraction"]["median"], 0.5 / 1.5)
        self.assertFalse(result["target_met"])
        self.assertIn("**MISSED**", result["markdown"])
        self.assertAlmostEqual(result["loaders"]["shardmix"]["0.8"]["trainer_wait_fraction"]["median"], 0.2)


class CostTest(unittest.TestCase):
    def test_cpu_per_gb_memory_per_cached_gb_and_bytes_per_sample(self):
        memory = {str(r): {"rank": r, "samples": 1000, "cached_bytes": 250e6, "arena_bytes": 260e6,
                           "staging_bytes": 256e6, "catalog_bytes": 50_000, "catalog_copy_bytes": 90_000,
                           "placement_bytes": 20_000} for r in range(4)}
        row = {"kind": "cost", "dataset": "1000 samples", "epochs": 3, "delivered_bytes": 3e9,
               "cpu_before": 10.0, "cpu_after": 16.0, "memory": memory,
               "rss_end": {str(r): 400e6 for r in range(4)}, "rss_shmem_end": {str(r): 300e6 for r in range(4)}}
        result = cr.summarize_cost([row])
        self.assertAlmostEqual(result["cpu_s_per_gb"]["median"], 2.0)          # 6 CPU s over 3 GB
        self.assertAlmostEqual(result["rss_bytes_per_cached_gb"]["median"], 1.6e9)  # 1.6 GB RSS over 1 GB cached
        self.assertAlmostEqual(result["catalog_bytes_per_sample"]["median"], 50.0)
        self.assertAlmostEqual(result["bookkeeping_bytes_per_sample"]["median"], 110.0)
        parts = result["rss_parts_bytes_per_daemon"]
        self.assertAlmostEqual(parts["staging_resident"]["median"], 40e6)
        self.assertAlmostEqual(parts["other"]["median"], 400e6 - 260e6 - 40e6 - 50_000 - 90_000 - 20_000)
        self.assertTrue(result["catalog_target_met"])
        row["memory"] = {k: dict(v, catalog_bytes=65_000) for k, v in memory.items()}
        self.assertFalse(cr.summarize_cost([row])["catalog_target_met"])

    def test_memory_lines_without_a_catalog_copy(self):
        # Daemons no longer keep a serialized catalog for trainers: the field is absent.
        memory = {str(r): {"rank": r, "samples": 1000, "cached_bytes": 250e6, "arena_bytes": 260e6,
                           "staging_bytes": 256e6, "catalog_bytes": 50_000, "placement_bytes": 20_000}
                  for r in range(4)}
        row = {"kind": "cost", "dataset": "1000 samples", "epochs": 3, "delivered_bytes": 3e9,
               "cpu_before": 10.0, "cpu_after": 16.0, "memory": memory,
               "rss_end": {str(r): 400e6 for r in range(4)}, "rss_shmem_end": {str(r): 300e6 for r in range(4)}}
        result = cr.summarize_cost([row])
        self.assertAlmostEqual(result["bookkeeping_bytes_per_sample"]["median"], 20.0)
        parts = result["rss_parts_bytes_per_daemon"]
        self.assertNotIn("catalog_copy", parts)
        self.assertAlmostEqual(parts["other"]["median"], 400e6 - 260e6 - 40e6 - 50_000 - 20_000)


class StartupTest(unittest.TestCase):
    def run_row(self, samples, t0, load):
        startup = {r: {"rank": r, "t_begin": t0 + 0.5, "t_end": t0 + 0.5 + 3.0 + load, "setup": 0.0, "scan": 2.0,
                       "catalog_exchange": 0.5, "placement": 0.5, "regions": 0.0, "fabric": 0.0, "load": load,
                       "serve_setup": 0.0} for r in range(4)}
        firsts = [{"t_first_batch": t0 + 0.5 + 3.0 + load + 0.25 + 0.01 * r} for r in range(4)]
        run = cr.startup_run(t0, startup, firsts, 2e9)
        run.update({"kind": "startup", "samples": samples, "bytes": 2e9, "median_kib": 2})
        return run

    def test_phases_add_up_to_mpirun_to_first_batch_and_the_target_uses_the_disk_rate(self):
        rows = [self.run_row(1_000_000, 100.0, 10.0), self.run_row(1_000_000, 200.0, 12.0),
                self.run_row(1_000_000, 300.0, 11.0)]
        rows += [{"kind": "disk_read", "samples": 1_000_000, "threads": 16, "mbps": m} for m in (100.0, 200.0, 150.0)]
        one = rows[0]
        self.assertAlmostEqual(one["phases"]["launch"], 0.5)
        self.assertAlmostEqual(one["phases"]["trainers"], 0.28)  # the last trainer's first batch
        self.assertAlmostEqual(sum(one["phases"].values()), one["total"])
        self.assertAlmostEqual(one["load_rate_mbps"], 200.0)
        result = cr.summarize_startup(rows)
        entry = result["sizes"]["1000000"]
        self.assertAlmostEqual(entry["total_s"]["median"], 0.5 + 3.0 + 11.0 + 0.28)
        self.assertAlmostEqual(entry["bytes_read_time_s"], 2e9 / 150e6)
        self.assertAlmostEqual(entry["target_s"], 10.0 + 2e9 / 150e6)
        self.assertTrue(entry["target_met"])  # 14.78 s < 23.3 s
        self.assertIn("**met**", result["markdown"])
        self.assertIn("1,000,000 samples", result["markdown"])
        # A disk 10x faster: the bytes take 2 s, the target is 12 s, 14.78 s misses it.
        fast = [r if r["kind"] != "disk_read" else dict(r, mbps=1000.0) for r in rows]
        self.assertFalse(cr.summarize_startup(fast)["sizes"]["1000000"]["target_met"])
        self.assertIn("**MISSED**", cr.summarize_startup(fast)["markdown"])

    def test_small_sizes_have_no_target(self):
        rows = [self.run_row(16384, 0.0, 1.0), {"kind": "disk_read", "samples": 16384, "threads": 16, "mbps": 100.0}]
        self.assertNotIn("target_s", cr.summarize_startup(rows)["sizes"]["16384"])


if __name__ == "__main__":
    unittest.main()
