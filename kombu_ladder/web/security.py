"""The console's safety rules: who may bind where, credentials, CSRF tokens (pure: no I/O)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass
from typing import Optional

__all__ = [
    "Auth", "MIN_SECRET", "is_loopback", "check_bind", "check_secret", "authorized", "challenge", "new_key",
    "new_session", "csrf_token", "csrf_ok", "same_origin",
]

#: The shortest password or token the console accepts (characters): a guessable secret on an open port is none.
MIN_SECRET = 16

E_EXPOSED = ("--host {host} is not a loopback address: the console would be open to the network without "
             "credentials. Give --password-file (HTTP basic) or --token-file (bearer token), or bind 127.0.0.1")
E_SHORT = "{option}: the secret must be at least {n} characters (it has {length})"
E_USER = "--user: {user!r} cannot contain ':' (HTTP basic separates the user from the password with it)"


@dataclass(frozen=True)
class Auth:
    """The credentials a request must present: HTTP basic (``user`` and ``password``), a bearer ``token``, or
    both (either is accepted). No field set: no authentication (loopback only)."""

    user: str = "admin"
    password: Optional[str] = None
    token: Optional[str] = None

    @property
    def required(self) -> bool:
        """Whether requests must authenticate."""
        return self.password is not None or self.token is not None

    def __repr__(self) -> str:  # never print a secret
        return f"Auth(user={self.user!r}, password={'***' if self.password else None}, " \
               f"token={'***' if self.token else None})"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only ever reaches this machine."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve to anything


def check_secret(secret: Optional[str], *, option: str) -> Optional[str]:
    """``secret`` without the newline a file ends with, refused when too short.

    Raises:
        ValueError: shorter than :data:`MIN_SECRET`, naming ``option``.
    """
    if secret is None:
        return None
    secret = secret.strip("\r\n")
    if len(secret) < MIN_SECRET:
        raise ValueError(E_SHORT.format(option=option, n=MIN_SECRET, length=len(secret)))
    return secret


def check_bind(host: str, auth: Auth) -> None:
    """Refuse to serve a non-loopback ``host`` without credentials.

    Raises:
        ValueError: naming ``--host`` and the options that fix it, or ``--user``.
    """
    if ":" in auth.user:
        raise ValueError(E_USER.format(user=auth.user))
    if not is_loopback(host) and not auth.required:
        raise ValueError(E_EXPOSED.format(host=host))


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def authorized(auth: Auth, header: Optional[str]) -> bool:
    """Whether an ``Authorization`` header value satisfies ``auth`` (always, when it requires nothing)."""
    if not auth.required:
        return True
    if not header:
        return False
    scheme, _, value = header.strip().partition(" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme == "bearer" and auth.token is not None:
        return _same(value, auth.token)
    if scheme == "basic" and auth.password is not None:
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, colon, password = decoded.partition(":")
        return bool(colon) and _same(user, auth.user) & _same(password, auth.password)
    return False


def challenge(auth: Auth) -> str:
    """The ``WWW-Authenticate`` value of a 401 for ``auth``."""
    return 'Basic realm="ladder", charset="UTF-8"' if auth.password is not None else 'Bearer realm="ladder"'


def new_key() -> bytes:
    """A key for CSRF tokens (one per console process)."""
    return secrets.token_bytes(32)


def new_session() -> str:
    """A browser session's random id (the cookie the CSRF token is bound to)."""
    return secrets.token_urlsafe(24)


def csrf_token(key: bytes, session: str) -> str:
    """The CSRF token of ``session``: forms carry it, and only a page the console served can know it."""
    return hmac.new(key, b"csrf:" + session.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def csrf_ok(key: bytes, session: Optional[str], submitted: Optional[str]) -> bool:
    """Whether ``submitted`` is the CSRF token of ``session`` (both present)."""
    if not session or not submitted:
        return False
    return _same(submitted, csrf_token(key, session))


def same_origin(origin: Optional[str], host: Optional[str]) -> bool:
    """Whether a request's ``Origin`` header (absent: not sent, accepted) names the host it was sent to."""
    if origin is None:
        return True
    if not host or origin == "null":
        return False
    return origin.split("://", 1)[-1].rstrip("/").lower() == host.lower()
