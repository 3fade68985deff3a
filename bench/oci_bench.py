"""OCI benchmark: a checkpoint published to, and imported from, a real CNCF distribution registry
(``docker-registry`` on 127.0.0.1, plain HTTP, its storage under ``bench/out/work``).

The model folder is the benchmark checkpoint (hard-linked) with a ``config.json``, a 512 KiB
``tokenizer.json`` and a ``README.md``; it is snapshotted into a local store (untimed). Measured:

- export: ``export_oci`` of the snapshot to a new repository (every layer uploaded), against the
  ``oras`` Python SDK alone pushing the same files (``OrasClient.push``) to another new repository;
- second export after a one-file change (the README): bytes uploaded (target ≤ 1 MiB), and its time
  against ``oras`` pushing the changed folder to a repository that holds the first version (oras
  also asks before uploading, but hashes every file first; concord hashes only the README, the
  other digests coming from its memo of the first export, ``concord.oci.memo``);
- import: ``import_oci`` into an empty store (download, check every digest, snapshot), against
  ``oras`` pulling the same artifact into an empty folder.

Each timed run uses a repository of its own, so no run finds the blobs of another, and the first
export a digest memo of its own, empty (as on a machine that never exported the model).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

from bench.common import (
    GB,
    Case,
    MiB,
    Options,
    Row,
    Table,
    Target,
    ensure_checkpoint,
    fresh_dir,
    log,
    probe_memory,
    race,
    remove,
    settle,
    times_note,
    warm,
)

#: run in a child process polled by ``probe_memory``: one export (or oras push) to a new repository
CHILD = """
import sys
from bench.oci_bench import child
child(*sys.argv[1:])
"""


def child(how: str, store_dir: str, root: str, folder: str, target: str) -> None:
    """Push once, after printing ``READY <RssAnon kB>`` and reading a line; print a JSON line."""
    import json

    import oras.client

    from bench.common import self_anon_kb
    from concord.oci import export_oci, parse_reference
    from concord.snapshots.refs import load_manifest
    from concord.stores import LocalDirStore

    store = LocalDirStore(store_dir)
    manifest = load_manifest(store, root)
    client = oras.client.OrasClient(hostname=target.split("/", 1)[0], insecure=True)
    print(f"READY {self_anon_kb()}", flush=True)
    sys.stdin.readline()
    if how == "concord":
        r = export_oci(store, manifest, parse_reference(target), plain_http=True, memo=False)
        out = {"bytes_uploaded": r.bytes_uploaded}
    else:
        os.chdir(folder)
        files = sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file())
        client.push(target=target, files=files, disable_path_validation=True, quiet=True)
        out = {}
    print(json.dumps(out), flush=True)


def _model_folder(ckpt_folder: Path, ckpt_file: Path, dst: Path) -> Path:
    fresh_dir(dst)
    os.link(ckpt_file, dst / ckpt_file.name)
    (dst / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    (dst / "tokenizer.json").write_bytes(os.urandom(512 * 1024))
    (dst / "README.md").write_text("# bench model\n")
    return dst


def run(opts: Options) -> list[Table]:
    import oras.client

    from concord.localservers import RegistryServer
    from concord.oci import export_oci, import_oci, parse_reference
    from concord.oci.memo import DigestMemo
    from concord.snapshots.refs import load_manifest
    from concord.snapshots.snapshot import snapshot
    from concord.stores import LocalDirStore

    base = ensure_checkpoint(opts.data_dir, opts.size_gb)
    work = fresh_dir(opts.work_dir / "oci")
    v1 = _model_folder(base.folder, base.file, work / "model-v1")
    v2 = work / "model-v2"
    shutil.copytree(v1, v2, copy_function=os.link)
    (v2 / "README.md").unlink()
    (v2 / "README.md").write_text("# bench model, second version\n")
    warm(base.file)
    store = LocalDirStore(str(work / "store"))
    log("setup: snapshot both versions")
    m1 = load_manifest(store, snapshot(v1, store, ref="bench/model").root)
    m2 = load_manifest(store, snapshot(v2, store, ref="bench/model").root)
    size = m1.total_bytes
    memo = DigestMemo(work / "memo")  # this machine's memory of what it exported, for all but the first exports

    with RegistryServer(work / "registry", work / "registry.log") as server:
        address = server.wait(60)
        oras_client = oras.client.OrasClient(hostname=address, insecure=True)

        def repo(kind: str) -> str:
            return f"{address}/bench/{kind}-{uuid.uuid4().hex[:8]}"

        def oras_push(folder: Path, target: str):
            cwd = os.getcwd()
            os.chdir(folder)  # oras names layers by their path relative to where it runs
            try:
                files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
                return oras_client.push(target=target, files=files, disable_path_validation=True, quiet=True)
            finally:
                os.chdir(cwd)

        # export: every layer uploaded
        export = [
            Case("concord export", lambda: export_oci(
                store, m1, parse_reference(repo("concord") + ":v1"), plain_http=True,
                memo=DigestMemo(work / f"memo-{uuid.uuid4().hex[:8]}"),
            )),
            Case("oras push", lambda: oras_push(v1, repo("oras") + ":v1")),
        ]
        race(opts.runs, *export, wait_idle=opts.wait_idle)
        if export[0].result.bytes_uploaded < size:
            raise RuntimeError("a first export found blobs already in a new repository")

        # second export after a one-file change, into a repository holding the first version
        state: dict[str, str] = {}

        def first(kind: str) -> None:
            state[kind] = repo(kind)
            if kind == "concord":
                export_oci(store, m1, parse_reference(state[kind] + ":v1"), plain_http=True, memo=memo)
            else:
                oras_push(v1, state[kind] + ":v1")
            settle()

        second = [
            Case(
                "concord export v2",
                lambda: export_oci(store, m2, parse_reference(state["concord"] + ":v1"), plain_http=True, memo=memo),
                before=lambda: first("concord"),
            ),
            Case("oras push v2", lambda: oras_push(v2, state["oras"] + ":v1"), before=lambda: first("oras")),
        ]
        race(opts.runs, *second, wait_idle=opts.wait_idle)
        uploaded = second[0].result.bytes_uploaded
        hashed = second[0].result.bytes_hashed

        # import: from one artifact, into an empty store / folder each run
        ref = parse_reference(repo("pull") + ":v1")
        export_oci(store, m1, ref, plain_http=True, memo=memo)

        def empty(path: Path) -> None:
            remove(path)
            settle()

        imported = work / "imported"
        pulled = work / "pulled"
        imports = [
            Case(
                "concord import",
                lambda: import_oci(
                    ref, LocalDirStore(str(imported)), plain_http=True, staging_dir=str(work / "staging")
                ),
                before=lambda: empty(imported),
            ),
            Case(
                "oras pull", lambda: oras_client.pull(target=str(ref), outdir=str(pulled)), before=lambda: empty(pulled)
            ),
        ]
        race(opts.runs, *imports, wait_idle=opts.wait_idle)
        if imports[0].result.root != m1.root:
            raise RuntimeError(f"the import gave root {imports[0].result.root}, the export {m1.root}")

        # peak memory of one export and one oras push, each in a child process, above its level once loaded
        log("memory: one export and one oras push, each in a child process")
        peaks = {}
        for how in ("concord", "oras"):
            peak, baseline, _, _ = probe_memory(CHILD, [how, str(store.root), m1.root, str(v1), repo(f"mem-{how}") + ":v1"])
            peaks[how] = max(0, peak["RssAnon"] - baseline) / 1024
    remove(work)

    table = Table(f"oci: {size / GB:.2f} GB model (4 files) to and from CNCF distribution on 127.0.0.1, best of {opts.runs}")
    table.add(Row("export (every layer uploaded)", export[0].best, export[1].best, "s", Target("ratio", "<=", 1.2), "oras push"))
    table.add(Row("second export, one small file changed: uploaded", uploaded / MiB, None, "MiB", Target("value", "<=", 1.0)))
    table.add(Row("second export, one small file changed: time", second[0].best, second[1].best, "s", Target("ratio", "<=", 1.0), "oras push"))
    table.add(Row("peak memory of an export, above the loaded process", peaks["concord"], peaks["oras"], "MiB", Target("value", "<", 64), "oras push"))
    table.add(Row("import (digests checked, snapshot taken)", imports[0].best, imports[1].best, "s", Target("ratio", "<=", 2.0), "oras pull"))
    table.notes += [
        f"the import's root equals the export's ({m1.root[:12]}); the second export uploaded {uploaded} bytes "
        f"(the README and the model config) of {m2.total_bytes}, and hashed {hashed} (the README: the other files' digests "
        "came from this machine's memo of the first export, keyed by their checked chunk ids)",
        "oras 0.2 reads each file whole into memory to upload it and hashes every file before asking the registry; "
        "concord streams each layer from the store's checked chunks and computes every digest from them, or remembers it from an earlier "
        "export on this machine (never taking one from the registry), then asks; a remembered digest's upload is hashed on the way",
        "concord import also snapshots what it downloads into a staging store (hash and write every chunk), checks it, "
        "then copies the chunks the target lacks; oras pull only writes the files",
        times_note(export + second + imports),
    ]
    return [table]
