#!/usr/bin/env python3
"""Independent exactly-once oracle for ShardMix trainer traces.

Reads the per-rank CSV traces written by `shardmix-consume --trace DIR`
(DIR/rank-<R>.csv, header epoch,rank,batch,position,sample_id,path,label,bytes,
xxh64,tier,owner) and checks them against the dataset on disk, which it walks
itself with the folder-format rules:

  * classes are the immediate subdirectories of the root, sorted bytewise; a
    sample's label is the index of its class directory in that list;
  * files are found recursively below each class directory;
  * names starting with '.' (files and directories) are skipped;
  * files directly in the root belong to no class and are not samples.

Shard formats (--format webdataset | tfrecord) are walked independently too: tar
shards with Python's tarfile, TFRecord files by hand (length, masked CRC32C of
length and data, computed here in pure Python; the label from the tf.train.Example
protobuf, parsed here). A shard sample's trace path is "<shard>@<offset>" (offset
of the sample's first byte in the shard, shard relative to the dataset root);
damaged samples (the documented skip rules, docs/operations.md) are not part of
the exactly-once set and are reported as "invalid".

It imports nothing from the project: it is the referee. XXH64 (seed 0) comes from
the python3-xxhash module, else from libxxhash through ctypes, else from a pure
Python implementation (slow; fine for the tiny datasets of the unit tests).

Per epoch it checks: every sample delivered exactly once (with --drop-last:
exactly floor(N/(T*B))*T*B samples, none twice); bytes and xxh64 equal to the
file; labels; every rank the same number of batches, batches and positions
numbered 0.. without gaps, batch sizes <= B (== B with --drop-last); tier
'local' iff owner == rank // P, else 'peer' ('storage' only with
--allow-storage); a sample's owner the same everywhere; sample_id <-> path one
to one across ranks and epochs; each epoch's order differs from the previous
one's. --expect-peer / --expect-no-peer check that some / no sample came from a
peer. --skipped also reads DIR/skipped-rank-<R>.csv (epoch,rank,batch,sample_id,path:
samples whose bytes could not be read, skipped under dataset.strict = false): per epoch,
delivered and skipped samples together are the dataset, each exactly once, none both.
An empty batch leaves no row in rank-<R>.csv; the trainer lists it in
DIR/empty-rank-<R>.csv (epoch,rank,batch), read when present: a listed batch counts for
the batch numbering and the equal counts, must hold no sample, must come after all of
the rank's non-empty batches of that epoch, and is an error with --drop-last. A batch
neither traced nor listed is missing. With --drop-last the dropped samples must differ
from one epoch to the next (the plan drops a fresh random leftover every epoch).

Exit status: 0 PASS, 1 FAIL, 2 usage error (bad arguments, unreadable dataset).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import csv
import json
import os
import stat
import struct
import sys
from typing import Callable, Dict, List, Optional, Tuple

HEADER = ["epoch", "rank", "batch", "position", "sample_id", "path", "label",
          "bytes", "xxh64", "tier", "owner"]
TIERS = ("local", "peer", "storage")
SKIPPED_HEADER = ["epoch", "rank", "batch", "sample_id", "path"]
EMPTY_HEADER = ["epoch", "rank", "batch"]

# --------------------------------------------------------------------------- XXH64

_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261
_M64 = (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _M64
    return (_rotl(acc, 31) * _P1) & _M64


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _M64


def xxh64_pure(data: bytes, seed: int = 0) -> int:
    """XXH64 per the xxHash spec, in pure Python (reference and last-resort fallback)."""
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _M64
        v2 = (seed + _P2) & _M64
        v3 = seed & _M64
        v4 = (seed - _P1) & _M64
        while i + 32 <= n:
            a, b, c, d = struct.unpack_from("<4Q", data, i)
            v1 = _round(v1, a)
            v2 = _round(v2, b)
            v3 = _round(v3, c)
            v4 = _round(v4, d)
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M64
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        (k,) = struct.unpack_from("<Q", data, i)
        h ^= _round(0, k)
        h = (_rotl(h, 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        (k,) = struct.unpack_from("<I", data, i)
        h ^= (k * _P1) & _M64
        h = (_rotl(h, 23) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M64
        h = (_rotl(h, 11) * _P1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    h ^= h >> 32
    return h


def _pick_xxh64() -> Tuple[str, Callable[[bytes], str]]:
    """Returns (backend name, function bytes -> 16 lowercase hex digits)."""
    try:
        import xxhash  # python3-xxhash

        if hasattr(xxhash, "xxh64_intdigest"):
            digest = xxhash.xxh64_intdigest
        else:  # python-xxhash < 2.0
            def digest(data: bytes) -> int:
                return xxhash.xxh64(data).intdigest()
        return "python-xxhash", lambda data: "%016x" % digest(data)
    except ImportError:
        pass
    try:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
        lib = ctypes.CDLL(name)
        fn = lib.XXH64
        fn.restype = ctypes.c_uint64
        fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
        return "libxxhash (ctypes)", lambda data: "%016x" % fn(data, len(data), 0)
    except (OSError, AttributeError):
        pass
    return "pure python (slow)", lambda data: "%016x" % xxh64_pure(data)


XXH64_BACKEND, xxh64_hex = _pick_xxh64()

# --------------------------------------------------------------------------- dataset


class FileInfo:
    __slots__ = ("path", "abspath", "label", "size", "offset", "_xxh")

    def __init__(self, path: str, abspath: str, label: int, size: int, offset: Optional[int] = None):
        self.path = path
        self.abspath = abspath
        self.label = label
        self.size = size
        self.offset = offset  # shard formats: the sample is `size` bytes at `offset` of abspath
        self._xxh: Optional[str] = None


def _bytewise(name: str) -> bytes:
    return os.fsencode(name)


def scan_dataset(root: str) -> Tuple[List[str], Dict[str, FileInfo]]:
    """Walks a folder-format dataset: returns (class names by label, path -> FileInfo)."""
    entries = sorted(os.scandir(root), key=lambda e: _bytewise(e.name))
    classes = [e.name for e in entries
               if not e.name.startswith(".") and e.is_dir(follow_symlinks=True)]
    files: Dict[str, FileInfo] = {}
    for label, cls in enumerate(classes):
        top = os.path.join(root, cls)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                files[rel] = FileInfo(rel, full, label, st.st_size)
    return classes, files


# ---- shard formats

def _crc32c_table() -> List[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli), bytewise table; independent of the daemon's ISA-L."""
    c = 0xFFFFFFFF
    t = _CRC32C
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(buf: bytes, i: int) -> Tuple[int, int]:
    v = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("bad varint")
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _fields(buf: bytes):
    """Yields (field number, wire type, value) of one protobuf message."""
    i = 0
    while i < len(buf):
        tag, i = _varint(buf, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ValueError("length past the end")
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wire)
        if i > len(buf):
            raise ValueError("field past the end")
        yield field, wire, v


