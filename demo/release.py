"""The demo's release chapter: sign what was released, refuse what was not, keep an encrypted and
compressed copy off-site, and flip a serving node to the release and back.

Each step is a ``concord`` command, printed as a person would type it and run as one:

- ``concord keys generate`` makes the release key; ``concord sign`` signs what us-east's
  ``models/minilm`` points at (an OpenSSF Model Signing bundle in the store); ``concord sync``
  carries the signature to ap-south, where ``concord verify --trust`` finds it trusted, and a
  folder restored there verifies with the ``model_signing`` command of the OpenSSF package;
- someone who can write eu-central's folder snapshots a model of their own under the same ref:
  every chunk of it verifies, but ``restore`` and ``sync`` under the trust policy refuse its root
  in one line and write nothing;
- ``concord init --encrypt --compress auto`` makes an off-site store; a sync into it holds the
  same root, takes fewer bytes than the raw model, holds neither weight bytes nor tensor names,
  restores byte for byte with its key and refuses without it;
- ``concord checkout`` materialises the release for a serving node next to the link the node
  reads, flips the link to the base model and to the release (fetching only what changed), and
  ``--rollback`` flips it back at once.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from demo._common import REF, same_files
from demo._common import human as _human
from demo.story import Story


def release_folders(home: Path) -> tuple[Path, ...]:
    """What this chapter writes under ``home`` (besides the cluster stores)."""
    return (home / "release",)


def concord(*argv: str, quiet: bool = False) -> tuple[int, dict | None, str]:
    """Run ``concord ARGV --json`` as a person would, printing the command as typed: (exit code,
    the JSON it printed or None, its error line)."""
    here = os.getcwd()
    shown = " ".join(shlex.quote(os.path.relpath(a) if os.path.isabs(a) and a.startswith(here + os.sep) else a) for a in argv)
    if not quiet:
        print(f"  $ concord {shown}")
    ran = subprocess.run([*_CONCORD, *argv, "--json"], capture_output=True, text=True, timeout=600)
    text = ran.stdout.strip()
    return ran.returncode, (json.loads(text) if text else None), ran.stderr.strip()


#: the ``concord`` command of this environment (the script beside this Python, else its module)
_SCRIPT = Path(sys.executable).parent / "concord"
_CONCORD = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "concord.cli"]


def _tamper(base: Path, out: Path) -> None:
    """A model of someone's own: the release's files with one tensor of its weights changed."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shutil.copytree(base, out)
    weights = out / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(weights))
    name = "encoder.layer.0.attention.output.dense.bias"
    tensors[name] = tensors[name] + 0.5
    weights.unlink()
    save_file(tensors, str(weights), metadata=metadata)


def _holds(folder: Path, needles: list[bytes]) -> list[bytes]:
    """Which of ``needles`` occur in any file under ``folder``."""
    found = set()
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found.update(n for n in needles if n in data)
    return sorted(found)


