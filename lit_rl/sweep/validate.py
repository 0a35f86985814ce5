"""A sweep checked against its base config before the first trial (:func:`check_against_base`).

The training config's preflight (:func:`lit_rl.config.preflight`) runs on ``base`` + ``overrides`` + the trial
values of a set of points of the space: every choice of a categorical key and both bounds (or the grid) of a
numeric one, with the derived keys computed from them. So a misspelled space key (``unknown key for ...``), a
choice of the wrong type, and a derived rule that gives an invalid value (a negative count) are one line naming
the sweep file's line, before any trial trains. The first point also reads the data (task, pool); the others
check the config only.

The objective is checked where lit_rl knows the metric's name: ``val/<task>/<evaluation>/<metric>`` must name the
base config's task, an evaluation it runs (``greedy``, the module's, or a ``PassAtKEvaluation`` config's name) and
a metric that evaluation logs. Other names (``train/...``) are left to the trials.
"""

from __future__ import annotations

import difflib
import itertools
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from lit_rl.errors import ConfigError
from lit_rl.sweep.errors import SweepConfigError

__all__ = ["check_against_base", "space_points"]

#: the most points of the space the check runs the preflight on
MAX_POINTS = 64
_GREEDY_METRICS = ("accuracy", "length_mean")
_PASSK_METRIC = re.compile(r"^(unbiased_)?pass@\d+$|^(accuracy|length_mean|hit_limit_frac)$")


def space_points(cfg: Any) -> list[dict[str, Any]]:
    """Points of the space: each key's candidates (choices, grid, or low and high) in every combination, or, past
    :data:`MAX_POINTS`, the all-first point and each key's candidates one at a time."""
    cands = {}
    for name, spec in cfg.space.items():
        if spec.type == "categorical":
            cands[name] = list(spec.choices)
        elif spec.grid is not None:
            cands[name] = list(spec.grid)
        else:
            lo, hi = (int(spec.low), int(spec.high)) if spec.type == "int" else (spec.low, spec.high)
            cands[name] = [lo] if lo == hi else [lo, hi]
    names = list(cands)
    total = 1
    for v in cands.values():
        total *= len(v)
    if total <= MAX_POINTS:
        return [dict(zip(names, combo)) for combo in itertools.product(*(cands[n] for n in names))]
    first = {n: cands[n][0] for n in names}
    points = [first]
    for n in names:
        points += [{**first, n: v} for v in cands[n][1:]]
    return points


def _bad(cfg: Any, key: tuple, problem: str) -> SweepConfigError:
    err = SweepConfigError(f"{'.'.join(map(str, key))}: {problem}")
    err.key = key
    return _located(cfg, err)


def _located(cfg: Any, err: SweepConfigError) -> SweepConfigError:
    """``err`` with the sweep file's line of its key in front."""
    where = getattr(cfg, "where", {}) or {}
    key = tuple(err.key)
    found = next((where[key[:n]] for n in range(len(key), 0, -1) if key[:n] in where), getattr(cfg, "source", None))
    out = SweepConfigError(f"{found}: {err}" if found else str(err))
    out.key = key
    return out


def _cli(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def check_against_base(cfg: Any) -> None:
    """Raise :class:`~lit_rl.sweep.errors.SweepConfigError` (one line, the sweep file's line) for a space or derived
    key, a choice or a derived value the base config refuses, or an objective it does not log (module doc)."""
    import yaml

    from lit_rl.config import preflight

    with tempfile.TemporaryDirectory(prefix="lit_rl-sweep-check-") as tmp:
        overlay = Path(tmp) / "overrides.yaml"
        overlay.write_text(yaml.safe_dump(cfg.overrides), encoding="utf-8")
        base = [a for b in cfg.base for a in ("--config", b)] + (["--config", str(overlay)] if cfg.overrides else [])
        view = None
        for i, point in enumerate(space_points(cfg)):
            try:
                values = cfg.trial_values(point)
            except SweepConfigError as e:  # a derived rule that fails for this point: at its line
                raise _located(cfg, e) from None
            argv = ["fit", *base, *(f"--{k}={_cli(v)}" for k, v in values.items())]
            try:
                view = preflight(argv, data=i == 0) if view is None else (preflight(argv, data=False) or view)
            except ConfigError as e:
                msg = str(e).replace(str(overlay), f"{getattr(cfg, 'source', 'the sweep')} (overrides)")
                m = re.match(r"command line \(--([^)]+)\)", msg)
                key = m.group(1) if m else None
                section = "derived" if key in cfg.derived else "space"
                shown = ", ".join(f"{k.rsplit('.', 1)[-1]}={v!r}" for k, v in values.items())
                raise _bad(cfg, (section, key) if key in values else ("space",),
                           f"the base config refuses the trial values ({shown}): {msg}") from None
    if view is not None:
        _check_objective(cfg, view)


def _check_objective(cfg: Any, view: Any) -> None:
    metric = cfg.objective.metric
    parts = metric.split("/")
    if parts[0] not in ("val", "test") or len(parts) != 4:
        return
    _, task_name, evaluation, name = parts
    task = view.get(("data", "init_args", "task"))
    known_task = _task_name(task)
    evals = {"greedy": _GREEDY_METRICS}
    for cb in view.get(("trainer", "callbacks")) or []:
        if isinstance(cb, dict) and str(cb.get("class_path", "")).endswith("PassAtKEvaluation"):
            for c in (cb.get("init_args") or {}).get("configs") or []:
                if isinstance(c, dict) and isinstance(c.get("name"), str):
                    evals[c["name"]] = None
    problem = None
    if known_task is not None and task_name != known_task:
        problem = f"the base config's task is {known_task!r}, not {task_name!r}"
    elif evaluation not in evals:
        problem = f"no evaluation {evaluation!r} in the base config (it logs {', '.join(sorted(evals))})"
    elif evals[evaluation] is not None and name not in evals[evaluation]:
        problem = f"the greedy evaluation logs {', '.join(evals[evaluation])}, not {name!r}"
    elif evals[evaluation] is None and not _PASSK_METRIC.match(name):
        problem = f"a PassAtKEvaluation config logs pass@k, accuracy, length_mean, hit_limit_frac, not {name!r}"
    if problem:
        logged = [f"val/{known_task or task_name}/{e}/{m}" for e, ms in evals.items() for m in (ms or ("pass@1",))]
        near = difflib.get_close_matches(metric, logged, n=1)
        raise _bad(cfg, ("objective", "metric"), f"{metric!r}: {problem}"
                   + (f"; did you mean {near[0]!r}?" if near else ""))


def _task_name(node: Any) -> str | None:
    """The name of the task a config builds (``None`` if it cannot be built here)."""
    if not isinstance(node, dict) or not isinstance(node.get("class_path"), str):
        return None
    try:
        import lit_rl.config.signatures as sig

        return str(sig.import_class(node["class_path"])(**(node.get("init_args") or {})).name)
    except Exception:  # noqa: BLE001 - the preflight reported a task it cannot build
        return None
