#!/usr/bin/env python3
"""Tests of check_overtake.py and check_min_entropy.py on hand-made traces and logs: each
passes a correct case and fails the broken one it exists to catch."""

import contextlib
import csv
import io
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_min_entropy  # noqa: E402
import check_overtake  # noqa: E402

HEADER = ["epoch", "rank", "batch", "position", "sample_id", "path", "label", "bytes", "xxh64", "tier", "owner"]


def write_trace(trace_dir, batches, rank=0, epoch=0):
    """batches: [[(path, label), ...], ...] of one rank and epoch, in delivery order."""
    os.makedirs(trace_dir, exist_ok=True)
    with open(os.path.join(trace_dir, "rank-%d.csv" % rank), "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for b, batch in enumerate(batches):
            for pos, (path, label) in enumerate(batch):
                w.writerow([epoch, rank, b, pos, int(path[1:]), path, label, 1, "0" * 16, "local", 0])


def run(main, argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="promises_checkers_test.")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class OvertakeTest(Base):
    # Planned: 3 batches of 4, samples s0..s11 in order.
    PLAN = [[("s%d" % (4 * b + i), 0) for i in range(4)] for b in range(3)]

    def check(self, delivered, *flags, window=2):
        planned, got = os.path.join(self.tmp, "planned"), os.path.join(self.tmp, "got")
        write_trace(planned, self.PLAN)
        write_trace(got, delivered)
        return run(check_overtake.main, [planned, got, "--window", str(window), *flags])

    def test_the_planned_order_has_no_overtake(self):
        self.assertEqual(self.check(self.PLAN, "--expect-same-order")[0], 0)
        rc, out = self.check(self.PLAN, "--expect-overtake")
        self.assertEqual(rc, 1)
        self.assertIn("no sample overtook", out)

    def test_a_sample_from_the_window_overtakes_a_late_one(self):
        late = [[("s0", 0), ("s1", 0), ("s2", 0), ("s4", 0)], [("s3", 0), ("s5", 0), ("s6", 0), ("s7", 0)], self.PLAN[2]]
        rc, out = self.check(late, "--expect-overtake")
        self.assertEqual(rc, 0, out)
        self.assertIn("'s4' (planned position 4) delivered in batch 0 before 's3' (planned position 3)", out)
        rc, out = self.check(late, "--expect-same-order")
        self.assertEqual(rc, 1)
        self.assertIn("expected the planned order", out)

    def test_a_sample_beyond_the_window_fails(self):
        far = [[("s0", 0), ("s1", 0), ("s2", 0), ("s6", 0)], [("s3", 0), ("s4", 0), ("s5", 0), ("s7", 0)], self.PLAN[2]]
        rc, out = self.check(far, "--expect-overtake", window=2)
        self.assertEqual(rc, 1)
        self.assertIn("'s6' (planned position 6) delivered in batch 0, outside its window 2", out)

    def test_other_samples_than_planned_fail(self):
        other = [self.PLAN[0], self.PLAN[1], [("s8", 0), ("s9", 0), ("s10", 0), ("s99", 0)]]
        rc, out = self.check(other, "--expect-same-order")
        self.assertEqual(rc, 1)
        self.assertIn("other samples than the plan", out)


class MinEntropyTest(Base):
    # C = 4 classes, batches of 4: [0,0,1,1] scores ln 2 / ln 4 = 0.5, [0,1,2,3] scores 1.
    BATCHES = [[("s0", 0), ("s1", 0), ("s2", 1), ("s3", 1)], [("s4", 0), ("s5", 1), ("s6", 2), ("s7", 3)]]

    def check(self, log_lines, *flags, floor=0.7, ceiling=1.0):
        trace = os.path.join(self.tmp, "trace")
        write_trace(trace, self.BATCHES)
        log = os.path.join(self.tmp, "daemons.log")
        with open(log, "w", encoding="utf-8") as f:
            f.write("\n".join(log_lines) + "\n")
        return run(check_min_entropy.main, [trace, "--log", log, "--daemons", "2", "--epochs", "1", "--classes", "4",
                                            "--floor", str(floor), "--ceiling", str(ceiling), *flags])

    @staticmethod
    def chose(rank, q, mean):
        return ("12:00:00.000 I [rank %d][service] epoch 0: shuffle.min_entropy chose exchange_fraction %s "
                "(planned label entropy mean %.3f, p5 0.500; 4 candidates)" % (rank, q, mean))

    @staticmethod
    def unmet(rank, q, mean):
        return ("12:00:00.000 W [rank %d][service] epoch 0: no exchange_fraction up to the configured ceiling "
                "reaches shuffle.min_entropy; using %s (planned label entropy mean %.3f)" % (rank, q, mean))

    def test_a_met_floor_passes(self):
        rc, out = self.check([self.chose(0, 0.5, 0.75), self.chose(1, 0.5, 0.75)])
        self.assertEqual(rc, 0, out)
        self.assertIn("delivered entropy 0.7500", out)

    def test_delivery_below_the_floor_fails(self):
        rc, out = self.check([self.chose(0, 0.5, 0.75), self.chose(1, 0.5, 0.75)], floor=0.8)
        self.assertEqual(rc, 1)
        self.assertIn("delivered label entropy 0.7500 is below shuffle.min_entropy 0.8", out)

    def test_a_logged_figure_that_was_not_delivered_fails(self):
        rc, out = self.check([self.chose(0, 0.5, 0.8), self.chose(1, 0.5, 0.8)])
        self.assertEqual(rc, 1)
        self.assertIn("delivered label entropy 0.7500, the daemons logged 0.800", out)

    def test_a_daemon_that_did_not_log_or_the_ceiling_fails(self):
        rc, out = self.check([self.chose(0, 0.5, 0.75)])
        self.assertEqual(rc, 1)
        self.assertIn("1 of 2 daemons logged", out)
        rc, out = self.check([self.chose(0, 1.0, 0.75), self.chose(1, 1.0, 0.75)])
        self.assertEqual(rc, 1)
        self.assertIn("not below the ceiling", out)

    def test_an_unreachable_floor_is_reported_and_not_met(self):
        lines = [self.unmet(0, 0.05, 0.75), self.unmet(1, 0.05, 0.75)]
        rc, out = self.check(lines, "--unreachable", floor=0.9, ceiling=0.05)
        self.assertEqual(rc, 0, out)
        rc, out = self.check(lines, "--unreachable", floor=0.7, ceiling=0.05)
        self.assertEqual(rc, 1)
        self.assertIn("reaches the floor 0.7 said to be unreachable", out)


if __name__ == "__main__":
    unittest.main()
