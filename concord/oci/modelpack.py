"""The CNCF ModelPack layout of a model as an OCI artifact: media types, annotation keys, which
layer a file becomes, the model config read from the checkpoint, and the checks an imported
manifest must pass.

One layer per file, unarchived (``.raw``): weights (``*.safetensors``, ``*.bin``, ``*.gguf``…),
documentation (``README*``, ``LICENSE*``, ``*.md``…), code (``*.py``…), and everything else as
configuration of the weights (``config.json``, tokenizer files…). Each layer carries its path in
``org.cncf.model.filepath`` (and ``org.opencontainers.image.title``, so ``oras pull`` lays the files
out the same way). The manifest carries the Concord root and chunk size, so an import rebuilds
the snapshot with the same root.
"""

from __future__ import annotations

import json
import posixpath

from concord.errors.oci import OciNotAModelError, OciUnsafePathError
from concord.errors.snapshots import UnsafePathError
from concord.snapshots.manifest import FileEntry, Manifest, safe_relpath
from concord.text import control_char

ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_TYPE = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
DATASET = "application/vnd.cncf.model.dataset.v1.raw"
RAW_TYPES = (WEIGHT, WEIGHT_CONFIG, DOC, CODE, DATASET)
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"

FILEPATH = "org.cncf.model.filepath"
FILE_METADATA = "org.cncf.model.file.metadata+json"
TITLE = "org.opencontainers.image.title"
#: the manifest's annotations that let an import rebuild the same snapshot
ROOT = "dev.concord.root"
CHUNK_SIZE = "dev.concord.chunk-size"
#: a layer's Concord file hash: an export reuses the digest of an unchanged file from the tag's last manifest
FILE_HASH = "dev.concord.file-hash"

#: a layer's file path has at most this many folders and bytes (far above any model's layout)
MAX_PATH_DEPTH = 32
MAX_PATH_BYTES = 1024
#: layers an imported artifact may have at most
MAX_LAYERS = 100_000

_WEIGHT_EXT = (
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".gguf",
    ".ggml",
    ".onnx",
    ".h5",
    ".msgpack",
    ".npz",
    ".pdparams",
    ".tflite",
    ".mlmodel",
    ".nemo",
)
_DOC_NAMES = ("readme", "license", "licence", "notice", "copying", "changelog", "model_card", "use_policy")
_DOC_EXT = (".md", ".rst", ".pdf")
_CODE_EXT = (".py", ".sh", ".ipynb", ".js", ".ts", ".go", ".rs", ".c", ".cc", ".cpp", ".h")

#: safetensors dtype → the precision names of the ModelPack config
PRECISION = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
}
FORMATS = {".safetensors": "safetensors", ".gguf": "gguf", ".onnx": "onnx", ".pt": "pt", ".pth": "pt", ".bin": "pt", ".ckpt": "pt", ".h5": "h5"}


def layer_type(path: str) -> str:
    """The ModelPack media type of the layer that holds file ``path``."""
    name = posixpath.basename(path).lower()
    stem, ext = posixpath.splitext(name)
    if ext in _WEIGHT_EXT:
        return WEIGHT
    if stem in _DOC_NAMES or any(name.startswith(n) for n in _DOC_NAMES) or ext in _DOC_EXT:
        return DOC
    if ext in _CODE_EXT:
        return CODE
    return WEIGHT_CONFIG