def release_story(home: Path, story: Story, stores: dict[str, str], base: Path, tuned: Path) -> None:
    """The chapter: ``stores`` as the snapshots chapter left them (us-east and ap-south at the
    fine-tune, eu-central rolled back to the base model), ``tuned`` the fine-tune's folder."""
    work = home / "release"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    us, eu, ap = stores["us-east"], stores["eu-central"], stores["ap-south"]
    key, pub = work / "release.pem", work / "release.pub.pem"

    story.step("Sign the release: a key of the release team, then an OpenSSF Model Signing bundle in us-east")
    code, made, err = concord("keys", "generate", str(key))
    story.say(f"key id {made['key_id'][:16]}…; public key {pub.name} (what clusters trust)" if made else err)
    code, signed, err = concord("sign", us, "--ref", REF, "--key", str(key))
    if signed:
        story.say(f"signed root {signed['root'][:12]}: {signed['document'][:24]}…/{signed['key_id'][:8]}….sig in us-east")
    story.check(code == 0 and signed is not None and signed["root"] == _root(us), f"us-east's {REF} is signed{_why(err)}")
    story.done()

    story.step("The signature travels with sync; ap-south trusts what it holds")
    code, synced, err = concord("sync", us, ap, "--ref", REF)
    code, verdict, err = concord("verify", ap, "--ref", REF, "--trust", str(pub))
    if verdict:
        signers = ", ".join(k[:16] + "…" for k in verdict.get("signed_by") or []) or "nobody"
        story.say(f"verify: {verdict.get('chunks_checked')} chunks re-hashed; signed by {signers}; trusted: {verdict.get('trusted')}")
    story.check(code == 0 and bool(verdict and verdict.get("trusted")), f"ap-south's {REF} carries a signature from the release key{_why(err)}")
    restored = work / "restored-ap-south"
    code, _, err = concord("restore", ap, "--ref", REF, str(restored), "--trust", str(pub))
    story.check(code == 0 and same_files(tuned, restored)[1] == [], f"restored under the trust policy, byte for byte{_why(err)}")
    bundle = next((Path(ap) / "signatures").rglob("*.sig"), None)
    tool = Path(sys.executable).parent / "model_signing"
    if tool.exists() and bundle is not None:
        cmd = [str(tool), "verify", "key", str(restored), "--signature", str(bundle), "--public_key", str(pub)]
        print(f"  $ model_signing verify key {restored.name} --signature {bundle.name} --public_key {pub.name}")
        ran = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        story.check(ran.returncode == 0, "the OpenSSF model_signing command verifies the restored folder with the release's public key")
    else:
        story.say("(the model_signing command is not installed here: `pip install model-signing` to check the bundle with it)")
    story.done()

    story.step("A forged root: someone who can write eu-central snapshots a model of their own as the release")
    forged_dir = work / "forged-model"
    _tamper(base, forged_dir)
    code, forged, err = concord("snapshot", str(forged_dir), "--store", eu, "--ref", REF, "--message", "looks like the release")
    forged_root = forged["root"] if forged else ""
    story.say(f"eu-central's {REF} now names {forged_root[:12]}; each of its chunks hashes right")
    out = work / "restored-eu-central"
    code, _, err = concord("restore", eu, "--ref", REF, str(out), "--trust", str(pub))
    story.say(f"restore: exit {code}: {err}")
    story.check(
        code != 0 and forged_root[:12] in err and not out.exists(),
        "restore under the trust policy refuses the forged root, names it, and writes nothing",
    )
    before = _root(ap)
    code, _, err = concord("sync", eu, ap, "--ref", REF, "--trust", str(pub))
    story.check(code != 0 and _root(ap) == before, "sync under the trust policy refuses it too: ap-south keeps the release")
    story.done()

    story.step("An off-site copy, encrypted (AES-256-GCM) and compressed (byte planes + zstd)")
    offsite, offsite_key = str(home / "stores" / "offsite"), work / "offsite.key"
    shutil.rmtree(offsite, ignore_errors=True)
    code, config, err = concord("init", offsite, "--encrypt", "--compress", "auto", "--key-file", str(offsite_key))
    story.check(code == 0 and offsite_key.exists(), f"the off-site store is encrypted with a new key in {offsite_key.name}{_why(err)}")
    code, sent, err = concord("sync", us, offsite, "--ref", REF, "--target-key-file", str(offsite_key))
    target = (sent or {}).get("targets", [{}])[0]
    raw, moved = target.get("raw_bytes_sent", 0), target.get("bytes_sent", 0)
    if raw:
        story.say(f"sent {target.get('chunks_sent')} chunks: {_human(moved)} for {_human(raw)} of raw bytes ({moved / raw:.2f}×)")
    story.check(code == 0 and 0 < moved < raw, f"the bytes that crossed are fewer than the raw bytes they stand for{_why(err)}")
    story.check(_root(offsite, offsite_key) == _root(us), "the off-site store holds the same root as us-east (roots are over the raw bytes)")
    from safetensors import safe_open

    with safe_open(str(tuned / "model.safetensors"), "np") as f:
        names = list(f.keys())[:3]
        sample = f.get_tensor(names[0]).tobytes()[:64]
    leaks = _holds(Path(offsite), [n.encode() for n in names] + [sample])
    story.check(not leaks, "no object of the off-site store holds a tensor name or a run of weight bytes")
    back = work / "restored-offsite"
    code, _, err = concord("restore", offsite, "--ref", REF, str(back), "--key-file", str(offsite_key))
    story.check(code == 0 and same_files(tuned, back)[1] == [], "restored from off-site with its key, byte for byte")
    code, _, err = concord("restore", offsite, "--ref", REF, str(work / "no-key"), quiet=True)
    story.say(f"without the key: exit {code}: {err}")
    story.check(code != 0 and not (work / "no-key").exists(), "without the key the store is refused in one line, nothing written")
    story.done()

    story.step("A serving node: check out the base model, flip to the release, roll back")
    link = work / "serving" / "current"
    code, first, err = concord("checkout", us, "--ref", f"{REF}~1", str(link))
    code, flip, err = concord("checkout", us, "--ref", REF, str(link))
    if flip:
        story.say(f"flip: fetched {_human(flip['bytes_fetched'])}, reused {_human(flip['bytes_reused'])} already on the node, in {flip['seconds']:.2f} s")
    story.check(
        code == 0 and flip is not None and os.path.realpath(link).endswith(flip["root"]) and flip["bytes_fetched"] < flip["bytes"] / 10,
        f"the link names the release; only the changed bytes were fetched{_why(err)}",
    )
    code, rolled, err = concord("checkout", "--rollback", str(link))
    story.check(
        code == 0 and first is not None and os.path.realpath(link).endswith(first["root"]),
        f"--rollback flips the link back to the base model{_why(err)}",
    )
    story.done()


def _why(err: str) -> str:
    return f" ({err})" if err else ""


def _root(store: str, key_file: Path | None = None) -> str:
    """The root ``REF`` names in ``store`` (opened with the key in ``key_file``, if encrypted)."""
    from concord.stores import open_store
    from concord.stores.cipher import read_key_file

    opened = open_store(store)
    if key_file is not None:
        opened.unlock(read_key_file(str(key_file)))
    ref = opened.read_ref(REF)
    return ref.root if ref else ""
