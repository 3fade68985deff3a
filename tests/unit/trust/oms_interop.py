"""The real ``model_signing`` package, for the interop tests.

``model_signing`` 1.1.1 imports ``OpenSSL`` (pyOpenSSL) at import time for its certificate
signer only; pyOpenSSL is not installed here, so a stand-in module is registered before the
import when the real one is missing. The key signer and verifier the tests use never touch it:
every signature and every check is the real package's code.
"""

from __future__ import annotations

import sys
import types


def import_model_signing():
    try:
        import OpenSSL  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("OpenSSL")
        stand_in.crypto = None
        sys.modules.setdefault("OpenSSL", stand_in)
    import model_signing

    return model_signing
