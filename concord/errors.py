"""Every error Concord raises, grouped by area.

Each subclasses the standard exception a caller would already catch (``ValueError`` for bad
input, ``FileNotFoundError`` / ``KeyError`` for things that are not there, ``ConnectionError``
for an endpoint that does not answer), carries its context as attributes, and says in its
message what to do next.
"""

from __future__ import annotations


class ConcordError(Exception):
    """Base of every error raised by Concord. A credential in a URL of its message
    (``http://user:secret@host``) is hidden (:func:`concord.redact.redact`)."""

    def __init__(self, *args: object) -> None:
        from concord.redact import redact

        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


# --------------------------------------------------------------------------- input files


class SafetensorsError(ConcordError, ValueError):
    """A file that claims to be safetensors is not a valid one."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(
            f"{path}: not a valid safetensors file: {problem}. "
            "Re-export it with safetensors.torch.save_file, or rename it to another "
            "extension to snapshot it as an opaque file."
        )


class SourceNotFoundError(ConcordError, FileNotFoundError):
    """The checkpoint folder or file to snapshot does not exist."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: no such file or folder to snapshot; check the path.")


class SourceChangedError(ConcordError, RuntimeError):
    """A file changed while it was being snapshotted."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} changed while it was being snapshotted; nothing of it was kept. Snapshot a "
            "checkpoint only once its writer has finished (write a completion marker, then snapshot)."
        )


class UnsafePathError(ConcordError, ValueError):
    """A path from a manifest or a name would escape the folder it belongs in."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(
            f"refusing path {path!r}: {reason}. Manifest paths must be relative, use '/', "
            "and stay inside the restore folder."
        )


class ControlCharacterNameError(ConcordError, ValueError):
    """A file to snapshot has a control character (``\\x00``-``\\x1f``, ``\\x7f``) in its name."""

    def __init__(self, path: str) -> None:
        from concord.text import printable

        self.path = path
        super().__init__(
            f"{printable(path)}: the file name holds a control character (shown escaped); such a "
            "name cannot be printed or restored safely. Rename the file, then snapshot again."
        )


class InvalidNameError(ConcordError, ValueError):
    """A ref, namespace or tenant name is not allowed."""

    def __init__(self, name: str, what: str = "ref name") -> None:
        self.name = name
        super().__init__(
            f"invalid {what} {name!r}: use 'namespace/name' or 'name', each part made of "
            "letters, digits, '.', '_' or '-', not starting with '.', at most 128 characters."
        )


# --------------------------------------------------------------------------- manifests


class ManifestError(ConcordError, ValueError):
    """A manifest is malformed or does not hash to the root it claims."""

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
        ValueError.__init__(
            self,
            f"{self.where} is unreadable: {problem}. Remove it or copy the ref back from another store "
            f"(`concord sync OTHER_STORE {store or 'STORE'} --ref {ref}`).",
        )


# --------------------------------------------------------------------------- stores


class StoreError(ConcordError):
    """Something went wrong inside a store."""


class InvalidStoreURIError(StoreError, ValueError):
    def __init__(self, spec: str, reason: str) -> None:
        self.spec = spec
        super().__init__(
            f"cannot use {spec!r} as a store: {reason}. A store is a folder path, "
            "file:///path, s3://bucket/prefix, or block:NAME (a saved Prefect block)."
        )


class StoreUnreachableError(StoreError, ConnectionError):
    """The store's endpoint did not answer (network, DNS, refused connection)."""

    def __init__(self, store: str, cause: str) -> None:
        self.store = store
        super().__init__(
            f"store {store} is unreachable: {cause}. Check the endpoint URL "
            "(AWS_ENDPOINT_URL or the block's endpoint_url) and that the service is running."
        )


class StoreAccessError(StoreError, PermissionError):
    """The store refused the request (credentials, permissions, missing bucket)."""

    def __init__(self, store: str, cause: str) -> None:
        self.store = store
        super().__init__(
            f"store {store} refused the request: {cause}. Check the bucket name and the "
            "credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the block's fields)."
        )


class ChunkNotFoundError(StoreError, KeyError):
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
        OSError.__init__(self, f"{key} in {store} is not a regular file ({kind}); {fix or _fix_for(key)}.")

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


class StoreLockedError(StoreError, TimeoutError):
    """A writer waited for a garbage collection of the store to finish, and it did not in time."""

    def __init__(self, store: str, holder: str, waited: float) -> None:
        self.store = store
        self.holder = holder
        self.waited = waited
        super().__init__(
            f"{store} is being garbage-collected ({holder}) and the collection did not finish within "
            f"{waited:g} s; run again once it has (a collection killed midway stops holding the "
            "store when its heartbeat stops, within 10 minutes)."
        )


