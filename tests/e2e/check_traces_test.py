#!/usr/bin/env python3
"""Tests of the trace checker (check_traces.py) on hand-made datasets and traces.

Each test builds a tiny folder-format dataset, writes traces the way a correct
ShardMix run would (a seeded per-epoch permutation dealt round-robin to the
ranks, batches of B), breaks them in one specific way, and asserts that the
checker fails with the right kind of problem naming the right sample.
"""

import contextlib
import csv
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_traces as ct  # noqa: E402

# The tiny dataset: bytewise class order is B_upper (0), a_lower (1), c (2).
DATASET = {
    "B_upper/x0.bin": b"x0" * 40,
    "B_upper/x1.bin": bytes(range(256)) * 3,
    "B_upper/with space.bin": b"spaces are fine",
    "B_upper/empty.bin": b"",
    "a_lower/y0.bin": b"y" * 1000,
    'a_lower/comma,and"quote.bin': b"csv needs quoting",
    "a_lower/\u00fcn\u00efc\u00f8d\u00e9-\u6570\u636e.bin": "unicode".encode() * 9,
    "a_lower/nested/deeper/z.bin": b"zz" * 33,
    "c/c0.bin": b"c0" * 17,
    "c/c1.bin": b"c1" * 19,
    "c/c2.bin": b"c2" * 23,
    "c/c3.bin": os.urandom(4097),
    "c/new\nline.bin": b"newline in the name",
}
LABELS = {"B_upper": 0, "a_lower": 1, "c": 2}
# Present on disk but not samples: hidden files and dirs, files in the root.
NOT_SAMPLES = {
    "a_lower/.hidden.bin": b"hidden file",
    ".hidden_dir/h.bin": b"hidden class dir",
    "c/.git/objects.bin": b"hidden subdir",
    "README": b"root-level file, no class",
}


