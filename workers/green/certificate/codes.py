"""The verification code: HMAC-SHA256 over a report's canonical JSON (all but its ``verification`` block),
keyed with a key derived from the control plane's secret; the first 20 base32 characters of the digest, in
groups of four, are the code a person reads."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Any

from workers.green.certificate.canonical import canonical_json

CODE_CHARS = 20
"""Characters of the base32 HMAC digest in the human code (100 bits), printed in groups of four."""
VERIFY_PATH = "/api/public/certificates/{code}/verify"
ALGORITHM = "HMAC-SHA256"
_KEY_CONTEXT = b"cann-train/green/energy-and-carbon-report/v1"
"""Domain separation: the HMAC key is HMAC-SHA256(secret, this), so the control plane's SECRET_KEY can be
passed as is without a report's digest being usable as any other signature made with that secret."""
MIN_SECRET_BYTES = 16
_CODE_RE = re.compile(rf"^[A-Z2-7]{{{CODE_CHARS}}}$")


def check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes | bytearray):
        raise ValueError(
            "secret must be bytes: pass the control plane's secret key encoded (settings.SECRET_KEY.encode())"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"secret must be at least {MIN_SECRET_BYTES} bytes (got {len(secret)}): use the control plane's "
            "SECRET_KEY, not a short password"
        )
    return bytes(secret)


_PRINTED_CONTEXT = b"cann-train/green/energy-and-carbon-report/printed-text/v1"
"""The key of :func:`text_digest`'s HMAC, apart from the document's (:data:`_KEY_CONTEXT`)."""


def _key(secret: bytes, context: bytes = _KEY_CONTEXT) -> bytes:
    return hmac.new(secret, context, hashlib.sha256).digest()


def hmac_digest(content: Mapping[str, Any], secret: bytes) -> str:
    return hmac.new(_key(secret), canonical_json(content).encode("ascii"), hashlib.sha256).hexdigest()


def text_digest(text: str, secret: bytes) -> str:
    """HMAC-SHA256 (hex) of a report's printed text under ``secret``, with a key of its own (domain separated
    from the document's code, as :data:`_KEY_CONTEXT` says why)."""
    key = _key(check_secret(secret), _PRINTED_CONTEXT)
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def code_of(digest_hex: str) -> str:
    """The human code of a hex digest: the first 20 base32 characters, ``XXXX-XXXX-XXXX-XXXX-XXXX``."""
    raw = base64.b32encode(bytes.fromhex(digest_hex)).decode("ascii")[:CODE_CHARS]
    return "-".join(raw[i : i + 4] for i in range(0, CODE_CHARS, 4))


def normalise_code(text: str) -> str:
    """A code as a person may type it (any case, spaces or dashes anywhere) in its printed form; raises
    ``ValueError`` with what is wrong."""
    if not isinstance(text, str):
        raise ValueError("a verification code is text such as ABCD-EFGH-IJKL-MNOP-QRST")
    raw = re.sub(r"[\s-]", "", text).upper()
    if not _CODE_RE.match(raw):
        raise ValueError(
            f"{text!r} is not a verification code: it has {CODE_CHARS} letters A-Z and digits 2-7, "
            "in groups of four (e.g. ABCD-EFGH-IJKL-MNOP-QRST)"
        )
    return "-".join(raw[i : i + 4] for i in range(0, CODE_CHARS, 4))


def signed_content(document: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "verification"}
