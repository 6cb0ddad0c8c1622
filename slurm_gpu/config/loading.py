"""Reading the configuration file: trusted where privileged, parsed, validated."""

from __future__ import annotations

import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from typing import Any

from slurm_gpu.config.settings import Settings, sections
from slurm_gpu.errors import ConfigError

DEFAULT_PATH = "/etc/slurm-gpu/config.toml"
ENV_VAR = "SLURM_GPU_CONFIG"


def config_path() -> tuple[str, bool]:
    """The file to read and whether it was named explicitly (by ``SLURM_GPU_CONFIG``).

    The variable may name any file; privileged code still reads it only when it is trusted
    (``load_settings``), so the environment can choose among root's files, never supply one.
    """
    env = os.environ.get(ENV_VAR)
    return (env, True) if env else (DEFAULT_PATH, False)


#: Largest configuration file read, bytes: a real one is a few KiB.
MAX_CONFIG_BYTES = 1 << 20


def must_be_trusted(trusted: bool | None) -> bool:
    """Whether a load with this ``trusted`` argument requires a trusted file: ``None`` means
    "when running as root" (root taking its settings from another account's file would run
    that account's choices, such as ``accounting.sacct_path``, as root)."""
    return os.geteuid() == 0 if trusted is None else trusted


def load_settings(path: str | None = None, *, trusted: bool | None = None) -> Settings:
    """Read and validate the configuration file.

    ``path`` overrides ``SLURM_GPU_CONFIG`` and the default. Raises ``ConfigError`` naming the
    key and the file for any bad value, unknown key or unreadable file.

    ``trusted``: ``True`` for privileged entry points (hooks, sampler, collector, ship): the
    file must be trusted (``slurm_gpu.trust``: owned by root or the caller, not writable by
    group or others, nor any directory above it), else ``ConfigError``. ``None`` (default):
    required when the effective uid is 0, so the admin CLI run by root is held to the same
    rule. ``False``: never required; only ``slurm-gpu doctor``, which reports an untrusted
    file instead of acting on it. A missing default file still means "all defaults".
    """
    explicit = path is not None
    if path is None:
        path, explicit = config_path()
    if must_be_trusted(trusted):
        data = _read_trusted(path, explicit)
        if data is None:
            return parse_settings({}, path=None)
        return parse_settings(_parse_toml(data, path), path=path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        if explicit:
            raise _not_found(path) from None
        return parse_settings({}, path=None)
    except PermissionError:
        raise ConfigError(
            "configuration file is not readable",
            path=path,
            hint="make it readable (mode 0644) by the users who run gpueff",
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read ({exc.strerror})", path=path) from None
    return parse_settings(_parse_toml(raw, path), path=path)


def _not_found(path: str) -> ConfigError:
    return ConfigError(
        "configuration file not found",
        path=path,
        hint=f"write one with 'slurm-gpu config example > {path}', or unset {ENV_VAR}",
    )


def _read_trusted(path: str, explicit: bool) -> bytes | None:
    """The bytes of ``path`` if it is a trusted file; ``None`` when the default file is
    absent. The path is walked as configured, each directory checked on its descriptor, and
    the bytes are read from the descriptor that was checked (``slurm_gpu.trust``)."""
    from slurm_gpu.trust import require_trusted_fd

    if not os.path.exists(path):
        if explicit:
            raise _not_found(path)
        return None
    fd = require_trusted_fd(path)
    with os.fdopen(fd, "rb") as fh:
        try:
            return fh.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read ({exc.strerror})", path=path) from None


def _parse_toml(raw: bytes, path: str) -> dict[str, Any]:
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"larger than {MAX_CONFIG_BYTES} bytes",
            path=path,
            hint="a configuration file is a few KiB; check that this is the right file",
        )
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text", path=path, hint="save it as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"not valid TOML ({exc})", path=path, hint="check the line named above"
        ) from None


def parse_settings(data: Mapping[str, Any], *, path: str | None) -> Settings:
    """Validate a parsed TOML mapping into ``Settings`` (no I/O)."""
    known = sections()
    where = path or "<defaults>"
    for name in data:
        if name not in known:
            raise ConfigError(
                f"unknown section [{name}]",
                key=name,
                path=where,
                hint=f"known sections: {', '.join(known)}",
            )
    built: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, cls in known.items():
        table = data.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError("must be a table", key=name, path=where, hint=f"write it as [{name}]")
        built[name], section_sources = _parse_section(name, cls, table, where)
        sources.update(section_sources)
    return Settings(**built, sources=sources, path=path)


def _parse_section(
    name: str, cls: type[Any], table: Mapping[str, Any], where: str
) -> tuple[Any, dict[str, str]]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in table:
        if key not in fields:
            raise ConfigError(
                "unknown key",
                key=f"{name}.{key}",
                path=where,
                hint=f"keys of [{name}]: {', '.join(fields)}",
            )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, f in fields.items():
        dotted = f"{name}.{key}"
        if key in table:
            values[key] = _coerce(table[key], hints[key], f.metadata, dotted, where)
            sources[dotted] = where
        else:
            sources[dotted] = "default"
    return cls(**values), sources


def _coerce(value: Any, hint: Any, meta: Mapping[str, Any], key: str, where: str) -> Any:
    def bad(msg: str, hint_text: str | None = None) -> ConfigError:
        return ConfigError(msg, key=key, path=where, hint=hint_text or meta.get("doc"))

    origin = typing.get_origin(hint)
    if hint is bool:
        if not isinstance(value, bool):
            raise bad(f"must be true or false, not {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(f"must be a whole number, not {value!r}")
        out: Any = value
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(f"must be a number, not {value!r}")
        out = float(value)
    elif hint is str:
        if not isinstance(value, str):
            raise bad(f"must be a string, not {value!r}")
        out = value
    elif origin is tuple:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise bad(f"must be a list of strings, not {value!r}")
        out = tuple(value)
    elif origin is dict or hint is dict or origin is Mapping:
        if not isinstance(value, Mapping):
            raise bad(f"must be a table, not {value!r}")
        out = dict(value)
    else:  # pragma: no cover - a declaration error, caught by the example-config test
        raise bad(f"unsupported setting type {hint!r}")
    if "check" in meta:
        # A declaration's own validation (tables whose keys and values have a form).
        problem = meta["check"](out)
        if problem:
            raise bad(problem)
    if "choices" in meta and out not in meta["choices"]:
        raise bad(f"must be one of {', '.join(map(repr, meta['choices']))}, not {out!r}")
    if "min" in meta and out < meta["min"]:
        raise bad(f"must be at least {meta['min']}, not {out!r}")
    if "max" in meta and out > meta["max"]:
        raise bad(f"must be at most {meta['max']}, not {out!r}")
    return out
