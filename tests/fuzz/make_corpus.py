#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: tests/fuzz/corpus/<target>/*.

A few small valid files laid out as fasttrain's (and the reference implementation's) writers lay them
out, and a few near-valid ones that each break one rule, so that the fuzzers start next to both the
accepting and the rejecting paths. Run it again after changing it; the files are checked in.
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
# The reference's order, descending: the writer puts wider dtypes first.
DTYPE_ORDER = ["I64", "F64", "F32", "I32", "BF16", "F16", "I16", "I8", "U8", "BOOL"]


def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, data bytes)] -> a file image laid out like the writer's."""
    tensors = sorted(tensors, key=lambda t: (DTYPE_ORDER.index(t[1]), t[0]))
    header = {}
    if metadata:
        header["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    return raw(json.dumps(header, separators=(",", ":")), b"".join(t[3] for t in tensors), pad)


def raw(header_text, buffer, pad=True):
    header = header_text.encode()
    if pad:
        header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + buffer


def idx(dims, data, type_code=0x08, rank=None):
    rank = len(dims) if rank is None else rank
    return bytes([0, 0, type_code, rank]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


def write(target, files):
    folder = os.path.join(HERE, "corpus", target)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as out:
            out.write(data)


one_f32 = ("w", "F32", [2, 3], f32(0, 1, 2, 3, 4, 5))
write("safetensors", {
    "valid-f32": safetensors([one_f32], {"step": "100"}),
    "valid-mixed": safetensors([
        ("z", "I64", [1], struct.pack("<q", -7)),
        ("d", "F64", [], struct.pack("<d", 0.5)),
        ("h", "F16", [2], b"\x00\x3c\x00\xc0"),
        ("b16", "BF16", [1, 1], b"\x80\x3f"),
        ("i", "I32", [2], struct.pack("<2i", 1, -1)),
        ("s", "I16", [1], struct.pack("<h", 3)),
        ("c", "I8", [2], b"\x01\xff"),
        ("u", "U8", [3], b"\x00\x7f\xff"),
        ("flag", "BOOL", [2], b"\x00\x01"),
        ("empty", "F32", [0, 4], b""),
    ], {"format": "pt", "a": "x\"y"}),
    "valid-no-tensors": safetensors([], {"note": "only metadata"}),
    "valid-empty-header": raw("{}", b""),
    "valid-unpadded": safetensors([one_f32], pad=False),
    "bad-hole": raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x00\x01"),
    "bad-overlap": raw('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                       '"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', b"\x00\x01\x02"),
    "bad-trailing-byte": safetensors([one_f32]) + b"\x00",
    "bad-size": raw('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', bytes(8)),
    "bad-dtype-u16": raw('{"a":{"dtype":"U16","shape":[1],"data_offsets":[0,2]}}', bytes(2)),
    "bad-duplicate": raw('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                         '"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)),
    "bad-bool-byte": safetensors([("flag", "BOOL", [2], b"\x01\x02")]),
    "bad-shape-overflow": raw('{"a":{"dtype":"F64","shape":[4294967296,4294967296,0],'
                              '"data_offsets":[0,0]}}', b""),
    "bad-header-length": struct.pack("<Q", 1 << 20) + b"{}",
    "bad-deep-nesting": raw('{"a":' + "[" * 130 + "]" * 130 + "}", b""),
    "bad-number-overflow": raw('{"a":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}}', bytes(4)),
    "bad-truncated-json": raw('{"a":{"dtype":"F32","shape":[2,3],"data_offs', b""),
})

write("idx", {
    "valid-labels": idx([5], [0, 1, 2, 9, 7]),
    "valid-images": idx([2, 3, 3], range(18)),
    "valid-rank2": idx([2, 2], [255, 0, 128, 1]),
    "bad-type-float": idx([1], [0, 0, 128, 63], type_code=0x0D),
    "bad-truncated": idx([2, 3, 3], range(17)),
    "bad-trailing": idx([3], [1, 2, 3, 4]),
    "bad-zero-dim": idx([2, 0], []),
    "bad-rank0": idx([], [], rank=0),
    "bad-header": idx([2, 3, 3], [], rank=3)[:9],
    "bad-huge-dims": idx([0xFFFFFFFF] * 3, [1, 2]),
})
