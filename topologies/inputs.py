"""User input helpers shared by every package: the one-line error type and safe YAML loading.

Everything a user can type or point at (a catalogue name, a YAML file, a flag) is checked at the
boundary and turned into a :class:`UserInputError` whose message is one line naming the field or
file and what would be valid. The CLI prints that line and exits with code 2, with no traceback.
YAML is always read with the safe loader (libyaml's ``CSafeLoader`` when PyYAML has it, else
``yaml.SafeLoader``: the same objects, several times faster): a configuration file can never execute code.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError, model_validator

FAST_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser with PyYAML's safe constructor and resolver (the objects ``yaml.safe_load`` gives)."""


class UserInputError(ValueError):
    """An invalid input that the user can fix; ``str(err)`` is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def _number_word(annotation: Any) -> str | None:
    """'an integer' / 'a number' when a field of this annotation takes numbers but not booleans, else None."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    args = typing.get_args(annotation) if union else (annotation,)
    if bool in args:
        return None
    return "an integer" if int in args else "a number" if float in args else None


class NoBoolNumbers(BaseModel):
    """A model whose integer and float fields refuse booleans: pydantic's lax mode reads ``gpus: true``
    in a YAML file as 1 (a bool is an int in Python), a silent wrong value instead of an error."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_bool_for_number(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key) if isinstance(value, bool) else None
                word = _number_word(field.annotation) if field is not None else None
                if word is not None:
                    raise BoolForNumberError(key, value, f"Input should be {word}, not a boolean")
        return data


class BoolForNumberError(ValueError):
    """A boolean given for the number field ``key`` (its location for :func:`describe_validation_error`)."""

    def __init__(self, key: str, value: bool, message: str) -> None:
        super().__init__(f"{key}: {message} (got {value!r})")
        self.key, self.value, self.message = key, value, message


def load_yaml_file(path: str | Path, what: str = "file") -> dict[str, Any]:
    """Read a YAML mapping from ``path`` safely; raise UserInputError on any problem."""
    p = Path(path)
    if p.is_dir():
        raise UserInputError(f"{what} '{p}' is a directory, not a YAML file")
    if not p.is_file():
        raise UserInputError(f"{what} '{p}' does not exist")
    try:
        text = p.read_text(encoding="utf-8")
        try:
            data = yaml.load(text, Loader=FAST_SAFE_LOADER)  # noqa: S506 - a safe loader (C or Python)
        except yaml.YAMLError:  # the pure-Python parser's message for the error (where and what)
            data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserInputError(f"{what} '{p}' is malformed YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserInputError(f"{what} '{p}' cannot be read: {err}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{what} '{p}' must contain a YAML mapping at the top level")
    return data


def flag_words(message: str) -> str:
    """A pydantic error message in the words of muonsim's flag errors (``--tp: must be greater than 0``):
    without pydantic's ``Value error, `` prefix and with ``must be`` for ``Input should be``."""
    return re.sub(r"^Input should be\b", "must be", message.removeprefix("Value error, "))


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun`` agreeing in number: ``1 run``, ``2 runs``, ``1 NVLink domain`` (``many``: an
    irregular plural, default ``noun + 's'``)."""
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


def did_you_mean(name: str, valid: Iterable[str]) -> str | None:
    """The one valid name ``name`` was most likely meant to be, or None.

    Tried in order: the same name with ``-`` and ``_`` swapped, the initials of a ``snake_case`` name
    (``mbs`` -> ``micro_batch_size``), the only name starting with ``name`` (``kimi`` -> ``kimi-k2``), then the
    closest spelling (``paralelism`` -> ``parallelism``). A name that starts several valid names gets a guess only when one of them is
    nearly the same (``gpu`` -> ``gpus``, but no guess for ``llama3``).
    """
    names = sorted(set(valid))
    same = _same_name(name, names)
    if same is not None:
        return same
    prefixed = [v for v in names if v.startswith(name) and len(name) >= 3]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:  # several names start with it: only a near-identical one (gpu -> gpus) is a safe guess
        near = difflib.get_close_matches(name, prefixed, n=1, cutoff=0.85)
        return near[0] if near else None
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return close[0] if close else None


def first_repeat(values: Sequence[Any]) -> Any | None:
    """The first value of ``values`` equal to an earlier one (None when each is given once): a list of
    choices (``--tp 2,2``, a grid's ``gpus: [8, 8]``) that would run the same variant twice. Compared with
    ``==``, so unhashable values (an inline model mapping) work too."""
    return next((v for k, v in enumerate(values) if any(v == earlier for earlier in values[:k])), None)


def guess_hint(name: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` when :func:`did_you_mean` finds the name ``name`` was meant to be, else nothing:
    the hint an unknown-name error puts right after the name."""
    guess = did_you_mean(name, valid)
    return f" (did you mean '{guess}'?)" if guess else ""


def likely_misspelling(name: str, valid: Iterable[str]) -> str | None:
    """The valid name that ``name`` is almost surely a misspelling of, or None: stricter than
    :func:`did_you_mean`, for refusing input rather than hinting. ``-``/``_`` swapped, the initials of a
    ``snake_case`` name (``mbs`` -> ``micro_batch_size``), or a spelling at least 0.8 alike (``ppp`` -> ``pp``,
    ``seq_lenght`` -> ``seq_length``); not a name that merely begins a valid one or shares most of its letters
    (``tokens``, ``source_url`` and ``precision_mode`` are columns of their own, not ``tokens_per_s_per_gpu``,
    ``source`` and ``precision``)."""
    names = sorted(set(valid))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return _same_name(name, names) or (close[0] if close else None)


def _same_name(name: str, names: list[str]) -> str | None:
    """The one of ``names`` that ``name`` writes another way: ``-`` and ``_`` swapped, or the initials of a
    ``snake_case`` name (``mbs`` -> ``micro_batch_size``); None when there is no such name or several."""
    for variant in (name.replace("-", "_"), name.replace("_", "-")):
        if variant != name and variant in names:
            return variant
    key = name.lower().replace("-", "_")
    initials = [v for v in names if "_" in v and "".join(part[:1] for part in v.split("_")) == key]
    return initials[0] if len(initials) == 1 else None


def unknown_name_hint(name: str, valid: Iterable[str], max_listed: int = 60) -> str:
    """``; did you mean 'X'?`` when ``name`` resembles one valid name, else `` (valid: a, b, ...)`` (or nothing
    when there are more than ``max_listed``)."""
    names = sorted(set(valid))
    guess = did_you_mean(name, names)
    if guess is not None:
        return f"; did you mean '{guess}'?"
    return f" (valid: {', '.join(names)})" if 0 < len(names) <= max_listed else ""


def _model_fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str] | None:
    """The field names of the nested model at ``loc`` under ``model`` (None when it is not a model)."""
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            continue  # a union member's tag or a list index: stay on the current model
        annotation = fields[part].annotation
        members = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
            typing.get_origin(annotation) is typing.Union else (annotation,)
        nested = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if not nested:
            return None
        current = nested[0]
    fields = getattr(current, "model_fields", None)
    return None if fields is None else list(fields)


