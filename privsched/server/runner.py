"""Serving the HTTP API on uvicorn, in a thread beside the scheduler of the same process.

Plain HTTP is allowed on loopback addresses only: a bearer token sent in clear over a
network can be read by anyone on the path. Any other address needs ``--tls-cert`` and
``--tls-key``, or an explicit ``insecure=True`` from the operator.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

#: Where ``privsched serve`` listens unless told otherwise.
DEFAULT_LISTEN = "127.0.0.1:8470"


@dataclass(frozen=True)
class Listen:
    host: str
    port: int
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls_cert else 'http'}://{host}:{self.port}"


def parse_listen(text: str, tls_cert: str | None = None, tls_key: str | None = None, insecure: bool = False) -> Listen:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) checked against the TLS rule above;
    ``ValueError`` with one line otherwise."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen must be HOST:PORT, got {text!r}")
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    for path in filter(None, (tls_cert, tls_key)):
        if not os.path.isfile(path):
            raise ValueError(f"no TLS file at {path}")
    if tls_cert is None and not insecure and not is_loopback(host):
        raise ValueError(f"listening on {host} needs TLS (--tls-cert/--tls-key); pass --insecure to send tokens in clear on purpose")
    return Listen(host, int(port), tls_cert, tls_key)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_for_options(
    db: str | os.PathLike,
    listen: str | None,
    until_idle: bool,
    tls_cert: str | None,
    tls_key: str | None,
    insecure: bool,
    log: Callable[[str], None] | None,
    policy: Any = None,
) -> AbstractContextManager[Listen | None]:
    """What ``privsched serve``'s options ask for: the API on ``listen`` (by default on
    :data:`DEFAULT_LISTEN`, except for a batch ``--until-idle`` run), or nothing for 'none'.
    An address in use (by a scheduler this one takes over from, paused or ending) is bound
    as soon as it is free."""
    text = listen if listen is not None else ("none" if until_idle else DEFAULT_LISTEN)
    if text == "none":
        return nullcontext()
    address = parse_listen(text, tls_cert, tls_key, insecure)
    if listen is None:  # the default address: a scheduler still runs if it cannot be bound
        return _default_api(db, address, log, policy)
    return http_api(db, address, log, policy, wait_for_port=True)


@contextmanager
def _default_api(db: str | os.PathLike, listen: Listen, log: Callable[[str], None] | None, policy: Any) -> Iterator[Listen | None]:
    try:
        api = http_api(db, listen, log, policy, wait_for_port=True)
        bound = api.__enter__()
    except ValueError as exc:
        print(f"warning: no HTTP API: {exc}; pass --listen HOST:PORT for another address", file=sys.stderr)
        yield None
        return
    try:
        yield bound
    finally:
        api.__exit__(None, None, None)


class PortInUse(ValueError):
    """The address is bound by another process (for now)."""


def _probe(listen: Listen) -> None:
    """Raise :class:`PortInUse` while another process listens on ``listen``, ``ValueError``
    when it is no address of this host."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((listen.host, listen.port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(f"{listen.host}:{listen.port} is in use") from None
        if not isinstance(exc, socket.gaierror):
            raise ValueError(f"cannot listen on {listen.host}:{listen.port} ({exc.strerror})") from None


@contextmanager
def http_api(
    db: str | os.PathLike,
    listen: Listen,
    log: Callable[[str], None] | None = None,
    policy: Any = None,
    header_timeout: float | None = None,
    wait_for_port: bool = False,
) -> Iterator[Listen]:
    """Serve the API of database ``db`` while the block runs; yields the address bound
    (port 0 picks a free one). A port in use raises ``ValueError``, or with
    ``wait_for_port`` is bound once it is free (polled every half second; the address asked
    for is yielded at once). The open-file limit is raised to its hard limit first, and
    clients are held to :mod:`privsched.server.limits`."""
    servers: list[Any] = []
    done = threading.Event()
    waiter = None
    try:
        bound = _start(db, listen, log, policy, header_timeout, servers)
    except PortInUse as exc:
        if not wait_for_port:
            raise
        print(f"warning: {exc}: the HTTP API starts there once it is free", file=sys.stderr)
        bound = listen

        def bind_when_free() -> None:
            while not done.wait(0.5):
                try:
                    _start(db, listen, log, policy, header_timeout, servers)
                    return
                except PortInUse:
                    continue
                except ValueError as failed:
                    print(f"warning: no HTTP API: {failed}", file=sys.stderr)
                    return

        waiter = threading.Thread(target=bind_when_free, name="privsched-http-wait", daemon=True)
        waiter.start()
    try:
        yield bound
    finally:
        done.set()
        if waiter is not None:
            waiter.join(timeout=10)
        for server, thread in servers:
            server.should_exit = True
            thread.join(timeout=10)


def _start(
    db: str | os.PathLike, listen: Listen, log: Callable[[str], None] | None, policy: Any, header_timeout: float | None, servers: list[Any]
) -> Listen:
    """Start serving on ``listen`` in a thread (added to ``servers``); the address bound."""
    import uvicorn

    from privsched.server.app import create_app
    from privsched.server.limits import (
        HEADER_TIMEOUT,
        KEEP_ALIVE,
        connection_cap,
        guarded_protocol,
        open_descriptors,
        raise_open_file_limit,
    )

    if listen.port:
        _probe(listen)
    cap = connection_cap(raise_open_file_limit(), open_descriptors())
    config = uvicorn.Config(
        create_app(db, policy),
        host=listen.host,
        port=listen.port,
        ssl_certfile=listen.tls_cert,
        ssl_keyfile=listen.tls_key,
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # no X-Forwarded-* rewriting: the API reads no client address, and trusts no proxy
        lifespan="on",
        http=guarded_protocol(cap, HEADER_TIMEOUT if header_timeout is None else header_timeout),
        loop="uvloop",
        limit_concurrency=cap + 1,  # uvicorn answers 503 from this many connections (or tasks) on
        timeout_keep_alive=KEEP_ALIVE,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="privsched-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise ValueError(f"cannot listen on {listen.host}:{listen.port} (in use, or not an address of this host)")
        time.sleep(0.01)
    servers.append((server, thread))
    port = server.servers[0].sockets[0].getsockname()[1]
    bound = Listen(listen.host, port, listen.tls_cert, listen.tls_key)
    if log is not None:
        log(f"HTTP API on {bound.url} (OpenAPI schema: {bound.url}/openapi.json)")
    return bound
