"""Credentials come from configuration and never show up in logs or error messages (SPEC §2).

The Kafka SASL password and the ClickHouse password are set to distinctive
values, through the environment and through ``*_FILE`` secret files. Then the
code paths that log or raise run for real: ``load_settings`` and the reprs of
what it returns; ``channel-health worker`` at ``--loglevel debug`` against a
Kafka listener that takes the SASL/PLAIN login and rejects it (aiokafka logs
every request at DEBUG, the PLAIN login request included); the worker and
``channel-health query`` against a ClickHouse endpoint that refuses the login
(and, like a careless proxy, echoes the credentials it was sent), and against
a closed port with the password inside the URL; the router subscriber's SASL
path in-process. Every captured byte of stdout, stderr and log text is
searched for each secret, in every form it could be printed in. The fake
servers also record what they received, which proves the configured secret
(the file's, where a file is given) was the one used.

Also: ``channel-health query`` refuses anything but one read-only statement
(before it connects anywhere) and binds ``--param`` values server-side, so a
value cannot change the statement.
"""

from __future__ import annotations

import base64
import http.server
import json
import logging
import os
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TOKEN = uuid.uuid4().hex[:10]
SASL_ENV_PW = f"sasl-env-{TOKEN}-Pw!"
SASL_FILE_PW = f"sasl-file-{TOKEN}-Pw'x"
CH_ENV_PW = f"ch-env-{TOKEN}-Pw+/"
CH_FILE_PW = f"ch-file-{TOKEN}-Pw@#"
CH_URL_PW = f"ch-url-{TOKEN}-Pw:@/"
SECRETS = [SASL_ENV_PW, SASL_FILE_PW, CH_ENV_PW, CH_FILE_PW, CH_URL_PW]


def _forms(secret: str) -> set[str]:
    """Every way the secret could be printed: as is, URL-quoted, escaped in a str or bytes repr."""
    return {secret, quote(secret, safe=""), repr(secret)[1:-1], repr(secret.encode())[2:-1],
            json.dumps(secret)[1:-1]}


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        for form in _forms(secret):
            assert form not in text, f"secret {secret!r} (as {form!r}) appears in {where}:\n{text[-3000:]}"
    assert TOKEN not in text, f"part of a secret appears in {where}:\n{text[-3000:]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- fake servers ----------------------------------------------------------------------------------------------

