"""Model checkpoints from Python (docs/decisions/0056), as one trainer rank of a running job
whose daemons have checkpoint.dir set (tests/e2e/checkpoint_e2e.sh case `python` starts
them): shardmix.Client.save/wait_durable/load/list, and shardmix.torch.save/load.

torch.save/torch.load are what shardmix.torch wraps. Where PyTorch is not installed, a fake
`torch` module whose save/load pickle the object stands in for it, so that the wrapper
(serialise to memory, hand the bytes to the daemon, load them back) is still tested; the
script says which it used.
    test_checkpoints.py CHECKPOINT_DIR
"""
import os
import pickle
import sys
import types


def install_fake_torch():
    torch = types.ModuleType("torch")
    torch.save = lambda obj, f: pickle.dump(obj, f)
    torch.load = lambda f, **kwargs: pickle.load(f)
    data = types.ModuleType("torch.utils.data")

    class IterableDataset:  # what shardmix.torch subclasses; unused here
        pass

    data.IterableDataset = IterableDataset
    data.DataLoader = object
    data.get_worker_info = lambda: None
    utils = types.ModuleType("torch.utils")
    utils.data = data
    torch.utils = utils
    torch.distributed = types.SimpleNamespace(is_available=lambda: False, is_initialized=lambda: False)
    sys.modules.update({"torch": torch, "torch.utils": utils, "torch.utils.data": data})


def main():
    checkpoint_dir = sys.argv[1]
    try:
        import torch  # noqa: F401
        real_torch = True
    except ImportError:
        install_fake_torch()
        real_torch = False
    import shardmix
    import shardmix.torch as smt

    client = shardmix.Client()
    rank = client.rank
    name = f"py-rank{rank}"
    first = bytes(range(256)) * 64
    v1 = client.save(name, first)
    v2 = client.save(name, memoryview(bytearray(b"second version")))
    assert (v1, v2) == (1, 2), (v1, v2)
    assert (name, 2) in client.list(), client.list()
    client.wait_durable(name)
    assert os.path.exists(os.path.join(checkpoint_dir, name, "v2.smxckpt")), os.listdir(checkpoint_dir)
    assert client.load(name) == b"second version"
    try:
        client.load("never-saved")
        raise AssertionError("loading a checkpoint never saved did not raise")
    except shardmix.Error as e:
        assert "never-saved" in str(e) and checkpoint_dir in str(e), str(e)
    try:
        client.save("bad/name", b"x")
        raise AssertionError("a name with a slash was accepted")
    except shardmix.Error as e:
        assert "bad/name" in str(e), str(e)

    # A memfd the caller filled, handed over without a copy; then what the seal refuses.
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, b"written into a memfd")
    assert client.save_memfd(name, fd) == 3
    try:
        os.write(fd, b"x")
        raise AssertionError("a handed-over memfd stayed writable")
    except PermissionError:
        pass
    os.close(fd)
    assert client.load(name) == b"written into a memfd"
    for flags, why in ((os.MFD_CLOEXEC, "MFD_ALLOW_SEALING"), (os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING, "sealed already")):
        fd = os.memfd_create("test", flags)
        os.write(fd, b"y")
        if why == "sealed already":
            client.save_memfd(f"{name}-sealed", fd)
        try:
            client.save_memfd(name, fd)
            raise AssertionError(f"a memfd that cannot be sealed ({why}) was accepted")
        except shardmix.Error as e:
            assert why in str(e) and name in str(e), str(e)
        finally:
            os.close(fd)
    assert client.list().count((name, 3)) == 1, client.list()

    # A lease (decision 0069): written in place, part of it saved; then it is used up.
    lease = client.lease_checkpoint(name, 100)
    assert (lease.name, lease.size) == (name, 100), (lease.name, lease.size)
    assert lease.write(0, b"leased ") == 7 and lease.write(7, memoryview(b"bytes")) == 5
    for offset, data in ((96, b"12345"), (101, b"")):
        try:
            lease.write(offset, data)
            raise AssertionError(f"a write of {len(data)} bytes at {offset} into a lease of 100 was accepted")
        except ValueError as e:
            assert "100" in str(e), str(e)
    assert client.holds_lease(lease)
    assert client.save_lease(lease, 12) == 4
    assert client.load(name) == b"leased bytes"
    try:
        lease.write(0, b"late")
        raise AssertionError("a write into a saved lease was accepted")
    except ValueError as e:
        assert "saved" in str(e), str(e)
    abandoned = client.lease_checkpoint(name, 10)
    client.abandon_lease(abandoned)
    assert not client.holds_lease(abandoned)
    assert client.list().count((name, 4)) == 1, client.list()

    # The torch wrapper, on the same client (one connection per rank).
    state = {"step": 7, "weights": [0.5, 1.5, 2.5], "rank": rank}
    version = smt.save(state, f"torch-rank{rank}", client=client, wait_durable=True)
    assert version == 1, version
    assert os.path.exists(os.path.join(checkpoint_dir, f"torch-rank{rank}", "v1.smxckpt"))
    assert smt.load(f"torch-rank{rank}", client=client) == state
    # A state larger than its tensors let the wrapper guess: serialised once more, into a
    # lease of its size; the next save of the name asks for that size at once.
    passes = []
    serialise = smt.torch.save
    smt.torch.save = lambda obj, f: (passes.append(1), serialise(obj, f))[1]
    try:
        big = {"blob": bytes(range(256)) * (12 << 10), "rank": rank}  # 3 MiB, no tensor
        assert smt.save(big, f"torch-big{rank}", client=client) == 1
        assert len(passes) == 2, passes
        assert smt.save(big, f"torch-big{rank}", client=client) == 2
        assert len(passes) == 3, passes
    finally:
        smt.torch.save = serialise
    assert smt.load(f"torch-big{rank}", client=client) == big
    if real_torch:
        # A tensor whose storage cannot be asked for (sparse) is saved as torch.save saves it.
        import torch
        grad = torch.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2))
        assert smt.save({"grad": grad, "rank": rank}, f"torch-sparse{rank}", client=client) == 1
        back = smt.load(f"torch-sparse{rank}", client=client)
        assert torch.equal(back["grad"].to_dense(), grad.to_dense()) and back["rank"] == rank, back
    print(f"test_checkpoints: rank {rank}: PASS (save/wait_durable/load/list; shardmix.torch.save/load with "
          f"{'torch' if real_torch else 'a pickle-based fake of torch.save/torch.load: torch is not installed'})")


if __name__ == "__main__":
    main()
