"""``gradient-doctor serve``: run the MCP server over stdio (default) or streamable HTTP.

HTTP binds to loopback by default, where the SDK checks Host and Origin headers against
DNS rebinding. Binding any other address needs ``--allow-remote`` and a bearer token (from
``--token-file`` or the environment variable named by ``--token-env``), checked by the SDK's
bearer-auth middleware through :class:`StaticTokenVerifier`.
"""

from __future__ import annotations

import argparse
import atexit
import hmac
import logging
import os
import sys
from pathlib import Path
from typing import Any

from gradient_doctor.skill_server.cli import EXIT_OK, UsageError

NAME = "serve"
HELP = "Run the MCP server (stdio by default, or streamable HTTP with --http)."

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
DEFAULT_TOKEN_ENV = "GRADIENT_DOCTOR_TOKEN"
MIN_TOKEN_CHARS = 16
#: Test hook: when set, the server writes the names of its imported modules there at exit,
#: so a test can check what the process loaded (torch must never be among them).
MODULES_REPORT_ENV = "GRADIENT_DOCTOR_MODULES_REPORT"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` options."""
    parser.add_argument(
        "--http", action="store_true", help="serve streamable HTTP instead of stdio"
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    parser.add_argument(
        "--root",
        action="append",
        default=None,
        metavar="DIR",
        help="directory the tools may read (repeatable; default: the working directory)",
    )
    parser.add_argument(
        "--no-exec", action="store_true", help="never run scripts (probe tools refuse)"
    )
    parser.add_argument(
        "--max-probes",
        type=int,
        default=None,
        help="concurrent probes per device kind (default 1 per GPU, 2 on CPU)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a non-loopback --host (requires a bearer token)",
    )
    parser.add_argument("--token-file", type=Path, default=None, help="file holding the token")
    parser.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        help=f"environment variable holding the token (default {DEFAULT_TOKEN_ENV})",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        metavar="HOST[:PORT]",
        help="Host header accepted on a non-loopback bind (repeatable; enables the check)",
    )
    parser.add_argument(
        "--python",
        metavar="PATH",
        default=None,
        help="interpreter for probed scripts (default: per script, the project's .venv/venv "
        "from the script's folder up to its root, then $VIRTUAL_ENV, $CONDA_PREFIX, "
        "gradient-doctor's own)",
    )
    parser.add_argument(
        "--max-memory",
        metavar="SIZE",
        default=None,
        help="cap each probed script's address space, e.g. 8G (status out-of-memory when hit)",
    )
    parser.add_argument("--log-level", default="WARNING", help="stderr log level")


class StaticTokenVerifier:
    """Accepts exactly one bearer token (compared in constant time)."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def verify_token(self, token: str):  # type: ignore[no-untyped-def]
        """An access record for the configured token; None for any other."""
        from mcp.server.auth.provider import AccessToken

        if hmac.compare_digest(token.encode(), self._token.encode()):
            return AccessToken(token=token, client_id="gradient-doctor-user", scopes=[])
        return None


def _read_token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file: {exc.strerror or exc}") from None
    else:
        token = os.environ.get(args.token_env, "").strip()
    if not token:
        return None
    if len(token) < MIN_TOKEN_CHARS:
        raise UsageError(f"the bearer token must be at least {MIN_TOKEN_CHARS} characters")
    return token


def _report_modules_at_exit() -> None:
    target = os.environ.get(MODULES_REPORT_ENV)
    if not target:
        return

    def write() -> None:
        Path(target).write_text("\n".join(sorted(sys.modules)) + "\n", encoding="utf-8")

    atexit.register(write)


def _secret_variables(args: argparse.Namespace, token: str | None) -> list[str]:
    """Environment variables a probed script must not see: the token's, wherever it came from."""
    names = {DEFAULT_TOKEN_ENV, args.token_env}
    if token:
        names |= {name for name, value in os.environ.items() if token in value}
    return sorted(names)


def loopback_security(port: int) -> Any:
    """Host/Origin checks for a loopback bind: the SDK's own, plus a Host header without a port.

    Clients and proxies that talk to the default port may send ``Host: 127.0.0.1``; a
    DNS-rebinding page cannot, because its Host header names the attacker's domain.
    """
    from mcp.server.transport_security import TransportSecuritySettings

    names = ("127.0.0.1", "localhost", "[::1]")
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[*names, *(f"{n}:{port}" for n in names)],
        allowed_origins=[f"http://{n}" for n in names] + [f"http://{n}:*" for n in names],
    )


def run(args: argparse.Namespace) -> int:
    """Start the server and serve until the client disconnects (stdio) or Ctrl-C (HTTP)."""
    from gradient_doctor.skill_server.safety import InputError, parse_memory_size

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    if not 1 <= args.port <= 65535:
        raise UsageError("--port must be between 1 and 65535")
    if args.max_probes is not None and args.max_probes < 1:
        raise UsageError("--max-probes must be at least 1")
    remote = args.http and args.host not in LOOPBACK_HOSTS
    try:
        max_memory = parse_memory_size(args.max_memory) if args.max_memory else None
    except InputError as exc:
        raise UsageError(f"--max-memory: {exc}") from None
    python = None
    if args.python is not None:
        from gradient_doctor.probes.runtime.interpreter import InterpreterError, from_option

        try:
            python = from_option(args.python).path
        except InterpreterError as exc:
            raise UsageError(str(exc)) from None
    token = _read_token(args) if args.http else None
    if remote and not args.allow_remote:
        raise UsageError(
            f"--host {args.host} is not loopback; pass --allow-remote and a bearer token "
            f"(--token-file or ${args.token_env})"
        )
    if remote and token is None:
        raise UsageError(
            f"a non-loopback bind needs a bearer token: --token-file or ${args.token_env}"
        )

    from gradient_doctor.skill_server.safety import PathPolicy

    try:
        PathPolicy.from_roots(args.root)  # a bad --root fails before any answer goes out
    except InputError as exc:
        raise UsageError(str(exc)) from None

    def build() -> Any:
        from gradient_doctor.skill_server.server import build_server

        verifier = auth = None
        if token is not None:
            from mcp.server.auth.settings import AuthSettings
            from pydantic import AnyHttpUrl

            verifier = StaticTokenVerifier(token)
            auth = AuthSettings(
                issuer_url=AnyHttpUrl(f"http://{_url_host(args.host)}:{args.port}"),
                resource_server_url=None,
            )
        return build_server(
            args.root,
            allow_exec=not args.no_exec,
            max_probes=args.max_probes,
            token_verifier=verifier,
            auth=auth,
            python=python,
            max_memory=max_memory,
            scrub_env=_secret_variables(args, token),
        )

    _report_modules_at_exit()
    if not args.http:
        if sys.platform == "win32":  # the early initialize answer needs POSIX descriptors
            build().run()
            return EXIT_OK
        from gradient_doctor.skill_server.stdio import serve_stdio

        serve_stdio(build)
        return EXIT_OK
    server = build()
    security = None if remote else loopback_security(args.port)
    if remote and args.allowed_host:
        from mcp.server.transport_security import TransportSecuritySettings

        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[h if ":" in h else f"{h}:*" for h in args.allowed_host],
            allowed_origins=[f"http://{h}" for h in args.allowed_host]
            + [f"https://{h}" for h in args.allowed_host],
        )
    print(
        f"gradient-doctor: serving MCP on http://{_url_host(args.host)}:{args.port}/mcp",
        file=sys.stderr,
        flush=True,
    )
    server.run(
        "streamable-http",
        host=args.host,
        port=args.port,
        transport_security=security,
    )
    return EXIT_OK


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
