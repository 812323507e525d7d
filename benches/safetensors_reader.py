"""A checkpoint's safetensors tensors as float32 numpy arrays, read by hand: numpy has no
bfloat16 (nor does the `safetensors` package's numpy loader take it), so bf16 tensors are read as
u16 and widened, exactly. Shared by `make_gguf.py` and `tests/fixtures/bf16_floor.py`."""

import json
import struct

import numpy as np


def checkpoint_tensors(checkpoint):
    """(name, float32 array) of every tensor of the checkpoint folder's safetensors files."""
    for path in sorted(checkpoint.glob("*.safetensors")):
        raw = path.read_bytes()
        header_len = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + header_len])
        data = memoryview(raw)[8 + header_len:]
        for name, info in sorted(header.items()):
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            dtype = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}[info["dtype"]]
            values = np.frombuffer(data[start:end], dtype=dtype).reshape(info["shape"])
            if info["dtype"] == "BF16":
                values = (values.astype(np.uint32) << 16).view(np.float32)
            yield name, values.astype(np.float32)