def make_dataset(root):
    for rel, data in list(DATASET.items()) + list(NOT_SAMPLES.items()):
        full = os.path.join(root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
    os.makedirs(os.path.join(root, "d_empty_class"), exist_ok=True)  # label 3, no files


def plan_rows(trainers=4, per_node=2, batch=2, epochs=2, drop_last=False, seed=1,
              exchange=True):
    """Rows of a correct run: {'epoch','rank','batch','position',...} dicts."""
    paths = sorted(DATASET)
    ids = {p: i for i, p in enumerate(paths)}
    daemons = trainers // per_node
    owner = {p: i % daemons for i, p in enumerate(paths)}
    rows = []
    for e in range(epochs):
        order = list(paths)
        random.Random(seed * 1000 + e).shuffle(order)
        if drop_last:
            order = order[: (len(order) // (trainers * batch)) * trainers * batch]
        if not exchange:  # every rank only gets samples its own node owns
            order.sort(key=lambda p: owner[p])
        for r in range(trainers):
            if exchange:
                mine = order[r::trainers]
            else:
                node = r // per_node
                local = [p for p in order if owner[p] == node]
                mine = local[r % per_node::per_node]
            for i, p in enumerate(mine):
                rows.append({
                    "epoch": e, "rank": r, "batch": i // batch, "position": i % batch,
                    "sample_id": ids[p], "path": p, "label": LABELS[p.split("/")[0]],
                    "bytes": len(DATASET[p]), "xxh64": ct.xxh64_hex(DATASET[p]),
                    "tier": "local" if owner[p] == r // per_node else "peer",
                    "owner": owner[p],
                })
    return rows


def write_traces(trace_dir, rows, trainers=4, header=None):
    os.makedirs(trace_dir, exist_ok=True)
    for r in range(trainers):
        with open(os.path.join(trace_dir, "rank-%d.csv" % r), "w", newline="",
                  encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(header or ct.HEADER)
            for row in rows:
                if row["rank"] == r:
                    w.writerow([row[k] if k != "bytes" else row["bytes"]
                                for k in ct.HEADER])


def find(rows, **kw):
    for row in rows:
        if all(row[k] == v for k, v in kw.items()):
            return row
    raise AssertionError("no row with %r" % kw)


class CheckerTestBase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check_traces_test.")
        self.data = os.path.join(self.tmp, "data")
        self.trace = os.path.join(self.tmp, "trace")
        make_dataset(self.data)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def check(self, rows, *extra, trainers=4, per_node=2, batch=2, epochs=2):
        """Writes rows as traces, runs the checker; returns (exit code, stdout, summary)."""
        write_traces(self.trace, rows, trainers)
        return self.run_checker(*extra, trainers=trainers, per_node=per_node, batch=batch,
                                epochs=epochs)

    def run_checker(self, *extra, trainers=4, per_node=2, batch=2, epochs=2):
        out_json = os.path.join(self.tmp, "verdict.json")
        argv = [self.trace, "--dataset", self.data, "--epochs", str(epochs),
                "--trainers", str(trainers), "--trainers-per-node", str(per_node),
                "--batch-size", str(batch), "--json", out_json, "--max-problems", "50"]
        argv += list(extra)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = ct.main(argv)
        with open(out_json, encoding="utf-8") as f:
            summary = json.load(f)
        return rc, buf.getvalue(), summary

    def assertFailsWith(self, result, kind, *needles):
        rc, out, summary = result
        self.assertEqual(rc, 1, out)
        self.assertTrue(out.startswith("exactly-once: FAIL"), out)
        self.assertIn(kind, summary["problem_counts"], out)
        msgs = [p["message"] for p in summary["problems"] if p["kind"] == kind]
        for needle in needles:
            self.assertTrue(any(needle in m for m in msgs),
                            "no [%s] problem mentions %r: %r" % (kind, needle, msgs))
        self.assertIn("[%s]" % kind, out)
        return summary


class DatasetScanTest(CheckerTestBase):
    def test_labels_are_bytewise_class_order_and_hidden_skipped(self):
        classes, files = ct.scan_dataset(self.data)
        self.assertEqual(classes, ["B_upper", "a_lower", "c", "d_empty_class"])
        self.assertEqual(set(files), set(DATASET))
        for rel, info in files.items():
            self.assertEqual(info.label, LABELS[rel.split("/")[0]], rel)
            self.assertEqual(info.size, len(DATASET[rel]), rel)

    def test_xxh64_backend_matches_reference(self):
        self.assertEqual(ct.xxh64_hex(b""), "ef46db3751d8e999")
        self.assertEqual(ct.xxh64_hex(b"abc"), "44bc2cf5ad770999")
        self.assertEqual("%016x" % ct.xxh64_pure(b""), "ef46db3751d8e999")
        self.assertEqual("%016x" % ct.xxh64_pure(b"abc"), "44bc2cf5ad770999")
        rng = random.Random(7)
        for n in [1, 3, 4, 5, 8, 9, 31, 32, 33, 64, 100, 1023]:
            data = bytes(rng.getrandbits(8) for _ in range(n))
            self.assertEqual(ct.xxh64_hex(data), "%016x" % ct.xxh64_pure(data), n)


class PassingTracesTest(CheckerTestBase):
    def test_correct_trace_passes(self):
        rc, out, s = self.check(plan_rows(), "--expect-peer")
        self.assertEqual(rc, 0, out)
        self.assertTrue(out.startswith("exactly-once: PASS  epochs=2 ranks=4 samples/epoch=13"),
                        out)
        self.assertEqual(s["verdict"], "PASS")
        self.assertEqual(s["samples_per_epoch"], [13, 13])
        self.assertEqual(s["samples_verified"], 26)
        self.assertEqual(s["bytes_verified"], 2 * sum(len(d) for d in DATASET.values()))
        self.assertEqual(s["tiers"]["local"] + s["tiers"]["peer"], 26)
        self.assertGreater(s["tiers"]["peer"], 0)
        self.assertEqual(s["problems"], [])

    def test_correct_drop_last_trace_passes(self):
        rows = plan_rows(drop_last=True)
        rc, out, s = self.check(rows, "--drop-last")
        self.assertEqual(rc, 0, out)
        self.assertEqual(s["samples_per_epoch"], [8, 8])  # floor(13 / (4*2)) * 8

    def test_local_only_trace_passes_expect_no_peer(self):
        rc, out, s = self.check(plan_rows(exchange=False), "--expect-no-peer")
        self.assertEqual(rc, 0, out)
        self.assertEqual(s["tiers"]["peer"], 0)

    def test_cli_exit_codes_and_output(self):
        write_traces(self.trace, plan_rows())
        cmd = [sys.executable, os.path.join(HERE, "check_traces.py"), self.trace,
               "--dataset", self.data, "--epochs", "2", "--trainers", "4",
               "--trainers-per-node", "2", "--batch-size", "2"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("exactly-once: PASS", p.stdout)
        os.remove(os.path.join(self.trace, "rank-3.csv"))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("exactly-once: FAIL", p.stdout)
        self.assertIn("no trace file rank-3.csv", p.stdout)
        p = subprocess.run(cmd[:-4] + ["--trainers-per-node", "3"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("multiple of --trainers-per-node", p.stderr)


class FailingTracesTest(CheckerTestBase):
    def test_repeated_sample_fails(self):
        rows = plan_rows()
        victim = find(rows, epoch=0, rank=1, batch=0, position=0)
        dup = find(rows, epoch=0, rank=2, batch=1, position=0)
        lost = victim["path"]
        victim.update({k: dup[k] for k in ("sample_id", "path", "label", "bytes", "xxh64",
                                           "owner")})
        victim["tier"] = "local" if dup["owner"] == 0 else "peer"
        s = self.assertFailsWith(self.check(rows), "repeat", repr(dup["path"]),
                                 "delivered 2 times", "rank 1 batch 0 pos 0",
                                 "rank 2 batch 1 pos 0")
        self.assertIn("missing", s["problem_counts"])  # what it displaced is now missing
        self.assertTrue(any(repr(lost) in p["message"] for p in s["problems"]))

    def test_missing_sample_fails(self):
        rows = plan_rows()
        gone = find(rows, epoch=1, rank=0, batch=1, position=1)
        rows.remove(gone)
        s = self.assertFailsWith(self.check(rows), "missing", "epoch 1: " + repr(gone["path"]))
        self.assertNotIn("repeat", s["problem_counts"])
        self.assertEqual(s["samples_per_epoch"], [13, 12])

    def write_skipped(self, skipped_rows, trainers=4):
        for r in range(trainers):
            with open(os.path.join(self.trace, "skipped-rank-%d.csv" % r), "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(ct.SKIPPED_HEADER)
                for row in skipped_rows:
                    if row["rank"] == r:
                        w.writerow([row["epoch"], row["rank"], row["batch"], row["sample_id"], row["path"]])

    def last_in_its_batch(self, rows, **kw):
        row = find(rows, **kw)
        same = [x for x in rows if (x["epoch"], x["rank"], x["batch"]) == (row["epoch"], row["rank"], row["batch"])]
        return max(same, key=lambda x: x["position"])

    def test_skipped_samples_complete_the_epoch_with_the_flag(self):
        rows = plan_rows()
        gone = self.last_in_its_batch(rows, epoch=1, rank=0, batch=1)
        rows.remove(gone)
        write_traces(self.trace, rows)
        self.write_skipped([gone])
        rc, out, s = self.run_checker("--skipped")
        self.assertEqual(rc, 0, out)
        self.assertEqual([e["skipped"] for e in s["per_epoch"]], [0, 1])
        # Without the flag the skipped sample is missing.
        self.assertFailsWith(self.run_checker(), "missing", "epoch 1: " + repr(gone["path"]))

    def test_a_batch_whose_samples_were_all_skipped_still_counts(self):
        for drop_last in (False, True):
            with self.subTest(drop_last=drop_last):
                shutil.rmtree(self.trace, ignore_errors=True)
                rows = plan_rows(drop_last=drop_last)
                gone = [r for r in rows if (r["epoch"], r["rank"], r["batch"]) == (0, 1, 0)]
                self.assertTrue(gone)
                for r in gone:
                    rows.remove(r)
                write_traces(self.trace, rows)
                self.write_skipped(gone)
                extra = ("--skipped", "--drop-last") if drop_last else ("--skipped",)
                rc, out, s = self.run_checker(*extra)
                self.assertEqual(rc, 0, out)
                self.assertEqual(s["per_epoch"][0]["skipped"], len(gone))

    def test_a_sample_both_skipped_and_delivered_fails(self):
        rows = plan_rows()
        row = find(rows, epoch=0, rank=2, batch=0, position=0)
        write_traces(self.trace, rows)
        self.write_skipped([row])
        self.assertFailsWith(self.run_checker("--skipped"), "repeat", "skipped", "and delivered")

    def test_wrong_xxh64_fails(self):
        rows = plan_rows()
        row = find(rows, epoch=1, path="c/c3.bin")
        good = row["xxh64"]
        row["xxh64"] = "%016x" % (int(good, 16) ^ 1)
        s = self.assertFailsWith(self.check(rows), "xxh64", repr("c/c3.bin"), good)
        self.assertEqual(s["problem_counts"], {"xxh64": 1})

    def test_wrong_bytes_fails(self):
        rows = plan_rows()
        find(rows, epoch=0, path="B_upper/empty.bin")["bytes"] = 1
        self.assertFailsWith(self.check(rows), "bytes", repr("B_upper/empty.bin"),
                             "bytes 1, file has 0")

    def test_wrong_label_fails(self):
        rows = plan_rows()
        find(rows, epoch=0, path="a_lower/nested/deeper/z.bin")["label"] = 0
        self.assertFailsWith(self.check(rows), "label", "label 0, expected 1")

    def test_unequal_batch_counts_fails(self):
        rows = plan_rows()
        # Move rank 3's last batch of epoch 0 to rank 0 as an extra batch: every sample
        # still delivered exactly once, but rank 0 now has 3 batches and rank 3 has 1.
        for row in rows:
            if row["epoch"] == 0 and row["rank"] == 3 and row["batch"] == 1:
                row["rank"] = 0
                row["batch"] = 2
                row["tier"] = "local" if row["owner"] == 0 else "peer"
        s = self.assertFailsWith(self.check(rows), "batches", "epoch 0: ranks have unequal "
                                 "batch counts (1 batches: ranks 3, 2 batches: ranks 1-2, "
                                 "3 batches: ranks 0)")
        for kind in ("repeat", "missing"):
            self.assertNotIn(kind, s["problem_counts"])

    def test_wrong_tier_fails(self):
        rows = plan_rows()
        row = find(rows, epoch=1, rank=2, tier="peer")
        row["tier"] = "local"
        s = self.assertFailsWith(self.check(rows), "tier", repr(row["path"]),
                                 "tier 'local' but owner 0 is not rank 2's node 1")
        self.assertEqual(s["problem_counts"], {"tier": 1})

    def test_storage_tier_needs_flag(self):
        rows = plan_rows()
        find(rows, epoch=0, rank=0, batch=0, position=0)["tier"] = "storage"
        self.assertFailsWith(self.check(rows), "tier", "tier 'storage'")
        rc, out, _ = self.run_checker("--allow-storage")
        self.assertEqual(rc, 0, out)
        self.assertIn("storage=1/0", out)

    def test_expect_peer_fails_without_peer_reads(self):
        self.assertFailsWith(self.check(plan_rows(exchange=False), "--expect-peer"), "peer",
                             "no sample came from a peer")

    def test_expect_no_peer_fails_with_peer_reads(self):
        self.assertFailsWith(self.check(plan_rows(), "--expect-no-peer"), "peer",
                             "samples came from peers, expected none")

    def test_sample_id_must_map_to_one_path(self):
        rows = plan_rows()
        a = find(rows, epoch=1, path="c/c0.bin")
        b = find(rows, epoch=1, path="c/c1.bin")
        a["sample_id"], b["sample_id"] = b["sample_id"], a["sample_id"]
        self.assertFailsWith(self.check(rows), "id", repr("c/c0.bin"))

    def test_owner_must_not_change(self):
        rows = plan_rows()
        row = find(rows, epoch=1, path="B_upper/x0.bin")
        row["owner"] = 1 - row["owner"]
        row["tier"] = "local" if row["owner"] == row["rank"] // 2 else "peer"
        self.assertFailsWith(self.check(rows), "owner", repr("B_upper/x0.bin"),
                             "placement must not change")

    def test_same_order_every_epoch_fails(self):
        rows = [r for r in plan_rows() if r["epoch"] == 0]
        rows += [dict(r, epoch=1) for r in rows]
        self.assertFailsWith(self.check(rows), "order", "epoch 1 delivered exactly the order "
                             "of epoch 0")

    def test_drop_last_wrong_count_fails(self):
        rows = plan_rows(drop_last=False)  # delivered the partial batches anyway
        s = self.assertFailsWith(self.check(rows, "--drop-last"), "count",
                                 "13 samples delivered, expected floor(13/(4*2))*4*2 = 8")
        self.assertIn("batch-size", s["problem_counts"])

    def test_oversized_batch_fails(self):
        rows = plan_rows()
        rc, out, s = self.check(rows, batch=1)
        self.assertFailsWith((rc, out, s), "batch-size", "2 samples > batch size 1")

    def test_gap_in_positions_fails(self):
        rows = plan_rows()
        find(rows, epoch=0, rank=1, batch=0, position=1)["position"] = 5
        self.assertFailsWith(self.check(rows), "positions", "epoch 0 rank 1 batch 0")

    def test_hidden_file_delivered_is_unknown(self):
        rows = plan_rows()
        row = find(rows, epoch=0, rank=0, batch=0, position=0)
        row["path"] = "a_lower/.hidden.bin"
        self.assertFailsWith(self.check(rows), "unknown", repr("a_lower/.hidden.bin"))

    def test_missing_rank_file_and_bad_header_fail(self):
        write_traces(self.trace, plan_rows())
        os.remove(os.path.join(self.trace, "rank-2.csv"))
        with open(os.path.join(self.trace, "rank-1.csv"), "w", encoding="utf-8") as f:
            f.write("epoch,rank,batch\n0,1,0\n")
        s = self.assertFailsWith(self.run_checker(), "files", "no trace file rank-2.csv")
        self.assertIn("format", s["problem_counts"])
        self.assertIn("batches", s["problem_counts"])  # ranks 1 and 2 delivered nothing

    def test_verdict_lists_first_problems_compactly(self):
        rows = plan_rows()
        for row in rows:
            row["xxh64"] = "0" * 16
        write_traces(self.trace, rows)
        argv = [self.trace, "--dataset", self.data, "--epochs", "2", "--trainers", "4",
                "--trainers-per-node", "2", "--batch-size", "2"]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = ct.main(argv)
        out = buf.getvalue().splitlines()
        self.assertEqual(rc, 1)
        self.assertEqual(out[0], "exactly-once: FAIL  26 problem(s): xxh64=26")
        self.assertEqual(sum(1 for line in out if line.startswith("  - [xxh64]")), 10)
        self.assertEqual(out[-1], "  ... (16 more)")



class ShardScannerTest(unittest.TestCase):
    """The oracle's own readers of tar and TFRecord shards (independent of the daemon)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check_traces_shards.")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    @staticmethod
    def record(data):
        import struct
        n = struct.pack("<Q", len(data))
        return (n + struct.pack("<I", ct.masked_crc32c(n)) + data
                + struct.pack("<I", ct.masked_crc32c(data)))

    @staticmethod
    def example(label):
        # Example{features{feature{key:"label" value{int64_list{value:[label]}}}}}, packed
        lst = bytes([0x0A, 0x01, label])
        feat = bytes([0x1A, len(lst)]) + lst
        entry = bytes([0x0A, 0x05]) + b"label" + bytes([0x12, len(feat)]) + feat
        features = bytes([0x0A, len(entry)]) + entry
        return bytes([0x0A, len(features)]) + features

    def test_crc32c_check_value(self):
        self.assertEqual(ct.crc32c(b"123456789"), 0xE3069283)

    def test_tfrecord_labels_offsets_and_a_bad_crc(self):
        recs = [self.record(self.example(i)) for i in range(3)]
        bad = bytearray(recs[1])
        bad[14] ^= 1  # a data byte of record 1
        with open(os.path.join(self.tmp, "a.tfrecord"), "wb") as f:
            f.write(recs[0] + bytes(bad) + recs[2])
        classes, files, invalid = ct.scan_tfrecord(self.tmp, "label")
        self.assertEqual(invalid, 1)
        second = len(recs[0]) + len(recs[1])
        self.assertEqual(sorted(files), sorted(["a.tfrecord@12", "a.tfrecord@%d" % (second + 12)]))
        self.assertEqual(files["a.tfrecord@%d" % (second + 12)].label, 2)
        self.assertEqual(classes, ["0", "1", "2"])

    def test_webdataset_groups_and_a_truncated_shard(self):
        import tarfile
        path = os.path.join(self.tmp, "s.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for key, label in (("k0", 4), ("k1", 5), ("k2", 6)):
                for ext, data in (("jpg", key.encode() * 100), ("cls", str(label).encode())):
                    info = tarfile.TarInfo("%s.%s" % (key, ext))
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        classes, files, invalid = ct.scan_webdataset(self.tmp, ["jpg"], "cls")
        self.assertEqual(invalid, 0)
        self.assertEqual(sorted(f.label for f in files.values()), [4, 5, 6])
        with tarfile.open(path) as tf:
            k2 = tf.getmember("k2.jpg")
        os.truncate(path, k2.offset_data + 10)  # cut inside k2's data: k2 and the rest are lost
        classes, files, invalid = ct.scan_webdataset(self.tmp, ["jpg"], "cls")
        self.assertEqual(invalid, 1)
        self.assertEqual(sorted(f.label for f in files.values()), [4, 5])
        os.truncate(path, k2.offset + 100)  # cut inside k2's header: k1 may be incomplete, lost too
        classes, files, invalid = ct.scan_webdataset(self.tmp, ["jpg"], "cls")
        self.assertEqual(invalid, 1)
        self.assertEqual(sorted(f.label for f in files.values()), [4])


class EmptyAndDroppedBatchesTest(CheckerTestBase):
    """Empty last batches (drop_last = false, fewer leftovers than trainers) and the
    dropped leftover of drop_last = true."""

    # 13 samples, 4 trainers, batches of 3: rank 0 gets 4 samples (2 batches), ranks 1-3
    # get 3 (one full batch and an empty last one).
    BATCH = 3

    def write_empty(self, listed, trainers=4):
        for r in range(trainers):
            with open(os.path.join(self.trace, "empty-rank-%d.csv" % r), "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(ct.EMPTY_HEADER)
                w.writerows([e, rank, b] for e, rank, b in listed if rank == r)

    def empty_last_batches(self, epochs=2):
        return [(e, r, 1) for e in range(epochs) for r in (1, 2, 3)]

    def test_listed_empty_last_batches_pass(self):
        rows = plan_rows(batch=self.BATCH)
        write_traces(self.trace, rows)
        self.write_empty(self.empty_last_batches())
        rc, out, s = self.run_checker(batch=self.BATCH)
        self.assertEqual(rc, 0, out)
        self.assertEqual([e["empty_batches"] for e in s["per_epoch"]], [3, 3])
        self.assertEqual([e["batches_per_rank"] for e in s["per_epoch"]], [2, 2])

    def test_an_empty_batch_not_listed_is_missing(self):
        rows = plan_rows(batch=self.BATCH)
        write_traces(self.trace, rows)
        self.write_empty([x for x in self.empty_last_batches() if x != (1, 2, 1)])
        s = self.assertFailsWith(self.run_checker(batch=self.BATCH), "batches",
                                 "epoch 1: ranks have unequal batch counts (1 batches: ranks 2, "
                                 "2 batches: ranks 0-1,3)")
        self.assertEqual(set(s["problem_counts"]), {"batches"})

    def test_a_listed_empty_batch_with_samples_fails(self):
        rows = plan_rows(batch=self.BATCH)
        write_traces(self.trace, rows)
        self.write_empty(self.empty_last_batches() + [(0, 0, 1)])
        self.assertFailsWith(self.run_checker(batch=self.BATCH), "empty",
                             "epoch 0 rank 0 batch 1 listed as empty but it has 1 samples")

    def test_an_empty_batch_before_a_full_one_fails(self):
        rows = plan_rows(batch=self.BATCH)
        for row in rows:  # rank 1's only batch becomes batch 1: batch 0 is the empty one
            if row["rank"] == 1 and row["epoch"] == 0:
                row["batch"] = 1
        write_traces(self.trace, rows)
        self.write_empty([x for x in self.empty_last_batches() if x != (0, 1, 1)] + [(0, 1, 0)])
        self.assertFailsWith(self.run_checker(batch=self.BATCH), "empty",
                             "epoch 0 rank 1: empty batch(es) [0] before the rank's last non-empty batch 1")

    def test_an_empty_batch_fails_with_drop_last(self):
        rows = plan_rows(drop_last=True)
        write_traces(self.trace, rows)
        self.write_empty([(0, 3, 1)])
        self.assertFailsWith(self.run_checker("--drop-last"), "empty",
                             "epoch 0 rank 3 batch 1 is empty, but with drop_last")

    def test_drop_last_must_drop_a_fresh_leftover_every_epoch(self):
        epoch0 = [r for r in plan_rows(drop_last=True) if r["epoch"] == 0]
        # Epoch 1 delivers epoch 0's samples again, dealt to other ranks: a new order but
        # the same 5 samples dropped.
        epoch1 = []
        for r in epoch0:
            rank = (r["rank"] + 1) % 4
            epoch1.append(dict(r, epoch=1, rank=rank, tier="local" if r["owner"] == rank // 2 else "peer"))
        self.assertFailsWith(self.check(epoch0 + epoch1, "--drop-last"), "dropped",
                             "epoch 1 dropped the same 5 samples as epoch 0")


if __name__ == "__main__":
    unittest.main()
