"""shardmix.torch: ShardMix as a PyTorch IterableDataset, in place of dataset + DistributedSampler.

    from shardmix.torch import ShardMixDataset, make_loader

    ds = ShardMixDataset(sample_shape=(1, 28, 28))      # rank/world from the launcher's env
    loader = make_loader(ds)                            # DataLoader(batch_size=None, num_workers=0)
    for epoch in range(epochs):
        ds.set_epoch(epoch)                             # as with DistributedSampler
        for x, y in loader:                             # x: uint8 [B, 1, 28, 28], y: int64 [B]
            ...

What it yields, per batch the daemon delivers (batch.size in the daemons' config is the
per-trainer batch size): ``(x, y)`` with x a uint8 tensor of shape [n, *sample_shape]
(or [n, nbytes] without sample_shape) and y the int64 labels; with ``with_ids=True`` a
third tensor of sample ids. ``transform(x, y)`` (optional) maps the batch afterwards, e.g.
to float. Every rank gets the same number of batches (the daemons guarantee it); with
batch.drop_last = false the last one may be short or empty (n = 0), and any batch is short
by the samples the daemon could not read (dataset.strict = false; Batch.skipped).

Hand-over (docs/decisions/0020): the bytes are *copied once*, by Batch.copy_into (one
memcpy per sample, GIL released), into a fresh contiguous tensor per batch (pinned when
pin_memory=True). A zero-copy tensor is not handed to PyTorch because the shared memory
is read-only (torch.frombuffer warns, and an in-place op would fault) and is reused once
the iterator moves on, while a DataLoader/training step may keep tensors longer. The raw
binding (shardmix.Client) stays zero-copy for code that wants it.

Rank and world: shardmix.Client reads them from the launcher's environment (Open MPI,
Slurm, PMI, torchrun's RANK/WORLD_SIZE, SHARDMIX_RANK). If torch.distributed is
initialised, its rank and world size must agree, else ValueError.

DataLoader workers: the connection is one per trainer process and rank, and the daemon
already prefetches, so the loader runs in the main process (num_workers=0); iterating
the dataset inside a DataLoader worker raises RuntimeError.

Model checkpoints (checkpoint.dir set on the daemons; docs/decisions/0056), in place of
one rank's torch.save/torch.load:

    shardmix.torch.save(model.state_dict(), f"rank{rank}")   # returns once in this and a peer node's RAM
    model.load_state_dict(shardmix.torch.load(f"rank{rank}"))  # RAM, else checkpoint.dir

Both use the process's ShardMix client (the first one a ShardMixDataset created, else a new one),
or ``client=``.
"""
import io
import os
import warnings

import torch
from torch.utils.data import DataLoader, IterableDataset

import shardmix

__all__ = ["ShardMixDataset", "make_loader", "save", "load"]

# The client save/load use by default: the first one a ShardMixDataset of this process
# created, else one they create. A rank has one batch connection (the daemon refuses a
# second of the same rank), so save/load must not open another next to a dataset's.
_process_client = None


def _adopt(client):
    global _process_client
    if _process_client is None or _process_client.closed:
        _process_client = client
    return client


def _client(client=None):
    if client is not None:
        return client
    if _process_client is None or _process_client.closed:
        _adopt(shardmix.Client())
    return _process_client