def example_int64(record: bytes, name: str) -> int:
    """The single int64 value of feature `name` of a tf.train.Example (ValueError if none)."""
    found = None
    for f, w, features in _fields(record):
        if f != 1 or w != 2:
            continue
        for f2, w2, entry in _fields(features):
            if f2 != 1 or w2 != 2:
                continue
            key, value = None, b""
            for f3, w3, v in _fields(entry):
                if f3 == 1 and w3 == 2:
                    key = v
                elif f3 == 2 and w3 == 2:
                    value = v
            if key == name.encode():
                found = value
    if found is None:
        raise ValueError("no feature %r" % name)
    lst = None
    for f, w, v in _fields(found):
        if f in (1, 2, 3) and w == 2:
            lst = v if f == 3 else None
    if lst is None:
        raise ValueError("feature %r is not an int64_list" % name)
    values = []
    for f, w, v in _fields(lst):
        if f == 1 and w == 2:
            i = 0
            while i < len(v):
                x, i = _varint(v, i)
                values.append(x)
        elif f == 1 and w == 0:
            values.append(v)
    if len(values) != 1:
        raise ValueError("%d values" % len(values))
    x = values[0]
    return x - (1 << 64) if x >= 1 << 63 else x


def _shard_files(root: str, suffixes: Tuple[str, ...]) -> List[Tuple[str, str]]:
    """(relative name, absolute path) of the shards: root itself or the shards in it."""
    if os.path.isfile(root):
        return [(os.path.basename(root), root)]
    out = []
    for e in sorted(os.scandir(root), key=lambda e: _bytewise(e.name)):
        if e.name.startswith(".") or not e.name.endswith(suffixes):
            continue
        if e.is_file(follow_symlinks=True):
            out.append((e.name, e.path))
    return out


def _label_list(files: Dict[str, FileInfo]) -> List[str]:
    top = max((i.label for i in files.values()), default=-1)
    return [str(i) for i in range(top + 1)]


