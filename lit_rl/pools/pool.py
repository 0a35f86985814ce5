"""The external rollout pool file: JSONL, one completion per line, keyed by prompt id.

Line 1 is a header, every other line a :class:`PoolRecord`::

    {"lit_rl_pool": 1, "task": "sudoku", "policy": "scripted-sudoku", "tokenizer": "lit_rl/char", ...}
    {"prompt_id": "sudoku-train-0", "index": 0, "source": "scripted-sudoku", "completion": "<reasoning>...",
     "reward": 1.0, "num_tokens": 61, "tokenizer": "lit_rl/char", "usable": true, "meta": {...}}

Records of one prompt appear in candidate order (``index``); a builder moves usable candidates to the
front (ERILS App. B), so training takes the first ``G_ext`` usable records of each prompt. ``reward`` is the
task verifier's reward of the final completion; ``num_tokens`` is counted with ``tokenizer`` (the external
model's tokenizer). ``meta`` holds generation metadata (temperature, seed, first-stage text and reward of a
two-stage length-controlled build, wall time, ...).

Writers either append whole prompts (:class:`PoolAppender`: all ``n`` lines of a prompt in one write, then
``fsync``; a killed build leaves a valid prefix that :func:`repair_pool_for_resume` checks and trims before
the build continues) or write a whole file atomically (temp file + rename). Readers name the file and line
of any malformed record. Side files share the pool's stem (:func:`pool_stem`): ``<stem>.build.json``
(build sessions, wall time), ``<stem>.stats.md`` / ``.stats.json`` / ``.lengths.png`` (statistics).
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from lit_rl.atomic import atomic_write

POOL_VERSION = 1
#: ERILS App. B: external completions longer than this (external-tokenizer tokens) are unusable.
MAX_USABLE_TOKENS = 500
#: ``index`` and ``num_tokens`` must lie in ``[0, _MAX_COUNT)`` (a 400-digit count would overflow statistics)
_MAX_COUNT = 2**63


class PoolFormatError(ValueError):
    """A malformed pool file (message names the file and line)."""


def _short(value: Any) -> str:
    """``value`` for a message; a huge integer by its size (``str`` of one over 4300 digits raises)."""
    if isinstance(value, int) and abs(value) >= 10**40:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return repr(value)


@dataclass
class PoolRecord:
    """One external completion.

    Attributes:
        prompt_id: the task example id this completion answers.
        index: candidate index among the prompt's completions (after usable-first reordering).
        source: name of the external policy that wrote it.
        completion: the completion text (``<reasoning>...</reasoning>\\n<answer>...</answer>``).
        reward: verifier reward of ``completion``.
        num_tokens: completion length under ``tokenizer``.
        tokenizer: name of the tokenizer ``num_tokens`` was counted with (``"chars"`` = fallback).
        usable: ``num_tokens <= 500`` (ERILS App. B).
        meta: generation metadata.
    """

    prompt_id: str
    index: int
    source: str
    completion: str
    reward: float
    num_tokens: int
    tokenizer: str
    usable: bool = True
    meta: dict[str, Any] = field(default_factory=dict)

    _REQUIRED = {"prompt_id": str, "index": int, "source": str, "completion": str, "reward": (int, float),
                 "num_tokens": int, "tokenizer": str}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "PoolRecord":
        if not isinstance(obj, dict):
            raise PoolFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        for key, typ in cls._REQUIRED.items():
            if key not in obj:
                raise PoolFormatError(f"{where}: missing field '{key}'")
            if not isinstance(obj[key], typ) or isinstance(obj[key], bool):
                raise PoolFormatError(f"{where}: field '{key}' has type {type(obj[key]).__name__}")
        for key in ("prompt_id", "source", "completion", "tokenizer"):
            try:
                obj[key].encode("utf-8")
            except UnicodeEncodeError as e:
                raise PoolFormatError(f"{where}: field '{key}' is not valid Unicode "
                                      f"(lone surrogate at character {e.start})") from None
        for key in ("index", "num_tokens"):
            if not 0 <= obj[key] < _MAX_COUNT:
                raise PoolFormatError(f"{where}: field '{key}' must be an integer in [0, 2**63), "
                                      f"got {_short(obj[key])}")
        try:
            reward = float(obj["reward"])
        except OverflowError:  # an integer too large for a float
            reward = float("inf")
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise PoolFormatError(f"{where}: field 'reward' is not finite ({_short(obj['reward'])})")
        usable = obj.get("usable", obj["num_tokens"] <= MAX_USABLE_TOKENS)
        if not isinstance(usable, bool):  # bool("false") is True
            raise PoolFormatError(f"{where}: field 'usable' must be true or false, "
                                  f"got {type(usable).__name__} {_short(usable)[:40]}")
        meta = obj.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise PoolFormatError(f"{where}: field 'meta' must be an object, got {type(meta).__name__}")
        return cls(
            prompt_id=obj["prompt_id"],
            index=obj["index"],
            source=obj["source"],
            completion=obj["completion"],
            reward=reward,
            num_tokens=obj["num_tokens"],
            tokenizer=obj["tokenizer"],
            usable=usable,
            meta=dict(meta or {}),
        )


def _header(task: str, policy: str, tokenizer: str, **extra: Any) -> dict[str, Any]:
    return {"lit_rl_pool": POOL_VERSION, "task": task, "policy": policy, "tokenizer": tokenizer, **extra}


def _parse_line(raw: bytes, where: str) -> Any:
    """One JSONL line (bytes) as a JSON value; every decoding failure is a :class:`PoolFormatError` naming ``where``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PoolFormatError(f"{where}: not UTF-8 (byte {raw[e.start:e.start + 1]!r} at offset {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PoolFormatError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise PoolFormatError(f"{where}: invalid JSON (nested too deeply)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise PoolFormatError(f"{where}: invalid JSON ({str(e).split(';')[0][:120]})") from None


def _check_header(header: Any, where: str) -> None:
    version = header.get("lit_rl_pool") if isinstance(header, dict) else None
    if type(version) is not int or version != POOL_VERSION:  # not true, not 1.0
        raise PoolFormatError(f"{where}: not a lit_rl pool header (expected \"lit_rl_pool\": {POOL_VERSION})")
    for key, value in header.items():  # its texts end up in statistics files and on the console
        try:
            json.dumps([key, value], ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise PoolFormatError(f"{where}: header field {key.encode('utf-8', 'backslashreplace').decode()!r} "
                                  "is not valid Unicode (a lone surrogate)") from None


def _read_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, raw line)`` of a plain or gzipped file; a damaged gzip stream is a :class:`PoolFormatError`."""
    lineno = 0
    # a committed pool may be gzipped (``.jsonl.gz``); builders write plain JSONL
    fh = gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")
    with fh:
        while True:
            try:
                line = fh.readline()
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                raise PoolFormatError(f"{path}: truncated or corrupt gzip ({type(e).__name__}: {e}; "
                                      f"at line {lineno + 1})") from None
            if not line:
                return
            lineno += 1
            yield lineno, line


def iter_pool(path: str | Path, with_lines: bool = False) -> tuple[dict[str, Any], Iterator[Any]]:
    """Header and a record iterator (of ``(line number, record)`` with ``with_lines``); errors name ``path:line``.

    Every malformed input (bad JSON, UTF-8 or gzip, a wrong field, a record twice) is a :class:`PoolFormatError`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pool file not found: {path} (python -m lit_rl rollouts build writes one)")
    lines = _read_lines(path)
    try:
        _, first = next(lines, (1, b""))
        header = _parse_line(first, f"{path}:1: header")
        _check_header(header, f"{path}:1")
    except BaseException:
        lines.close()
        raise

    def records() -> Iterator[PoolRecord]:
        seen: dict[tuple[str, int], int] = {}
        with closing(lines):
            for lineno, line in lines:
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                if not line.endswith(b"\n"):
                    raise PoolFormatError(f"{where}: truncated last line (a killed writer?); "
                                          "resume the build to repair it")
                rec = PoolRecord.from_json(_parse_line(line, where), where)
                first_at = seen.setdefault((rec.prompt_id, rec.index), lineno)
                if first_at != lineno:
                    raise PoolFormatError(f"{where}: duplicate record prompt_id {rec.prompt_id!r} index {rec.index}, "
                                          f"first at line {first_at}")
                yield (lineno, rec) if with_lines else rec

    return header, records()


def load_pool(
    path: str | Path,
    g_ext: int,
    valid_ids: Iterable[str] | None = None,
    task: str | None = None,
) -> dict[str, list[PoolRecord]]:
    """The first ``g_ext`` usable records of every prompt, keyed by prompt id.

    Args:
        path: pool JSONL file.
        g_ext: external rollouts per prompt group; prompts with fewer usable records are left out.
        valid_ids: the dataset's prompt ids; a record naming another id is an error (wrong pool/dataset).
        task: expected task name (checked against the header).
    """
    header, records = iter_pool(path, with_lines=True)
    if task is not None and header.get("task") != task:
        raise PoolFormatError(f"{path}:1: pool is for task {header.get('task')!r}, the run's task is {task!r}")
    valid = set(valid_ids) if valid_ids is not None else None
    by_prompt: dict[str, list[PoolRecord]] = {}
    for lineno, rec in records:
        if valid is not None and rec.prompt_id not in valid:
            raise PoolFormatError(f"{path}:{lineno}: prompt_id {rec.prompt_id!r} is not in the task's training set")
        by_prompt.setdefault(rec.prompt_id, []).append(rec)
    out = {}
    for pid, recs in by_prompt.items():
        usable = [r for r in sorted(recs, key=lambda r: r.index) if r.usable][:g_ext]
        if len(usable) >= g_ext:
            out[pid] = usable
    return out


def write_pool_atomic(path: str | Path, header: dict[str, Any], records: Iterable[PoolRecord]) -> None:
    """Write a whole pool file atomically (:func:`lit_rl.atomic.atomic_write`: temp file + fsync + rename),
    gzipped when the name ends in ``.gz`` (no name or time in the gzip header: the same pool, the same bytes)."""

    def lines(fh) -> None:
        fh.write((json.dumps(header, sort_keys=True) + "\n").encode("utf-8"))
        for rec in records:
            fh.write((json.dumps(asdict(rec), sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))

    def gzipped(fh) -> None:
        with gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0) as gz:
            lines(gz)

    atomic_write(path, gzipped if Path(path).name.endswith(".gz") else lines)


def reorder_usable_first(records: list[PoolRecord], max_tokens: int = MAX_USABLE_TOKENS) -> list[PoolRecord]:
    """ERILS App. B: mark records over ``max_tokens`` unusable and move usable ones to the front.

    The order among usable (and among unusable) records is kept; reward never affects it.
    """
    for r in records:
        r.usable = r.num_tokens <= max_tokens
    return usable_first(records)


def usable_first(records: list[PoolRecord]) -> list[PoolRecord]:
    """``records`` with the usable ones first (order kept within each part), ``index`` renumbered from 0."""
    ordered = [r for r in records if r.usable] + [r for r in records if not r.usable]
    for i, r in enumerate(ordered):
        r.index = i
    return ordered


# -- append-mode writing (crash-safe builds) -------------------------------------------------------------
def pool_stem(path: str | Path) -> Path:
    """``data/pools/sudoku.jsonl[.gz]`` -> ``data/pools/sudoku``: the base name of a pool's side files
    (``.build.json``, ``.stats.md``, ``.stats.json``, ``.lengths.png``)."""
    path = Path(path)
    name = path.name
    for suffix in (".gz", ".jsonl", ".json"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return path.with_name(name)


def create_pool(path: str | Path, header: dict[str, Any]) -> None:
    """Start an empty pool (header only), atomically."""
    write_pool_atomic(path, header, [])


def record_line(rec: PoolRecord) -> str:
    """The JSONL line of one record (the same serialisation as :func:`write_pool_atomic`)."""
    return json.dumps(asdict(rec), sort_keys=True, ensure_ascii=False) + "\n"


class PoolAppender:
    """Appends whole prompts to a pool: one ``write`` of all a prompt's lines, then ``flush`` + ``fsync``.

    A prompt is therefore complete or absent after a crash (a torn write can only leave a partial last
    prompt or line, which :func:`repair_pool_for_resume` removes).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh = self.path.open("ab")

    def append_prompt(self, records: Sequence[PoolRecord]) -> None:
        data = "".join(record_line(r) for r in records).encode("utf-8")
        self._fh.write(data)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "PoolAppender":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class ResumeState:
    """What :func:`repair_pool_for_resume` found.

    Attributes:
        header: the pool header.
        done: complete prompt ids, in file order.
        records: number of records kept.
        dropped_lines: lines removed from the end (a truncated line or an incomplete last prompt).
    """

    header: dict[str, Any]
    done: list[str]
    records: int
    dropped_lines: int


def repair_pool_for_resume(path: str | Path, per_prompt: int,
                           check_header: Callable[[dict[str, Any]], None] | None = None) -> ResumeState:
    """Check a partially built pool and cut a torn tail so that appending can continue.

    The file must be a prefix of whole prompts (``per_prompt`` consecutive records each) possibly followed
    by one incomplete prompt and/or a line without its newline (a killed writer); that tail is removed
    (the file is truncated and fsynced). Anything else (bad JSON or a short prompt in the middle, a
    prompt id twice) is a :class:`PoolFormatError` naming the line: such a file was not written by an
    interrupted build and is not touched. ``check_header(header)`` runs before anything is cut (a resume
    with a changed config raises there and leaves the file as it was).
    """
    path = Path(path)
    with path.open("rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a truncated last line
    if not lines:
        raise PoolFormatError(f"{path}:1: no complete header line")
    header = _parse_line(lines[0], f"{path}:1: header")
    _check_header(header, f"{path}:1")
    if check_header is not None:
        check_header(header)
    offset = len(lines[0]) + 1
    keep = offset  # byte offset after the last complete prompt
    done: list[str] = []
    seen: set[str] = set()
    group: list[str] = []
    indices: dict[int, int] = {}  # index -> line number within the current prompt
    records = kept_records = 0
    dropped = 1 if tail else 0
    body = lines[1:]
    for k, raw in enumerate(body):
        lineno = k + 2
        where = f"{path}:{lineno}"
        try:
            rec = PoolRecord.from_json(_parse_line(raw, where), where)
        except PoolFormatError:
            if k == len(body) - 1:  # a bad last line: torn write
                dropped += 1
                break
            raise
        if group and rec.prompt_id != group[0]:
            raise PoolFormatError(f"{where}: prompt {group[0]!r} has {len(group)} records before {rec.prompt_id!r} "
                                  f"starts (expected {per_prompt})")
        if not group and rec.prompt_id in seen:
            raise PoolFormatError(f"{where}: prompt {rec.prompt_id!r} appears twice")
        if rec.index in indices:
            raise PoolFormatError(f"{where}: duplicate record prompt_id {rec.prompt_id!r} index {rec.index}, "
                                  f"first at line {indices[rec.index]}")
        indices[rec.index] = lineno
        group.append(rec.prompt_id)
        records += 1
        offset += len(raw) + 1
        if len(group) == per_prompt:
            done.append(group[0])
            seen.add(group[0])
            group, indices = [], {}
            keep, kept_records = offset, records
    dropped += len(group)
    if keep < len(data):
        with path.open("r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    return ResumeState(header=header, done=done, records=kept_records, dropped_lines=dropped)