class ShardMixDataset(IterableDataset):
    """Batches of this trainer's share of each epoch, from the node's ShardMix daemon.

    sample_shape: shape of one sample's bytes (its product must equal each sample's
        length), or None for flat [n, nbytes] (all samples of a batch equal in length;
        use pad_to= for variable lengths).
    pad_to: with variable-length samples, copy each into pad_to bytes (zero-padded).
    transform: callable(x, y) -> anything, applied to each batch.
    with_ids: also yield the sample ids (int64 tensor).
    pin_memory: allocate each batch tensor in pinned (page-locked) host memory.
    client: an existing shardmix.Client; else one is created with client_options
        (run_dir, daemon, rank, world_size, ready_timeout, receive_timeout, progress_timeout).
    epoch: the first epoch; iteration uses the current epoch and then moves to the next
        unless set_epoch() is called (like DistributedSampler.set_epoch).
    """

    def __init__(self, sample_shape=None, *, pad_to=None, transform=None, with_ids=False,
                 pin_memory=False, client=None, epoch=0, **client_options):
        super().__init__()
        self.sample_shape = tuple(sample_shape) if sample_shape is not None else None
        self.pad_to = pad_to
        self.transform = transform
        self.with_ids = with_ids
        self.pin_memory = pin_memory  # ignored, with a warning, when CUDA is not available
        self._client_options = client_options
        self._client = client
        self._checked = False  # rank/world compared with torch.distributed on first use
        self.epoch = epoch
        self.last_stats = None  # the daemon's statistics of the last finished epoch (dict)

    # -- the client, created lazily in the process that iterates
    @property
    def client(self):
        if self._client is None:
            self._client = _adopt(shardmix.Client(**self._client_options))
        if not self._checked:
            self._check_distributed()
            self._checked = True
        return self._client

    def _check_distributed(self):
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            if (rank, world) != (self._client.rank, self._client.world_size):
                raise ValueError(
                    f"torch.distributed is rank {rank} of {world}, but ShardMix took rank "
                    f"{self._client.rank} of {self._client.world_size} from the launcher's environment "
                    f"({shardmix.detect_launcher_rank()['source']}); pass rank=/world_size= or fix the launch")

    @property
    def rank(self):
        return self.client.rank

    @property
    def world_size(self):
        return self.client.world_size

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def __len__(self):
        """Batches per epoch for this trainer (the same on every rank)."""
        return int(self.client.batches_per_epoch)

    def _stride(self, batch):
        if self.sample_shape is not None:
            n = 1
            for d in self.sample_shape:
                n *= int(d)
            return n
        if self.pad_to is not None:
            return int(self.pad_to)
        return batch[0].nbytes if len(batch) else 0

    def __iter__(self):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("ShardMixDataset runs in the trainer's main process: use num_workers=0 "
                               "(make_loader does); the daemon already prefetches")
        client = self.client
        epoch = self.epoch
        pin = self.pin_memory and torch.cuda.is_available()
        if self.pin_memory and not pin:
            warnings.warn("ShardMixDataset: pin_memory=True but CUDA is not available; batches are not pinned")
        for batch in client.epoch(epoch):
            n = len(batch)
            stride = self._stride(batch)
            x = torch.empty((n, stride), dtype=torch.uint8, pin_memory=pin)
            if n:
                batch.copy_into(x.numpy(), stride=stride)
            if self.sample_shape is not None:
                x = x.view((n,) + self.sample_shape)
            y = torch.tensor(batch.labels, dtype=torch.int64)
            out = (x, y, torch.tensor(batch.ids, dtype=torch.int64)) if self.with_ids else (x, y)
            if self.transform is not None:
                out = self.transform(*out)
            yield out
        self.last_stats = client.last_epoch_stats
        self.epoch = epoch + 1

    # -- checkpoint / resume (docs/decisions/0022): the client's blob and the epoch in progress.
    # Take it after the optimizer step, inside the loop: the batches yielded so far count as
    # delivered. In the restarted process, load_state_dict() then iterate: the epoch in
    # progress continues with exactly the batches not yet delivered.
    def state_dict(self):
        return {"epoch": self.epoch, "client": self.client.state_dict()}

    def load_state_dict(self, state):
        self.client.load_state_dict(state["client"])
        self.epoch = int(state["epoch"])


