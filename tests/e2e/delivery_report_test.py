#!/usr/bin/env python3
"""Tests of bench/delivery_report.py on hand-made raw lines: lockstep runs are rated over
the whole measured span, free-running ones per epoch, and short epochs are flagged."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import delivery_report  # noqa: E402


def row(mode, rank, epoch, t_first, t_last, q=1, touch="none", run=0, gb=1.0):
    """One trainer's epoch: GB bytes, half of them from peers; started 0.1 s before its first
    batch and ended 0.1 s after its last."""
    return {"bench": "shardmix", "mode": mode, "provider": "tcp", "q": q, "touch": touch, "run": run,
            "rank": rank, "epoch": epoch, "bytes": gb * 1e9, "samples": 1000, "peer_bytes": gb * 0.5e9,
            "t_start": t_first - 0.1, "t_first_batch": t_first, "t_last_batch": t_last, "t_end": t_last + 0.1}


class DeliveryReportTest(unittest.TestCase):
    def test_lockstep_rate_is_over_the_whole_measured_span(self):
        # Epochs 1 and 2 of two trainers: first batch at 10.0, last batch done at 14.0.
        rows = [row("lockstep", 0, 1, 10.0, 12.0), row("lockstep", 1, 1, 10.5, 11.9),
                row("lockstep", 0, 2, 12.1, 14.0), row("lockstep", 1, 2, 12.1, 13.0)]
        got = delivery_report.whole_span(rows)
        self.assertAlmostEqual(got["gbps"], 4.0 / 4.0)
        self.assertAlmostEqual(got["peer_gbps"], 2.0 / 4.0)
        self.assertEqual(got["measured"], 1)
        self.assertAlmostEqual(got["epoch_seconds"], (2.0 + 1.9) / 2)

    def test_free_running_rate_is_per_epoch(self):
        # Epoch 1 spans 9.9-12.1 (2.2 s), epoch 2 12.0-14.1 (2.1 s): 2 GB each.
        rows = [row("free", 0, 1, 10.0, 12.0), row("free", 1, 1, 10.5, 11.9),
                row("free", 0, 2, 12.1, 14.0), row("free", 1, 2, 12.1, 13.0)]
        got = delivery_report.per_epoch(rows)
        self.assertEqual(got["measured"], 2)
        self.assertAlmostEqual(got["gbps"], (2 / 2.2 + 2 / 2.1) / 2)

    def test_report_has_both_tables_and_flags_short_epochs(self):
        rows = [{"bench": "memcpy", "threads": 1, "gbps_median": 10.0},
                {"bench": "memcpy", "threads": 2, "gbps_median": 20.0},
                {"provider_run": "tcp", "total_gbps": 2.0}]
        for mode in ("lockstep", "free"):
            for key, q, touch in delivery_report.VARIANTS:
                # Epoch 0 (warm-up, left out) and epoch 1; Q=0 copying gets 0.5 s epochs.
                length = 0.5 if key == "q0" else 3.0
                for rank in (0, 1):
                    rows.append(row(mode, rank, 0, 1.0, 1.0 + length, q, touch))
                    rows.append(row(mode, rank, 1, 5.0, 5.0 + length, q, touch))
        with tempfile.TemporaryDirectory() as d:
            raw, out = os.path.join(d, "raw.jsonl"), os.path.join(d, "out.json")
            with open(raw, "w") as f:
                f.write("\n".join(json.dumps(r) for r in rows) + "\n")
            text = io.StringIO()
            sys.argv = ["delivery_report.py", raw, out, "64", "112"]
            with contextlib.redirect_stdout(text):
                delivery_report.main()
            result = json.load(open(out))
        tcp = result["providers"]["tcp"]
        self.assertAlmostEqual(tcp["q1_none"]["gbps"], 2.0 / 3.0)  # 2 trainers x 1 GB over 3 s
        self.assertAlmostEqual(tcp["peer_vs_raw_fi_read"], (1.0 / 3.0) / 2.0)
        self.assertAlmostEqual(tcp["free_running"]["q1_none"]["gbps"], 2.0 / 3.2)  # t_start..t_end
        self.assertIn("trainers in lockstep, rate over the whole measured span", text.getvalue())
        self.assertIn("Secondary: free-running trainers", text.getvalue())
        self.assertIn("Epochs shorter than 2 s (start-up and boundaries weigh in): tcp q0;", text.getvalue())


if __name__ == "__main__":
    unittest.main()