def describe_validation_error(err: ValidationError, source: str, model: type[BaseModel] | None = None) -> str:
    """Turn the first pydantic error into one line: ``source: field.path: message``.

    An unknown field is reported before a missing one: a misspelt name causes both, and the
    unknown name is the one the user has to fix. With the validated ``model``, an unknown key says
    which valid key it resembles (or lists the valid keys of its section), and a section given as a
    scalar or a list says which mapping to write.
    """
    errors = err.errors()
    first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    parts = tuple(part for part in first.get("loc", ()) if part != "__root__")
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, BoolForNumberError):  # raised for the model: locate it at its key
        first = {**first, "msg": cause.message, "input": cause.value}
        parts = (*parts, cause.key)
    loc = ".".join(str(part) for part in parts)
    if first.get("type") == "extra_forbidden" and model is not None and parts:
        valid = _model_fields_at(model, parts[:-1])
        if valid is not None:
            return f"{source}: {loc}: unknown key{unknown_name_hint(str(parts[-1]), valid)}"
    value = first.get("input")
    if first.get("type") == "model_type" and model is not None and parts:
        keys = _model_fields_at(model, parts)
        if keys is not None:  # a section given as a scalar or a list
            how = (f", e.g. {loc}: {{kind: {value}}}" if "kind" in keys and isinstance(value, str)
                   else f" (keys: {', '.join(keys)})")
            return f"{source}: {loc}: expected a mapping of its settings{how} (got {value!r})"
    msg = first.get("msg", "invalid value")
    msg = msg.removeprefix("Value error, ")
    shown = ""
    if first.get("type") not in ("missing",) and not isinstance(value, dict | list) and loc:
        shown = f" (got {value!r})"
    field = f"{loc}: " if loc else ""
    return f"{source}: {field}{msg}{shown}"


def resolve_catalog_entry(name_or_path: str, catalog_dir: Path, what: str) -> dict[str, Any]:
    """Load a catalogue entry by name (``catalog_dir/NAME.yaml``) or a user file by path."""
    candidate = catalog_dir / f"{name_or_path}.yaml"
    if candidate.is_file():
        return load_yaml_file(candidate, what)
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        return load_yaml_file(name_or_path, what)
    names = sorted(p.stem for p in catalog_dir.glob("*.yaml"))
    raise UserInputError(f"unknown {what} '{name_or_path}'{guess_hint(name_or_path, names)}; known: {', '.join(names)} "
                         "(or a path to a YAML file)")
