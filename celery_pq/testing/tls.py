"""A redis-server that speaks only TLS, and the certificates it needs (made with ``openssl``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .server import RedisServer


def make_certificates(directory: Path, *, name: str = "pq test CA") -> dict[str, Path]:
    """A self-signed CA and a server certificate for 127.0.0.1 and localhost, made by ``openssl``
    in ``directory``: ``{"ca", "cert", "key"}`` paths. Another directory gives an unrelated CA."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl not found: it makes the test certificates (apt-get install openssl)")
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    cert, key, csr = directory / "server.crt", directory / "server.key", directory / "server.csr"
    ext = directory / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    by_ca = ["-CA", ca, "-CAkey", ca_key, "-CAcreateserial"]
    for args in (
        ["req", "-x509", *curve, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", f"/CN={name}"],
        ["req", "-new", *curve, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"],
        ["x509", "-req", "-in", csr, *by_ca, "-out", cert, "-days", "2", "-extfile", ext],
    ):
        done = subprocess.run([openssl, *map(str, args)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")
    return {"ca": ca, "cert": cert, "key": key}


class TLSRedisServer(RedisServer):
    """A redis-server that speaks only TLS, with the certificates of ``certs`` (``make_certificates``)."""

    certs: dict

    def __init__(self, certs: dict, *args: str, **kwargs):
        self.certs = certs
        super().__init__(*args, **kwargs)