def scan_webdataset(root: str, sample_exts: List[str], label_ext: str):
    """Tar shards with tarfile: returns (classes, path -> FileInfo, invalid samples)."""
    import tarfile

    files: Dict[str, FileInfo] = {}
    invalid = 0
    for rel, full in _shard_files(root, (".tar",)):
        size = os.path.getsize(full)
        members = []
        truncated = False
        cut_key = None  # key of the member whose data is cut, when its header was readable
        try:
            with tarfile.open(full, "r:") as tf:
                while True:
                    m = tf.next()
                    if m is None:
                        break
                    if m.offset_data + m.size > size:
                        truncated = True
                        base = m.name.rsplit("/", 1)
                        cut_key = (base[0] + "/" if len(base) == 2 else "") + base[-1].partition(".")[0]
                        break
                    if m.isreg() and not m.name.endswith("/"):
                        members.append(m)
                if tf.offset > size:
                    truncated = True
        except tarfile.TarError:
            truncated = True
        if not truncated and size % 512 != 0:
            truncated = True  # a partial header block at the end
        groups = []
        for m in members:
            base = m.name.rsplit("/", 1)
            stem = base[-1]
            prefix = base[0] + "/" if len(base) == 2 else ""
            key, _, ext = stem.partition(".")
            key = prefix + key
            if groups and groups[-1][0] == key:
                groups[-1][1][ext] = m
            else:
                groups.append((key, {ext: m}))
        if truncated:
            # The last group may be incomplete (documented rule): lost when the cut member
            # has its key, or when the cut is in a header (the member is unknown).
            if groups and (cut_key is None or cut_key == groups[-1][0]):
                groups = groups[:-1]
            invalid += 1
        with open(full, "rb") as f:
            for key, by_ext in groups:
                data = next((by_ext[x] for x in sample_exts if x in by_ext), None)
                if data is None:
                    invalid += 1
                    continue
                label = 0
                if label_ext:
                    lm = by_ext.get(label_ext)
                    try:
                        f.seek(lm.offset_data)
                        label = int(f.read(lm.size).decode("ascii").strip())
                        if not 0 <= label < 2 ** 31:
                            raise ValueError(label)
                    except (AttributeError, ValueError, UnicodeDecodeError):
                        invalid += 1
                        continue
                path = "%s@%d" % (rel, data.offset_data)
                files[path] = FileInfo(path, full, label, data.size, data.offset_data)
    return _label_list(files), files, invalid


def scan_tfrecord(root: str, label_feature: str):
    """TFRecord files by hand: returns (classes, path -> FileInfo, invalid samples)."""
    files: Dict[str, FileInfo] = {}
    invalid = 0
    for rel, full in _shard_files(root, (".tfrecord", ".tfrecords")):
        with open(full, "rb") as f:
            buf = f.read()
        i = 0
        while i < len(buf):
            if len(buf) - i < 12:
                invalid += 1
                break
            (n,) = struct.unpack_from("<Q", buf, i)
            (lcrc,) = struct.unpack_from("<I", buf, i + 8)
            if masked_crc32c(buf[i:i + 8]) != lcrc or i + 12 + n + 4 > len(buf):
                invalid += 1
                break
            data = buf[i + 12:i + 12 + n]
            (dcrc,) = struct.unpack_from("<I", buf, i + 12 + n)
            start, i = i, i + 12 + n + 4
            if masked_crc32c(data) != dcrc:
                invalid += 1
                continue
            label = 0
            if label_feature:
                try:
                    label = example_int64(data, label_feature)
                    if not 0 <= label < 2 ** 31:
                        raise ValueError(label)
                except ValueError:
                    invalid += 1
                    continue
            path = "%s@%d" % (rel, start + 12)
            files[path] = FileInfo(path, full, label, n, start + 12)
    return _label_list(files), files, invalid


def hash_files(infos: List[FileInfo], workers: int = 4) -> None:
    """Fills FileInfo._xxh for each file (once; reads run in a small thread pool)."""

    def one(info: FileInfo) -> None:
        if info._xxh is None:
            with open(info.abspath, "rb") as f:
                if info.offset is None:
                    info._xxh = xxh64_hex(f.read())
                else:
                    f.seek(info.offset)
                    info._xxh = xxh64_hex(f.read(info.size))

    todo = [i for i in infos if i._xxh is None]
    if len(todo) < 64 or workers <= 1:
        for info in todo:
            one(info)
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(one, todo, chunksize=32):
            pass


# --------------------------------------------------------------------------- traces


class Row:
    __slots__ = ("epoch", "rank", "batch", "position", "sample_id", "path", "label",
                 "nbytes", "xxh64", "tier", "owner", "where")

    def __init__(self, fields: List[str], where: str):
        (epoch, rank, batch, position, sample_id, self.path, label, nbytes,
         self.xxh64, self.tier, owner) = fields
        self.epoch = int(epoch)
        self.rank = int(rank)
        self.batch = int(batch)
        self.position = int(position)
        self.sample_id = int(sample_id)
        self.label = int(label)
        self.nbytes = int(nbytes)
        self.owner = int(owner)
        self.where = where

    def loc(self) -> str:
        return "epoch %d rank %d batch %d pos %d" % (self.epoch, self.rank, self.batch,
                                                     self.position)


def _q(path: str) -> str:
    """A path for messages: quoted, with control characters escaped."""
    return repr(path)


