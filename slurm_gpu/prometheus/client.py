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

from slurm_gpu.errors import ConfigError, TelemetryUnavailableError
from slurm_gpu.prometheus.auth import (
    PASSWORD_FILE_KEY,
    basic_header,
    read_password_file,
    split_credentials,
)
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


def _urlopen_fetch(url: str | urllib.request.Request, timeout_s: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        data: bytes = resp.read(MAX_RESPONSE_BYTES + 1)
    if len(data) > MAX_RESPONSE_BYTES:
        raise PrometheusUnavailableError(
            f"Prometheus answered more than {MAX_RESPONSE_BYTES} bytes",
            hint="the live view's query matched far more series than running jobs have",
        )
    return data


def _fetch_with(authorization: str) -> Fetch:
    """``_urlopen_fetch`` sending ``authorization`` to the URL asked only: an unredirected
    header, so that a redirect (to another host) does not carry the credentials."""

    def fetch(url: str, timeout_s: float) -> bytes:
        request = urllib.request.Request(url)
        request.add_unredirected_header("Authorization", authorization)
        return _urlopen_fetch(request, timeout_s)

    return fetch


class PrometheusClient:
    """Instant queries against ``base_url`` (``http://host:9090``).

    A user named in ``base_url`` (``http://user@host:9090``) is sent with HTTP basic
    authentication, with the password from ``password_file`` or from the URL
    (``slurm_gpu.prometheus.auth``); the URL asked never holds them."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float,
        fetch: Fetch = _urlopen_fetch,
        *,
        password_file: str = "",
    ) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PrometheusUnavailableError(
                f"live.prometheus_url {without_password(base_url)!r} is not an http(s) URL",
                hint="set it to Prometheus' base URL, e.g. http://prometheus:9090",
            )
        bare, user, password = split_credentials(base_url)
        if password_file:
            if user is None or password is not None:
                raise ConfigError(
                    "needs the user, and only the user, named in live.prometheus_url"
                    f" ({without_password(base_url)})",
                    key=PASSWORD_FILE_KEY,
                    hint="name Prometheus' user in the URL (http://user@host:9090); "
                    "the password goes in the file alone",
                )
            password = read_password_file(password_file)
        self.base_url = bare.rstrip("/")
        self.shown_url = without_password(base_url.rstrip("/"))
        """``base_url`` as messages show it: its password, if any, as ``***``."""
        self.timeout_s = timeout_s
        self.authenticated = user is not None
        """Whether requests carry a user and password (HTTP basic authentication)."""
        if user is not None and fetch is _urlopen_fetch:
            fetch = _fetch_with(basic_header(user, password or ""))
        self._fetch = fetch

    def _refused(self, exc: urllib.error.HTTPError, what: str) -> PrometheusUnavailableError:
        """The error for an HTTP error answer to ``what`` (a query, the configuration)."""
        detail = _error_of(exc.read(65536)) if exc.fp is not None else ""
        hint = f"check {self.shown_url}/-/ready and the recording rules"
        if exc.code in (401, 403):
            hint = (
                "check the user in live.prometheus_url and its password "
                "(live.prometheus_password_file)"
                if self.authenticated
                else "this Prometheus asks for a password: name its user in "
                "live.prometheus_url (http://user@host:9090) and the password in "
                "live.prometheus_password_file"
            )
        return PrometheusUnavailableError(
            f"Prometheus refused {what} (HTTP {exc.code}){detail}", hint=hint
        )

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
            raise self._refused(exc, "the query") from None
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
        except urllib.error.HTTPError as exc:
            raise self._refused(exc, "its configuration") from None
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
        except urllib.error.HTTPError as exc:
            raise self._refused(exc, "its flags") from None
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
