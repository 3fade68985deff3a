"""The real ``model_signing`` package, for the interop tests (pyOpenSSL, which it imports when it
loads, is a dev dependency beside it)."""

from __future__ import annotations


def import_model_signing():
    import model_signing

    return model_signing