class FakeSaslKafka(socketserver.ThreadingTCPServer):
    """Speaks just enough Kafka for a SASL/PLAIN login (ApiVersions v0, SaslHandshake v0/v1, SaslAuthenticate
    v0) and rejects every login with SASL_AUTHENTICATION_FAILED. ``logins`` holds ``(username, password)``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.logins: list[tuple[str, str]] = []
        super().__init__(("127.0.0.1", 0), _KafkaHandler)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _KafkaHandler(socketserver.BaseRequestHandler):
    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.request.recv(n - len(buf))
            if not chunk:
                raise ConnectionError
            buf += chunk
        return buf

    def _reply(self, correlation_id: int, body: bytes) -> None:
        payload = struct.pack(">i", correlation_id) + body
        self.request.sendall(struct.pack(">i", len(payload)) + payload)

    def handle(self) -> None:
        try:
            while True:
                size = struct.unpack(">i", self._read(4))[0]
                msg = self._read(size)
                api_key, _version, corr, client_len = struct.unpack(">hhih", msg[:10])
                body = msg[10 + max(client_len, 0):]
                if api_key == 18:  # ApiVersions v0
                    apis = [(18, 0, 0), (17, 0, 1), (36, 0, 0), (3, 0, 1)]
                    self._reply(corr, struct.pack(">hi", 0, len(apis)) + b"".join(struct.pack(">hhh", *a) for a in apis))
                elif api_key == 17:  # SaslHandshake: PLAIN enabled
                    self._reply(corr, struct.pack(">hih", 0, 1, 5) + b"PLAIN")
                elif api_key == 36:  # SaslAuthenticate v0: record the login, reject it
                    n = struct.unpack(">i", body[:4])[0]
                    _authzid, user, password = body[4:4 + n].split(b"\x00")
                    self.server.logins.append((user.decode(), password.decode()))
                    text = b"Authentication failed: Invalid username or password"
                    self._reply(corr, struct.pack(">hh", 58, len(text)) + text + struct.pack(">i", 0))
                    return
                else:
                    return
        except (ConnectionError, OSError, struct.error, ValueError):
            return


class FakeClickHouse(http.server.ThreadingHTTPServer):
    """Answers every request with ClickHouse's AUTHENTICATION_FAILED (516), echoing the credentials it was sent
    the way a careless proxy might. ``logins`` holds the ``(user, password)`` pairs received."""

    daemon_threads = True

    def __init__(self) -> None:
        self.logins: list[tuple[str, str]] = []
        super().__init__(("127.0.0.1", 0), _ClickHouseHandler)

    @property
    def port(self) -> int:
        return self.server_address[1]


class _ClickHouseHandler(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        auth = self.headers.get("Authorization", "")
        user, password = "", ""
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        self.server.logins.append((user, password))
        body = (f"Code: 516. DB::Exception: {user}: Authentication failed: password is incorrect, or there is no "
                f"user with such name. (AUTHENTICATION_FAILED) [proxy: credentials {user}:{password}]").encode()
        self.send_response(403)  # what ClickHouse answers for AUTHENTICATION_FAILED
        self.send_header("X-ClickHouse-Exception-Code", "516")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def _serve(server: socketserver.BaseServer) -> Iterator[socketserver.BaseServer]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def fake_kafka() -> Iterator[FakeSaslKafka]:
    yield from _serve(FakeSaslKafka())  # type: ignore[misc]


@pytest.fixture()
def fake_clickhouse() -> Iterator[FakeClickHouse]:
    yield from _serve(FakeClickHouse())  # type: ignore[misc]


@pytest.fixture()
def secret_files(tmp_path: Path) -> dict[str, Path]:
    files = {}
    for name, value in (("sasl", SASL_FILE_PW), ("clickhouse", CH_FILE_PW)):
        path = tmp_path / f"{name}.secret"
        path.write_text(value + "\n")  # a trailing newline, as editors and `echo` leave it
        path.chmod(0o600)
        files[name] = path
    return files


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
    env.update({f"CHANNEL_HEALTH_{k}": v for k, v in values.items()})
    env["PYTHONPATH"] = str(REPO)
    return env


def _cli(args: list[str], env: dict[str, str], timeout_s: float = 90.0) -> tuple[int, str, float]:
    """Run ``python -m pipeline.cli ARGS``; returns (exit code, stdout+stderr, seconds)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, env=env, capture_output=True,
                          timeout=timeout_s)
    out = proc.stdout.decode("utf-8", "replace") + "\n" + proc.stderr.decode("utf-8", "replace")
    return proc.returncode, out, time.monotonic() - t0


# -- settings --------------------------------------------------------------------------------------------------

