#!/usr/bin/env python3
"""The frame corpus speaks the current protocol: every frame header in
tests/fuzz/corpus/frame/ carries proto/wire.h's kProtocolVersion, except the inputs that
are about the header itself (listed below). A header of another version is refused before
any payload decoder runs, so an input left behind by a protocol bump would replay as a
no-op while looking like coverage of its decoder.

    corpus_version_test.py [-v]
"""
import os
import re
import struct
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus", "frame")
WIRE_H = os.path.join(HERE, "..", "..", "proto", "wire.h")
MAGIC = struct.unpack("<I", b"SMX1")[0]
HEADER = struct.Struct("<IHHII")  # magic, version, type, payload_bytes, reserved (proto::FrameHeader)
# Inputs about the header itself: another version on purpose, or too short to hold one.
ABOUT_THE_HEADER = {"old-version", "short-header"}


def protocol_version():
    with open(WIRE_H) as f:
        m = re.search(r"kProtocolVersion\s*=\s*(\d+)\s*;", f.read())
    if not m:
        raise AssertionError(f"no kProtocolVersion in {WIRE_H}")
    return int(m.group(1))


def headers(data):
    """(offset, version) of each frame header, walking header + payload as the fuzz target reads."""
    out, off = [], 0
    while off + HEADER.size <= len(data):
        magic, version, _type, payload, _reserved = HEADER.unpack_from(data, off)
        if magic != MAGIC:
            break
        out.append((off, version))
        off += HEADER.size + payload
    return out


class FrameCorpusVersionTest(unittest.TestCase):
    def test_every_frame_is_of_the_current_protocol(self):
        current = protocol_version()
        names = sorted(os.listdir(CORPUS))
        self.assertGreater(len(names), len(ABOUT_THE_HEADER))
        for name in names:
            with open(os.path.join(CORPUS, name), "rb") as f:
                found = headers(f.read())
            if name in ABOUT_THE_HEADER:
                self.assertTrue(all(v != current for _, v in found), f"{name} is meant to hold no current header")
                continue
            self.assertTrue(found, f"{name}: no frame header")
            for off, version in found:
                self.assertEqual(version, current, f"{name}: the header at byte {off} is protocol {version}, "
                                                   f"not {current}: refresh the input for the new layout")


if __name__ == "__main__":
    unittest.main()