class Checker:
    MAX_KEPT = 1000  # problem messages kept (all are counted)

    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.problems: List[Tuple[str, str]] = []
        self.counts: collections.Counter = collections.Counter()

    def problem(self, kind: str, msg: str) -> None:
        self.counts[kind] += 1
        if len(self.problems) < self.MAX_KEPT:
            self.problems.append((kind, msg))

    # ---- loading
    def _side_rows(self, stem: str, header_want: List[str], required: bool):
        """Yields (rank, where, fields) of each row of DIR/<stem>-<R>.csv after its header."""
        for r in range(self.a.trainers):
            name = "%s-%d.csv" % (stem, r)
            full = os.path.join(self.a.trace_dir, name)
            if not os.path.exists(full):
                if required:
                    self.problem("files", "no %s for trainer rank %d (--skipped)" % (name, r))
                continue
            with open(full, newline="", encoding="utf-8", errors="surrogateescape") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                if header != header_want:
                    self.problem("format", "%s: header %r, expected %r" % (name, header, header_want))
                    continue
                for fields in reader:
                    yield r, "%s:%d" % (name, reader.line_num), fields

    def load_skipped(self) -> Dict[int, List[Tuple[str, int, str, int, int]]]:
        """epoch -> [(path, sample_id, where, rank, batch)] from DIR/skipped-rank-<R>.csv."""
        out: Dict[int, List[Tuple[str, int, str, int, int]]] = collections.defaultdict(list)
        for r, where, fields in self._side_rows("skipped-rank", SKIPPED_HEADER, required=True):
            try:
                epoch, rank, batch, sid = (int(x) for x in fields[:4])
                path = fields[4]
            except (ValueError, IndexError):
                self.problem("format", "%s: bad row %r" % (where, fields))
                continue
            if rank != r:
                self.problem("format", "%s: rank %d in rank %d's file" % (where, rank, r))
            out[epoch].append((path, sid, where, rank, batch))
        return out

    def load_empty(self) -> Dict[int, List[Tuple[int, int, str]]]:
        """epoch -> [(rank, batch, where)] from DIR/empty-rank-<R>.csv, where present (traces
        of a trainer that does not list its empty batches have none)."""
        out: Dict[int, List[Tuple[int, int, str]]] = collections.defaultdict(list)
        for r, where, fields in self._side_rows("empty-rank", EMPTY_HEADER, required=False):
            try:
                epoch, rank, batch = (int(x) for x in fields)
            except ValueError:
                self.problem("format", "%s: bad row %r" % (where, fields))
                continue
            if rank != r:
                self.problem("format", "%s: rank %d in rank %d's file" % (where, rank, r))
                continue
            out[epoch].append((rank, batch, where))
        return out

    def _add_empty_batches(self, e: int, listed: List[Tuple[int, int, str]],
                           batches: Dict[int, Dict[int, List[int]]]) -> int:
        """Counts the listed empty batches of epoch e into `batches`; returns how many."""
        for rank, batch, where in listed:
            if self.a.drop_last:
                self.problem("empty", "%s: epoch %d rank %d batch %d is empty, but with drop_last "
                             "every batch is full" % (where, e, rank, batch))
            if batches[rank].get(batch):
                self.problem("empty", "%s: epoch %d rank %d batch %d listed as empty but it has %d "
                             "samples in the trace" % (where, e, rank, batch, len(batches[rank][batch])))
            batches[rank][batch]  # counts as a batch, with no positions
        for rank in {rank for rank, _, _ in listed}:
            full = [b for b, pos in batches[rank].items() if pos]
            early = sorted(b for r, b, _ in listed if r == rank and full and b < max(full))
            if early:
                self.problem("empty", "epoch %d rank %d: empty batch(es) %s before the rank's last "
                             "non-empty batch %d (only the last batches may be empty)"
                             % (e, rank, early[:10], max(full)))
        return len(listed)

    def load_traces(self) -> List[Row]:
        a = self.a
        rows: List[Row] = []
        present = set()
        for name in sorted(os.listdir(a.trace_dir)):
            if not (name.startswith("rank-") and name.endswith(".csv")):
                continue
            stem = name[len("rank-"):-len(".csv")]
            if not stem.isdigit():
                self.problem("files", "unexpected trace file %s" % name)
                continue
            r = int(stem)
            if r >= a.trainers:
                self.problem("files", "trace file %s but only %d trainers" % (name, a.trainers))
                continue
            present.add(r)
            rows.extend(self._read_file(os.path.join(a.trace_dir, name), name, r))
        for r in range(a.trainers):
            if r not in present:
                self.problem("files", "no trace file rank-%d.csv for trainer rank %d" % (r, r))
        return rows

    def _read_file(self, full: str, name: str, rank: int) -> List[Row]:
        out: List[Row] = []
        with open(full, newline="", encoding="utf-8", errors="surrogateescape") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header != HEADER:
                self.problem("format", "%s: header %r, expected %r" % (name, header, HEADER))
                return out
            for fields in reader:
                where = "%s:%d" % (name, reader.line_num)
                if len(fields) != len(HEADER):
                    self.problem("format", "%s: %d fields, expected %d: %r"
                                 % (where, len(fields), len(HEADER), fields))
                    continue
                try:
                    row = Row(fields, where)
                except ValueError as e:
                    self.problem("format", "%s: bad number (%s): %r" % (where, e, fields))
                    continue
                if row.rank != rank:
                    self.problem("format", "%s: rank column %d in the file of rank %d"
                                 % (where, row.rank, rank))
                    continue
                if not 0 <= row.epoch < self.a.epochs:
                    self.problem("epochs", "%s: epoch %d outside 0..%d"
                                 % (where, row.epoch, self.a.epochs - 1))
                    continue
                out.append(row)
        return out

    # ---- checks
    def run(self) -> dict:
        a = self.a
        P = a.trainers_per_node
        daemons = a.trainers // P
        invalid = 0
        if a.format == "webdataset":
            classes, files, invalid = scan_webdataset(a.dataset, a.sample_ext.split(","), a.label_ext)
        elif a.format == "tfrecord":
            classes, files, invalid = scan_tfrecord(a.dataset, a.label_feature)
        else:
            classes, files = scan_dataset(a.dataset)
        self.invalid = invalid
        N = len(files)
        rows = self.load_traces()

        # Hash every file that was delivered (each once), or all of them.
        wanted = {r.path for r in rows if r.path in files}
        hash_files([files[p] for p in sorted(wanted)], workers=a.jobs)

        by_epoch: Dict[int, List[Row]] = collections.defaultdict(list)
        for r in rows:
            by_epoch[r.epoch].append(r)

        sid_to_path: Dict[int, Tuple[str, str]] = {}
        path_to_sid: Dict[str, Tuple[int, str]] = {}
        path_owner: Dict[str, Tuple[int, str]] = {}
        tiers_total: collections.Counter = collections.Counter()
        bytes_verified = 0
        samples_verified = 0
        per_epoch = []
        orders: Dict[int, Dict[Tuple[int, int, int], str]] = {}

        skipped_by_epoch = self.load_skipped() if a.skipped else {}
        empty_by_epoch = self.load_empty()
        dropped_before: Optional[set] = None
        dropped_by_epoch: Dict[int, set] = {}
        for e in range(a.epochs):
            erows = by_epoch.get(e, [])
            tiers: collections.Counter = collections.Counter()
            seen: Dict[str, List[Row]] = collections.defaultdict(list)
            slots: Dict[Tuple[int, int, int], Row] = {}
            batches: Dict[int, Dict[int, List[int]]] = {r: collections.defaultdict(list)
                                                        for r in range(a.trainers)}
            for r in erows:
                key = (r.rank, r.batch, r.position)
                if key in slots:
                    self.problem("position", "%s appears twice (%s and %s)"
                                 % (r.loc(), slots[key].where, r.where))
                    continue
                slots[key] = r
                batches[r.rank][r.batch].append(r.position)
                tiers[r.tier] += 1

                info = files.get(r.path)
                if info is None:
                    self.problem("unknown", "%s: path %s is not a sample of the dataset (%s)"
                                 % (r.loc(), _q(r.path), r.where))
                    continue
                seen[r.path].append(r)
                ok = True
                if r.label != info.label:
                    ok = False
                    self.problem("label", "%s %s: label %d, expected %d (class %s)"
                                 % (r.loc(), _q(r.path), r.label, info.label,
                                    _q(classes[info.label])))
                if r.nbytes != info.size:
                    ok = False
                    self.problem("bytes", "%s %s: bytes %d, file has %d"
                                 % (r.loc(), _q(r.path), r.nbytes, info.size))
                if r.xxh64 != info._xxh:
                    ok = False
                    self.problem("xxh64", "%s %s: xxh64 %s, file's is %s"
                                 % (r.loc(), _q(r.path), r.xxh64, info._xxh))
                if ok:
                    bytes_verified += info.size
                    samples_verified += 1

                prev = sid_to_path.get(r.sample_id)
                if prev is None:
                    sid_to_path[r.sample_id] = (r.path, r.loc())
                elif prev[0] != r.path:
                    self.problem("id", "sample_id %d is %s at %s but %s at %s"
                                 % (r.sample_id, _q(prev[0]), prev[1], _q(r.path), r.loc()))
                prevs = path_to_sid.get(r.path)
                if prevs is None:
                    path_to_sid[r.path] = (r.sample_id, r.loc())
                elif prevs[0] != r.sample_id:
                    self.problem("id", "%s has sample_id %d at %s but %d at %s"
                                 % (_q(r.path), prevs[0], prevs[1], r.sample_id, r.loc()))

                self._check_tier(r, daemons, P, path_owner)

            # exactly once
            for path, occ in seen.items():
                if len(occ) > 1:
                    self.problem("repeat", "epoch %d: %s delivered %d times (%s)"
                                 % (e, _q(path), len(occ),
                                    "; ".join("rank %d batch %d pos %d" % (o.rank, o.batch,
                                                                           o.position)
                                              for o in occ[:4])))
            # Skipped (unreadable) samples: with the delivered ones, each exactly once.
            skipped: Dict[str, str] = {}
            skipped_in: collections.Counter = collections.Counter()  # (rank, batch) -> skipped there
            for path, sid, where, srank, sbatch in skipped_by_epoch.get(e, []):
                if 0 <= srank < a.trainers:
                    batches[srank][sbatch]  # a batch whose samples were all skipped still counts
                    skipped_in[(srank, sbatch)] += 1
                if path not in files:
                    self.problem("unknown", "%s: skipped path %s is not a sample of the dataset" % (where, _q(path)))
                elif path in skipped:
                    self.problem("repeat", "epoch %d: %s skipped twice (%s, %s)" % (e, _q(path), skipped[path], where))
                elif path in seen:
                    self.problem("repeat", "epoch %d: %s skipped (%s) and delivered (%s)"
                                 % (e, _q(path), where, seen[path][0].loc()))
                prevs = path_to_sid.get(path)
                if prevs is not None and prevs[0] != sid:
                    self.problem("id", "%s: %s skipped as sample_id %d, delivered as %d at %s"
                                 % (where, _q(path), sid, prevs[0], prevs[1]))
                skipped.setdefault(path, where)
            delivered = len(erows)
            empty = self._add_empty_batches(e, empty_by_epoch.get(e, []), batches)
            if a.drop_last:
                dropped = {p for p in files if p not in seen and p not in skipped}
                if dropped and dropped == dropped_before:
                    self.problem("dropped", "epoch %d dropped the same %d samples as epoch %d "
                                 "(the leftover must be drawn afresh every epoch)"
                                 % (e, len(dropped), e - 1))
                dropped_before = dropped
                dropped_by_epoch[e] = dropped
                expected = (N // (a.trainers * a.batch_size)) * a.trainers * a.batch_size
                if delivered + len(skipped) != expected:
                    self.problem("count", "epoch %d: %d samples delivered, expected "
                                 "floor(%d/(%d*%d))*%d*%d = %d with drop_last"
                                 % (e, delivered, N, a.trainers, a.batch_size, a.trainers,
                                    a.batch_size, expected))
            else:
                missing = sorted(p for p in files if p not in seen and p not in skipped)
                for p in missing[:20]:
                    self.problem("missing", "epoch %d: %s (label %d) never delivered"
                                 % (e, _q(p), files[p].label))
                if len(missing) > 20:
                    self.counts["missing"] += len(missing) - 20
                    self.problems.append(("missing", "epoch %d: ... and %d more never delivered"
                                          % (e, len(missing) - 20)))

            self._check_batches(e, batches, skipped_in)
            orders[e] = {k: r.path for k, r in slots.items()}
            tiers_total.update(tiers)
            per_epoch.append({"epoch": e, "delivered": delivered, "skipped": len(skipped), "empty_batches": empty,
                              "distinct": len(seen), "tiers": dict(tiers),
                              "batches_per_rank": len(batches[0]) if a.trainers else 0})

        # Where each epoch's drop_last leftover came from (owners are known once all epochs
        # are read; a sample never delivered in any epoch has none): "?" for those.
        for pe in per_epoch:
            dropped = dropped_by_epoch.get(pe["epoch"])
            if dropped is not None:
                by_owner = collections.Counter(str(path_owner[p][0]) if p in path_owner else "?" for p in dropped)
                pe["dropped_by_owner"] = dict(sorted(by_owner.items()))

        # epochs must differ in order
        for e in range(1, a.epochs):
            if N > 1 and orders.get(e) and orders.get(e) == orders.get(e - 1):
                self.problem("order", "epoch %d delivered exactly the order of epoch %d "
                             "(no reshuffle between epochs)" % (e, e - 1))

        peer = tiers_total.get("peer", 0)
        if a.expect_peer and peer == 0:
            self.problem("peer", "no sample came from a peer (tier 'peer'), expected some")
        if a.expect_no_peer and peer:
            self.problem("peer", "%d samples came from peers, expected none" % peer)

        if a.expect_invalid is not None and self.invalid != a.expect_invalid:
            self.problem("invalid", "the dataset has %d invalid samples by the skip rules, expected %d"
                         % (self.invalid, a.expect_invalid))

        passed = not self.counts
        summary = {
            "verdict": "PASS" if passed else "FAIL",
            "epochs": a.epochs,
            "ranks": a.trainers,
            "trainers_per_node": P,
            "daemons": daemons,
            "dataset_samples": N,
            "invalid_samples": self.invalid,
            "classes": len(classes),
            "samples_per_epoch": [pe["delivered"] for pe in per_epoch],
            "tiers": {t: tiers_total.get(t, 0) for t in TIERS},
            "bytes_verified": bytes_verified,
            "samples_verified": samples_verified,
            "per_epoch": per_epoch,
            "problem_counts": dict(self.counts),
            "problems": [{"kind": k, "message": m} for k, m in self.problems],
            "xxh64_backend": XXH64_BACKEND,
        }
        return summary

    def _check_tier(self, r: Row, daemons: int, P: int,
                    path_owner: Dict[str, Tuple[int, str]]) -> None:
        if r.tier not in TIERS:
            self.problem("tier", "%s %s: unknown tier %r" % (r.loc(), _q(r.path), r.tier))
            return
        if r.tier == "storage":
            if not self.a.allow_storage:
                self.problem("tier", "%s %s: tier 'storage' (the dataset should fit in RAM; "
                             "pass --allow-storage if not)" % (r.loc(), _q(r.path)))
            return
        if not 0 <= r.owner < daemons:
            self.problem("owner", "%s %s: owner %d outside 0..%d"
                         % (r.loc(), _q(r.path), r.owner, daemons - 1))
            return
        node = r.rank // P
        want = "local" if r.owner == node else "peer"
        if r.tier != want:
            self.problem("tier", "%s %s: tier '%s' but owner %d %s rank %d's node %d "
                         "(expected '%s')" % (r.loc(), _q(r.path), r.tier, r.owner,
                                              "is" if r.owner == node else "is not",
                                              r.rank, node, want))
        prev = path_owner.get(r.path)
        if prev is None:
            path_owner[r.path] = (r.owner, r.loc())
        elif prev[0] != r.owner:
            self.problem("owner", "%s has owner %d at %s but %d at %s (placement must not "
                         "change)" % (_q(r.path), prev[0], prev[1], r.owner, r.loc()))

    def _check_batches(self, e: int, batches: Dict[int, Dict[int, List[int]]],
                       skipped_in: Optional[collections.Counter] = None) -> None:
        a = self.a
        counts = {}
        for rank in range(a.trainers):
            bmap = batches[rank]
            counts[rank] = len(bmap)
            nums = sorted(bmap)
            if nums != list(range(len(nums))):
                gaps = sorted(set(range(max(nums) + 1)) - set(nums)) if nums else []
                self.problem("batches", "epoch %d rank %d: batch numbers not 0..%d (missing %s)"
                             % (e, rank, len(nums) - 1, gaps[:10]))
            for b in nums:
                pos = sorted(bmap[b])
                if pos != list(range(len(pos))):
                    self.problem("positions", "epoch %d rank %d batch %d: positions %s, "
                                 "expected 0..%d" % (e, rank, b, pos[:20], len(pos) - 1))
                # Skipped (unreadable) samples held their places in the batch.
                size = len(pos) + (skipped_in[(rank, b)] if skipped_in else 0)
                if a.batch_size:
                    if size > a.batch_size:
                        self.problem("batch-size", "epoch %d rank %d batch %d: %d samples > "
                                     "batch size %d" % (e, rank, b, size, a.batch_size))
                    elif a.drop_last and size != a.batch_size:
                        self.problem("batch-size", "epoch %d rank %d batch %d: %d samples, "
                                     "expected %d with drop_last"
                                     % (e, rank, b, size, a.batch_size))
        if len(set(counts.values())) > 1:
            groups = collections.defaultdict(list)
            for rank, c in counts.items():
                groups[c].append(rank)
            desc = ", ".join("%d batches: ranks %s" % (c, _ranges(rs))
                             for c, rs in sorted(groups.items()))
            self.problem("batches", "epoch %d: ranks have unequal batch counts (%s)"
                         % (e, desc))


def _ranges(xs: List[int]) -> str:
    xs = sorted(xs)
    out = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else "%d-%d" % (xs[i], xs[j]))
        i = j + 1
    return ",".join(out)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return str(n)


