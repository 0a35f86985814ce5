"""Fuzzing every verifier and parser that reads untrusted model text (hypothesis + adversarial regressions).

Targets: the Sudoku / Countdown / MATH training rewards and evaluation rules (both parsers), and the pure
parsers under them *without* the verifiers' catch-all ``except`` (answer blocks, ``\\boxed{}`` extraction,
Hendrycks normalisation, safe arithmetic, number extraction, Countdown expression extraction, Sudoku answer
patterns), the double-rollout thinking-trace splitters (text and token level), the tiny models' character
tokenizer and the external-pool record parser.

Properties, for every input:

* zero exceptions (the pool record parser may only raise its documented ``PoolFormatError``);
* zero code execution: ``builtins.eval/exec/__import__`` are replaced by tripwires and a
  ``sys.addaudithook`` hook records ``exec``, process, socket, file-open and module-import events while a
  target runs (``compile`` is allowed: ``ast.parse`` parses without executing);
* bounded time: every call is timed; the p99 per target is printed and must stay under 50 ms on the
  generated inputs, every adversarial (up to 1 MB) input under 5 s.
"""

from __future__ import annotations

import builtins
import math
import statistics
import sys
import time
from collections import defaultdict
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_rl.core.double_rollout import split_thinking, split_thinking_text
from lit_rl.pools.pool import PoolFormatError, PoolRecord
from lit_rl.tasks import (CountdownTask, MathTask, SudokuTask, countdown, countdown_arith, math_normalize, math_task,
                          parsing, sudoku, word_problems)

# -- targets ----------------------------------------------------------------------------------------------
SUDOKU, COUNTDOWN, MATH = SudokuTask(num_train=0), CountdownTask(num_train=0), MathTask()
SX, CX, MX = SUDOKU.eval_examples()[0], COUNTDOWN.eval_examples()[0], MATH.eval_examples()[0]
WORDS = word_problems.WordProblemTask(num_train=0, num_eval=1)
WX = WORDS.eval_examples()[0]
CX_NUMBERS, CX_TARGET = CX.answer
DELIM_IDS = [ord(c) for c in "</think>"]


def _tokenizer():
    from lit_rl.models.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


TOK = _tokenizer()


def _tok_roundtrip(text: str) -> str:
    # decode: any ids a model can emit (and out-of-range ones); encode: external (pool) text, which is valid
    # Unicode once the pool reader rejects lone surrogates (the tokenizer raises TypeError on them: a pool line
    # holding "\ud800" would crash a training step; see test_bad_inputs' pool_lone_surrogate case).
    TOK.decode([ord(c) % (len(TOK) + 8) for c in text[:256]], skip_special_tokens=True)
    valid = text.encode("utf-8", "replace").decode("utf-8")
    ids = TOK(valid[:4096], add_special_tokens=False)["input_ids"]
    return TOK.decode(ids, skip_special_tokens=False)


