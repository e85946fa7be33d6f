"""Helpers the Python parts of the benchmarks in bench/ share (bench/lib.sh is the shell side).

Results: json_rows / json_lines read the 'JSON {...}' lines every benchmark program prints;
stats is the median, min and max every table reports; epoch_span is an epoch's wall-clock
span over ranks; utc_now and machine head a result file.

The PyTorch DataLoader baselines (storage_torch.py, stall_torch.py, torch_loader.py):
SampleFiles, the map-style dataset of raw sample files they all read; and for the ones that
start one process per rank, rank_main, join_ranks, rank_loader and timed_epochs.
Importing this module does not import torch: the report scripts run without it.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time


# ----------------------------------------------------------------------------- results
def json_rows(lines):
    """The objects of the 'JSON {...}' lines among lines (a benchmark program's output)."""
    return [json.loads(line[5:]) for line in lines if line.startswith("JSON ")]


def json_lines(path):
    """The 'JSON {...}' lines of the file at path, as objects."""
    with open(path) as f:
        return json_rows(f)


def stats(xs):
    """Median, min and max of the values that are not None, and their count (Nones when empty)."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def epoch_span(ranks):
    """An epoch's wall-clock span over its ranks' records: first start to last end (the
    monotonic clock every program here reports, on one machine)."""
    return max(r["t_end"] for r in ranks) - min(r["t_start"] for r in ranks)


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def machine():
    """"2 cores, x86_64": what a result's figures were measured on, in brief."""
    return f"{os.cpu_count()} cores, {platform.machine()}"


# ----------------------------------------------------------------------------- DataLoader baselines
class SampleFiles:
    """Map-style dataset: item i is (the bytes of sample file i, the number in its class
    folder's name: class_00012/... -> 12). Each item is read as a reader of sample files
    does: open, one exact-size pread (the size from a stat at start), close."""

    def __init__(self, root, paths):
        self.root = root
        self.paths = paths
        self.sizes = [os.stat(os.path.join(root, p)).st_size for p in paths]
        self.labels = [int(m.group(1)) if (m := re.search(r"class_(\d+)", p)) else 0 for p in paths]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        path = os.path.join(self.root, self.paths[i])
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, self.sizes[i], 0)
            while len(data) < self.sizes[i]:  # short reads are legal
                more = os.pread(fd, self.sizes[i] - len(data), len(data))
                if not more:
                    raise IOError(f"{path}: file shrank to {len(data)} bytes, expected {self.sizes[i]}")
                data += more
        finally:
            os.close(fd)
        return data, self.labels[i]


def collate_list(batch):
    """The batch as the list of (bytes, label) pairs: no tensor conversion."""
    return batch


def read_list(path):
    """The sample paths of a --list file: one a line, relative to --root."""
    with open(path) as f:
        return [line.split()[0] for line in f if line.strip()]


def rank_main(script, doc, run_rank, label, add_arguments=None, check=None):
    """The main() of a DataLoader baseline that runs one process per rank. Its options:
    what add_arguments(parser) adds, then --world, --workers, --prefetch, --epochs, --batch
    and --seed; check(parser, args) may reject a combination. Without --rank it starts
    --world copies of script (argv plus the gloo rendezvous file and --rank R), relays
    their output and returns the first non-zero exit status; with --rank it is one of
    them and calls run_rank(args)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if add_arguments:
        add_arguments(parser)
    parser.add_argument("--world", type=int, default=4, help="rank processes")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    parser.add_argument("--prefetch", type=int, default=2, help="DataLoader prefetch_factor (batches per worker)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if check:
        check(parser, args)
    if args.rank is not None:
        run_rank(args)
        return 0
    with tempfile.TemporaryDirectory(prefix=f"smx-{label}.") as tmp:
        base = [sys.executable, os.path.abspath(script)] + sys.argv[1:] + ["--store", os.path.join(tmp, "store")]
        procs = [subprocess.Popen(base + ["--rank", str(r)]) for r in range(args.world)]
        rc = 0
        for proc in procs:
            rc = proc.wait() or rc
        return rc


def join_ranks(args):
    """Joins this rank (args.rank of args.world) to the job's gloo group (args.store), as a
    DDP rank would; one torch thread, so that the ranks do not fight over the cores.
    Returns torch.distributed, for the barriers."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=args.rank, world_size=args.world)
    return dist


def rank_loader(args, dataset):
    """(sampler, loader) of this rank: a shuffling DistributedSampler (args.seed) and a
    DataLoader of args.batch list-collated items with args.workers persistent workers."""
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=args.world, rank=args.rank, shuffle=True, seed=args.seed)
    # prefetch_factor only with workers: some torch versions reject any value (None too)
    # when the loader runs in the rank's own process.
    workers = {"persistent_workers": True, "prefetch_factor": args.prefetch} if args.workers > 0 else {}
    loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
                        collate_fn=collate_list, **workers)
    return sampler, loader


def timed_epochs(args, dist, sampler, batches, bench, consume):
    """args.epochs epochs over batches, each started together (a barrier, as DDP ranks
    would) and timed on the monotonic clock; consume(batch) handles a batch and returns
    its bytes. Prints one 'JSON' line per epoch: bench, rank, epoch, samples, bytes,
    workers, t_start, t_end. sampler (None for in-memory batches) gets set_epoch."""
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        dist.barrier()
        t_start = time.monotonic()
        samples = nbytes = 0
        for batch in batches:
            nbytes += consume(batch)
            samples += len(batch)
        t_end = time.monotonic()
        print_json_line({"bench": bench, "rank": args.rank, "epoch": epoch, "samples": samples, "bytes": nbytes,
                         "workers": args.workers, "t_start": t_start, "t_end": t_end})
    dist.barrier()
    dist.destroy_process_group()


def print_json_line(record):
    """Prints 'JSON {...}' with one write(2): ranks share stdout, and print() under
    PYTHONUNBUFFERED writes the text and the newline apart, so two ranks' lines could
    interleave."""
    os.write(1, ("JSON " + json.dumps(record) + "\n").encode())
