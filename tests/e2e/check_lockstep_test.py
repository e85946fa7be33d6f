#!/usr/bin/env python3
"""Tests of check_lockstep.py on hand-made batch times: it passes trainers held in step and
fails one that began waiting for the next batch before another had the current one."""

import contextlib
import csv
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_lockstep  # noqa: E402


def write_times(trace_dir, rank, rows):
    """rows: [(batch, t_request, t_received)] of epoch 0."""
    with open(os.path.join(trace_dir, "batch-rank-%d.csv" % rank), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "rank", "batch", "t_request", "t_received"])
        for batch, t_request, t_received in rows:
            w.writerow([0, rank, batch, t_request, t_received])


class CheckLockstepTest(unittest.TestCase):
    def run_checker(self, rank_rows, *extra):
        with tempfile.TemporaryDirectory() as d:
            for rank, rows in enumerate(rank_rows):
                write_times(d, rank, rows)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = check_lockstep.main([d, "--trainers", str(len(rank_rows)), *extra])
            return rc, out.getvalue()

    def test_in_step_passes(self):
        # Rank 1 gets batch 0 late (2.5); both ask for batch 1 only after it (3.0).
        rc, out = self.run_checker([[(0, 1.0, 1.5), (1, 3.0, 3.2)], [(0, 1.0, 2.5), (1, 3.0, 3.1)]],
                                   "--expect-in-step")
        self.assertEqual(rc, 0, out)
        self.assertIn("1 batch boundaries checked, 0 where a rank ran ahead", out)

    def test_rank_ahead_fails_when_expected_in_step(self):
        # Rank 0 asks for batch 1 at 2.0, before rank 1 has batch 0 (2.5).
        rows = [[(0, 1.0, 1.5), (1, 2.0, 3.2)], [(0, 1.0, 2.5), (1, 3.0, 3.1)]]
        rc, out = self.run_checker(rows, "--expect-in-step")
        self.assertEqual(rc, 1, out)
        self.assertIn("rank 0 began waiting for batch 1 500.000 ms before rank 1 had batch 0", out)
        rc, out = self.run_checker(rows)  # reported only
        self.assertEqual(rc, 0, out)
        self.assertIn("1 where a rank ran ahead", out)

    def test_different_batch_numbers_fail(self):
        rc, out = self.run_checker([[(0, 1.0, 1.5), (1, 2.0, 2.2)], [(0, 1.0, 1.5)]])
        self.assertEqual(rc, 1, out)
        self.assertIn("different batch numbers", out)

    def test_missing_rank_fails(self):
        with tempfile.TemporaryDirectory() as d:
            write_times(d, 0, [(0, 1.0, 1.5), (1, 2.0, 2.2)])
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = check_lockstep.main([d, "--trainers", "2"])
            self.assertEqual(rc, 1, out.getvalue())
            self.assertIn("expected 0..1", out.getvalue())


if __name__ == "__main__":
    unittest.main()
