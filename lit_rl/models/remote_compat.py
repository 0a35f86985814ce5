"""Load a checkpoint's own modeling code (``trust_remote_code``) on the transformers that is installed.

Remote code is written against the transformers its authors had. LLaDA-8B-Instruct's ``modeling_llada.py``
(written for 4.46) fails on transformers 5.x in three ways, measured on the official files:

1. ``LLaDAModelLM.__init__`` never calls ``post_init()``, so transformers 5's loader finds no
   ``all_tied_weights_keys`` (``AttributeError``);
2. its ``tie_weights(self)`` takes no arguments; transformers 5 calls ``tie_weights(missing_keys=...,
   recompute_mapping=...)`` (``TypeError``);
3. its config class does not keep ``use_cache`` (transformers 5's ``PretrainedConfig`` no longer defines
   it) while its forward reads ``self.config.use_cache`` (``AttributeError``).

Dream-v0-Instruct-7B's ``modeling_dream.py`` (written for 4.4x) fails in two more: it looks up
``ROPE_INIT_FUNCTIONS["default"]``, which transformers 5 removed (``KeyError: 'default'``; the shim registers
the 4.x default RoPE, ``inv_freq = 1 / theta^(2i/d)`` with scaling 1, under that key when it is missing),
and it declares ``_tied_weights_keys`` as a 4.x list where transformers 5 expects a ``{target: source}``
mapping (``AttributeError: 'list' object has no attribute 'keys'``; the shim maps each listed key to the
input embedding's weight, the 4.x meaning). Its ``DreamGenerationConfig.validate(self, is_init=False,
strict=True)`` rejects the ``user_set_attributes=`` that transformers 5 passes (``TypeError``): the shim
wraps ``validate`` of the remote code's ``GenerationConfig`` subclasses, in memory, to drop keywords the
remote signature does not take. And its rotary embedding keeps ``inv_freq`` as a non-persistent buffer that
its ``_init_weights`` does not set: transformers 5 builds models on the meta device and materialises such
buffers uninitialised (garbage frequencies, NaN logits). After loading, the shim recomputes every remote
rotary module's ``inv_freq`` (:func:`reinit_rotary_buffers`).

:func:`load_remote_model` supplies these behaviours **without editing the user's files**: it resolves the
class named by ``config.json``'s ``auto_map``, derives a subclass that calls ``post_init()`` when the
original ``__init__`` did not and that accepts (and ignores) the extra ``tie_weights`` arguments, gives
the config a ``use_cache`` (``False``: diffusion LMs have no generation cache) when it has none, and
loads through that subclass. A remote model that still fails raises :class:`RemoteCodeError` naming the
class, the installed transformers and the ways out (the native implementation, or a transformers
version the code was written for), instead of the bare ``AttributeError``.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch import nn

#: what the shim covers; listed in the error a still-incompatible model raises
COVERED = (
    "post_init() not called, tie_weights() without arguments, config without use_cache, "
    "ROPE_INIT_FUNCTIONS['default'] missing, _tied_weights_keys as a list, GenerationConfig.validate() "
    "without transformers 5's keywords, rotary inv_freq left uninitialised"
)


class RemoteCodeError(RuntimeError):
    """A checkpoint's remote modeling code cannot be loaded on the installed transformers."""


def remote_model_class(config: Any, path: str, auto_key: str = "AutoModel") -> type[nn.Module]:
    """The class ``config.auto_map[auto_key]`` names, imported from the checkpoint's own code."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    auto_map = getattr(config, "auto_map", None) or {}
    ref = auto_map.get(auto_key) or auto_map.get("AutoModelForCausalLM") or auto_map.get("AutoModelForMaskedLM")
    if ref is None:
        raise RemoteCodeError(f"{path}/config.json: no auto_map entry for {auto_key} (keys: {sorted(auto_map)})")
    return get_class_from_dynamic_module(ref, path)


def tied_keys_as_mapping(model: nn.Module, keys: list[str] | tuple[str, ...]) -> dict[str, str]:
    """transformers 4.x's ``_tied_weights_keys = ["lm_head.weight"]`` (tied to the input embeddings) as
    transformers 5's ``{"lm_head.weight": "model.embed_tokens.weight"}``."""
    emb = model.get_input_embeddings()
    source = next((f"{n}.weight" for n, m in model.named_modules() if m is emb), None)
    return {k: source for k in keys} if source else {}