TARGETS: dict[str, Callable[[str], Any]] = {
    "sudoku.reward": lambda t: SUDOKU.reward(t, SX),
    "sudoku.evaluate": lambda t: SUDOKU.evaluate(t, SX),
    "sudoku.evaluate[reward]": lambda t: SUDOKU.evaluate(t, SX, parser="reward"),
    "countdown.reward": lambda t: COUNTDOWN.reward(t, CX),
    "countdown.evaluate": lambda t: COUNTDOWN.evaluate(t, CX),
    "countdown.evaluate[reward]": lambda t: COUNTDOWN.evaluate(t, CX, parser="reward"),
    "math.reward": lambda t: MATH.reward(t, MX),
    "math.evaluate": lambda t: MATH.evaluate(t, MX),
    "math.evaluate[reward]": lambda t: MATH.evaluate(t, MX, parser="reward"),
    # parsers, without the verifiers' catch-all except
    "parsing.answer_blocks": parsing.answer_blocks,
    "parsing.first_answer_block": parsing.first_answer_block,
    "parsing.reference_boxed": parsing.reference_boxed,
    "parsing.last_boxed": parsing.last_boxed,
    "parsing.sudoku_eval_answer": lambda t: parsing.fit16(parsing.sudoku_eval_answer(t)),
    "sudoku.reward_answer": sudoku.reward_answer,
    "sudoku.puzzle_from_question": sudoku.puzzle_from_question,
    "math_normalize.is_equiv": lambda t: (math_normalize.is_equiv(t, MX.answer), math_normalize.is_equiv(t, t),
                                          math_normalize.is_equiv(t[:64], "\\frac{1}{2}")),
    "math_task.math_eval_answer": math_task.math_eval_answer,
    "math_task.math_format_reward": math_task.math_format_reward,
    "countdown_arith.safe_eval": lambda t: (countdown_arith.safe_eval(t), countdown_arith.safe_eval(t[:200])),
    "countdown_arith.numbers_in": countdown_arith.numbers_in,
    "countdown_arith.uses_exactly": lambda t: countdown_arith.uses_exactly(t, CX_NUMBERS),
    "countdown.eval_expression": countdown.eval_expression,
    "countdown.equals_lhs": countdown.equals_lhs,
    "split_thinking_text": lambda t: (split_thinking_text(t), split_thinking_text(t, missing="skip"),
                                      split_thinking_text(t, "</reasoning>")),
    "split_thinking[tokens]": lambda t: (split_thinking([ord(c) for c in t], DELIM_IDS),
                                         split_thinking([ord(c) for c in t], DELIM_IDS, missing="skip")),
    "char_tokenizer": _tok_roundtrip,
    "word_problems.reward": lambda t: (WORDS.reward(t, WX), WORDS.evaluate(t, WX), WORDS.extract(t, WX)),
    "word_problems.steps": lambda t: (word_problems.steps_verdict(t, WX), word_problems.first_error_at(t, WX),
                                      word_problems.final_int(t), word_problems.equations(t)),
}


def _pool_record(t: str) -> Any:
    # the record validator on decoded JSON values (whole pool files, JSON decoding included, are fuzzed in
    # test_bad_inputs.py: a file read would trip the audit hook here)
    for obj in (t, [t], {"prompt_id": t, "index": 0, "source": t, "completion": t, "reward": 1.0, "num_tokens": len(t),
                         "tokenizer": "x"},
                {"prompt_id": "p", "index": len(t), "source": "s", "completion": t, "reward": float(len(t) % 3) - 1,
                 "num_tokens": -len(t), "tokenizer": t, "meta": {t: t}},
                {"completion": t}):
        try:
            PoolRecord.from_json(obj, "fuzz:1")
        except PoolFormatError:
            pass


TARGETS["pool.PoolRecord.from_json"] = _pool_record

# -- tripwires against code execution ------------------------------------------------------------------------
_ARMED = False
_EVENTS: list[str] = []
_FORBIDDEN = ("exec", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
              "socket.connect", "socket.bind", "ctypes.dlopen", "builtins.input", "import", "open", "shutil.",
              "os.remove", "os.rename")


def _audit(event: str, args: tuple) -> None:
    if _ARMED and event.startswith(_FORBIDDEN):
        _EVENTS.append(f"{event} {str(args)[:200]}")


sys.addaudithook(_audit)  # cannot be removed; inert unless _ARMED


def _tripwire(name: str) -> Callable[..., Any]:
    def boom(*args: Any, **kwargs: Any) -> Any:
        _EVENTS.append(f"builtins.{name}{str(args)[:200]}")
        raise RuntimeError(f"untrusted text reached builtins.{name}")

    return boom


_real_import = builtins.__import__


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if name not in sys.modules:  # an import statement of an already loaded module loads nothing
        _EVENTS.append(f"builtins.__import__({name!r})")
        raise RuntimeError(f"untrusted text triggered an import of {name}")
    return _real_import(name, globals, locals, fromlist, level)


TIMES: dict[str, list[float]] = defaultdict(list)
ADV_TIMES: dict[str, float] = defaultdict(float)
CASES = {"generated": 0, "adversarial": 0}


def _run_all(text: str, record: dict[str, list[float]] | None, monkeypatch_builtins: bool = True) -> None:
    global _ARMED
    saved = {n: getattr(builtins, n) for n in ("eval", "exec", "__import__")}
    failures = []
    for name, fn in TARGETS.items():
        if monkeypatch_builtins:
            builtins.eval, builtins.exec = _tripwire("eval"), _tripwire("exec")
            builtins.__import__ = _guarded_import
        _EVENTS.clear()
        _ARMED = True
        t0 = time.perf_counter()
        try:
            fn(text)
        except Exception as e:  # noqa: BLE001 - the property under test
            failures.append(f"{name}: {type(e).__name__}: {e}")
        finally:
            dt = time.perf_counter() - t0
            _ARMED = False
            for n, f in saved.items():
                setattr(builtins, n, f)
        if record is not None:
            record[name].append(dt)
        else:
            ADV_TIMES[name] = max(ADV_TIMES[name], dt)
        if _EVENTS:
            failures.append(f"{name}: code execution / side effect: {_EVENTS[:3]}")
    assert not failures, f"input {text[:120]!r}... (len {len(text)}): {failures}"


