"""A small external causal LM trained here, with its own tokenizer: the miniature stand-in for ERILS's
stronger AR model (the paper samples Qwen3-30B-A3B-Instruct; the embedded demos used a scripted solver).

``train_external_lm`` writes a Hugging Face model directory that every pool backend loads like a real
checkpoint (``backend: {type: hf, model: <dir>}``, or vLLM's engine):

1. **Its own tokenizer.** A byte-level BPE (``tokenizers``) trained on the teacher's prompts and completions,
   with digits split one by one (as Llama's and Qwen's pre-tokenizers do: a number reads the same in the prompt
   and in the trace, which the model needs to notice that a try hits the target),
   so completion lengths in the external tokenizer differ from the dLLM's character tokens (as Qwen3's
   differ from LLaDA's). Special tokens ``[PAD] [EOS] [BOS]``; the chat template writes each message on its
   own line, as the character tokenizer's does.
2. **A Llama** built from a config (``LlamaForCausalLM``), trained by completion-only SFT
   (:func:`lit_rl.algorithms.ar_sft.scripted_sft`) on the teacher's traces.
3. **Length instruction following.** A share ``instruction_share`` of the SFT prompts carry the build's length
   instruction (:meth:`~lit_rl.pools.length_control.LengthControl.first_stage_messages`, the same text the
   pool builder appends) and are answered with the teacher's *brief* trace; the others get the long trace.
   So ``length_control.mode: instruction`` changes what the model writes, and ``none`` gives the
   uncontrolled-length pool.

The model is a guesser, not a solver: the teacher (:func:`lit_rl.tasks.scripted.countdown_trials_completion`)
writes random wrong tries before the hit, and the model has to learn which try hits. Sampled at T 1 it is
varied and sometimes wrong, as the paper's external rollouts are (Table V).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from lit_rl.atomic import atomic_write_text
from lit_rl.pools.length_control import LengthControl
from lit_rl.tasks.base import Example, Task

__all__ = ["ExternalLMSettings", "train_bpe_tokenizer", "train_external_lm"]

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
SPECIAL_TOKENS = ["[PAD]", "[EOS]", "[BOS]"]


@dataclasses.dataclass(frozen=True)
class ExternalLMSettings:
    """Size and training of the external LM.

    Attributes:
        vocab_size: BPE vocabulary (specials and the 256 byte symbols included).
        hidden_size, num_layers, num_heads, intermediate_size, max_positions: the Llama's shape.
        steps, lr, batch_size: the SFT (AdamW, linear decay to 10%, grad-norm 1).
        instruction_share: share of SFT prompts that carry the length instruction (brief traces).
        long_tries, brief_tries: ``[lo, hi]`` wrong tries before the hit, without / with the instruction.
        max_completion_len: SFT completions are cut to this many tokens (EOS included).
        seed: init, data order and teacher draws.
    """

    vocab_size: int = 384
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 512
    steps: int = 1500
    lr: float = 1e-3
    batch_size: int = 32
    instruction_share: float = 0.5
    long_tries: tuple[int, int] = (1, 4)
    brief_tries: tuple[int, int] = (0, 1)
    max_completion_len: int = 96
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_positions",
                    "steps", "batch_size", "max_completion_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"external_lm.{key}: must be an integer >= 1, got {value!r}")
        if self.vocab_size <= 256 + len(SPECIAL_TOKENS):
            raise ValueError(f"external_lm.vocab_size: must exceed the 256 bytes + {len(SPECIAL_TOKENS)} specials, "
                             f"got {self.vocab_size}")
        if not 0.0 <= self.instruction_share <= 1.0:
            raise ValueError(f"external_lm.instruction_share: must be in [0, 1], got {self.instruction_share!r}")
        for key in ("long_tries", "brief_tries"):
            lo_hi = getattr(self, key)
            if len(lo_hi) != 2 or not 0 <= lo_hi[0] <= lo_hi[1]:
                raise ValueError(f"external_lm.{key}: must be [lo, hi] with 0 <= lo <= hi, got {list(lo_hi)!r}")


def train_bpe_tokenizer(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` (deterministic for the same texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([  # digits one by one, as Llama's and Qwen's tokenizers split them
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(list(texts), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", eos_token="[EOS]", bos_token="[BOS]")
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def _with_instruction(task: Task, example: Example, control: LengthControl) -> Example:
    """``example`` whose ``task.messages`` are the builder's ``P_task || P_len`` (the instruction is appended to the
    question, which ends the last message whatever the task's system prompt and role)."""
    briefed = dataclasses.replace(example, question=example.question.rstrip() + "\n\n" + control.length_instruction())
    if task.messages(briefed) != control.first_stage_messages(task, example):
        raise ValueError(f"external LM training: the task's prompt for {example.id!r} does not end with its question, "
                         "so the length instruction cannot be placed where the pool builder puts it")
    return briefed


