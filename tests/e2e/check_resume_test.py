#!/usr/bin/env python3
"""Tests of the resume oracle (check_resume.py): it passes a correct split of an epoch
over two jobs and fails each way a resume can go wrong, naming it."""

import contextlib
import io
import os
import random
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resume as cr  # noqa: E402
from check_traces_test import DATASET, make_dataset, plan_rows, write_traces  # noqa: E402


def redeal(rows, trainers, batch):
    """The rows of one epoch dealt again to `trainers` ranks, batches numbered from 0."""
    paths = [r for r in rows]
    random.Random(5).shuffle(paths)
    out = []
    per = [paths[t::trainers] for t in range(trainers)]
    for t, mine in enumerate(per):
        for i, row in enumerate(mine):
            out.append(dict(row, rank=t, batch=i // batch, position=i % batch))
    return out


class ResumeCheckerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check_resume_test.")
        self.data = os.path.join(self.tmp, "data")
        make_dataset(self.data)
        rows = plan_rows(trainers=4, per_node=1, batch=2, epochs=3)
        e1 = [r for r in rows if r["epoch"] == 1]
        # Each rank checkpointed after its first batch of epoch 1.
        self.before = [r for r in e1 if r["batch"] < 1]
        self.after = [r for r in e1 if r["batch"] >= 1] + [r for r in rows if r["epoch"] == 2]

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_checker(self, before, after, after_trainers=4, redealt=False, batch=2):
        b, a = os.path.join(self.tmp, "b"), os.path.join(self.tmp, "a")
        shutil.rmtree(b, ignore_errors=True)
        shutil.rmtree(a, ignore_errors=True)
        write_traces(b, before, 4)
        write_traces(a, after, after_trainers)
        argv = ["--dataset", self.data, "--epoch", "1", "--batch-size", str(batch), "--before", b,
                "--before-trainers", "4", "--after", a, "--after-trainers", str(after_trainers), "--later", "1"]
        if redealt:
            argv.append("--redealt")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = cr.main(argv)
        return rc, buf.getvalue()

    def test_a_correct_resume_passes(self):
        rc, out = self.run_checker(self.before, self.after)
        self.assertEqual(rc, 0, out)

    def test_a_sample_delivered_again_after_the_resume_fails(self):
        again = dict(self.before[0], rank=self.before[0]["rank"], batch=1, position=2)
        rc, out = self.run_checker(self.before, self.after + [again])
        self.assertEqual(rc, 1, out)
        self.assertIn("delivered 2 times", out)

    def test_a_sample_lost_by_the_resume_fails(self):
        lost = [r for r in self.after if r["epoch"] == 1][-1]
        rc, out = self.run_checker(self.before, [r for r in self.after if r is not lost])
        self.assertEqual(rc, 1, out)
        self.assertIn("never delivered", out)

    def test_resumed_batches_that_do_not_continue_fail(self):
        shifted = [dict(r, batch=r["batch"] + 1) if r["epoch"] == 1 and r["rank"] == 2 else r for r in self.after]
        rc, out = self.run_checker(self.before, shifted)
        self.assertEqual(rc, 1, out)
        self.assertIn("do not continue at 1", out)

    def test_a_checkpoint_that_covered_nothing_proves_nothing(self):
        rc, out = self.run_checker([], [r for r in plan_rows(trainers=4, per_node=1, batch=2, epochs=3)
                                        if r["epoch"] >= 1])
        self.assertEqual(rc, 1, out)
        self.assertIn("nothing was provoked", out)

    def test_a_re_dealt_rest_passes_and_unequal_batch_counts_fail(self):
        rest = [r for r in self.after if r["epoch"] == 1]
        # Batches of 3 in the new job: 13 samples over 3 ranks give 2 batches each (a trace
        # cannot show an empty last batch, so the shapes avoid them, as the e2e's do).
        later = redeal([r for r in self.after if r["epoch"] == 2], 3, 3)
        rc, out = self.run_checker(self.before, redeal(rest, 3, 3) + later, after_trainers=3, redealt=True, batch=3)
        self.assertEqual(rc, 0, out)
        uneven = redeal(rest, 3, 3)
        victim = max(uneven, key=lambda r: (r["rank"] == 0, r["batch"]))
        uneven = [r for r in uneven if r is not victim] + [dict(victim, rank=1, batch=9, position=0)]
        rc, out = self.run_checker(self.before, uneven + later, after_trainers=3, redealt=True, batch=3)
        self.assertEqual(rc, 1, out)
        self.assertIn("unequal batch counts", out)


if __name__ == "__main__":
    unittest.main()
