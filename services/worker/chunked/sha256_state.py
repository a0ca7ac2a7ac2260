"""A SHA-256 whose state can be saved and taken up again, so that a coordinator that takes over an assembly
hashes only the bytes after the last recorded part (docs/chunks.md: Chunked exports, A coordinator's takeover).

``hashlib`` cannot export a hash's state, nor can OpenSSL 3's EVP interface. OpenSSL's ``SHA256_Init``,
``SHA256_Update`` and ``SHA256_Final`` can: their context, ``SHA256_CTX`` in ``openssl/sha.h``, is a public
structure of eight chaining words, the bit count and the pending block, owned here, so its bytes are the state.
OpenSSL 3 deprecates these functions but every build that keeps its deprecated API (Debian's, the image's)
exports them from the libcrypto that Python's own ``hashlib`` uses, with the same code and speed.
"""

from __future__ import annotations

import ctypes
import ctypes.util


class _Sha256Context(ctypes.Structure):
    """``SHA256_CTX``: ``h[8]``, ``Nl``, ``Nh``, ``data[16]`` (32-bit words), ``num``, ``md_len``."""

    _fields_ = (
        ("h", ctypes.c_uint32 * 8),
        ("nl", ctypes.c_uint32),
        ("nh", ctypes.c_uint32),
        ("data", ctypes.c_uint32 * 16),
        ("num", ctypes.c_uint),
        ("md_len", ctypes.c_uint),
    )


# The bytes of a saved state: the structure as this machine lays it out (one ABI for every worker of a fleet).
STATE_BYTES = ctypes.sizeof(_Sha256Context)


def _libcrypto() -> ctypes.CDLL:
    library = ctypes.CDLL(ctypes.util.find_library("crypto") or "libcrypto.so.3")
    library.SHA256_Init.argtypes = (ctypes.POINTER(_Sha256Context),)
    library.SHA256_Update.argtypes = (ctypes.POINTER(_Sha256Context), ctypes.c_char_p, ctypes.c_size_t)
    library.SHA256_Final.argtypes = (ctypes.c_char_p, ctypes.POINTER(_Sha256Context))
    return library


_LIBCRYPTO = _libcrypto()


class ResumableSha256:
    """SHA-256 of the bytes given to ``update``, from the empty string or from a ``state`` that ``state()``
    returned (``STATE_BYTES`` bytes); raises ``ValueError`` for a state of another length.
    """

    def __init__(self, state: bytes | None = None) -> None:
        if state is None:
            self._context = _Sha256Context()
            _LIBCRYPTO.SHA256_Init(ctypes.byref(self._context))
        elif len(state) != STATE_BYTES:
            raise ValueError(f"a SHA-256 state is {STATE_BYTES} bytes, not {len(state)}")
        else:
            self._context = _Sha256Context.from_buffer_copy(state)

    def update(self, data: bytes) -> None:
        """Hash ``data`` after everything before it."""
        _LIBCRYPTO.SHA256_Update(ctypes.byref(self._context), data, len(data))

    def state(self) -> bytes:
        """The state now, to build a ``ResumableSha256`` that goes on from here."""
        return bytes(self._context)

    def hexdigest(self) -> str:
        """The digest of everything hashed so far, as hex; the hash can go on after it."""
        final = _Sha256Context.from_buffer_copy(self._context)
        digest = ctypes.create_string_buffer(32)
        _LIBCRYPTO.SHA256_Final(digest, ctypes.byref(final))
        return digest.raw.hex()