# -- strategies ------------------------------------------------------------------------------------------
FRAGMENTS = [
    "<answer>", "</answer>", "<reasoning>", "</reasoning>", "<think>", "</think>", "\\boxed{", "\\boxed ", "\\fbox{",
    "{", "}", "(", ")", "**", "//", "=", "+", "-", "*", "/", ".", "$", "```", "<|eot_id|>", "<|endoftext|>", "\n", " ",
    "__import__('os').system('touch /tmp/lit_rl_pwned')", "eval('1')", "exec('x=1')", "lambda: 0",
    "().__class__.__bases__[0]",
    "\\frac", "\\dfrac", "\\sqrt", "\\text{ ", "\\left(", "\\right)", "\\!", "^\\circ", "\\%", "\\div", "\\times",
    "\x00", "\ud800", "\udfff", "\u202e", "\ufeff", "\u0663", "\u00b2", "1e308", "1e-999", "inf", "nan", "0x1F",
    "1_000", "9" * 50, "9**9**9", "(" * 30, ")" * 30, "1234123412341234", "Sudoku puzzle: ", "30", "100", "93", "23",
]
_expr = st.recursive(
    st.integers(-10**6, 10**6).map(str) | st.sampled_from([str(n) for n in CX_NUMBERS]),
    lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "**", "//", " "]), inner).map(
        lambda t: f"({t[0]}{t[1]}{t[2]})"),
    max_leaves=12,
)
TEXT = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=()), max_size=300),  # surrogates included
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6), st.integers(-10**60, 10**60).map(str)),
             max_size=50).map("".join),
    st.binary(max_size=400).map(lambda b: b.decode("utf-8", errors="surrogateescape")),  # invalid UTF-8 after decoding
    st.binary(max_size=400).map(lambda b: b.decode("utf-8", errors="replace")),
    st.tuples(st.sampled_from(["", "<reasoning>x</reasoning>\n", "<think>", "</think>"]), _expr,
              st.sampled_from(["</answer>", "", "=23", "</answer><answer>"])).map(
        lambda t: f"{t[0]}<answer>{t[1]}{t[2]}"),
    st.tuples(st.lists(st.sampled_from(["\\frac", "{", "}", "1", "2", "\\sqrt", "x", "=", "/", "\\text{ m}", " "]),
                       max_size=30)).map(lambda t: "<answer>\\boxed{" + "".join(t[0]) + "}</answer>"),
    st.text(alphabet="0123456789 \n<>/answer`", max_size=80).map(lambda s: "<answer>" + s),
)

N_EXAMPLES = 400


