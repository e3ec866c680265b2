"""Pure SCRAM credential math (RFC 5802 section 3, RFC 7677) and Kafka's bounds on it: the one
place the gateway's SASL exchange, the controller and the CLI take them from.

A SCRAM credential is stored as (salt, iterations, StoredKey, ServerKey), never a password:

    SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)   (RFC 5802's Hi())
    StoredKey      = H(HMAC(SaltedPassword, "Client Key"))
    ServerKey      = HMAC(SaltedPassword, "Server Key")

Kafka's AlterUserScramCredentials (KIP-554) carries the salt, the iterations and the
*SaltedPassword*: the client salts, so the password never leaves it, and the controller derives
the keys with :func:`scram_keys`. Kafka takes the password's UTF-8 bytes as they are (no
SASLprep), and so do its clients: so does :func:`salted_password`.
"""

from __future__ import annotations

import hashlib
import hmac

SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"
SCRAM_HASHES = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}  # mechanism -> hashlib name
# Kafka's bounds for SCRAM iterations (ScramMechanism.minIterations, ScramControlManager's
# MAX_ITERATIONS).
ITERATIONS_MIN = 4096
ITERATIONS_MAX = 16384
USER_NAME_CHARS_MAX = 255


def valid_user_name(name: str) -> bool:
    """Whether ``name`` can be a SCRAM user: 1..USER_NAME_CHARS_MAX characters, none of them
    a control character."""
    return 0 < len(name) <= USER_NAME_CHARS_MAX and all(ord(c) >= 0x20 for c in name)


def hash_name(mechanism: str) -> str | None:
    """The hashlib name of a SCRAM mechanism; None for any other mechanism."""
    return SCRAM_HASHES.get(mechanism)


def digest_size(mechanism: str) -> int:
    """The length of a SaltedPassword, StoredKey and ServerKey of ``mechanism`` (a SCRAM one)."""
    return hashlib.new(SCRAM_HASHES[mechanism]).digest_size


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's SaltedPassword := Hi(password, salt, iterations), for a SCRAM ``mechanism``."""
    return hashlib.pbkdf2_hmac(SCRAM_HASHES[mechanism], password.encode(), salt, iterations)


def scram_keys(mechanism: str, salted: bytes) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) of a SaltedPassword, for a SCRAM ``mechanism``."""
    name = SCRAM_HASHES[mechanism]
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    return stored_key, hmac.new(salted, b"Server Key", name).digest()