def train_external_lm(
    task: Task,
    teacher: Callable[[Example, random.Random, tuple[int, int]], str],
    out: str | Path,
    settings: ExternalLMSettings = ExternalLMSettings(),
    control: LengthControl | None = None,
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train the tokenizer and the LM on ``task.train_examples()`` and save both to ``out``.

    ``teacher(example, rng, tries)`` writes a completion with ``tries = [lo, hi]`` wrong tries; prompts with
    the instruction of ``control`` (``mode: instruction``) get ``settings.brief_tries``. Returns the summary
    that is also written to ``<out>/external_lm.json``. The directory is written in full or not at all
    (a temporary sibling, renamed at the end); an existing ``out`` is replaced only with ``overwrite``.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_rl.algorithms.ar_sft import scripted_sft
    from lit_rl.models.ar import PretrainedCausalLM

    out = Path(out)
    control = control or LengthControl(mode="instruction")
    examples = task.train_examples()
    briefed = [_with_instruction(task, e, control) for e in examples]
    rng = random.Random(f"lit_rl/external_lm/{settings.seed}")
    corpus = []
    for e, b in zip(examples, briefed):
        for ex, tries in ((e, settings.long_tries), (b, settings.brief_tries)):
            text = "\n".join(m["content"] for m in task.messages(ex))
            corpus.append(text + "\n" + teacher(ex, rng, tries))
    tok = train_bpe_tokenizer(corpus, settings.vocab_size)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=settings.hidden_size,
                         intermediate_size=settings.intermediate_size,
                         num_hidden_layers=settings.num_layers, num_attention_heads=settings.num_heads,
                         num_key_value_heads=settings.num_heads, max_position_embeddings=settings.max_positions,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         tie_word_embeddings=True)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass overwrite=True (rollouts train-lm --overwrite) to replace it")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():  # a killed earlier run
        shutil.rmtree(tmp)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        LlamaForCausalLM(config).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    policy = PretrainedCausalLM(str(tmp), dtype="float32")
    share = settings.instruction_share
    pick = random.Random(f"lit_rl/external_lm/{settings.seed}/instruction")
    mixed = [b if pick.random() < share else e for e, b in zip(examples, briefed)]

    instruction = control.length_instruction()

    def make_text(example: Example, r: random.Random) -> str:
        brief = example.question.endswith(instruction)
        return teacher(example, r, settings.brief_tries if brief else settings.long_tries)

    loss = scripted_sft(policy, task, mixed, make_text, steps=settings.steps, lr=settings.lr,
                        batch_size=settings.batch_size, max_completion_len=settings.max_completion_len,
                        seed=settings.seed, log=log)
    policy.model.save_pretrained(tmp)
    summary = {"settings": dataclasses.asdict(settings), "final_loss": loss, "vocab_size": len(tok),
               "parameters": sum(p.numel() for p in policy.model.parameters()),
               "instruction": control.length_instruction(), "task": task.name, "num_train": len(examples)}
    atomic_write_text(tmp / "external_lm.json", json.dumps(summary, indent=1) + "\n")
    if out.exists():  # moved aside first: a crash leaves the old model or the new one, never neither
        old = out.with_name(out.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old)
    else:
        tmp.rename(out)
    return summary


def _teacher(name: str) -> Callable[[Example, random.Random, tuple[int, int]], str]:
    """``external_lm.teacher``: a name of :data:`TEACHERS` or a dotted path to a function."""
    import importlib

    module, _, attr = TEACHERS.get(name, name).rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError):
        raise ValueError(f"external_lm.teacher={name!r}: not one of {sorted(TEACHERS)} and not an importable "
                         "function (module.function)") from None


#: teachers by name: (example, rng, tries) -> completion
TEACHERS = {"countdown_trials": "lit_rl.tasks.scripted.countdown_trials_completion",
            "countdown_ordered_trials": "lit_rl.tasks.scripted.countdown_ordered_trials_completion"}


def train_from_config(cfg: Any, log: Callable[[str], None] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """``rollouts train-lm``: train the model that ``cfg`` (a :class:`~lit_rl.pools.build_config.BuildConfig`)
    samples, into ``backend.model``, from its ``external_lm`` block, task and length control."""
    from lit_rl.pools.build_config import build_task

    where = cfg.source
    if not cfg.external_lm:
        raise ValueError(f"{where}: external_lm: missing (teacher, steps, ...): nothing says how to train the model")
    backend = cfg.backend_spec if isinstance(cfg.backend_spec, dict) else {}
    if backend.get("type") not in ("hf", "vllm") or not backend.get("model"):
        raise ValueError(f"{where}: backend: train-lm writes backend.model of an 'hf' or 'vllm' backend, "
                         f"got {backend.get('type')!r} with model {backend.get('model')!r}")
    block = dict(cfg.external_lm)
    try:
        teacher = _teacher(str(block.pop("teacher", "countdown_trials")))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    for key in ("long_tries", "brief_tries"):
        if key in block:
            if not isinstance(block[key], (list, tuple)):
                raise ValueError(f"{where}: external_lm.{key}: must be [lo, hi], got {block[key]!r}")
            block[key] = tuple(block[key])
    try:
        settings = ExternalLMSettings(**block)
    except TypeError as e:  # an unknown key
        raise ValueError(f"{where}: external_lm: {e}") from None
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    control = cfg.length_control if cfg.length_control.mode == "instruction" else LengthControl(
        mode="instruction", instruction=cfg.length_control.instruction,
        target_total_tokens=cfg.length_control.target_total_tokens)
    return train_external_lm(build_task(cfg.task_spec), teacher, backend["model"], settings, control, log, overwrite)