@settings(max_examples=N_EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(TEXT)
def test_fuzz_all_verifiers_and_parsers(text):
    CASES["generated"] += 1
    _run_all(text, TIMES)


M = 1_000_000
ADVERSARIAL = {
    "empty": "",
    "1MB_x": "x" * M,
    "1MB_digits": "1" * M,
    "huge_int_answer": "<answer>" + "9" * 100_000 + "</answer>",
    "huge_int_boxed": "\\boxed{" + "9" * 100_000 + "}",
    "int_str_limit": "<answer>" + "1" * 4301 + "+1</answer>",
    "float_overflow": "<answer>1e309*1e309</answer>",
    "pow_tower": "<answer>9**9**9**9**9**9</answer>",
    "pow_tower_parens": "<answer>" + "(9**" * 50 + "9" + ")" * 50 + "</answer>",
    "deep_parens_1e5": "<answer>" + "(" * 100_000 + "30+93-100" + ")" * 100_000 + "</answer>",
    "deep_parens_200": "<answer>" + "(" * 199 + "30+93-100" + ")" * 199 + "</answer>",
    "unary_chain": "<answer>" + "-" * 100_000 + "1</answer>",
    "import_os": "<answer>__import__('os').system('touch /tmp/lit_rl_pwned')</answer>",
    "import_boxed": "\\boxed{__import__('os').system('id')}",
    "eval_builtin": "<answer>eval(\"__import__('os')\")</answer>",
    "lambda": "<answer>(lambda: __import__('os'))()</answer>",
    "dunder": "<answer>().__class__.__base__.__subclasses__()</answer>",
    "unbalanced_open": "\\boxed" + "{" * M,
    "unbalanced_close": "\\boxed" + "}" * M,
    "nested_boxes": "\\boxed{" * 50_000 + "1" + "}" * 50_000,
    "many_answer_tags": "<answer>" * (M // 8),
    "many_blocks": "<answer>30+93-100</answer>" * 40_000,
    "frac_chain": "\\boxed{" + "\\frac" * (M // 5) + "}",
    "sqrt_end": "\\boxed{1\\sqrt}",
    "text_units": "\\boxed{1\\text{ a}\\text{ b}}",
    "slash_bigints": "\\boxed{" + "9" * 5000 + "/" + "9" * 5000 + "}",
    "think_tags_1MB": "</think>" * (M // 8),
    "think_at_end_1MB": "a" * M + "</think>",
    "invalid_utf8": bytes(range(256)).decode("utf-8", errors="surrogateescape") * 100,
    "lone_surrogates": "<answer>\ud800\udfff\udc80</answer>\\boxed{\ud800}",
    "nul_bytes": "<answer>\x00" * 1000 + "</answer>",
    "rtl_override": "<answer>\u202e001-39+03</answer>",
    "unicode_digits": "<answer>\u0663\u0660+\u0669\u0663-\u0661\u0660\u0660</answer>",
    "crlf_whitespace": "\r\n\t\x0b\x0c " * (M // 6),
    "fence_digits": "<answer>```" + "1 " * (M // 2) + "```",
    "sixteen_words": "1234123412341234 " * 50_000,
    "equals_chain": "1+" * (M // 2) + "=5",
    "json_bomb": "[" * 100_000 + "]" * 100_000,
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_regressions(name):
    CASES["adversarial"] += 1
    t0 = time.perf_counter()
    _run_all(ADVERSARIAL[name], None)
    assert time.perf_counter() - t0 < 5.0 * len(TARGETS)


def test_adversarial_answers_score_nothing():
    ex = CX
    for name in ("import_os", "eval_builtin", "lambda", "dunder", "pow_tower", "deep_parens_1e5"):
        assert COUNTDOWN.reward(ADVERSARIAL[name], ex) in (0.0, 0.1), name
        assert COUNTDOWN.evaluate(ADVERSARIAL[name], ex).correct == 0, name
    assert countdown_arith.safe_eval("__import__('os').system('id')") is None
    assert countdown_arith.safe_eval("9**9**9") is None
    assert split_thinking_text(ADVERSARIAL["think_at_end_1MB"]) == M
    assert split_thinking_text("no delimiter", missing="skip") is None


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def test_timing_summary():
    """Runs last (file order): the figures for the report, and the time bounds."""
    if not TIMES:
        pytest.skip("fuzz test did not run")
    rows = []
    for name in TARGETS:
        xs = TIMES[name]
        rows.append((name, len(xs), statistics.median(xs) * 1e3, _p(xs, 0.99) * 1e3, max(xs) * 1e3,
                     ADV_TIMES.get(name, 0.0) * 1e3))
    print(f"\n[fuzz] cases: {CASES['generated']} generated + {CASES['adversarial']} adversarial, "
          f"{len(TARGETS)} targets each ({(CASES['generated'] + CASES['adversarial']) * len(TARGETS)} calls)")
    print(f"[fuzz] {'target':32s} {'n':>5s} {'median ms':>10s} {'p99 ms':>8s} {'max ms':>8s} "
          f"{'max adversarial ms':>19s}")
    for name, n, med, p99, mx, adv in rows:
        print(f"[fuzz] {name:32s} {n:5d} {med:10.3f} {p99:8.3f} {mx:8.2f} {adv:19.1f}")
    slow = [r for r in rows if r[3] > 50.0]
    assert not slow, f"p99 above 50 ms: {slow}"
    slow_adv = [r for r in rows if r[5] > 5000.0]
    assert not slow_adv, f"an adversarial input took more than 5 s: {slow_adv}"
