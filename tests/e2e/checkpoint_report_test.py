#!/usr/bin/env python3
"""Tests of bench/checkpoint_report.py on hand-made raw rows: the time in one save, the
stall fraction over the time not spent saving (epoch 0 left out), the after-phases' rates
over the first start to the last end, the verdicts, and a run lacking a mode refused."""

import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import checkpoint_report  # noqa: E402


def epoch(mode, rank, e, span, wait, save=0.0, saves=0):
    return {"run": 0, "bench": "checkpoint", "mode": mode, "rank": rank, "epoch": e, "batches": 10, "samples": 320,
            "t_start": 100.0 * e, "t_end": 100.0 * e + span, "wait_s": wait, "save_s": save, "saves": saves}


def phase(mode, rank, name, t_start, t_end, nbytes=1e9):
    return {"run": 0, "bench": "checkpoint", "mode": mode, "rank": rank, "phase": name, "bytes": nbytes,
            "t_start": t_start, "t_end": t_end}


def rows():
    out = []
    for rank in (0, 1):
        # Epoch 0 is start-up: its huge wait must not count.
        out += [epoch("none", rank, 0, 10, 9), epoch("none", rank, 1, 10, 0.1)]
        out += [epoch("shardmix", rank, 0, 10, 9), epoch("shardmix", rank, 1, 12, 0.2, save=2.0, saves=4)]
        out += [epoch("torch", rank, 0, 10, 9), epoch("torch", rank, 1, 50, 0.1, save=40.0, saves=4)]
    # Drain: 2 GB from 1000.0 to 1010.0 (200 MB/s); raw write: 2 GB from 2000.0 to 2008.0 (250 MB/s).
    out += [phase("shardmix", 0, "drain", 1000.0, 1009.0), phase("shardmix", 1, "drain", 1000.5, 1010.0)]
    out += [phase("torch", 0, "fs_write", 2000.0, 2008.0), phase("torch", 1, "fs_write", 2001.0, 2007.0)]
    return out


class CheckpointReportTest(unittest.TestCase):
    def report(self, raw_rows):
        with tempfile.TemporaryDirectory() as tmp:
            raw, out = os.path.join(tmp, "raw.jsonl"), os.path.join(tmp, "out.json")
            with open(raw, "w") as f:
                for r in raw_rows + [{"kind": "conditions", "state_mib": 1024}]:
                    f.write(json.dumps(r) + "\n")
            sys.argv = ["checkpoint_report.py", raw, out]
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                checkpoint_report.main()
            with open(out) as f:
                return json.load(f), printed.getvalue()

    def test_figures_and_verdicts(self):
        got, printed = self.report(rows())
        # 2 s over 4 saves against 40 s over 4 saves.
        self.assertAlmostEqual(got["save_s_per_save"]["shardmix"], 0.5)
        self.assertAlmostEqual(got["save_s_per_save"]["torch"], 10.0)
        self.assertAlmostEqual(got["save_s_per_save"]["torch_over_shardmix"], 20.0)
        self.assertTrue(got["save_s_per_save"]["met"])
        # Epoch 1 only: 0.1 s of 10; 0.2 s of 12 - 2 s not saving.
        self.assertAlmostEqual(got["stall_fraction"]["none"], 0.01)
        self.assertAlmostEqual(got["stall_fraction"]["shardmix"], 0.02)
        self.assertAlmostEqual(got["stall_fraction"]["shardmix_rise"], 0.01)
        self.assertAlmostEqual(got["drain"]["drain_bytes_per_s"], 2e9 / 10.0)
        self.assertAlmostEqual(got["drain"]["fs_write_bytes_per_s"], 2e9 / 8.0)
        self.assertAlmostEqual(got["drain"]["ratio"], 0.8)
        self.assertIn("| time in one save | 0.500 s | 10.000 s | - | 20.0x shorter", printed)

    def test_first_saves_are_told_apart_from_later_ones(self):
        # Each rank's saves in epoch order: its first one is the slow one, whatever epoch
        # row comes first in the file. Epoch 0's saves are not measured.
        timed = [r for r in rows() if r["mode"] != "shardmix" or "phase" in r]
        for rank, (first, later) in enumerate(((3.0, [1.0, 1.0]), (5.0, [2.0]))):
            timed.append(dict(epoch("shardmix", rank, 0, 10, 9, save=9.0, saves=1), save_each_s=[9.0]))
            timed.append(dict(epoch("shardmix", rank, 2, 10, 0.1, save=sum(later), saves=len(later)),
                              save_each_s=later))
            timed.append(dict(epoch("shardmix", rank, 1, 10, 0.1, save=first, saves=1), save_each_s=[first]))
        got, printed = self.report(timed)
        fig = got["runs"]["shardmix"][0]
        self.assertAlmostEqual(fig["save_s_first"], 4.0)
        self.assertAlmostEqual(fig["save_s_later"], 4.0 / 3)
        self.assertAlmostEqual(fig["save_s_max"], 5.0)
        self.assertAlmostEqual(fig["save_s_per_save"], 12.0 / 5)
        self.assertIn("each rank's first 4.00 s (mean), the later ones 1.33 s (mean), the slowest 5.00 s", printed)

    def test_rows_without_each_saves_time_have_no_split(self):
        got, printed = self.report(rows())
        self.assertIsNone(got["runs"]["shardmix"][0]["save_s_first"])
        self.assertNotIn("each rank's first", printed)

    def test_missed_targets_say_no(self):
        slow = [dict(r, save_s=r["save_s"] * 5) if r.get("mode") == "shardmix" and "phase" not in r else r
                for r in rows()]
        got, printed = self.report(slow)
        self.assertAlmostEqual(got["save_s_per_save"]["torch_over_shardmix"], 4.0)
        self.assertFalse(got["save_s_per_save"]["met"])
        self.assertIn("| NO |", printed)

    def test_a_missing_mode_is_refused(self):
        with self.assertRaises(SystemExit) as e:
            self.report([r for r in rows() if r["mode"] != "none"])
        self.assertIn("none", str(e.exception.code))


if __name__ == "__main__":
    unittest.main()
