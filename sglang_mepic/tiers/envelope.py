"""A stored chunk entry: the envelope around its KV, and the settings it is tied to.

An entry is magic, settings fingerprint, SHA-256 and length of the payload, and an
HMAC-SHA256 of header and payload under `--mepic-storage-secret` (zeros without
one), then the KV. `open_envelope` refuses an entry that must not be loaded
(CorruptEntry; ForeignEntry when it does not claim our settings). The settings
fingerprint covers every setting that shapes an entry's bytes (SETTINGS); storage
keys carry it and the secret's id (storage.py), so instances with other settings
or secrets use other keys.
"""

import hashlib
import hmac
import json
import struct

import torch

MAGIC = b"MEPICKV2"
# magic, settings fingerprint, sha256 of payload, payload bytes, HMAC-SHA256 of header (this field zeroed) + payload
_HEADER = struct.Struct("<8s32s32sQ32s")
_NO_MAC = bytes(32)

# Every setting that shapes the bytes of a stored chunk.
SETTINGS = ("model", "mode", "canonical_from", "compile_sink", "placement", "page_size", "kv_dtype",
            "tp_rank", "tp_size")


def settings_fingerprint(**settings) -> str:
    """32 hex digits naming the settings an entry's bytes depend on (SETTINGS, every one required)."""
    missing = [k for k in SETTINGS if k not in settings]
    unknown = [k for k in settings if k not in SETTINGS]
    if missing or unknown:
        raise TypeError(f"settings_fingerprint: missing {missing}, unknown {unknown}")
    text = json.dumps({k: str(settings[k]) for k in SETTINGS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def secret_id(secret: bytes | None) -> str:
    """What storage keys carry of the secret: instances with other secrets use other keys."""
    return hmac.new(secret, b"mepic storage key", hashlib.sha256).hexdigest()[:16] if secret else ""


class CorruptEntry(ValueError):
    """A stored entry that must not be loaded."""


class ForeignEntry(CorruptEntry):
    """An entry that does not claim our settings (another format or configuration): left alone."""


def _mac(secret: bytes, header: bytes, payload: torch.Tensor) -> bytes:
    m = hmac.new(secret, header, hashlib.sha256)
    m.update(payload.numpy().tobytes())
    return m.digest()


def envelope(kv: torch.Tensor, fingerprint: str, secret: bytes | None = None) -> torch.Tensor:
    payload = kv.contiguous().view(torch.uint8).reshape(-1)
    digest = hashlib.sha256(payload.numpy().tobytes()).digest()
    fields = (MAGIC, fingerprint.encode()[:32].ljust(32, b"\0"), digest, payload.numel())
    mac = _mac(secret, _HEADER.pack(*fields, _NO_MAC), payload) if secret else _NO_MAC
    header = _HEADER.pack(*fields, mac)
    return torch.cat([torch.frombuffer(bytearray(header), dtype=torch.uint8), payload])


def envelope_bytes(like: torch.Tensor) -> int:
    return _HEADER.size + like.numel() * like.element_size()


def open_envelope(data: torch.Tensor, fingerprint: str, like: torch.Tensor,
                  secret: bytes | None = None) -> torch.Tensor:
    """The KV in `data`, shaped as `like`; raises CorruptEntry when it must not be loaded
    (ForeignEntry when it does not claim our settings)."""
    if data.numel() < _HEADER.size:
        raise ForeignEntry("shorter than its header")
    magic, fp, digest, size, mac = _HEADER.unpack(data[:_HEADER.size].numpy().tobytes())
    if magic != MAGIC:
        raise ForeignEntry("not a MEPIC chunk entry of this format")
    written_for = fp.rstrip(b"\0")
    if written_for != fingerprint.encode()[:32]:
        raise ForeignEntry(f"written for other settings or another model (fingerprint "
                           f"{written_for.decode(errors='replace')})")
    payload = data[_HEADER.size:]
    if size != payload.numel() or size != like.numel() * like.element_size():
        raise CorruptEntry(f"payload of {size} bytes, expected {like.numel() * like.element_size()}")
    if secret is not None:
        header = _HEADER.pack(magic, fp, digest, size, _NO_MAC)
        if not hmac.compare_digest(mac, _mac(secret, header, payload)):
            raise CorruptEntry("authentication failed (HMAC mismatch: not written with this --mepic-storage-secret)")
    if hashlib.sha256(payload.numpy().tobytes()).digest() != digest:
        raise CorruptEntry("checksum mismatch")
    return payload.view(like.dtype).reshape(like.shape)
