"""What writing either file of a pair shares: the output types, how a tensor is stored and how a file
is closed (gguf_export.py, mmproj_export.py)."""

from __future__ import annotations

from typing import Literal

import gguf
import numpy as np

OutType = Literal["f32", "f16"]
FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16}


def add_tensor(writer: gguf.GGUFWriter, name: str, values: np.ndarray, outtype: OutType) -> None:
    """1-D tensors (norms, biases) in f32 as llama.cpp keeps them; the rest in `outtype`. The
    patch embedding stays a 4-D [hidden, channels, patch, patch] tensor (ggml's conv kernel order
    reversed, which is how GGUF stores every shape)."""
    is_f16 = outtype == "f16" and values.ndim > 1
    writer.add_tensor(name, values.astype(np.float16 if is_f16 else np.float32))


def finish(writer: gguf.GGUFWriter) -> None:
    """Header, metadata, tensors, in GGUF's order."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
