"""Errors of the store and what it holds: names, objects, manifests and refs as read, small documents."""

from __future__ import annotations

from concord.errors.base import ConcordError

__all__ = [
    "ChunkArchivedError",
    "ChunkNotFoundError",
    "DocumentError",
    "IntegrityError",
    "InvalidNameError",
    "InvalidStoreURIError",
    "ManifestError",
    "ManifestNotFoundError",
    "NotRegularFileError",
    "RefConflictError",
    "RefFormatError",
    "RefNotFoundError",
    "ReservedNameError",
    "StoreAccessError",
    "StoreError",
    "StoreNotFoundError",
    "StoreUnreachableError",
]


class InvalidNameError(ConcordError, ValueError):
    """A ref, namespace or tenant name is not allowed."""

    def __init__(self, name: str, what: str = "ref name") -> None:
        self.name = name
        super().__init__(
            f"invalid {what} {name!r}: use 'namespace/name' or 'name', each part made of "
            "letters, digits, '.', '_' or '-', not starting with '.', at most 128 characters."
        )


class ManifestError(ConcordError, ValueError):
    """A manifest is malformed or does not hash to the root it claims."""

    exit_code = 15

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(
            f"manifest {where}: {problem}. The manifest is damaged: restore it from another "
            "store with `concord sync`, or take the snapshot again."
        )


class RefFormatError(ManifestError):
    """A ref file cannot be read as a ref (not JSON, too large or deep, a field of the wrong type)."""

    def __init__(self, ref: str, problem: str, store: str = "") -> None:
        self.where = f"ref {ref}" + (f" in {store}" if store else "")
        self.ref = ref
        self.store = store
        self.problem = problem
        ConcordError.__init__(
            self,
            f"{self.where} is unreadable: {problem}. Remove it or copy the ref back from another store "
            f"(`concord sync OTHER_STORE {store or 'STORE'} --ref {ref}`).",
        )


class StoreError(ConcordError):
    """Something went wrong inside a store."""


class InvalidStoreURIError(StoreError, ValueError):
    """``spec`` names no store. ``reason`` says why; ``part`` says which part of an
    ``s3://bucket/prefix`` is wrong: ``"address"`` (its form), ``"bucket"`` or ``"prefix"``."""

    def __init__(self, spec: str, reason: str, *, part: str | None = None) -> None:
        self.spec = spec
        self.reason = reason
        self.part = part
        super().__init__(
            f"cannot use {spec!r} as a store: {reason}. A store is a folder path, "
            "file:///path, s3://bucket/prefix, or block:NAME (a saved Prefect block)."
        )


class StoreUnreachableError(StoreError, ConnectionError):
    """The store's endpoint did not answer (network, DNS, refused connection)."""

    exit_code = 14

    def __init__(self, store: str, cause: str) -> None:
        self.store = store
        super().__init__(
            f"store {store} is unreachable: {cause}. Check the endpoint URL "
            "(AWS_ENDPOINT_URL or the block's endpoint_url) and that the service is running."
        )


class StoreAccessError(StoreError, PermissionError):
    """The store refused the request (credentials, permissions, missing bucket; for a folder
    store: its permissions, a full disk or the open-file limit)."""

    def __init__(self, store: str, cause: str) -> None:
        self.store = store
        if "://" not in store:  # a folder on this machine: nothing to do with credentials
            super().__init__(
                f"store {store} refused the request: {cause}. It is a folder on this machine: check "
                "its permissions and free space, and the open-file limit (ulimit -n)."
            )
            return
        super().__init__(
            f"store {store} refused the request: {cause}. Check the bucket name and the "
            "credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the block's fields)."
        )


class ChunkNotFoundError(StoreError, KeyError):
    exit_code = 10

    def __init__(self, store: str, chunk: str) -> None:
        self.store = store
        self.chunk = chunk
        super().__init__(
            f"chunk {chunk} is missing from {store}; run `concord verify {store} "
            "--repair-from OTHER_STORE` to fetch it from a store that holds it."
        )

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