def test_settings_read_secrets_from_env_and_files_and_never_print_them(secret_files: dict[str, Path],
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from pipeline.config import ConfigError, load_settings
    from pipeline.stream.runtime import faust_broker_kwargs

    base = {"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": "127.0.0.1:9093", "CHANNEL_HEALTH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "CHANNEL_HEALTH_KAFKA_SASL_MECHANISM": "PLAIN", "CHANNEL_HEALTH_KAFKA_SASL_USERNAME": "svc"}
    from_env = load_settings({**base, "CHANNEL_HEALTH_KAFKA_SASL_PASSWORD": SASL_ENV_PW,
                              "CHANNEL_HEALTH_CLICKHOUSE_URL": "http://analyst@ch.internal:8123/channel_health",
                              "CHANNEL_HEALTH_CLICKHOUSE_PASSWORD": CH_ENV_PW})
    from_files = load_settings({**base, "CHANNEL_HEALTH_KAFKA_SASL_PASSWORD": SASL_ENV_PW,  # the file wins
                                "CHANNEL_HEALTH_KAFKA_SASL_PASSWORD_FILE": str(secret_files["sasl"]),
                                "CHANNEL_HEALTH_CLICKHOUSE_URL": "https://analyst@ch.internal:8443/channel_health",
                                "CHANNEL_HEALTH_CLICKHOUSE_PASSWORD_FILE": str(secret_files["clickhouse"])})
    in_url = load_settings({**base, "CHANNEL_HEALTH_KAFKA_SASL_PASSWORD": SASL_ENV_PW, "CHANNEL_HEALTH_CLICKHOUSE_URL":
                            f"https://analyst:{quote(CH_URL_PW, safe='')}@ch.internal:8443/channel_health"})
    assert from_env.kafka_security.sasl_password.reveal() == SASL_ENV_PW
    assert from_env.clickhouse_password.reveal() == CH_ENV_PW
    assert from_files.kafka_security.sasl_password.reveal() == SASL_FILE_PW  # newline stripped
    assert from_files.clickhouse_password.reveal() == CH_FILE_PW
    assert from_env.kafka_security.aiokafka_kwargs()["sasl_plain_password"] == SASL_ENV_PW  # for the client only

    printed = []
    for s in (from_env, from_files, in_url):
        credentials = faust_broker_kwargs(s)["broker_credentials"]
        printed += [repr(s), str(s), f"{s}", repr(s.kafka_security), repr(s.clickhouse_password),
                    str(s.kafka_security.sasl_password), s.clickhouse_url_redacted, repr(credentials), str(credentials)]
        logging.getLogger("channel_health.test").warning("settings: %s %r", s, s)
    assert "https://analyst:***@ch.internal:8443/channel_health" in repr(in_url)
    with pytest.raises(ConfigError) as err:
        load_settings({"CHANNEL_HEALTH_KAFKA_SASL_PASSWORD_FILE": str(secret_files["sasl"].parent / "missing")})
    printed.append(str(err.value))
    assert_no_secret("\n".join(printed), "settings reprs")
    assert_no_secret(caplog.text, "log records")


def test_library_debug_logs_of_secrets_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """Once loaded, a secret is scrubbed from any log record, also from a library's and from tracebacks."""
    from pipeline.config import load_settings

    load_settings({"CHANNEL_HEALTH_KAFKA_SASL_PASSWORD": SASL_ENV_PW})
    log = logging.getLogger("aiokafka.conn")
    login = b"\x00svc\x00" + SASL_ENV_PW.encode()
    with caplog.at_level(logging.DEBUG):
        log.debug("Request to %s:%d %d: %s", "127.0.0.1", 9092, 3, f"SaslAuthenticateRequest_v0(sasl_auth_bytes={login!r})")
        try:
            raise RuntimeError(f"login failed for {SASL_ENV_PW}")
        except RuntimeError:
            log.exception("connect failed")
    assert "SaslAuthenticateRequest_v0(sasl_auth_bytes=b'\\x00svc\\x00***')" in caplog.text
    assert "login failed for ***" in caplog.text
    assert_no_secret(caplog.text, "library log records")


def test_router_subscriber_sasl_failure_logs_no_secret(fake_kafka: FakeSaslKafka,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    from pipeline.config import load_settings
    from pipeline.router import HealthSubscriber

    settings = load_settings({"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": fake_kafka.bootstrap,
                              "CHANNEL_HEALTH_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                              "CHANNEL_HEALTH_KAFKA_SASL_MECHANISM": "PLAIN",
                              "CHANNEL_HEALTH_KAFKA_SASL_USERNAME": "router",
                              "CHANNEL_HEALTH_KAFKA_SASL_PASSWORD": SASL_ENV_PW})

    async def main() -> str:
        try:
            async with HealthSubscriber(settings):
                pass
        except Exception as exc:  # noqa: BLE001 - the login must fail; keep what would be printed
            return f"{type(exc).__name__}: {exc!r} {exc}"
        raise AssertionError("login to the fake broker succeeded")

    with caplog.at_level(logging.DEBUG):
        error = asyncio.run(main())
    assert ("router", SASL_ENV_PW) in fake_kafka.logins  # the configured password was used on the wire
    assert "SaslAuthenticate" in caplog.text  # aiokafka did log the login request at DEBUG ...
    assert_no_secret(caplog.text + "\n" + error, "router subscriber logs/errors")  # ... redacted


# -- worker ----------------------------------------------------------------------------------------------------

def test_worker_rejected_sasl_login_fails_fast_without_logging_the_password(
        fake_kafka: FakeSaslKafka, secret_files: dict[str, Path], tmp_path: Path) -> None:
    env = _env(KAFKA_BOOTSTRAP=fake_kafka.bootstrap, KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
               KAFKA_SASL_MECHANISM="PLAIN", KAFKA_SASL_USERNAME="svc", KAFKA_SASL_PASSWORD=SASL_ENV_PW,
               KAFKA_SASL_PASSWORD_FILE=str(secret_files["sasl"]), CLICKHOUSE_URL=f"chdb://{tmp_path / 'chdb'}",
               CLICKHOUSE_PASSWORD=CH_ENV_PW, TOPIC_PREFIX=f"sec{TOKEN}.")
    rc, out, took = _cli(["worker", "--loglevel", "debug"], env)
    assert rc != 0, out[-3000:]
    assert took < 60, f"worker took {took:.0f} s to give up"
    assert ("svc", SASL_FILE_PW) in fake_kafka.logins, "the password from the secret file was not used"
    assert "SaslAuthenticate" in out  # the DEBUG request log is there, with the password redacted
    assert_no_secret(out, "worker output (rejected SASL login)")
    # Nothing listens at the bootstrap address.
    env["CHANNEL_HEALTH_KAFKA_BOOTSTRAP"] = f"127.0.0.1:{_free_port()}"
    rc, out, took = _cli(["worker", "--loglevel", "debug"], env)
    assert rc != 0 and took < 60, (rc, took, out[-3000:])
    assert "Unable to bootstrap" in out
    assert_no_secret(out, "worker output (unreachable Kafka)")


def test_worker_wrong_clickhouse_fails_fast_without_printing_the_password(
        fake_kafka: FakeSaslKafka, fake_clickhouse: FakeClickHouse, secret_files: dict[str, Path]) -> None:
    common = dict(KAFKA_BOOTSTRAP=fake_kafka.bootstrap, KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
                  KAFKA_SASL_USERNAME="svc", KAFKA_SASL_PASSWORD=SASL_ENV_PW)
    # Password from a secret file; the server refuses the login (and echoes the credentials).
    rc, out, took = _cli(["worker", "--loglevel", "debug"], _env(
        **common, CLICKHOUSE_URL=f"http://analyst@127.0.0.1:{fake_clickhouse.port}/channel_health",
        CLICKHOUSE_PASSWORD_FILE=str(secret_files["clickhouse"])))
    assert rc == 1 and took < 60, (rc, took, out[-3000:])
    assert ("analyst", CH_FILE_PW) in fake_clickhouse.logins
    assert f"ClickHouse: cannot connect to ClickHouse at http://analyst@127.0.0.1:{fake_clickhouse.port}" in out
    assert "Traceback" not in out
    assert_no_secret(out, "worker output (ClickHouse login refused)")
    # Password inside the URL; nothing listens on the port.
    port = _free_port()
    rc, out, took = _cli(["worker"], _env(
        **common, CLICKHOUSE_URL=f"http://analyst:{quote(CH_URL_PW, safe='')}@127.0.0.1:{port}/channel_health"))
    assert rc == 1 and took < 60, (rc, took, out[-3000:])
    assert f"http://analyst:***@127.0.0.1:{port}/channel_health" in out
    assert_no_secret(out, "worker output (ClickHouse unreachable)")


# -- channel-health query ---------------------------------------------------------------------------------------

def test_query_errors_never_print_the_password(fake_clickhouse: FakeClickHouse, secret_files: dict[str, Path]) -> None:
    outputs = []
    for extra in ({"CLICKHOUSE_PASSWORD": CH_ENV_PW}, {"CLICKHOUSE_PASSWORD_FILE": str(secret_files["clickhouse"])}):
        rc, out, _ = _cli(["query", "SELECT 1"], _env(
            CLICKHOUSE_URL=f"http://analyst@127.0.0.1:{fake_clickhouse.port}/channel_health", **extra))
        assert rc == 1 and "query failed: cannot connect to ClickHouse" in out, out[-3000:]
        outputs.append(out)
    assert ("analyst", CH_ENV_PW) in fake_clickhouse.logins and ("analyst", CH_FILE_PW) in fake_clickhouse.logins
    rc, out, _ = _cli(["query", "SELECT {x:String}", "-p", "x=1"], _env(
        CLICKHOUSE_URL=f"https://analyst:{quote(CH_URL_PW, safe='')}@127.0.0.1:{_free_port()}/channel_health"))
    assert rc == 1 and "https://analyst:***@127.0.0.1" in out, out[-3000:]
    outputs.append(out)
    rc, out, _ = _cli(["query", "SELECT 1"], _env(CLICKHOUSE_URL=f"ftp://analyst:{CH_URL_PW}@host/db"))
    assert rc == 2 and "configuration error" in out, out[-3000:]
    outputs.append(out)
    assert_no_secret("\n".join(outputs), "channel-health query output")


@pytest.mark.parametrize("raw", ["/", "#", "?", "@", "/#?@:"])
def test_unparseable_clickhouse_url_is_redacted_in_every_message(raw: str, capsys: pytest.CaptureFixture) -> None:
    """Issue #16 item 8: a raw password with ``/``, ``#``, ``?`` or ``@`` breaks URL parsing; messages stay clean."""
    from pipeline.config import load_settings
    from pipeline.redaction import redact_secrets, redact_url
    from pipeline.storage.client import open_client
    from pipeline.storage.errors import StorageConfigError, StorageConnectError

    password = f"ch-raw-{TOKEN}{raw}tail"
    url = f"http://analyst:{password}@127.0.0.1:{_free_port()}/channel_health"
    assert redact_url(url) == f"http://analyst:***@127.0.0.1:{url.rsplit(':', 1)[1]}"
    settings = load_settings({"CHANNEL_HEALTH_CLICKHOUSE_URL": url})
    shown = [repr(settings), settings.clickhouse_url_redacted, redact_secrets(f"echo {password} {quote(password, safe='')}")]
    with pytest.raises((StorageConfigError, StorageConnectError)) as err:
        open_client(settings, timeout_s=2)
    shown.append(str(err.value))
    assert "http://analyst:***@127.0.0.1" in str(err.value)
    assert_no_secret("\n".join(shown), "messages about an unparseable ClickHouse URL")


REFUSED = [
    "INSERT INTO channel_health.request_events (event_id) VALUES ('x')",
    "DROP TABLE channel_health.request_events",
    "drop database channel_health",
    "TRUNCATE TABLE channel_health.channel_verdicts",
    "ALTER TABLE channel_health.request_events DELETE WHERE 1",
    "CREATE TABLE t (x UInt8) ENGINE = Memory",
    "OPTIMIZE TABLE channel_health.request_events FINAL",
    "SYSTEM DROP MARK CACHE",
    "SET readonly = 0",
    "GRANT ALL ON *.* TO analyst",
    "SELECT 1; DROP TABLE channel_health.request_events",
    "SELECT 1;; SELECT 2",
    "/* SELECT */ DROP TABLE channel_health.request_events",
    "SELECT * FROM channel_health.request_events INTO OUTFILE '/tmp/x.csv'",
    "WITH 1 AS x INSERT INTO t SELECT x",
    "",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_query_refuses_writes_before_connecting(sql: str, monkeypatch: pytest.MonkeyPatch,
                                                fake_clickhouse: FakeClickHouse) -> None:
    from typer.testing import CliRunner

    from pipeline.cli.main import app

    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_URL", f"http://analyst@127.0.0.1:{fake_clickhouse.port}/x")
    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_PASSWORD", CH_ENV_PW)
    result = CliRunner().invoke(app, ["query", sql])
    assert result.exit_code == 2, result.output
    assert "refused:" in result.output
    assert fake_clickhouse.logins == []  # refused before any connection
    assert_no_secret(result.output, "query refusal")


_SETUP = """
import sys
from pipeline.config import Settings
from pipeline.storage.client import open_client
c = open_client(Settings(kafka_bootstrap=None, clickhouse_url=sys.argv[1]))
c.command("CREATE TABLE channel_health.secrets_probe (name String, note String) ENGINE = MergeTree ORDER BY name")
c.insert("channel_health.secrets_probe", [["alice", "keep"], ["bob", "keep"]], column_names=["name", "note"])
"""


def test_query_binds_parameters_so_values_cannot_change_the_statement(tmp_path: Path) -> None:
    pytest.importorskip("chdb")
    url = f"chdb://{tmp_path / 'chdb'}"
    setup = subprocess.run([sys.executable, "-c", _SETUP, url], cwd=REPO, env=_env(), capture_output=True,
                           timeout=120)
    assert setup.returncode == 0, setup.stderr.decode()[-3000:]
    env = _env(CLICKHOUSE_URL=url)
    injection = "x' OR '1'='1"
    sql = "SELECT count() AS n FROM channel_health.secrets_probe WHERE name = {name:String}"
    rc, out, _ = _cli(["query", sql, "-p", f"name={injection}", "--json"], env)
    assert rc == 0, out[-3000:]
    assert json.loads(out.strip().splitlines()[0]) == {"n": 0}  # the quote did not end the string
    payload = "x'); DROP TABLE channel_health.secrets_probe; --"
    rc, out, _ = _cli(["query", "SELECT {v:String} AS v, (SELECT count() FROM channel_health.secrets_probe) AS n",
                       "-p", f"v={payload}", "--json"], env)
    assert rc == 0, out[-3000:]
    assert json.loads(out.strip().splitlines()[0]) == {"v": payload, "n": 2}  # echoed as data; table intact
    rc, out, _ = _cli(["query", sql, "-p", "name=alice", "--json"], env)
    assert rc == 0 and json.loads(out.strip().splitlines()[0]) == {"n": 1}, out[-3000:]
    rc, out, _ = _cli(["query", "SELECT 1 -- ; DROP TABLE channel_health.secrets_probe\n", "--json"], env)
    assert rc == 0, out[-3000:]  # the DROP is inside a comment: one statement
    rc, out, _ = _cli(["query", "SELECT count() AS n FROM channel_health.secrets_probe", "--json"], env)
    assert rc == 0 and json.loads(out.strip().splitlines()[0]) == {"n": 2}, out[-3000:]
    rc, out, _ = _cli(["query", sql, "--json"], env)  # a placeholder without a value is not run
    assert rc == 1 and "placeholders without a value" in out, out[-3000:]
