"""The Python binding inside a real job: run as every trainer rank by run_python_tests.sh
(deploy/launch.sh, 2 daemons on tcp, 1 trainer per node). Each rank checks its own stream.

Env (set by the runner): SMX_TEST_REF (trace dir of shardmix-consume, the C++
client, over the same config and seed: epochs 0 and 1), SMX_TEST_DATA (the dataset),
SMX_TEST_Q (the configured exchange fraction).
"""
import csv
import ctypes
import gc
import math
import os
import unittest
import warnings

import numpy as np
import xxhash

import shardmix

REF = os.environ.get("SMX_TEST_REF")
DATA = os.environ.get("SMX_TEST_DATA")

client = None


def setUpModule():
    global client
    if not REF:
        # Not a skip: a test that runs nothing must not pass as green.
        raise RuntimeError("SMX_TEST_REF is unset: this test runs inside a job, started by "
                           "tests/python/run_python_tests.sh")
    client = shardmix.Client()


def tearDownModule():
    if client is not None:
        gc.collect()
        client.close()


def shared_mappings():
    """(start, end, perms, path) of this process's shared memfd mappings."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            start, end = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5].strip() if len(parts) > 5 else ""
            out.append((start, end, parts[1], path))
    return out


def mapping_of(address, maps):
    for start, end, perms, path in maps:
        if start <= address < end:
            return perms, path
    return None


class BindingInJob(unittest.TestCase):
    # Epochs: 0-1 compared with the C++ trace; every other test takes its own epoch.

    def test_0_same_ids_labels_and_bytes_as_the_cpp_client(self):
        rank = client.rank
        with open(os.path.join(REF, f"rank-{rank}.csv"), newline="", encoding="utf-8") as f:
            ref = [(int(r["epoch"]), int(r["batch"]), int(r["position"]), int(r["sample_id"]), int(r["label"]),
                    int(r["bytes"]), r["xxh64"]) for r in csv.DictReader(f)]
        self.assertGreater(len(ref), 0)
        got = []
        batches = 0
        for epoch in (0, 1):
            for batch in client.epoch(epoch):
                batches += 1
                for pos, s in enumerate(batch):
                    got.append((epoch, batch.index, pos, s.id, s.label, s.nbytes,
                                f"{xxhash.xxh64_intdigest(memoryview(s)):016x}"))
            self.assertEqual(batches, client.batches_per_epoch * (epoch + 1))
        self.assertEqual(got, ref)

    def test_1_zero_copy_views_point_into_the_daemons_shared_memory(self):
        import torch
        maps = shared_mappings()
        tiers = set()
        checked = 0
        for batch in client.epoch(2):
            for s in batch:
                m = memoryview(s)
                self.assertTrue(m.readonly)
                self.assertEqual(m.nbytes, s.nbytes)
                self.assertEqual(m.format, "B")
                with self.assertRaises((BufferError, TypeError)):  # a writable export is refused
                    ctypes.c_char.from_buffer(s)
                a = np.frombuffer(s, np.uint8)
                self.assertFalse(a.flags.writeable)
                self.assertEqual(a.__array_interface__["data"][0], s.address)
                self.assertEqual(np.frombuffer(s, np.uint8).__array_interface__["data"][0], s.address)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # "The given buffer is not writable"
                    t = torch.frombuffer(s, dtype=torch.uint8)
                self.assertEqual(t.data_ptr(), s.address)
                where = mapping_of(s.address, maps)
                self.assertIsNotNone(where, f"sample {s.id} at {s.address:#x} is in no mapping")
                perms, path = where
                # A read-only shared mapping of one of the daemon's memfds: the arena or staging.
                self.assertEqual(perms, "r--s", f"sample {s.id}: mapping {where}")
                self.assertTrue(path.startswith("/memfd:"), f"sample {s.id}: mapping {where}")
                last = s.address + s.nbytes - 1
                self.assertEqual(mapping_of(last, maps), where)
                tiers.add(s.tier)
                checked += 1
                del m, a, t
        self.assertGreater(checked, 0)
        self.assertEqual(tiers, {"local", "peer"}, "both the cache arena and the staging area were checked")
        self.assertEqual(client.live_exports + client.stale_exports, 0)

    def test_2_a_released_batch_refuses_new_exports(self):
        it = iter(client.epoch(3))
        first = next(it)
        s = first[0]
        kept = memoryview(s)
        self.assertEqual(client.live_exports, 1)
        self.assertTrue(s.valid and first.valid)
        second = next(it)  # releases the first batch
        self.assertFalse(s.valid or first.valid)
        self.assertTrue(second.valid)
        with self.assertRaises(shardmix.ReleasedError) as cm:
            memoryview(s)
        self.assertIn("released", str(cm.exception))
        self.assertIsInstance(cm.exception, BufferError)
        with self.assertRaises(shardmix.ReleasedError):
            s.tobytes()
        with self.assertRaises(shardmix.ReleasedError):
            first.copy_into(bytearray(1 << 20), stride=1 << 16)
        self.assertEqual(client.stale_exports, 1)
        del kept
        self.assertEqual(client.stale_exports, 0)
        for _ in it:
            pass

    def test_3_strict_mode_refuses_to_release_a_batch_with_live_exports(self):
        client.strict = True
        try:
            it = iter(client.epoch(4))
            b = next(it)
            a = np.frombuffer(b[0], np.uint8)
            with self.assertRaises(BufferError) as cm:
                next(it)
            self.assertIn("still has 1 exported buffer", str(cm.exception))
            self.assertTrue(b.valid)  # nothing was released
            del a
            n = 1 + sum(1 for _ in it)
            self.assertEqual(n, client.batches_per_epoch)
        finally:
            client.strict = False

    def test_4_epoch_statistics(self):
        ep = client.epoch(5)
        samples = batches = 0
        labels = set()
        for batch in ep:
            batches += 1
            samples += len(batch)
            labels.update(batch.labels)
        st = ep.stats
        self.assertIsNotNone(st)
        same = lambda a, b: a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
        self.assertTrue(all(same(v, client.last_epoch_stats[k]) for k, v in st.items()), (st, client.last_epoch_stats))
        self.assertEqual(st["epoch"], 5)
        self.assertEqual(st["samples"], samples)
        self.assertEqual(st["batches"], batches)
        self.assertEqual(st["local_samples"] + st["peer_samples"] + st["storage_samples"], samples)
        self.assertAlmostEqual(st["exchange_fraction"], float(os.environ["SMX_TEST_Q"]))
        self.assertTrue(0.0 <= st["label_entropy_mean"] <= 1.0, st)
        self.assertFalse(math.isnan(st["label_entropy_p5"]))

    def test_5_torch_dataset_copies_the_delivered_bytes(self):
        import torch
        from shardmix.torch import ShardMixDataset, make_loader
        largest = max(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(DATA) for f in fs)
        ds = ShardMixDataset(pad_to=largest, with_ids=True, client=client, epoch=6)
        self.assertEqual(len(ds), client.batches_per_epoch)
        self.assertEqual((ds.rank, ds.world_size), (client.rank, client.world_size))
        loader = make_loader(ds)
        seen = []
        for x, y, ids in loader:
            self.assertEqual(x.dtype, torch.uint8)
            self.assertEqual(tuple(x.shape), (len(ids), largest))
            self.assertTrue(x.is_contiguous())
            seen.append((x, y, ids))
        self.assertEqual(len(seen), client.batches_per_epoch)
        self.assertEqual(ds.epoch, 7)
        self.assertEqual(ds.last_stats["epoch"], 6)
        # Tensors outlive their batches (they are copies): compare with the files afterwards.
        for x, y, ids in seen[:3]:
            for row, sid in zip(x, ids.tolist()):
                with open(os.path.join(DATA, client.sample_path(sid)), "rb") as f:
                    data = f.read()
                self.assertEqual(bytes(row[:len(data)].numpy()), data)
                self.assertFalse(row[len(data):].any())
        self.assertEqual(client.live_exports + client.stale_exports, 0)
        with self.assertRaises(ValueError):
            make_loader(ds, num_workers=2)

    def test_5b_torch_dataset_refuses_a_different_torch_distributed_rank(self):
        import tempfile
        import torch.distributed as dist
        from shardmix.torch import ShardMixDataset
        with tempfile.TemporaryDirectory() as d:
            # A one-process group: rank 0 of 1, which disagrees with ShardMix's rank r of 2.
            dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
            try:
                with self.assertRaises(ValueError) as cm:
                    len(ShardMixDataset(client=client))
                self.assertIn(f"torch.distributed is rank 0 of 1, but ShardMix took rank {client.rank} of "
                              f"{client.world_size}", str(cm.exception))
            finally:
                dist.destroy_process_group()

    def test_6_errors_carry_the_daemons_message(self):
        rank, world = client.rank, client.world_size
        with self.assertRaises(shardmix.Error) as cm:  # this rank is connected already (above)
            shardmix.Client(daemon=client.node, rank=rank, world_size=world)
        self.assertEqual(cm.exception.code, "invalid_argument")
        self.assertIn(f"daemon of node {client.node}: trainer rank {rank} is already connected to this daemon",
                      str(cm.exception))
        with self.assertRaises(shardmix.Error) as cm:
            shardmix.Client(daemon=client.node, rank=rank, world_size=world + 1)
        self.assertIn(f"trainer world size {world + 1} does not match the daemons' layout", str(cm.exception))
        self.assertIsInstance(cm.exception, RuntimeError)

    def test_8_close_refuses_while_exports_live_and_then_disconnects(self):
        # Last test: closes its own second client (the module's rank connection is reused
        # by reconnecting after it is closed).
        global client
        rank, world, node = client.rank, client.world_size, client.node
        it = iter(client.epoch(7))
        b = next(it)
        m = memoryview(b[0])
        with self.assertRaises(BufferError):
            client.close()
        self.assertFalse(client.closed)
        del m
        client.close()
        self.assertTrue(client.closed)
        with self.assertRaises(ValueError):
            next(it)
        with self.assertRaises(shardmix.ReleasedError):
            memoryview(b[0])
        client = shardmix.Client(daemon=node, rank=rank, world_size=world)  # the daemon took the rank back
        self.assertEqual(sum(1 for _ in client.epoch(8)), client.batches_per_epoch)

    def test_7_checkpoint_and_resume_continue_with_exactly_the_rest(self):
        global client
        self.assertTrue(shardmix.HAS_CHECKPOINT)
        full = [s.id for b in client.epoch(9) for s in b]  # shuffle.window = 0: planned order
        it = iter(client.epoch(9))
        taken = [s.id for _ in range(3) for s in next(it)]
        blob = client.checkpoint()
        self.assertIsInstance(blob, bytes)
        info = shardmix.Client.inspect_checkpoint(blob)
        self.assertEqual((info["epoch"], info["batches_consumed"], info["rank"]), (9, 3, client.rank))
        del it
        client.close()  # the trainer "dies" holding batch 2; a new process of its rank resumes
        client = shardmix.Client()
        with self.assertRaises(shardmix.Error) as cm:  # a blob of epoch 9 cannot resume epoch 8
            list(client.epoch(8, resume=blob))
        self.assertIn("epoch 9", str(cm.exception))
        client.close()
        client = shardmix.Client()
        client.load_state_dict(blob)
        rest = [s.id for b in client.epoch(9) for s in b]
        self.assertEqual(taken + rest, full)
        self.assertTrue(taken and rest)
        # Used once: the next pass over epoch 9 is whole again.
        self.assertEqual([s.id for b in client.epoch(9) for s in b], full)

if __name__ == "__main__":
    unittest.main(verbosity=2)