def make_loader(dataset, pin_memory=False, **kwargs):
    """A DataLoader around a ShardMixDataset: batch_size=None (the daemon batches),
    num_workers=0 (one connection per trainer; the daemon prefetches). pin_memory is
    handled by the dataset (it allocates pinned tensors) rather than by a copy in the
    loader. Other DataLoader keyword arguments are passed on."""
    if kwargs.get("num_workers", 0) != 0:
        raise ValueError("ShardMix loaders run with num_workers=0: the daemon prefetches, and each trainer "
                         "process has one connection")
    if kwargs.get("batch_size", None) is not None:
        raise ValueError("batch_size is the daemons' batch.size; the loader passes their batches through")
    kwargs.pop("num_workers", None)
    kwargs.pop("batch_size", None)
    if pin_memory:
        dataset.pin_memory = True
    return DataLoader(dataset, batch_size=None, num_workers=0, **kwargs)


# Bytes each checkpoint name's last save took: the next lease asks for as much.
_saved_sizes = {}


def _storage_bytes(obj, seen=None):
    """What the tensors in `obj` (nested dicts, lists, tuples) hold: torch.save writes each
    storage whole, once."""
    seen = set() if seen is None else seen
    tensor = getattr(torch, "Tensor", None)  # absent from the stand-in the tests use without torch
    if tensor is not None and isinstance(obj, tensor):
        try:
            storage = obj.untyped_storage() if hasattr(obj, "untyped_storage") else obj.storage()
            key = (storage.data_ptr(), obj.device.type)
            nbytes = storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            # No storage to ask (a sparse tensor, a wrapper subclass): torch.save still
            # writes it, in a layout of its own. The size is only the lease's first guess
            # (a state larger than the lease is serialised again), so its elements will do.
            try:
                return obj.element_size() * obj.numel()
            except (RuntimeError, NotImplementedError, TypeError, AttributeError):
                return 0
        if key in seen:
            return 0
        seen.add(key)
        return nbytes
    if isinstance(obj, dict):
        return sum(_storage_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_storage_bytes(v, seen) for v in obj)
    return 0


class _LeaseWriter:
    """torch.save's file: each write goes into the lease; past its end the writer only
    counts, so that a second pass knows the size."""

    def __init__(self, lease):
        self.lease = lease
        self.size = 0

    def write(self, data):
        n = memoryview(data).nbytes
        if self.size + n <= self.lease.size:
            self.lease.write(self.size, data)
        self.size += n
        return n

    def flush(self):
        pass


def save(obj, name, *, client=None, wait_durable=False):
    """torch.save(obj) into the node's ShardMix daemon as the next version of checkpoint
    `name` (one rank's state: use a name per rank). Returns the version number once the
    daemon holds the bytes; with wait_durable=True, once they are in checkpoint.dir.
    torch.save writes straight into a lease of the daemon's checkpoint pool (memory the
    daemon reuses from save to save), which is then saved without a copy
    (docs/decisions/0069). The lease asks for what the state's tensors hold plus room for
    the rest, or what the name's last save took if more; a state that turns out larger is
    serialised once more into a lease of its size."""
    c = _client(client)
    want = max(_storage_bytes(obj) + (1 << 20), _saved_sizes.get(name, 0))
    for _ in range(3):  # a state that keeps growing between passes: give up after three
        lease = c.lease_checkpoint(name, want)
        writer = _LeaseWriter(lease)
        try:
            torch.save(obj, writer)
        except BaseException:
            if c.holds_lease(lease):
                c.abandon_lease(lease)
            raise
        if writer.size <= want:
            _saved_sizes[name] = writer.size
            version = c.save_lease(lease, writer.size)
            if wait_durable:
                c.wait_durable(name)
            return version
        c.abandon_lease(lease)
        want = writer.size
    raise RuntimeError(f"shardmix.torch.save: checkpoint {name}: the state's size changed on every one of three "
                       f"passes (last {want} bytes)")


def load(name, *, client=None, **torch_load_kwargs):
    """torch.load of the newest version of checkpoint `name` (from the daemon's RAM, else
    from checkpoint.dir); keyword arguments (map_location, weights_only...) go to torch.load."""
    data = _client(client).load(name)
    return torch.load(io.BytesIO(data), **torch_load_kwargs)