def format_verdict(s: dict, max_problems: int = 10) -> str:
    def per_epoch(values: List[int]) -> str:
        # One number if every epoch had it, a/b/c for a few epochs, else the mean.
        if not values:
            return "0"
        if all(v == values[0] for v in values):
            return str(values[0])
        if len(values) <= 4:
            return "/".join(map(str, values))
        return "%.1f" % (sum(values) / len(values))

    tiers = {t: [pe["tiers"].get(t, 0) for pe in s["per_epoch"]] for t in TIERS}
    stats = ("epochs=%d ranks=%d samples/epoch=%s%s local=%s peer=%s%s bytes verified=%s "
             "(%d samples)" % (s["epochs"], s["ranks"], per_epoch(s["samples_per_epoch"]),
                               (" invalid=%d" % s["invalid_samples"]) if s.get("invalid_samples") else "",
                               per_epoch(tiers["local"]), per_epoch(tiers["peer"]),
                               (" storage=%s" % per_epoch(tiers["storage"]))
                               if any(tiers["storage"]) else "",
                               _human_bytes(s["bytes_verified"]), s["samples_verified"]))
    if s["verdict"] == "PASS":
        return "exactly-once: PASS  " + stats
    counts = s["problem_counts"]
    lines = ["exactly-once: FAIL  %d problem(s): %s" % (
        sum(counts.values()),
        " ".join("%s=%d" % (k, v) for k, v in sorted(counts.items()))),
        "  " + stats]
    for p in s["problems"][:max_problems]:
        lines.append("  - [%s] %s" % (p["kind"], p["message"]))
    if len(s["problems"]) > max_problems or sum(counts.values()) > max_problems:
        lines.append("  ... (%d more)" % (sum(counts.values()) - min(max_problems,
                                                                      len(s["problems"]))))
    return "\n".join(lines)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="check_traces.py",
        description="Check ShardMix trainer traces for exactly-once delivery against the "
                    "dataset on disk.")
    p.add_argument("trace_dir", help="directory with rank-<R>.csv files")
    p.add_argument("--dataset", required=True,
                   help="dataset root (folder format), or the shard directory or shard file")
    p.add_argument("--format", choices=("folder", "webdataset", "tfrecord"), default="folder",
                   help="dataset.format (default folder)")
    p.add_argument("--sample-ext", default="jpg,jpeg,png,webp,bin",
                   help="webdataset: dataset.sample_ext (default jpg,jpeg,png,webp,bin)")
    p.add_argument("--label-ext", default="cls", help="webdataset: dataset.label_ext (default cls)")
    p.add_argument("--label-feature", default="", help="tfrecord: dataset.label_feature (default none)")
    p.add_argument("--expect-invalid", type=int, default=None, metavar="K",
                   help="fail unless the dataset has exactly K invalid (skipped) samples")
    p.add_argument("--epochs", type=int, required=True, help="epochs the trainers ran")
    p.add_argument("--trainers", type=int, required=True, help="number of trainer ranks T")
    p.add_argument("--trainers-per-node", type=int, default=1, metavar="P",
                   help="trainer ranks per daemon; rank r's daemon is r // P (default 1)")
    p.add_argument("--batch-size", type=int, default=0, metavar="B",
                   help="batch size: batches must hold <= B samples")
    p.add_argument("--drop-last", action="store_true",
                   help="the run dropped partial batches: expect floor(N/(T*B))*T*B "
                        "samples per epoch, every batch exactly B")
    p.add_argument("--allow-storage", action="store_true",
                   help="accept tier 'storage' (dataset larger than the daemons' RAM)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--expect-peer", action="store_true",
                   help="fail unless some samples came from peers")
    g.add_argument("--expect-no-peer", action="store_true",
                   help="fail if any sample came from a peer")
    p.add_argument("--skipped", action="store_true",
                   help="also read skipped-rank-<R>.csv (unreadable samples skipped, dataset.strict = false): "
                        "they complete the exactly-once set")
    p.add_argument("--json", metavar="OUT", help="also write the full result as JSON")
    p.add_argument("--max-problems", type=int, default=10,
                   help="problems to print (default 10)")
    p.add_argument("--jobs", type=int, default=4, help="threads for hashing (default 4)")
    a = p.parse_args(argv)
    if a.epochs < 1:
        p.error("--epochs must be >= 1")
    if a.trainers < 1:
        p.error("--trainers must be >= 1")
    if a.trainers_per_node < 1 or a.trainers % a.trainers_per_node:
        p.error("--trainers (%d) must be a positive multiple of --trainers-per-node (%d)"
                % (a.trainers, a.trainers_per_node))
    if a.batch_size < 0:
        p.error("--batch-size must be >= 0")
    if a.drop_last and not a.batch_size:
        p.error("--drop-last needs --batch-size")
    if not os.path.isdir(a.trace_dir):
        p.error("trace dir %s is not a directory" % a.trace_dir)
    if a.format == "folder" and not os.path.isdir(a.dataset):
        p.error("dataset %s is not a directory" % a.dataset)
    if not os.path.exists(a.dataset):
        p.error("dataset %s does not exist" % a.dataset)
    return a


def main(argv: Optional[List[str]] = None) -> int:
    a = parse_args(argv)
    summary = Checker(a).run()
    print(format_verdict(summary, a.max_problems), flush=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, ensure_ascii=False)
            f.write("\n")
    return 0 if summary["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
