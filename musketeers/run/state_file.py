"""A checkpoint's training state without pickle: tensors in safetensors, the rest in JSON.

The optimizer's and scheduler's state dicts and every RNG state are nested dicts, lists and
tuples of numbers, strings, tensors and numpy arrays. ``write_state`` stores each tensor (and
array) under a numbered key of ``state.safetensors`` and the structure, with references to
those keys, in ``state.json``; ``read_state`` rebuilds it. Reading either file runs no code,
whatever it holds; anything outside this encoding is refused as unreadable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

JSON, TENSORS = "state.json", "state.safetensors"


def _encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().clone().contiguous()
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        key = str(len(tensors))
        # through int64/float64: safetensors has no uint32, numpy's RNG key is one
        wide = value.astype(np.float64 if value.dtype.kind == "f" else np.int64)
        tensors[key] = torch.from_numpy(np.ascontiguousarray(wide))
        return {"__ndarray__": key, "dtype": value.dtype.str}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, dict):
        # optimizer state is keyed by int parameter ids: kept as pairs, not JSON's str keys
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)]
                             for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint's state")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"__tensor__"}:
        return tensors[value["__tensor__"]]
    if set(value) == {"__ndarray__", "dtype"}:
        return tensors[value["__ndarray__"]].numpy().astype(np.dtype(value["dtype"]))
    if set(value) == {"__tuple__"}:
        return tuple(_decode(v, tensors) for v in value["__tuple__"])
    if set(value) == {"__dict__"}:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in value["__dict__"]}
    raise ValueError(f"unknown entry {sorted(value)[:3]} in {JSON}")


def write_state(state: dict[str, Any], folder: Path) -> None:
    tensors: dict[str, torch.Tensor] = {}
    encoded = _encode(state, tensors)
    save_file(tensors, str(Path(folder) / TENSORS))
    with open(Path(folder) / JSON, "w") as fh:
        json.dump(encoded, fh)
        fh.flush()
        os.fsync(fh.fileno())


def read_state(folder: Path) -> dict[str, Any]:
    """The state ``write_state`` wrote (ValueError, KeyError or OSError when it is not that)."""
    tensors = load_file(str(Path(folder) / TENSORS))
    state = _decode(json.loads((Path(folder) / JSON).read_text("utf-8")), tensors)
    if not isinstance(state, dict):
        raise ValueError(f"{JSON} is not a mapping")
    return state
