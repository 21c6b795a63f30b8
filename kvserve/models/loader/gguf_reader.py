"""GGUF container parsing: metadata and tensor table, with the tensor data memory-mapped.

We parse the header ourselves instead of using `gguf.GGUFReader`: that reader builds one
numpy view per vocabulary string, which takes ~10 s for Gemma's 262k-token vocabulary;
this walk skips string arrays nobody asked for and takes ~50 ms. Every malformed input
becomes a `CorruptModelFileError` naming the file, never a numpy/struct traceback.
"""

from __future__ import annotations

import struct
from collections.abc import Container
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from kvserve.models.errors import CorruptModelFileError, ModelNotFoundError, UnsupportedModelError

GGUF_MAGIC = b"GGUF"
_HEADER_BYTES = 24  # magic, version u32, tensor count u64, metadata count u64
_DEFAULT_ALIGNMENT = 32

# Fixed-size metadata value types (GGUF spec): u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64.
_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (ggml stores the fastest-moving dimension first)
    ggml_type: GGMLQuantizationType
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    """A parsed header plus a read-only memory map of the whole file."""

    path: Path
    metadata: dict[str, Any]  # string arrays not requested are stored as their length
    tensors: tuple[GGUFTensorInfo, ...]
    blob: np.ndarray  # uint8 memmap

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    @property
    def tensor_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tensors)

    def raw(self, info: GGUFTensorInfo) -> np.ndarray:
        """The stored bytes of one tensor, shaped [rows, bytes_per_row] (no copy)."""
        rows = prod(info.shape[:-1]) if len(info.shape) > 1 else 1
        return self.blob[info.offset : info.offset + info.nbytes].reshape(rows, -1)


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, blob: np.ndarray, path: Path) -> None:
        self.blob, self.path, self.pos = blob, path, 0

    def fail(self, problem: str) -> CorruptModelFileError:
        return CorruptModelFileError(self.path, problem)

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.blob):
            raise self.fail(f"truncated header (needs byte {self.pos + size}, file has {len(self.blob)})")
        values = struct.unpack_from("<" + fmt, self.blob, self.pos)
        self.pos += size
        return values

    def string(self) -> str:
        (length,) = self.unpack("Q")
        end = self.pos + length
        if end > len(self.blob):
            raise self.fail(f"truncated header (string of {length} bytes at offset {self.pos})")
        try:
            text = bytes(self.blob[self.pos : end]).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"invalid UTF-8 string at offset {self.pos}") from None
        self.pos = end
        return text

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            (length,) = self.unpack("Q")
            self.pos += length
        if self.pos > len(self.blob):
            raise self.fail("truncated header (string array runs past the end of the file)")

    def value(self, value_type: int, keep_strings: bool) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])[0]
        if value_type == _STRING:
            return self.string()
        if value_type != _ARRAY:
            raise self.fail(f"unknown metadata value type {value_type} at offset {self.pos}")
        element_type, count = self.unpack("IQ")
        if count > len(self.blob):
            raise self.fail(f"implausible array length {count} at offset {self.pos}")
        if element_type in _SCALAR_FORMATS:
            return list(self.unpack(f"{count}{_SCALAR_FORMATS[element_type]}"))
        if element_type != _STRING:
            raise self.fail(f"unsupported metadata array element type {element_type}")
        if keep_strings:
            return [self.string() for _ in range(count)]
        self.skip_strings(count)
        return count


def read_gguf(path: str | Path, string_arrays: Container[str] = ()) -> GGUFFile:
    """Parse `path`'s header; `string_arrays` names the string-array keys to keep in full."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(path, "no such file")
    size = path.stat().st_size
    if size < _HEADER_BYTES:
        raise CorruptModelFileError(path, f"not a GGUF file ({size} bytes, too small for a header)")
    blob = np.memmap(path, mode="r", dtype=np.uint8)
    if bytes(blob[:4]) != GGUF_MAGIC:
        raise CorruptModelFileError(path, f"not a GGUF file (magic {bytes(blob[:4])!r}, expected b'GGUF')")
    cursor = _Cursor(blob, path)
    cursor.pos = 4
    version, num_tensors, num_kv = cursor.unpack("IQQ")
    if version not in (2, 3):
        raise UnsupportedModelError(path, f"GGUF version {version} is not supported (2 and 3 are)")
    if num_tensors > size or num_kv > size:
        raise cursor.fail(f"implausible header counts ({num_tensors} tensors, {num_kv} metadata keys)")
    metadata: dict[str, Any] = {}
    for _ in range(num_kv):
        key = cursor.string()
        (value_type,) = cursor.unpack("I")
        metadata[key] = cursor.value(value_type, keep_strings=key in string_arrays)
    if "general.architecture" not in metadata:
        raise cursor.fail("metadata has no general.architecture")
    table = [_read_tensor_entry(cursor) for _ in range(num_tensors)]
    alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_start = (cursor.pos + alignment - 1) // alignment * alignment
    tensors = tuple(_tensor_info(path, size, data_start, *entry) for entry in table)
    return GGUFFile(path=path, metadata=metadata, tensors=tensors, blob=blob)


def _read_tensor_entry(cursor: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cursor.string()
    (num_dims,) = cursor.unpack("I")
    if num_dims > 8:
        raise cursor.fail(f"tensor {name!r} has {num_dims} dimensions")
    dims = cursor.unpack(f"{num_dims}Q")
    ggml_type, offset = cursor.unpack("IQ")
    return name, tuple(reversed(dims)), ggml_type, offset


def _tensor_info(
    path: Path, file_size: int, data_start: int, name: str, shape: tuple[int, ...], type_id: int, offset: int
) -> GGUFTensorInfo:
    try:
        ggml_type = GGMLQuantizationType(type_id)
    except ValueError:
        raise UnsupportedModelError(path, f"tensor {name!r} has unknown ggml type id {type_id}") from None
    block_elements, block_bytes = GGML_QUANT_SIZES[ggml_type]
    num_elements = prod(shape)
    if shape and shape[-1] % block_elements:
        raise CorruptModelFileError(
            path, f"tensor {name!r} row of {shape[-1]} is not a multiple of {block_elements}"
        )
    nbytes = num_elements // block_elements * block_bytes
    start = data_start + offset
    if start + nbytes > file_size:
        raise CorruptModelFileError(
            path, f"truncated: tensor {name!r} ends at byte {start + nbytes}, file has {file_size} bytes"
        )
    return GGUFTensorInfo(name=name, shape=shape, ggml_type=ggml_type, offset=start, nbytes=nbytes)