def patch_generation_configs(cls: type) -> list[str]:
    """Let the remote module's ``GenerationConfig`` subclasses take transformers 5's ``validate`` keywords
    (drops those the remote ``validate`` does not declare); returns the names of the patched classes."""
    import sys

    from transformers import GenerationConfig

    patched = []
    for module_name in {cls.__module__,
                        *(m for m in sys.modules if m.startswith(cls.__module__.rpartition(".")[0] + "."))}:
        for obj in list(vars(sys.modules.get(module_name) or object()).values()):
            if not (isinstance(obj, type) and issubclass(obj, GenerationConfig) and obj is not GenerationConfig):
                continue
            validate = obj.__dict__.get("validate")
            if validate is None or getattr(validate, "_lit_rl_compat", False):
                continue
            params = inspect.signature(validate).parameters
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue

            def wrapped(self, *args: Any, _orig=validate, _names=frozenset(params), **kwargs: Any) -> Any:
                return _orig(self, *args, **{k: v for k, v in kwargs.items() if k in _names})

            wrapped._lit_rl_compat = True  # type: ignore[attr-defined]
            obj.validate = wrapped
            patched.append(obj.__name__)
    return patched


def _tie_weights_takes_arguments(cls: type) -> bool:
    params = list(inspect.signature(cls.tie_weights).parameters.values())[1:]
    return any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params) or len(params) > 0


def compat_class(cls: type[nn.Module]) -> type[nn.Module]:
    """A subclass of the remote ``cls`` with the behaviours transformers 5 expects (module docstring).

    The subclass keeps ``cls``'s name, module and ``config_class``, so ``save_pretrained`` still writes the
    original ``auto_map`` and state-dict names are unchanged.
    """
    if getattr(cls, "_lit_rl_compat", False):
        return cls
    ns: dict[str, Any] = {"_lit_rl_compat": True, "__module__": cls.__module__, "__doc__": cls.__doc__}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, *args, **kwargs)
        if not getattr(self, "_lit_rl_post_init_done", False):
            self.post_init()

    def post_init(self) -> None:
        self._lit_rl_post_init_done = True
        tied = getattr(self, "_tied_weights_keys", None)
        if isinstance(tied, (list, tuple)):
            self._tied_weights_keys = tied_keys_as_mapping(self, tied)
        super(compat, self).post_init()

    patch_generation_configs(cls)
    ns["__init__"] = __init__
    ns["post_init"] = post_init
    from transformers import PreTrainedModel

    if cls.tie_weights is not PreTrainedModel.tie_weights and not _tie_weights_takes_arguments(cls):

        def tie_weights(self, *args: Any, **kwargs: Any) -> None:
            PreTrainedModel.tie_weights(self, *args, **kwargs)  # transformers' tying and missing-key handling
            cls.tie_weights(self)  # then the remote code's own (LLaDA: only with weight_tying)

        ns["tie_weights"] = tie_weights
    compat = type(cls.__name__, (cls,), ns)
    compat.__qualname__ = cls.__qualname__
    # save_pretrained copies the modeling files (custom_object_save) only for an auto-registered class;
    # AutoModel.from_pretrained would have registered it
    compat._auto_class = getattr(cls, "_auto_class", None) or "AutoModel"
    return compat


def default_rope_parameters(config: Any = None, device: Any = None, seq_len: int | None = None, **rope_kwargs: Any):
    """transformers 4.x's ``_compute_default_rope_parameters``: ``(inv_freq (d/2,), attention_scaling 1.0)``."""

    if rope_kwargs.get("base") is not None and rope_kwargs.get("dim") is not None:
        base, dim = rope_kwargs["base"], int(rope_kwargs["dim"])
    else:
        params = getattr(config, "rope_parameters", None) or {}
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
        dim = int(head_dim * factor)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    return inv_freq, 1.0


@contextlib.contextmanager
def default_rope_registered():
    """While loading: the 4.x ``"default"`` entry in ``ROPE_INIT_FUNCTIONS`` if transformers lacks it.

    Scoped, because transformers 5's own ``_init_weights`` merges ``ROPE_INIT_FUNCTIONS`` over each model's
    ``compute_default_rope_parameters``: a global entry would replace every model's default RoPE (Phi's
    partial rotary, ...). The remote module keeps its own reference (``self.rope_init_fn``) after loading.
    """
    from transformers import modeling_rope_utils

    registry = modeling_rope_utils.ROPE_INIT_FUNCTIONS
    added = "default" not in registry
    if added:
        registry["default"] = default_rope_parameters
    try:
        yield added
    finally:
        if added and registry.get("default") is default_rope_parameters:
            del registry["default"]


def prepare_config(config: Any) -> Any:
    """Give a remote config what transformers 5 no longer defines by default (``use_cache``)."""
    if not hasattr(config, "use_cache"):
        config.use_cache = False
    return config