class GcRefusedError(StoreError):
    """Garbage collection stopped before deleting anything: a ref names a snapshot whose
    manifest is missing or damaged, so what that snapshot keeps alive cannot be known."""

    def __init__(self, store: str, ref: str, root: str | None, problem: str) -> None:
        self.store = store
        self.ref = ref
        self.root = root
        self.problem = problem
        which = f"snapshot {root}" if root else "its snapshots"
        super().__init__(
            f"garbage collection of {store} refused: ref {ref!r} names {which}, but {problem}. "
            f"Nothing was deleted. Repair the store first (`concord verify {store} --repair-from "
            "OTHER_STORE`, from a store that holds the snapshot), then collect again."
        )


class HistoryError(ConcordError, ValueError):
    """A rollback target is not in the ref's history."""


class RestoreTargetError(ConcordError, FileExistsError):
    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} already exists and is not empty; restore into a new folder "
            "(Concord never overwrites files)."
        )


class ReplicationError(ConcordError):
    """One or more targets of a replication failed; the others completed."""

    def __init__(self, results: list, failures: dict[str, BaseException]) -> None:
        self.results = results
        self.failures = failures
        lines = "; ".join(f"{store}: {exc}" for store, exc in failures.items())
        done = ", ".join(r.store for r in results) or "none"
        super().__init__(
            f"replication failed for {len(failures)} target(s) ({lines}). Completed: {done}. "
            "Re-run the same sync: it sends only what is still missing."
        )


# --------------------------------------------------------------------------- lineage


class DataFormatError(ConcordError, ValueError):
    """A data source Concord cannot register (unknown format, unreadable file)."""

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(
            f"{source}: {problem}. Register a pandas DataFrame, a .parquet file or a .csv file."
        )


