"""A small client of Prometheus' HTTP API (instant and range-selector queries).

Only ``GET /api/v1/query`` is used (an instant vector for the live view; a range selector
``metric[Ns]``, answered as a matrix of raw samples, for the telemetry sources of
``slurm_gpu.sources``), with the standard library's ``urllib``; the answer is
read bounded (``MAX_RESPONSE_BYTES``) and checked field by field. Label values are cleaned
where they enter, here.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_gpu.errors import TelemetryUnavailableError
from slurm_gpu.textsafe import clean_user_text, without_password

#: Largest answer read from Prometheus, bytes (10,000 jobs x 8 GPUs of the view's series are
#: about 60 MB).
MAX_RESPONSE_BYTES = 256 * 1024 * 1024


class PrometheusUnavailableError(TelemetryUnavailableError):
    """Prometheus did not answer, or answered something that is not a query result
    (exit code 7, like other unavailable telemetry)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of an instant vector: its labels and value."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range-vector answer: its labels and its raw samples, as stored by
    Prometheus at each scrape (unix seconds, value), oldest first; non-finite values dropped."""

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]


Fetch = Callable[[str, float], bytes]
"""``fetch(url, timeout_s) -> body``: the HTTP seam (raises ``OSError`` or ``URLError``)."""


def _urlopen_fetch(url: str, timeout_s: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        data: bytes = resp.read(MAX_RESPONSE_BYTES + 1)
    if len(data) > MAX_RESPONSE_BYTES:
        raise PrometheusUnavailableError(
            f"Prometheus answered more than {MAX_RESPONSE_BYTES} bytes",
            hint="the live view's query matched far more series than running jobs have",
        )
    return data


class PrometheusClient:
    """Instant queries against ``base_url`` (``http://host:9090``)."""

    def __init__(self, base_url: str, timeout_s: float, fetch: Fetch = _urlopen_fetch) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PrometheusUnavailableError(
                f"live.prometheus_url {without_password(base_url)!r} is not an http(s) URL",
                hint="set it to Prometheus' base URL, e.g. http://prometheus:9090",
            )
        self.base_url = base_url.rstrip("/")
        self.shown_url = without_password(self.base_url)
        """``base_url`` as messages show it: its password, if any, as ``***``."""
        self.timeout_s = timeout_s
        self._fetch = fetch

    def query(self, promql: str, at_s: float | None = None) -> list[Sample]:
        """The instant vector of ``promql`` (now, or at ``at_s``); raises
        ``PrometheusUnavailableError`` when Prometheus is unreachable or the answer is not
        a vector."""
        return parse_vector(self._get(promql, at_s))

    def query_matrix(self, promql: str, at_s: float) -> list[Series]:
        """The range vector of ``promql`` (a selector with a ``[Ns]`` range) at ``at_s``:
        every raw sample of the window, at the series' own resolution. Raises
        ``PrometheusUnavailableError`` as ``query`` does, or when the answer is not a
        matrix."""
        return parse_matrix(self._get(promql, at_s))

    def _get(self, promql: str, at_s: float | None) -> bytes:
        params = {"query": promql}
        if at_s is not None:
            params["time"] = repr(at_s)
        url = f"{self.base_url}/api/v1/query?{urllib.parse.urlencode(params)}"
        try:
            raw = self._fetch(url, self.timeout_s)
        except urllib.error.HTTPError as exc:
            detail = _error_of(exc.read(65536)) if exc.fp is not None else ""
            raise PrometheusUnavailableError(
                f"Prometheus refused the query (HTTP {exc.code}){detail}",
                hint=f"check {self.shown_url}/-/ready and the recording rules",
            ) from None
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusUnavailableError(
                f"Prometheus at {self.shown_url} is unreachable ({reason})",
                hint="check live.prometheus_url; empty reads this node's live files instead",
            ) from None
        return raw

    def status_config(self) -> str:
        """Prometheus' loaded configuration, as the YAML text ``/api/v1/status/config`` gives
        (``slurm-gpu doctor``); raises ``PrometheusUnavailableError``."""
        url = f"{self.base_url}/api/v1/status/config"
        try:
            raw = self._fetch(url, self.timeout_s)
            text = json.loads(raw)["data"]["yaml"]
        except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusUnavailableError(
                f"Prometheus' configuration is not readable ({reason})",
                hint="check live.prometheus_url",
            ) from None
        if not isinstance(text, str):
            raise PrometheusUnavailableError(
                "Prometheus' configuration is not text", hint="check live.prometheus_url"
            )
        return text

    def listen_address(self) -> str:
        """Prometheus' ``--web.listen-address`` from ``/api/v1/status/flags`` (``slurm-gpu
        doctor``); raises ``PrometheusUnavailableError``."""
        url = f"{self.base_url}/api/v1/status/flags"
        try:
            raw = self._fetch(url, self.timeout_s)
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusUnavailableError(
                f"Prometheus at {self.shown_url} is unreachable ({reason})",
                hint="check live.prometheus_url",
            ) from None
        try:
            address = json.loads(raw)["data"]["web.listen-address"]
        except (ValueError, KeyError, TypeError) as exc:
            raise PrometheusUnavailableError(
                f"Prometheus' flags are not readable ({exc})",
                hint="is live.prometheus_url Prometheus' base URL?",
            ) from None
        if not isinstance(address, str):
            raise PrometheusUnavailableError(
                "Prometheus' flags name no listen address", hint="check live.prometheus_url"
            )
        return clean_user_text(address, 256)


def _error_of(body: bytes) -> str:
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ""
    return f": {clean_user_text(err, 200)}" if isinstance(err, str) else ""


def parse_vector(raw: bytes) -> list[Sample]:
    """The samples of an instant-vector answer; ``PrometheusUnavailableError`` otherwise."""
    try:
        body = json.loads(raw)
        if body.get("status") != "success" or body["data"]["resultType"] != "vector":
            raise ValueError("not a successful vector result")
        out = []
        clean = _Cleaner()
        for item in body["data"]["result"]:
            labels = item["metric"]
            value = float(item["value"][1])
            if not isinstance(labels, dict) or not math.isfinite(value):
                continue
            out.append(Sample(clean.labels(labels), value))
        return out
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise PrometheusUnavailableError(
            f"Prometheus' answer is not a query result ({exc})",
            hint="is live.prometheus_url Prometheus' base URL (not its /graph page)?",
        ) from None


class _Cleaner:
    """Label names and values cleaned once per distinct string of one answer: an answer
    repeats each job's id, user, host and every metric name across its series (about 20
    times per job), and cleaning is the costly part of reading it. Lives for one answer only,
    so memory does not grow from pass to pass."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def text(self, raw: object) -> str:
        s = raw if isinstance(raw, str) else str(raw)
        done = self._seen.get(s)
        if done is None:
            done = self._seen[s] = clean_user_text(s, 128)
        return done

    def labels(self, raw: dict[Any, Any]) -> dict[str, str]:
        text = self.text
        return {text(k): text(v) for k, v in raw.items()}


def _labels(raw: Any, clean: _Cleaner | None = None) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise TypeError("labels are not an object")
    return (clean or _Cleaner()).labels(raw)


def parse_matrix(raw: bytes) -> list[Series]:
    """The series of a range-vector (matrix) answer; ``PrometheusUnavailableError``
    otherwise. Label names and values are cleaned here, where they enter."""
    try:
        body = json.loads(raw)
        if body.get("status") != "success" or body["data"]["resultType"] != "matrix":
            raise ValueError("not a successful matrix result")
        out = []
        clean = _Cleaner()
        for item in body["data"]["result"]:
            points = []
            for t, v in item["values"]:
                value, at = float(v), float(t)
                if math.isfinite(value) and math.isfinite(at):
                    points.append((at, value))
            out.append(Series(_labels(item["metric"], clean), tuple(points)))
        return out
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise PrometheusUnavailableError(
            f"Prometheus' answer is not a range query result ({exc})",
            hint="is the Prometheus URL its base URL (not its /graph page)?",
        ) from None
