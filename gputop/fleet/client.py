"""Talking to a Prometheus (or anything that speaks its HTTP API: Thanos, VictoriaMetrics) through
prometheus-api-client, with a bearer token, basic auth, TLS and a CA file. Every failure becomes one
GputopError with a one-line message and a documented exit code."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

from gputop.util.errors import GputopError, PermissionDeniedError, UnavailableError, UsageError

ENV_TOKEN = "GPUTOP_PROMETHEUS_TOKEN"  # a bearer token (kept off argv: other users read argv in /proc)
ENV_PASSWORD = "GPUTOP_PROMETHEUS_PASSWORD"  # the basic-auth password


class PrometheusAuthError(PermissionDeniedError):
    """401/403: a wrong or missing token or password (exit 4)."""


class PrometheusUnavailable(UnavailableError):
    """Down, unreachable, too slow, or not a Prometheus (exit 6)."""


@dataclass(frozen=True)
class Auth:
    token: str | None = None
    user: str | None = None
    password: str | None = None
    ca_file: str | None = None
    insecure: bool = False  # skip TLS verification (explicit, never the default)
    client_cert: str | None = None
    client_key: str | None = None


def read_secret(path: str, what: str) -> str:
    """A token or password from a file: its first line, stripped. A missing or empty file is a usage error."""
    try:
        with open(path, encoding="utf-8") as f:
            value = f.readline().strip()
    except OSError as e:
        raise UsageError(f"cannot read the {what} file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"the {what} file {path} is not UTF-8 text") from None
    if not value:
        raise UsageError(f"the {what} file {path} is empty")
    return value


def check_url(url: str) -> str:
    u = urlparse(url or "")
    if u.scheme not in ("http", "https") or not u.netloc:
        raise UsageError(f"--prometheus {url!r}: give the server's base URL, e.g. http://prometheus:9090")
    return url.rstrip("/")


class Prometheus:
    """One server. ``query`` counts the HTTP queries it sends (``queries``), so a test and the benchmark
    can check the per-refresh budget. Thread-safe: the TUI queries from a worker thread."""

    def __init__(self, url: str, auth: Auth = Auth(), timeout: float = 5.0):
        self.url = check_url(url)
        self.timeout = timeout
        self.queries = 0
        self._lock = threading.Lock()
        self._auth = auth
        self._pc = None  # made at the first query: requests is imported then (fleet/first.py)

    def _client(self):
        with self._lock:
            if self._pc is None:
                self._pc = _connect(self.url, self._auth, self.timeout)
            return self._pc

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """An instant query's result (a list of {metric, value}); raises a GputopError."""
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        params = {"time": f"{at:.3f}"} if at is not None else None
        client = self._client()
        with self._lock:
            self.queries += 1
        try:
            return client.custom_query(promql, params=params)
        except PrometheusApiClientException as e:
            raise _http_error(self.url, str(e)) from None
        except requests.exceptions.SSLError as e:
            raise PrometheusUnavailable(f"Prometheus at {self.url}: TLS failed ({_short(e)}); give its CA with "
                                        "--ca-file") from None
        except requests.exceptions.ConnectionError as e:
            if isinstance(e, requests.exceptions.Timeout) or "read timed out" in str(e).lower():
                raise PrometheusUnavailable(f"Prometheus at {self.url} did not answer within {self.timeout:g}s "
                                            "(--timeout)") from None
            raise PrometheusUnavailable(f"Prometheus at {self.url} is unreachable ({_short(e)})") from None
        except requests.exceptions.Timeout:
            raise PrometheusUnavailable(f"Prometheus at {self.url} did not answer within {self.timeout:g}s "
                                        "(--timeout)") from None
        except (requests.exceptions.RequestException, ValueError, KeyError, TypeError) as e:
            raise PrometheusUnavailable(f"Prometheus at {self.url} gave a bad answer ({_short(e)}): is it a "
                                        "Prometheus HTTP API?") from None

    def close(self) -> None:
        if self._pc is not None:
            self._pc.close()


def _connect(url: str, auth: Auth, timeout: float):
    """prometheus-api-client's connection, on a requests session with our TLS settings."""
    import requests
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    session = requests.Session()
    session.verify = False if auth.insecure else (auth.ca_file or True)
    if auth.client_cert:
        session.cert = (auth.client_cert, auth.client_key) if auth.client_key else auth.client_cert
    headers = {"Authorization": f"Bearer {auth.token}"} if auth.token else None
    basic = (auth.user, auth.password or "") if auth.user else None
    # No retries: a down server is said at once, and the view keeps its last data.
    return PrometheusConnect(url=url, headers=headers, auth=basic, session=session,
                             retry=Retry(total=0, raise_on_status=False), timeout=timeout)


def _short(e: Exception) -> str:
    text = str(e)
    for marker in ("Connection refused", "Name or service not known", "timed out", "CERTIFICATE_VERIFY_FAILED",
                   "No route to host", "Temporary failure in name resolution"):
        if marker in text:
            return marker.lower()
    return text[:120]


def _http_error(url: str, text: str) -> GputopError:
    # prometheus-api-client says "HTTP Status Code 401 (b'...')"
    code = text.split("HTTP Status Code ", 1)[-1][:3]
    if code in ("401", "403"):
        return PrometheusAuthError(f"Prometheus at {url} refused the credentials (HTTP {code}): check the token "
                                   f"(--token-file, ${ENV_TOKEN}) or --user/--password-file")
    if code == "400" or code == "422":
        return GputopError(f"Prometheus at {url} rejected a query (HTTP {code}): {text[:200]}")
    return PrometheusUnavailable(f"Prometheus at {url} answered HTTP {code or '?'}: is the URL its base "
                                 "(e.g. http://host:9090)?")


def cleartext_warning(url: str, auth: Auth) -> str | None:
    """A warning when credentials would cross the network unencrypted (http:// to another host)."""
    u = urlparse(url)
    if (auth.token or auth.user) and u.scheme == "http" and u.hostname not in ("localhost", "127.0.0.1", "::1"):
        return (f"warning: the credentials go to {u.hostname} over plain http, readable on the network: "
                "use https:// (with --ca-file)")
    return None


def auth_from(args) -> Auth:
    """The credentials from ``gputop fleet``'s options and environment (secrets never on argv)."""
    token = read_secret(args.token_file, "token") if getattr(args, "token_file", None) else os.environ.get(ENV_TOKEN)
    password = (read_secret(args.password_file, "password") if getattr(args, "password_file", None)
                else os.environ.get(ENV_PASSWORD))
    if getattr(args, "ca_file", None) and not os.path.isfile(args.ca_file):
        raise UsageError(f"--ca-file {args.ca_file}: no such file")
    return Auth(token=token or None, user=getattr(args, "user", None), password=password,
                ca_file=getattr(args, "ca_file", None), insecure=bool(getattr(args, "insecure", False)),
                client_cert=getattr(args, "client_cert", None), client_key=getattr(args, "client_key", None))


def now() -> float:
    return time.time()