def param_size(count: int) -> str:
    """``count`` parameters as ModelPack writes them: ``6.7B``, ``22.7M``, ``512``."""
    for scale, letter in ((10**15, "Q"), (10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= scale:
            return f"{count / scale:.1f}{letter}"
    return str(count)


def model_config(manifest: Manifest, config_json: dict | None, *, name: str | None, layer_digests: list[str]) -> dict:
    """The ``application/vnd.cncf.model.config.v1+json`` document, from what the checkpoint says:
    format and precision from the weight files, the parameter count from the tensors' shapes,
    the architecture and family from ``config.json`` when there is one."""
    weights = [f for f in manifest.files if layer_type(f.path) == WEIGHT]
    by_format: dict[str, int] = {}
    for f in weights:
        fmt = FORMATS.get(posixpath.splitext(f.path)[1].lower())
        if fmt and f.size:
            by_format[fmt] = by_format.get(fmt, 0) + f.size
    by_dtype: dict[str, int] = {}
    params = 0
    for f in weights:
        for t in f.tensors:
            n = 1
            for d in t.shape or ():
                n *= d
            params += n
            if t.dtype:
                by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.length
    cfg: dict = {}
    if config_json and (config_json.get("architectures") or config_json.get("model_type")):
        cfg["architecture"] = "transformer"
    if by_format:  # the format holding most of the weights' bytes
        cfg["format"] = max(sorted(by_format), key=by_format.__getitem__)
    if params:
        cfg["paramSize"] = param_size(params)
    precisions = [PRECISION.get(d, d.lower()) for d, _ in sorted(by_dtype.items(), key=lambda kv: (-kv[1], kv[0]))]
    if precisions:
        cfg["precision"] = ",".join(precisions)
    quant = (config_json or {}).get("quantization_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        cfg["quantization"] = quant["quant_method"]
    descriptor: dict = {"revision": manifest.root}
    if name:
        descriptor["name"] = name
    family = (config_json or {}).get("model_type")
    if isinstance(family, str) and family:
        descriptor["family"] = family
    return {"descriptor": descriptor, "modelfs": {"type": "layers", "diffIds": list(layer_digests)}, "config": cfg}


def layer_descriptor(f: FileEntry, digest: str) -> dict:
    """The layer descriptor of one file, its path in ``org.cncf.model.filepath``."""
    meta = {"name": f.path, "mode": 0o644, "uid": 0, "gid": 0, "size": f.size, "mtime": "1970-01-01T00:00:00Z", "typeflag": 48}
    return {
        "mediaType": layer_type(f.path),
        "digest": digest,
        "size": f.size,
        "annotations": {
            FILEPATH: f.path,
            TITLE: f.path,
            FILE_METADATA: json.dumps(meta, separators=(",", ":")),
            FILE_HASH: f.hash,
        },
    }


def is_sha256_digest(value: object) -> bool:
    """Whether ``value`` is ``sha256:`` and 64 lowercase hex digits (the only digests checked)."""
    return isinstance(value, str) and len(value) == 71 and value.startswith("sha256:") and all(c in "0123456789abcdef" for c in value[7:])


def check_model_manifest(doc: object, reference: str) -> list[tuple[str, dict]]:
    """Check that ``doc`` is a ModelPack manifest Concord can import; ``(path, layer)`` for each
    layer. Every path is checked before anything is written: relative, normalised, inside the
    folder, no control character, no two layers on one path or on a file and its folder."""
    if not isinstance(doc, dict):
        raise OciNotAModelError(reference, "the manifest is not a JSON object")
    if doc.get("mediaType") not in (MANIFEST_TYPE, None) or doc.get("schemaVersion") != 2:
        raise OciNotAModelError(reference, f"its manifest is {doc.get('mediaType')!r}, not an OCI image manifest")
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    artifact = doc.get("artifactType") or config.get("mediaType")
    if artifact not in (ARTIFACT_TYPE, CONFIG_TYPE) or config.get("mediaType") != CONFIG_TYPE:
        raise OciNotAModelError(reference, f"its artifactType is {doc.get('artifactType')!r} and its config {config.get('mediaType')!r}")
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers:
        raise OciNotAModelError(reference, "it has no layers")
    if len(layers) > MAX_LAYERS:
        raise OciNotAModelError(reference, f"it has {len(layers)} layers, more than the {MAX_LAYERS} an import takes")
    if doc.get("annotations") is not None and not isinstance(doc.get("annotations"), dict):
        raise OciNotAModelError(reference, "its annotations are not an object")
    out: list[tuple[str, dict]] = []
    seen: set[str] = set()
    for i, layer in enumerate(layers):
        size = layer.get("size") if isinstance(layer, dict) else None
        if not isinstance(layer, dict) or not isinstance(layer.get("digest"), str) or isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise OciNotAModelError(reference, f"layer {i} has no digest or size")
        if layer.get("mediaType") not in RAW_TYPES:
            raise OciNotAModelError(reference, f"layer {i} is {layer.get('mediaType')!r}; only unarchived (.raw) layers are imported")
        if not is_sha256_digest(layer["digest"]):
            raise OciNotAModelError(reference, f"layer {i} has digest {layer['digest'][:80]!r}; only sha256 digests are checked")
        annotations = layer.get("annotations") if isinstance(layer.get("annotations"), dict) else {}
        path = annotations.get(FILEPATH)
        if not isinstance(path, str):
            raise OciNotAModelError(reference, f"layer {i} has no {FILEPATH} annotation")
        if len(path.encode("utf-8", "replace")) > MAX_PATH_BYTES or path.count("/") >= MAX_PATH_DEPTH:
            shown = path[:60] + "..." if len(path) > 60 else path
            raise OciUnsafePathError(reference, shown, f"it is longer than {MAX_PATH_BYTES} bytes or deeper than {MAX_PATH_DEPTH} folders")
        try:
            safe_relpath(path)
        except UnsafePathError as exc:
            raise OciUnsafePathError(reference, path, exc.reason) from None
        if control_char(path) is not None:
            raise OciUnsafePathError(reference, path, "it holds a control character")
        if path in seen:
            raise OciUnsafePathError(reference, path, "two layers name the same file")
        seen.add(path)
        out.append((path, layer))
    for path in seen:
        for i in range(len(path)):
            if path[i] == "/" and path[:i] in seen:
                raise OciUnsafePathError(reference, path, f"{path[:i]!r} is a file in the same artifact")
    return out
