"""Minimal safetensors reader/writer over numpy (with bfloat16 through ``ml_dtypes``).

Format: 8-byte little-endian header length N, N bytes of JSON ``{name: {dtype, shape, data_offsets}}``
(plus optional ``__metadata__``), then the raw little-endian tensor bytes. Reading memory-maps the
file, so a tensor is only paged in when asked for; writing streams one tensor at a time.
No pickle is involved anywhere.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterable, Mapping

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class SafetensorsFile:
    """Read-only view of one ``.safetensors`` file: ``names()``, ``shape(name)``, ``get(name)``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError(f"{self.path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n > 100_000_000:
                raise ValueError(f"{self.path}: not a safetensors file (header length {n})")
            try:
                header = json.loads(f.read(n))
            except json.JSONDecodeError as e:
                raise ValueError(f"{self.path}: corrupt safetensors header ({e})") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self.header = header
        self._offset = 8 + n
        self.size = self.path.stat().st_size
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r") if self.size > self._offset else None

    def names(self) -> list[str]:
        return list(self.header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.header[name]["shape"])

    def dtype(self, name: str) -> np.dtype:
        code = self.header[name]["dtype"]
        if code not in _DTYPES:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {code}")
        return _DTYPES[code]

    def get(self, name: str) -> np.ndarray:
        """The tensor as a (read-only, memory-mapped) numpy array; a tensor whose bytes lie past the end of the file
        (a truncated file) is a ``ValueError`` naming the file and the tensor."""
        info = self.header[name]
        dt = self.dtype(name)
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        if e - b != int(np.prod(shape)) * dt.itemsize:
            raise ValueError(f"{self.path}: tensor {name!r} byte size {e - b} does not match shape {shape} {dt}")
        if e == b:
            return np.zeros(shape, dt)
        if self._offset + e > self.size:
            raise ValueError(f"{self.path}: truncated file: tensor {name!r} {shape} {dt} needs bytes "
                             f"{self._offset + b}-{self._offset + e}, the file has {self.size}")
        raw = self._mm[self._offset + b:self._offset + e]
        return raw.view(dt).reshape(shape)


def save_file(tensors: Iterable[tuple[str, tuple[int, ...], np.dtype]], produce, path: str | Path,
              metadata: Mapping[str, str] | None = None) -> None:
    """Write a safetensors file streaming one tensor at a time.

    ``tensors``: (name, shape, dtype) in file order; ``produce(name) -> np.ndarray`` is called once per
    tensor, right before it is written, so only one tensor is on the host at a time.
    """
    entries = list(tensors)
    header: dict = {}
    off = 0
    for name, shape, dt in entries:
        dt = np.dtype(dt)
        if dt not in _NAMES:
            raise ValueError(f"cannot write tensor {name!r} with dtype {dt}")
        size = int(np.prod(shape)) * dt.itemsize
        header[name] = {"dtype": _NAMES[dt], "shape": [int(s) for s in shape], "data_offsets": [off, off + size]}
        off += size
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, dt in entries:
            arr = np.ascontiguousarray(np.asarray(produce(name)))
            if arr.shape != tuple(shape) or arr.dtype != np.dtype(dt):
                raise ValueError(f"tensor {name!r}: produced {arr.shape} {arr.dtype}, declared {tuple(shape)} {dt}")
            f.write(arr.tobytes())
