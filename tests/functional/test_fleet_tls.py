"""gputop fleet against a real Prometheus serving TLS (a throwaway CA made with openssl) with basic auth
(its --web.config.file): the CA file, the right and the wrong password, an unverified certificate."""

from __future__ import annotations

import shutil
import subprocess
import time
import warnings

import pytest
import yaml

from tests.conftest import run_gputop
from tests.functional import fleet_helpers as fh

pytestmark = [pytest.mark.skipif(fh.WHY_NOT is not None, reason=str(fh.WHY_NOT)),
              pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")]


def _bcrypt(password: str) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt  # the C library's bcrypt ($2b$), which Prometheus's web config wants
        except ImportError:
            return None
    h = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    return h if h and h.startswith("$2") else None


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls_prom(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet-tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=gputop test CA", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "srv.crt", "-days", "2", "-extfile", "ext.cnf", cwd=d)
    web = {"tls_server_config": {"cert_file": str(d / "srv.crt"), "key_file": str(d / "srv.key")}}
    hashed = _bcrypt("pa55word")
    if hashed:
        web["basic_auth_users"] = {"fleet": hashed}
    (d / "web.yml").write_text(yaml.safe_dump(web))
    (d / "pw").write_text("pa55word\n")
    (d / "badpw").write_text("nope\n")
    prom = fh.Prometheus(d / "prom", web_config=d / "web.yml")
    url = f"https://127.0.0.1:{prom.port}"
    auth = ["--user", "fleet", "--password-file", str(d / "pw")] if hashed else []
    deadline = time.time() + 60
    while True:
        r = run_gputop("fleet", "--prometheus", url, "--json", "--ca-file", str(d / "ca.crt"), *auth)
        if r.returncode == 0:
            break
        if time.time() > deadline:
            prom.stop()
            raise RuntimeError(r.stderr + (d / "prom" / "prometheus.log").read_text()[-2000:])
        time.sleep(0.5)
    try:
        yield {"url": url, "dir": d, "auth": auth, "basic": bool(hashed)}
    finally:
        prom.stop()


def test_tls_with_the_ca_file_and_basic_auth(tls_prom):
    t = tls_prom
    r = run_gputop("fleet", "--prometheus", t["url"], "--json", "--ca-file", str(t["dir"] / "ca.crt"), *t["auth"])
    assert r.returncode == 0, r.stderr
    assert '"nodes":[]' in r.stdout.replace(" ", "").replace("\n", "")


def test_an_unknown_ca_is_a_clear_error_and_insecure_skips_it(tls_prom):
    t = tls_prom
    r = run_gputop("fleet", "--prometheus", t["url"], "--json", *t["auth"])
    assert r.returncode == 6 and "TLS failed" in r.stderr and "--ca-file" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_gputop("fleet", "--prometheus", t["url"], "--json", "--insecure", *t["auth"])
    assert r.returncode == 0, r.stderr


def test_a_wrong_password_is_exit_4(tls_prom):
    t = tls_prom
    if not t["basic"]:
        pytest.skip("no bcrypt in this Python's crypt module: the server runs without basic auth")
    ca = ["--ca-file", str(t["dir"] / "ca.crt")]
    r = run_gputop("fleet", "--prometheus", t["url"], "--json", *ca, "--user", "fleet",
                   "--password-file", str(t["dir"] / "badpw"))
    assert r.returncode == 4 and "refused the credentials (HTTP 401)" in r.stderr, r.stderr
    r = run_gputop("fleet", "--prometheus", t["url"], "--json", *ca)
    assert r.returncode == 4
    r = run_gputop("fleet", "--prometheus", t["url"], "--json", *ca, "--user", "fleet",
                   env={"GPUTOP_PROMETHEUS_PASSWORD": "pa55word"})
    assert r.returncode == 0, r.stderr
