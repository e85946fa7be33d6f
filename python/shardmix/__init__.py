"""ShardMix for Python: the trainer side of ShardMix (libshardmix) as a Python module.

    import shardmix
    client = shardmix.Client()                      # rank/world from the launcher's env
    for epoch in range(90):
        for batch in client.epoch(epoch):           # prefetched by the daemon
            for s in batch:                         # s.id, s.label; bytes: zero-copy
                x = numpy.frombuffer(s, numpy.uint8)  # a read-only view into shared memory
        print(client.last_epoch_stats)              # the daemon's figures for the epoch

Lifetime of the bytes: a batch is *released* when the iterator moves past it (next(),
the next loop iteration), when another epoch starts, or when the client is closed. A
Sample of a released batch refuses new exports (ReleasedError, a BufferError).
Exports taken before stay mapped (no crash) but their bytes are unspecified, because
the daemon reuses staging slots: copy what you keep. Client(strict=True) raises
BufferError at the release if any export of the batch is still alive.

PyTorch: shardmix.torch (ShardMixDataset, make_loader). Errors: shardmix.Error (a
RuntimeError) with the daemon's message and .code. See docs/python.md.
"""
from ._shardmix import (  # noqa: F401  (re-exported)
    HAS_CHECKPOINT,
    Batch,
    Client,
    Epoch,
    Error,
    ReleasedError,
    Sample,
    detect_launcher_rank,
)

__all__ = [
    "Batch",
    "Client",
    "Epoch",
    "Error",
    "HAS_CHECKPOINT",
    "ReleasedError",
    "Sample",
    "detect_launcher_rank",
]