class DataSnapshotNotFoundError(ConcordError, KeyError):
    """No data snapshot with this id is registered in the store."""

    def __init__(self, store: str, snapshot_id: str) -> None:
        self.store = store
        self.snapshot_id = snapshot_id
        super().__init__(
            f"no data snapshot {snapshot_id} in {store}; register the data there with "
            "`concord.lineage.data.register_data`, or sync the snapshot and its datasets/ document there."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class LineageError(ConcordError):
    """A lineage record cannot be written or read as asked."""


class LineageUnreachableError(LineageError, ConnectionError):
    """The MLflow tracking server did not answer."""

    def __init__(self, uri: str, cause: str) -> None:
        self.uri = uri
        super().__init__(
            f"MLflow tracking server {uri} is unreachable: {cause}. Start it (`mlflow server "
            "--host 127.0.0.1 --port PORT`), or point MLFLOW_TRACKING_URI at a running one "
            "(unset it to use the embedded sqlite database under $CONCORD_HOME)."
        )


class PromotionRefused(LineageError):
    """A model version failed the promotion gate; ``reasons`` lists every failed check."""

    def __init__(self, name: str, version: str, alias: str, reasons: list[str]) -> None:
        self.name = name
        self.version = str(version)
        self.alias = alias
        self.reasons = list(reasons)
        listed = "; ".join(f"({i}) {r}" for i, r in enumerate(self.reasons, 1))
        super().__init__(
            f"refusing to point alias {alias!r} of model {name!r} at version {version}: {listed}. "
            "Fix each reason (register data and a contract, fix the data, or publish a compatible "
            "contract version) and promote again."
        )


# --------------------------------------------------------------------------- contracts


class ContractError(ConcordError, ValueError):
    """A schema contract is malformed, or cannot be saved or used as asked."""

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        fix = fix or (
            "Fix the contract (see concord.lineage.contracts.Contract for the fields), or infer a "
            "fresh one from good data with concord.lineage.contracts.infer_contract."
        )
        super().__init__(f"{where}: {problem}. {fix}")


class ContractConflictError(ContractError):
    """A contract version is already saved with different content; versions are immutable."""

    def __init__(self, store: str, ref: str, saved_digest: str, new_digest: str) -> None:
        self.store = store
        self.ref = ref
        self.saved_digest = saved_digest
        self.new_digest = new_digest
        super().__init__(
            f"contract {ref}",
            f"already saved in {store} with different content (saved {saved_digest[:12]}, "
            f"new {new_digest[:12]})",
            "A saved version never changes: bump the version and save again, then check the "
            "change with concord.lineage.contracts.compatible(old, new).",
        )


class ContractNotFoundError(ConcordError, KeyError, FileNotFoundError):
    """No contract of that name (or version, or file) exists."""

    def __init__(self, where: str, ref: str, available: list[str] | None = None) -> None:
        self.where = where
        self.ref = ref
        self.available = list(available or [])
        if available is None:  # a file path: there is no list to show
            listing = ""
        elif self.available:
            listing = "; saved there: " + ", ".join(self.available[:10]) + (" ..." if len(self.available) > 10 else "")
        else:
            listing = "; none is saved there yet"
        super().__init__(
            f"no contract {ref!r} in {where}{listing}. Save it with concord.lineage.contracts.save_contract, "
            "or pass 'name@VERSION', 'name' (its latest version) or the path of a .json file."
        )

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


# --------------------------------------------------------------------------- ledger


class LedgerError(ConcordError, ValueError):
    """A federation ledger cannot be read or extended as asked (bad record, inconsistent ledger)."""

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        fix = fix or "Inspect it with `concord federate verify TENANT --store STORE`."
        super().__init__(f"{where}: {problem}. {fix}")


class LedgerConflictError(RefConflictError):
    """A different round of the same tenant took this round's number first; nothing of this one
    was kept. ``winner`` is the hash of the round that holds the number."""

    def __init__(
        self, store: str, tenant: str, number: int, expected: str | None, actual: str | None, *, winner: str | None = None
    ) -> None:
        self.store = store
        self.ref = f"{tenant}/_ledger"
        self.tenant = tenant
        self.round = number
        self.expected = expected
        self.actual = actual
        self.winner = winner
        StoreError.__init__(
            self,
            f"round {number} of tenant {tenant!r} in {store} went to a different round "
            f"({'hash ' + winner[:12] if winner else 'head ' + (actual or '(none)')}) appended concurrently "
            f"by another run; this round was not recorded. Run it again to record it as a later round "
            f"(a round already in the ledger is never recorded twice); see `concord federate log {tenant} --store {store}`.",
        )


class TenantError(ConcordError, ValueError):
    """A federation round named something that belongs to another tenant."""

    def __init__(self, tenant: str, name: str, owner: str) -> None:
        self.tenant = tenant
        self.name = name
        self.owner = owner
        super().__init__(
            f"{name!r} belongs to tenant {owner!r}, not {tenant!r}: a round of one tenant never reads "
            f"or writes another's refs or ledger. Name the adapter as '{tenant}/NAME' or just 'NAME'."
        )


class AdapterNotFoundError(StoreError, KeyError):
    """No cluster store holds the adapter ref a federation round names."""

    def __init__(self, ref: str, stores: list[str]) -> None:
        self.ref = ref
        self.stores = list(stores)
        super().__init__(
            f"no cluster holds adapter ref {ref!r} (looked in {', '.join(self.stores) or 'no store'}); "
            f"snapshot the adapter there first (`concord snapshot DIR --store STORE --ref {ref}`), "
            "or list what a store holds with `concord refs STORE`."
        )

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


# ---- federation


class AdapterError(ConcordError, ValueError):
    """A folder is not a LoRA adapter Concord can aggregate."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(
            f"{path}: not a usable LoRA adapter: {problem}. Save the adapter with peft's "
            "save_pretrained (adapter_config.json + adapter_model.safetensors; plain LoRA without "
            "DoRA, LoRA biases or modules_to_save)."
        )


class RoundMismatchError(ConcordError, ValueError):
    """The adapters of one federation round do not fit together (base model, modules, shapes)."""

    def __init__(self, path: str, problem: str, index: int | None = None) -> None:
        self.path = str(path)
        self.problem = problem
        self.index = index
        which = f"adapter {index} ({path})" if index is not None else str(path)
        super().__init__(
            f"{which} does not belong in this round: {problem}. Every adapter of a round must be "
            "trained on the same base model (base_model_name_or_path) with LoRA on the same "
            "modules; leave it out or retrain it on the round's base."
        )


class AggregationError(ConcordError, ValueError):
    """The options of an aggregation are invalid, or no client is left to aggregate."""

    def __init__(self, problem: str, fix: str = "") -> None:
        self.problem = problem
        super().__init__(f"cannot aggregate: {problem}. {fix or 'Fix the arguments and run it again.'}")


class AdapterOutputExistsError(ConcordError, FileExistsError):
    """The folder an aggregated adapter is to be written to already holds files."""

    def __init__(self, path: str) -> None:
        self.path = str(path)
        super().__init__(
            f"{path} already exists and is not empty; write the aggregate into a new folder "
            "(Concord never overwrites an adapter)."
        )


# --------------------------------------------------------------------------- tiering


class PolicyError(ConcordError, ValueError):
    """A tier policy is malformed or cannot keep the copy rules; every problem is listed."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        listed = "; ".join(self.problems)
        super().__init__(
            f"tier policy {source} refused: {listed}. Fix the policy (see docs/tiering.md for every key) "
            "and run again; nothing was changed."
        )


class CheckpointNotReadyError(ConcordError, RuntimeError):
    """A checkpoint folder is still being written (no completion marker, or files still changing)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(
            f"checkpoint {path} is not complete: {reason}. Nothing was taken; run again once its "
            "writer has finished (write the completion marker last)."
        )


class CheckpointConflictError(ConcordError, ValueError):
    """A checkpoint name is already tiered with different contents."""

    def __init__(self, name: str, existing: str, new: str) -> None:
        self.name = name
        self.existing = existing
        self.new = new
        super().__init__(
            f"checkpoint {name!r} is already tiered as {existing[:12]}…, and this folder snapshots to "
            f"{new[:12]}…; checkpoints never change once tiered. Give the new one another name "
            "(e.g. its step)."
        )


class CheckpointNotFoundError(ConcordError, KeyError):
    """No tier holds the checkpoint asked for."""

    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace
        super().__init__(
            f"no tier holds checkpoint {name!r} of {namespace!r}; list what is tiered with "
            "`concord tier status --policy POLICY`."
        )

    def __str__(self) -> str:
        return str(self.args[0])


class CopyRuleError(ConcordError, RuntimeError):
    """Removing a copy would break the copy rules, or a copy it relies on failed verification."""

    def __init__(self, name: str, tier: str, problem: str) -> None:
        self.name = name
        self.tier = tier
        self.problem = problem
        super().__init__(
            f"kept checkpoint {name!r} in {tier}: {problem}. Nothing was removed; repair the other "
            "copies (`concord tier sweep` copies what is missing) and run again."
        )


class RestoreTimeoutError(ConcordError, TimeoutError):
    """An archive restore did not complete in time."""

    def __init__(self, store: str, waiting: int, total: int, seconds: float) -> None:
        self.store = store
        self.waiting = waiting
        self.seconds = seconds
        super().__init__(
            f"archive restore from {store} not complete after {seconds:.0f} s: {waiting} of {total} "
            "objects still restoring. The restore requests stay in place; run the same command again "
            "later (it waits for what is left), or raise the timeout (restore.timeout in the policy, "
            "--timeout on the command line)."
        )


# --------------------------------------------------------------------------- drift


class DriftConfigError(ConcordError, ValueError):
    """A drift audit was asked for with invalid options (thresholds, bins, columns, history, inputs).

    What is wrong with the data itself is never an error: it is a finding of the report."""

    def __init__(self, what: str, problem: str, fix: str) -> None:
        self.what = what
        self.problem = problem
        super().__init__(f"{what}: {problem}. {fix}")


# --------------------------------------------------------------------------- replicas and model cards


class ReplicaConfigError(ConcordError, ValueError):
    """A replica or model-card comparison was asked for with invalid options.

    What differs between the replicas themselves is never an error: it is a finding of the report."""

    def __init__(self, what: str, problem: str, fix: str) -> None:
        self.what = what
        self.problem = problem
        super().__init__(f"{what}: {problem}. {fix}")


class ModelCardNotFoundError(ConcordError, FileNotFoundError):
    """A snapshot holds no model card (no README.md, card.json or model_card.json at its top level)."""

    def __init__(self, store: str, root: str) -> None:
        self.store = store
        self.root = root
        super().__init__(
            f"snapshot {root} in {store} has no model card: no README.md, card.json or model_card.json "
            "at its top level. Add a README.md with YAML front matter (license, datasets, ...) to the "
            "checkpoint folder and snapshot it again."
        )


class ModelCardError(ConcordError, ValueError):
    """A model card file cannot be read (front matter that is not YAML, a JSON card that is not an object)."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(
            f"model card {where}: {problem}. Fix the file: README.md front matter is a YAML mapping between "
            "two '---' lines at the very top; card.json and model_card.json hold one JSON object."
        )


# --------------------------------------------------------------------------- checkpoint watcher


class WatchStateError(ConcordError, ValueError):
    """The watcher's state file cannot be read as watcher state."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(
            f"watcher state file {path} is unusable: {problem}. Fix it, or delete it (every complete "
            "checkpoint is then announced again; the flows they trigger are idempotent)."
        )
