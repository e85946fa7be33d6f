"""The Python binding without daemons: import, errors, argument checks. Seconds."""
import os
import subprocess
import sys
import tempfile
import unittest

import shardmix


class Offline(unittest.TestCase):
    def test_no_daemons_is_a_shardmix_error_with_the_clients_message(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(shardmix.Error) as cm:
                shardmix.Client(run_dir=d, ready_timeout=0)
        e = cm.exception
        self.assertIsInstance(e, RuntimeError)
        self.assertEqual(e.code, "unavailable")
        self.assertIn(f"no ShardMix daemons became ready: {d}/ready did not appear", str(e))

    def test_a_missing_socket_names_it(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(shardmix.Error) as cm:
                shardmix.Client(run_dir=d, daemon=3, rank=0, world_size=1)
        self.assertIn(f"cannot connect to the daemon of node 3 at {d}/d3.sock", str(cm.exception))

    def test_exception_hierarchy(self):
        self.assertTrue(issubclass(shardmix.ReleasedError, BufferError))
        self.assertTrue(issubclass(shardmix.ReleasedError, shardmix.Error))
        self.assertTrue(shardmix.HAS_CHECKPOINT)
        with self.assertRaises(shardmix.Error):  # a damaged blob is refused without a daemon
            shardmix.Client.inspect_checkpoint(b"not a checkpoint")

    def test_launcher_rank_from_the_environment(self):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMI_", "SLURM_", "SHARDMIX_", "PMIX_"))}
        env.update(RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4")
        out = subprocess.run([sys.executable, "-c", "import shardmix; r = shardmix.detect_launcher_rank(); "
                              "print(r['rank'], r['world_size'], r['local_rank'], r['local_size'], r['source'])"],
                             env=env, capture_output=True, text=True, timeout=60, check=True)
        self.assertEqual(out.stdout.split(), ["5", "8", "1", "4", "RANK"])

    def test_torch_loader_arguments(self):
        try:
            from shardmix.torch import ShardMixDataset, make_loader
        except ImportError as e:  # deploy/install-deps.sh installs python3-torch: its absence is a failure
            self.fail(f"torch not importable ({e}): install python3-torch (bash deploy/install-deps.sh)")
        ds = ShardMixDataset(sample_shape=(1, 28, 28), run_dir="/nonexistent", ready_timeout=0)
        with self.assertRaises(ValueError):
            make_loader(ds, num_workers=4)
        with self.assertRaises(ValueError):
            make_loader(ds, batch_size=32)
        loader = make_loader(ds)  # no connection yet: the client is made on first use
        self.assertIsNone(loader.batch_size)
        with self.assertRaises(shardmix.Error):
            iter(loader).__next__()


if __name__ == "__main__":
    unittest.main(verbosity=2)