def mask_token_id(tokenizer: Any, config: Any, path: str) -> int:
    """The ``[MASK]`` id: the tokenizer's ``mask_token_id``, else ``config.mask_token_id`` (LLaDA's official
    tokenizer has no mask token; its ``config.json`` says 126336)."""
    tok = getattr(tokenizer, "mask_token_id", None)
    if tok is not None:
        return check_token_id("policy.mask_id (the tokenizer's mask_token_id)", int(tok), config, path)
    cfg = getattr(config, "mask_token_id", None)
    if cfg is not None:
        return check_token_id("policy.mask_id (config.json's mask_token_id)", int(cfg), config, path)
    from lit_rl.errors import ConfigError

    raise ConfigError(
        f"policy.mask_id: null, but neither the tokenizer of {path} (mask_token) nor its config.json "
        "(mask_token_id) names a mask token; set policy.mask_id (LLaDA: 126336)"
    )


def reinit_rotary_buffers(model: nn.Module) -> list[str]:
    """Recompute the non-persistent ``inv_freq`` buffer of the remote code's rotary modules from their own
    ``rope_init_fn`` (a persistent, checkpoint-loaded ``inv_freq`` and everything else are left alone);
    returns the names of the modules touched."""
    touched = []
    for name, module in model.named_modules():
        inv = getattr(module, "_buffers", {}).get("inv_freq")
        if inv is None or "inv_freq" not in module._non_persistent_buffers_set or not hasattr(module, "rope_init_fn"):
            continue
        inv_freq, module.attention_scaling = module.rope_init_fn(module.config, inv.device,
                                                                 **getattr(module, "rope_kwargs", {}))
        module.register_buffer("inv_freq", inv_freq.to(inv.device), persistent=False)
        if hasattr(module, "original_inv_freq"):
            module.original_inv_freq = module.inv_freq
        touched.append(name)
    return touched


def check_token_id(field: str, token_id: int, config: Any, path: str) -> int:
    """``token_id`` if it indexes the model's vocabulary, else a ``ValueError`` naming ``field``.

    (LLaDA's config class defaults ``mask_token_id`` to 50256 when ``config.json`` lacks it.)"""
    from lit_rl.errors import ConfigError

    vocab = getattr(config, "embedding_size", None) or getattr(config, "vocab_size", None)
    if vocab is not None and not 0 <= token_id < int(vocab):
        raise ConfigError(f"{field} = {token_id} is outside the vocabulary of {path} ({vocab} ids); set it explicitly")
    return token_id


def remote_config(path: str) -> Any:
    """The config of ``path`` through the class its own ``auto_map`` names.

    Not ``AutoConfig``: importing the official LLaDA code registers ``"llada"`` with ``AutoConfig`` and
    ``AutoModel`` for the whole process, after which ``Auto*`` classes resolve ANY ``model_type: llada`` folder
    to that registered code instead of the folder's own files (measured: a second LLaDA-style checkpoint then
    loads with the wrong architecture)."""
    import json
    from pathlib import Path

    from transformers import AutoConfig
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    local = Path(path) / "config.json"
    ref = None
    if local.is_file():
        ref = (json.loads(local.read_text()).get("auto_map") or {}).get("AutoConfig")
    if ref is None:
        return AutoConfig.from_pretrained(path, trust_remote_code=True)
    return get_class_from_dynamic_module(ref, path).from_pretrained(path)


def load_remote_model(path: str, auto_key: str = "AutoModel", **kwargs: Any) -> nn.Module:
    """``from_pretrained`` through the checkpoint's own code, with the compatibility shim (module docstring).

    ``kwargs`` go to ``from_pretrained`` (``dtype``, ``quantization_config``, ``device_map``).
    """
    import transformers

    config = prepare_config(remote_config(path))
    cls = compat_class(remote_model_class(config, path, auto_key))
    try:
        with default_rope_registered():
            model = cls.from_pretrained(path, config=config, trust_remote_code=True, **kwargs)
    except (AttributeError, TypeError, KeyError) as err:
        raise RemoteCodeError(
            f"policy.path: the remote code of {path} ({cls.__name__}) does not load on transformers "
            f"{transformers.__version__}: {type(err).__name__}: {err}. lit_rl's shim covers: {COVERED}. "
            "Ways out: the native implementations (policy class lit_rl.models.NativeLLaDA / NativeDream for "
            "LLaDA / Dream checkpoints), or a fix in the checkpoint's modeling file (lit_rl needs transformers "
            ">= 5.2; the official LLaDA and Dream files were written for 4.4x and load unmodified on 4.57)."
        ) from err
    reinit_rotary_buffers(model)
    return model


__all__ = [
    "COVERED",
    "RemoteCodeError",
    "compat_class",
    "load_remote_model",
    "mask_token_id",
    "prepare_config",
    "remote_config",
    "remote_model_class",
]