class ChunkArchivedError(StoreError):
    """An object sits in an archive storage class (GLACIER, DEEP_ARCHIVE) and was not restored:
    the store holds it, but cannot hand out its bytes until a restore has completed."""

    def __init__(self, store: str, key: str, storage_class: str) -> None:
        self.store = store
        self.key = key
        self.storage_class = storage_class
        super().__init__(
            f"{key} in {store} is in archive storage class {storage_class} and must be restored "
            "before it can be read; restore it first (e.g. with `concord tier restore`, which "
            "requests the restore and waits for it), then read it again."
        )


class ManifestNotFoundError(StoreError, KeyError):
    exit_code = 10

    def __init__(self, store: str, root: str) -> None:
        self.store = store
        self.root = root
        super().__init__(
            f"no snapshot {root} in {store}; list what it holds with `concord refs {store}`, "
            "or sync the snapshot there first."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class RefNotFoundError(StoreError, KeyError):
    """The store has no ref of that name."""

    exit_code = 10

    def __init__(self, store: str, ref: str) -> None:
        self.store = store
        self.ref = ref
        super().__init__(
            f"no ref {ref!r} in {store}; list refs with `concord refs {store}`, or pass a "
            "64-hex snapshot root instead."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class RefConflictError(StoreError):
    """A compare-and-swap on a ref lost a race: someone else moved it first."""

    def __init__(self, store: str, ref: str, expected: str | None, actual: str | None) -> None:
        self.store = store
        self.ref = ref
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"ref {ref!r} in {store} moved concurrently: expected {expected or '(none)'}, "
            f"found {actual or '(none)'}. Nothing was overwritten; inspect with "
            f"`concord log {store} {ref}` and re-run if the new state is what you want."
        )


class IntegrityError(StoreError, ValueError):
    """Bytes did not hash to the name they were stored or sent under."""

    exit_code = 15

    def __init__(self, where: str, expected: str, actual: str) -> None:
        self.where = where
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{where}: content hashes to {actual}, expected {expected}. The copy is corrupt: "
            "run `concord verify STORE --repair-from OTHER_STORE`."
        )


class StoreNotFoundError(StoreError, FileNotFoundError):
    """A command that only reads was pointed at a place that holds no store (a mistyped path)."""

    exit_code = 10

    def __init__(self, store: str, problem: str = "") -> None:
        self.store = store
        problem = problem or "no chunks/, manifests/ or refs/ there"
        super().__init__(f"no Concord store at {store} ({problem}); check the path.")

    def __str__(self) -> str:
        return str(self.args[0])


def _fix_for(key: str) -> str:
    top = key.split("/", 1)[0]
    if top == "refs":
        return "remove it or copy the ref back from another store"
    if top == "chunks":
        return "remove it and run `concord verify STORE --repair-from OTHER_STORE`"
    if top == "manifests":
        return "remove it and run `concord verify STORE --repair-from OTHER_STORE`, or sync the snapshot again"
    if top == "ledger":
        return "remove it and copy the round back from a good copy of the store"
    return "remove it or copy it back from another store"


class NotRegularFileError(StoreError, OSError):
    """A folder store holds something other than a regular file (a FIFO, a device, a folder, a
    symbolic link) where it expects an object: it is refused rather than read (which could block)."""

    def __init__(self, store: str, key: str, kind: str, fix: str = "") -> None:
        self.store = store
        self.key = key
        self.kind = kind
        ConcordError.__init__(self, f"{key} in {store} is not a regular file ({kind}); {fix or _fix_for(key)}.")

    def __str__(self) -> str:
        return str(self.args[0])


class DocumentError(StoreError, ValueError):
    """A small document read from a store (a tier record, a lease, ...) is unusable: too large,
    too deeply nested, not JSON, or a field of the wrong type or out of range."""

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}. {fix or 'Remove it or copy it back from another store.'}")


class ReservedNameError(InvalidNameError):
    """A name the store format keeps for itself (``<tenant>/_ledger``, a federation ledger's head)."""

    def __init__(self, name: str, what: str = "ref name", reserved: str = "_ledger") -> None:
        self.name = name
        ConcordError.__init__(
            self,
            f"{what} {name!r} is reserved: {reserved!r} names a federation ledger's head, which "
            "points at ledger rounds, not snapshots; choose another name.",
        )
